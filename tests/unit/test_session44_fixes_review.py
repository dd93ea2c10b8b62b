"""An outside review of session 44's fixes (session 45).

docs/service.md, section 3: ``close`` (also leaving ``with GatewayProducer(...)``) may be
called from a signal handler: "a close inside the first close of the same thread (a
signal handler's) does not wait for itself"; a ``send`` after ``close`` (or while it
runs) is ``ProducerClosed``, and a turn's events are produced under one hold of the
send lock.

1. A signal handler's ``close`` while its thread was inside ``send`` / ``send_turn``
   (holding the send lock: up to ``delivery.timeout.ms`` when librdkafka's queue is
   full) waited for that lock for ever: the process hung on SIGTERM. So did one while
   its thread held the producer's own lock (recording or reading failures). One inside
   a delivery report (librdkafka's ``poll`` or ``flush``, where a pending signal's
   handler runs) flushed or closed librdkafka from inside its own callback: the real
   client aborts the process, or its close waits for itself.

2. docs/processor.md, "Rebalance": on a revocation the app's ``settle_revoked`` runs
   first, then the commit, then Faust's revocation. ``settle_revoked`` raising escaped
   into aiokafka, which logs a rebalance listener's error and goes on: nothing
   committed, Faust never told, the worker running on.

3. The rehydration client: a request after ``close`` is ``ClientClosed``; one whose
   ``close`` came from another thread between its check and its send raised httpx's
   ``RuntimeError``.

No broker is needed: librdkafka is replaced by ``FakeKafka`` (once the real client, in a
process of its own, with an unreachable broker), Kafka's commits are recorded
(``tests/unit/test_commit_before_revoke.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import httpx
import pytest
from confluent_kafka import KafkaError
from faust.types import TP
from faust.types.tuples import Message

from ratchet.samples import make_turn
from services.gateway.client import RehydrationClient
from services.gateway.errors import ClientClosed, DeliveryError, ProducerClosed
from streams.consumer_loop import LoopConsumerApp, WorkerApp
from tests.unit.test_commit_before_revoke import _recording_consumer
from tests.unit.test_gateway_library_review import effect_of, gateway

ROOT = Path(__file__).resolve().parents[2]
RETRIABLE = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not enough replicas", retriable=True)


def run_in_daemon(fn) -> threading.Thread:
    """``fn`` in a thread of its own, joined for at most 10 s (a hang stays behind)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(10)
    return thread


# 1. ------------------------------------------------------------------------------------
def test_a_signal_handlers_close_inside_send_turn_does_not_hang():
    """The handler's close runs while its thread has queued the turn's first effect:
    it closes (its DeliveryError names the effect it purged), and the send refuses the
    rest ``ProducerClosed``, nothing produced after the close."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    plain_produce = kafka.produce
    handler: list[BaseException | None] = []

    def produce_then_a_signal(topic, value, key, on_delivery):
        plain_produce(topic, value, key, on_delivery)
        if not handler:  # SIGTERM arrives now; its handler closes the producer
            try:
                producer.close(timeout_s=0)
                handler.append(None)
            except DeliveryError as exc:
                handler.append(exc)

    kafka.produce = produce_then_a_signal
    sent: list[BaseException | None] = []

    def send() -> None:
        try:
            producer.send_turn(turn, effects=effects)
            sent.append(None)
        except ProducerClosed as exc:
            sent.append(exc)

    thread = run_in_daemon(send)
    assert not thread.is_alive(), "the handler's close waited for the send lock its thread held"
    assert isinstance(handler[0], DeliveryError)
    assert [eid for eid, _ in handler[0].failures] == [effects[0].event_id]  # purged
    assert handler[0].retryable
    assert isinstance(sent[0], ProducerClosed)  # the second effect and the turn: not produced
    assert len(kafka.produced) == 1 and kafka.closed


def test_a_signal_handlers_close_inside_send_does_not_hang():
    """The same for one event: the handler closes after it was queued; the send returns
    (its event was queued before the close, whose DeliveryError names it)."""
    producer, kafka = gateway()
    turn = make_turn()
    plain_produce = kafka.produce
    handler: list[BaseException | None] = []

    def produce_then_a_signal(topic, value, key, on_delivery):
        plain_produce(topic, value, key, on_delivery)
        try:
            producer.close(timeout_s=0)
            handler.append(None)
        except DeliveryError as exc:
            handler.append(exc)

    kafka.produce = produce_then_a_signal
    sent: list[BaseException | None] = []

    def send() -> None:
        try:
            producer.send(turn)
            sent.append(None)
        except Exception as exc:  # noqa: BLE001 - what it raises is asserted
            sent.append(exc)

    thread = run_in_daemon(send)
    assert not thread.is_alive(), "the handler's close waited for the send lock its thread held"
    assert [eid for eid, _ in handler[0].failures] == [turn.event_id]
    assert sent == [None]  # queued before the close; not a closed client's RuntimeError


def test_a_signal_handlers_close_while_its_thread_records_a_failure_does_not_hang():
    """The handler runs while its thread's ``flush`` serves a delivery report (the
    producer's own lock held, recording the failure): its ``close`` waited for that lock
    for ever."""
    producer, kafka = gateway()
    producer.send(turn := make_turn())
    kafka.deliver(0, RETRIABLE)
    handler: list[BaseException | None] = []

    class FailuresWithASignal(list):
        def append(self, failure) -> None:
            super().append(failure)
            if not handler:  # SIGTERM arrives now; its handler closes the producer
                try:
                    producer.close(timeout_s=0)
                    handler.append(None)
                except DeliveryError as exc:
                    handler.append(exc)

    producer._failure_log = FailuresWithASignal()
    flushed: list[BaseException | None] = []

    def flush() -> None:
        try:
            producer.flush()
            flushed.append(None)
        except DeliveryError as exc:
            flushed.append(exc)

    thread = run_in_daemon(flush)
    assert not thread.is_alive(), "the handler's close waited for the lock its thread held"
    # Inside a delivery report librdkafka cannot be flushed or closed (the test below):
    # the handler's close returns, and the flush it ran in finishes it and raises.
    assert handler == [None]
    assert isinstance(flushed[0], DeliveryError)
    assert [eid for eid, _ in flushed[0].failures] == [turn.event_id]
    assert kafka.closed


# 2. ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_a_revocation_whose_settling_fails_crashes_the_worker(tmp_path, monkeypatch, cls):
    """``settle_revoked`` raising (a bug) escaped the consumer's revocation into
    aiokafka, which logs a rebalance listener's error and goes on: nothing committed,
    Faust never told (its acks of the partitions kept, its flow not stopped), the
    lanes of partitions now another worker's maybe still running. Before session 44 the
    same error in the app's revoke handler crashed the worker (Faust's rule): fail
    closed, the supervisor starts it again from the committed offsets."""
    async def check():
        consumer, committed = _recording_consumer(cls, "unit-settle-fails", tmp_path,
                                                  monkeypatch)
        told: list[set] = []

        async def app_revoke_handler(revoked):
            told.append(revoked)

        async def settle_revoked(revoked):
            raise RuntimeError("a bug while settling")

        monkeypatch.setattr(consumer, "_on_partitions_revoked", app_revoke_handler)
        monkeypatch.setattr(consumer.app, "settle_revoked", settle_revoked, raising=False)
        consumer.ack(Message("events", 0, 0, 0.0, 0, None, b"k", b"v", None))
        try:
            await consumer.on_partitions_revoked({TP("events", 0)})
            escaped = None
        except Exception as exc:  # noqa: BLE001 - asserted below
            escaped = exc
        return consumer.app, committed, told, escaped

    app, committed, told, escaped = asyncio.run(asyncio.wait_for(check(), 10))
    assert escaped is None, f"{escaped!r} escaped to aiokafka, which logs it and goes on"
    assert app.crashed and str(app.crash_reason) == "a bug while settling"
    assert told == [{TP("events", 0)}]  # Faust still told (it forgets the partition)
    assert committed.get(TP("events", 0)) == 1  # what was acked is committed all the same


def test_a_signal_handlers_close_while_its_thread_reads_its_failures_does_not_hang():
    """The handler runs while its thread's ``flush`` reads the failures to raise (the
    producer's own lock held, out of librdkafka's calls): its ``close`` flushes and
    purges, whose reports, and its own read of the failures, take that lock. It
    waited for it for ever."""
    producer, kafka = gateway()
    handler: list[BaseException | None] = []
    signalled: list[bool] = []

    class FailuresWithASignal(list):
        def __iter__(self):
            if not signalled:  # SIGTERM arrives now; its handler closes the producer
                signalled.append(True)
                try:
                    producer.close(timeout_s=0)
                    handler.append(None)
                except DeliveryError as exc:
                    handler.append(exc)
            return super().__iter__()

    producer._failure_log = FailuresWithASignal()
    producer.send(first := make_turn())
    kafka.deliver(0, RETRIABLE)
    producer.send(second := make_turn())  # still queued: the close purges it
    thread = run_in_daemon(lambda: _flush_quietly(producer))
    assert not thread.is_alive(), "the handler's close waited for the lock its thread held"
    assert isinstance(handler[0], DeliveryError)
    assert {eid for eid, _ in handler[0].failures} == {first.event_id, second.event_id}
    assert kafka.closed


def _flush_quietly(producer) -> None:
    with contextlib.suppress(DeliveryError):
        producer.flush()


# A signal handler's close inside librdkafka's own delivery report, with the real client:
# in a process of its own (confluent-kafka aborts the process on a flush from inside its
# callback, and its close there waits for itself).
_CLOSE_IN_A_REPORT = """
import sys
from ratchet.samples import make_turn
from ratchet.settings import Settings
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer


class Serde:
    def encode(self, event, topic):
        return b"\\0" * 100


producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=Serde(),
                           config={"message.timeout.ms": 300, "log_level": 0})
explained, handled = producer._explained, []


def report_with_a_signal(err):  # SIGTERM arrives while a delivery report runs
    if not handled:
        try:
            producer.close(timeout_s=1)
            handled.append("returned")
        except DeliveryError as exc:
            handled.append(sorted(eid for eid, _ in exc.failures))
    return explained(err)


producer._explained = report_with_a_signal
turns = [make_turn(), make_turn()]
for turn in turns:
    producer.send(turn)
try:
    producer.flush(20)  # the broker is unreachable: each event times out, reported here
    print("flush raised nothing")
except DeliveryError as exc:
    told = sorted(eid for eid, _ in exc.failures)
    print("flush:", "both" if told == sorted(t.event_id for t in turns) else told)
print("handler:", handled)
try:
    producer.send(make_turn())
except Exception as exc:
    print("send after:", type(exc).__name__)
sys.stdout.flush()
"""


def test_a_signal_handlers_close_inside_a_delivery_report_closes_once_the_flush_returns():
    """librdkafka cannot be flushed or closed from inside its own delivery report
    (confluent-kafka asserts and aborts the process, or its close waits for itself): a
    handler's ``close`` there refuses further sends at once, and the flush the report
    ran in completes the close when it returns, raising what was not delivered."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CLOSE_IN_A_REPORT], capture_output=True,
                          text=True, timeout=60, cwd=str(ROOT), env={**os.environ})
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert "handler: ['returned']" in lines, lines  # deferred: nothing of it raised there
    assert "flush: both" in lines, lines  # timed out or purged: both told, retryable
    assert "send after: ProducerClosed" in lines, lines


# 3. ------------------------------------------------------------------------------------
def test_a_close_in_another_thread_racing_a_request_is_client_closed():
    """The rehydration client's ``close`` in another thread landing between its request's
    closed check and the send: httpx's ``RuntimeError`` ("the client has been closed")
    escaped untyped, where a request after ``close`` is ``ClientClosed``."""

    class ClosedRightAfterTheCheck(httpx.Client):
        @property
        def is_closed(self) -> bool:
            closed = super().is_closed
            if not closed:
                self.close()  # the other thread's close, just now
            return closed

    client = RehydrationClient("http://rehydration.invalid")
    client._http.close()
    client._http = ClosedRightAfterTheCheck(
        base_url="http://rehydration.invalid",
        transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    with pytest.raises(ClientClosed):
        client.status("t1", "resp_1")
