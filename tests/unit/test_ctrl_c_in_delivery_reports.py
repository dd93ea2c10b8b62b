"""Ctrl-C landing inside a delivery report is ``KeyboardInterrupt`` out of the gateway
library's ``flush``, ``Delivery.wait``, ``close`` and a send waiting for room, and out
of the chaos producer's raw flush; never ``SystemError`` (session 50).

confluent-kafka 2.16 raised it out of librdkafka's call as ``SystemError: ... returned
NULL without setting an exception`` (``services/gateway/kafka_calls.py``): a CI run of ``ratchet
smoke``'s Ctrl-C test failed on it (session 49). The real client, its broker
unreachable: each event times out after ``delivery.timeout.ms`` (200) and its report is
served by the call under test; SIGINT is sent inside that report (``tests/ctrl_c.py``).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import Producer

from ratchet.chaos import produce as chaos_produce
from ratchet.samples import make_turn
from ratchet.settings import Settings
from services.gateway.errors import DeliveryError
from services.gateway.kafka_calls import interruptible
from services.gateway.producer import GatewayProducer
from tests.ctrl_c import ctrl_c_in, python_ctrl_c
from tests.unit.test_gateway_producer_lost_report import _Client, _Serde

UNREACHABLE = "127.0.0.1:1"
QUICK = {"log_level": 0, "delivery.timeout.ms": 200}


def _gateway(**config) -> GatewayProducer:
    producer = GatewayProducer(Settings(kafka_bootstrap=UNREACHABLE), serde=_Serde(),
                               config={**QUICK, **config})
    producer._producer = _Client(producer._producer, ctrl_c_in)
    return producer


@pytest.mark.parametrize("call", ["flush", "Delivery.wait", "close"])
def test_ctrl_c_in_a_report_is_keyboard_interrupt_out_of_the_gateway(call):
    """Then the event is told, as for any report Ctrl-C ended (session 49): a retryable
    ``DeliveryError`` of the next close."""
    producer = _gateway()
    sent = producer.send(make_turn())
    run = {"flush": lambda: producer.flush(10), "Delivery.wait": lambda: sent.wait(10),
           "close": lambda: producer.close(10)}[call]
    with python_ctrl_c(), pytest.raises(KeyboardInterrupt):
        run()
    with pytest.raises(DeliveryError) as closed:
        producer.close(0)
    assert [eid for eid, _ in closed.value.failures] == list(sent.event_ids)
    assert closed.value.retryable


def test_ctrl_c_in_a_report_a_send_waiting_for_room_serves_is_keyboard_interrupt():
    """librdkafka's queue holds one event: the second send polls for room, and that poll
    serves the first event's report."""
    producer = _gateway(**{"queue.buffering.max.messages": 1})
    producer.send(make_turn())
    with python_ctrl_c(), pytest.raises(KeyboardInterrupt):
        producer.send(make_turn())
    with pytest.raises(DeliveryError):
        producer.close(0)


class _SentAgain(BaseException):
    """The round was sent again: the Ctrl-C was taken for a failed round."""


def test_ctrl_c_in_a_raw_report_stops_the_chaos_producer_round():
    """The chaos producer sends a round again on any ``Exception`` (a delivery failure):
    the ``SystemError`` was one, and the producer sent on, its Ctrl-C gone."""
    raw = chaos_produce._RawProducer(Settings(kafka_bootstrap=UNREACHABLE))
    raw._p = _Client(Producer({**raw._config, **QUICK}), ctrl_c_in)
    sends = []

    def send(_story, _i, race=False):
        if sends:
            raise _SentAgain
        sends.append(1)
        raw.send(b"k", b"v")

    sender = SimpleNamespace(send=send, flush=raw.flush)
    with python_ctrl_c(), pytest.raises(KeyboardInterrupt):
        chaos_produce._send_round(sender, [(None, SimpleNamespace(sends=[0], race=[]))])


def test_a_systemerror_out_of_another_thread_is_left_as_it_is():
    """Control: no signal lands in a thread other than the main one, so what confluent-
    kafka lost there is not called a Ctrl-C; nor is another ``SystemError``."""
    def lost():
        raise SystemError("<method 'flush'> returned NULL without setting an exception")

    caught = []

    def other():
        try:
            interruptible(lost)
        except BaseException as exc:
            caught.append(exc)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert type(caught[0]) is SystemError
    with pytest.raises(SystemError):
        interruptible(lambda: (_ for _ in ()).throw(SystemError("something else")))
    with python_ctrl_c(), pytest.raises(KeyboardInterrupt):
        interruptible(lost)


def test_ctrl_c_in_a_report_is_keyboard_interrupt_out_of_the_bench_rig_flush():
    """The benches' and the test rig's ``EventProducer`` (``streams.testing``): its
    reports run in its ``flush``. Was ``SystemError`` (a Ctrl-C'd bench: its traceback
    as a bug's, ``ratchet bench``)."""
    from streams.testing import EventProducer

    rig = object.__new__(EventProducer)  # its topic never made: no broker here
    rig.topic, rig.placed, rig.failed, rig.unconfirmed = "rsmoke-rig", {}, [], []
    rig.producer = _Client(Producer({"bootstrap.servers": UNREACHABLE, **QUICK}),
                           ctrl_c_in)
    rig.send_raw(b"k", b"v")
    with python_ctrl_c(), pytest.raises(KeyboardInterrupt):
        rig.flush()


def _out_of_memory_in(report):
    """``report``, ended by a ``MemoryError`` raised in C (an allocation refused), as
    Python sets it: without an instance, so confluent-kafka loses it as it loses
    Ctrl-C's (``SystemError: ... returned NULL without setting an exception``)."""
    def out_of_memory(*args):
        bytearray(sys.maxsize)  # refused before any allocation: PyErr_NoMemory
        return report(*args)
    return out_of_memory


def _served_apart(_signum, _frame):
    """A host's SIGINT handler that raises nothing (uvicorn's sets a flag, asyncio's
    cancels the main task, ratchet's ``defer_stops`` keeps the stop for later)."""


@pytest.mark.parametrize("sigint", [signal.SIG_IGN, _served_apart],
                         ids=["ignored", "a host's handler"])
def test_a_lost_exception_is_no_ctrl_c_where_sigint_raises_none(sigint):
    """Only Python's own SIGINT handler raises ``KeyboardInterrupt`` without an
    instance; with SIGINT ignored (a background job) or handled by the host (a gateway
    served by uvicorn, whose event loop polls in the main thread) the lost exception is
    another's, here a report's ``MemoryError``. It was ``KeyboardInterrupt``, which
    stops the whole server as a Ctrl-C would (session 50's review); it is left the
    ``SystemError`` it is, and the event is still told as lost."""
    producer = GatewayProducer(Settings(kafka_bootstrap=UNREACHABLE), serde=_Serde(),
                               config=QUICK)
    producer._producer = _Client(producer._producer, _out_of_memory_in)
    sent = producer.send(make_turn())
    before = signal.signal(signal.SIGINT, sigint)
    try:
        producer.flush(10)
    except BaseException as exc:  # caught: a KeyboardInterrupt would end the run
        raised: BaseException | None = exc
    else:
        raised = None
    finally:
        signal.signal(signal.SIGINT, before)
    assert type(raised) is SystemError, repr(raised)
    assert "without setting an exception" in str(raised)
    with pytest.raises(DeliveryError) as closed:
        producer.close(0)
    assert [eid for eid, _ in closed.value.failures] == list(sent.event_ids)
    assert closed.value.retryable
