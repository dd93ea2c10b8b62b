"""The gateway producer's report pump and ``Delivery.wait`` of session 48, reviewed from
outside (session 48, rreva).

docs/service.md, section 3: a signal handler's ``close`` inside a call of its own thread
closes (session 45); a ``Delivery``'s ``wait`` raises every failure of its own events.
Two ways these broke:

- The thread that waits for reports (a send waiting for room, a ``Delivery.wait``)
  holds the producer's ``_room`` lock while it starts the report pump, and the pump
  takes that lock before anything else. A signal handler's ``close`` run there joined
  the pump, which could not take the lock its own thread held: the process hung.
- ``wait`` read its failures, then how many events were not reported: a report landing
  between the two reads was in neither, so a wait that timed out as that event failed
  returned as if it had been written.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, FlushTimeout
from services.gateway.producer import Delivery
from tests.unit.producer_process import run_script
from tests.unit.test_gateway_library_review import gateway

TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)

_HANDLERS_CLOSE_AS_THE_PUMP_STARTS = '''
import signal

from services.gateway import producer as module

told = []


def handler(signum, frame):
    try:
        producer.close(timeout_s=0)
        told.append("close: nothing")
    except DeliveryError as exc:
        told.append(f"close: {[eid for eid, _ in exc.failures]}")


class Pump(threading.Thread):
    """The report pump's thread; its start is where the signal lands (the waiting
    thread holds ``_room`` there, as at any step before its wait)."""

    def start(self):
        super().start()
        if self.name.startswith("ratchet-gateway-reports"):
            signal.raise_signal(signal.SIGUSR1)  # the handler runs before this returns


signal.signal(signal.SIGUSR1, handler)
module.threading.Thread = Pump
producer = unreachable({})
turn = make_turn()
sent = producer.send(turn)
try:
    sent.wait(timeout_s=600)  # never its timeout: done once closed
    told.append("wait: written")
except DeliveryError as exc:
    told.append(f"wait: {[eid for eid, _ in exc.failures]}")
for line in told:
    print(line)
print("turn", turn.event_id)
'''


def test_a_handlers_close_while_its_thread_starts_the_report_pump_does_not_hang():
    """``Delivery.wait`` in the main thread starts the report pump; SIGUSR1's handler
    closes the producer right then (its thread holds ``_room``). The close purges the
    turn and raises it, and the wait raises it too. Before: the close joined a pump
    waiting for ``_room`` for ever (the real client, in a process of its own)."""
    *told, turn = run_script(_HANDLERS_CLOSE_AS_THE_PUMP_STARTS, timeout_s=60)
    event_id = turn.removeprefix("turn ")
    assert told == [f"close: {[event_id]}", f"wait: {[event_id]}"]


class _ReportedWhileRead(list):
    """A ``Delivery``'s failure list whose first read lets its event's report land just
    after the read: the one step another thread's report may take there."""

    def __init__(self, delivery: Delivery, event_id: str) -> None:
        super().__init__()
        self._delivery, self._event_id, self._armed = delivery, event_id, True

    def __iter__(self):
        read = iter(list(super().__iter__()))
        if self._armed:
            self._armed = False
            self._delivery._reported(self._event_id, TIMED_OUT)
        return read


def test_a_report_landing_while_a_timed_out_wait_reads_it_is_not_lost():
    """The wait timed out (no report within 0 s); the turn's failure is reported as the
    wait reads what it knows. It must raise, the turn failed or still in flight (it
    landed after the read): ``DeliveryError`` naming it, else ``FlushTimeout`` counting
    it. Before, it returned: the turn told written."""
    producer, _ = gateway()
    turn = make_turn()
    sent = producer.send(turn)
    sent._failures = _ReportedWhileRead(sent, turn.event_id)
    with pytest.raises((DeliveryError, FlushTimeout)) as raised:
        sent.wait(timeout_s=0)
    if isinstance(raised.value, DeliveryError):
        assert [eid for eid, _ in raised.value.failures] == [turn.event_id]
    assert raised.value.pending == int(isinstance(raised.value, FlushTimeout))
    with pytest.raises(DeliveryError) as again:  # the report is in: a wait now is told
        sent.wait(timeout_s=0)
    assert [eid for eid, _ in again.value.failures] == [turn.event_id]
    assert again.value.pending == 0


def test_a_cancelled_wait_async_lets_its_thread_go():
    """A coroutine awaiting its ``Delivery`` is cancelled (what ``asyncio.run`` does to
    its task at Ctrl-C); the broker never answers. The wait's executor thread must end
    with it: ``asyncio.run`` waits for the loop's executor before it returns, so the
    process stayed up to the wait's ``timeout_s`` after Ctrl-C (here 600 s; the thread
    counted against the loop's executor meanwhile)."""
    producer, kafka = gateway()
    plain_poll = kafka.poll

    def poll(timeout=0):  # librdkafka's poll waits its timeout for a report: none here
        time.sleep(timeout)
        return plain_poll(0)

    kafka.poll = poll
    told: list[str] = []

    async def main() -> None:
        waiting = asyncio.create_task(producer.send(make_turn()).wait_async(600))
        while not producer._waiting_for_reports:  # its thread waits for reports
            await asyncio.sleep(0.01)
        waiting.cancel()
        try:
            await waiting
        except asyncio.CancelledError:
            told.append("cancelled")

    runner = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    runner.start()
    runner.join(30)
    try:
        assert not runner.is_alive(), "asyncio.run waited for the cancelled wait's thread"
        assert told == ["cancelled"]
        assert producer._waiting_for_reports == 0
    finally:
        with pytest.raises(DeliveryError):  # purged: told to the thread's close
            producer.close(timeout_s=0)


_HANDLERS_CLOSE_JUST_BEFORE_THE_WAIT = '''
import signal
import types

from services.gateway import producer as module

told = []
calls = []


def handler(signum, frame):
    try:
        producer.close(timeout_s=0)
    except DeliveryError as exc:
        told.append(f"close: {[eid for eid, _ in exc.failures]}")


def monotonic():
    """The wait's clock; its third reading is the wait's last step before it waits
    (the pump started, the condition checked again): where the signal lands."""
    calls.append(1)
    if len(calls) == 3:
        signal.raise_signal(signal.SIGUSR1)
    return time.monotonic()


signal.signal(signal.SIGUSR1, handler)
module.time = types.SimpleNamespace(monotonic=monotonic)
producer = unreachable({})
turn = make_turn()
sent = producer.send(turn)
try:
    sent.wait(timeout_s=600)  # never its timeout: done once closed
    told.append("wait: written")
except DeliveryError as exc:
    told.append(f"wait: {[eid for eid, _ in exc.failures]}")
for line in told:
    print(line)
print("turn", turn.event_id)
'''


def test_a_handlers_close_just_before_its_thread_waits_is_seen():
    """SIGUSR1's handler closes the producer between the wait's last check and its
    ``wait`` (its thread holds ``_room``; the close notifies no one). The wait must
    still see the close and raise the purged turn, not wait out its 600 s (a send's
    wait for room, which has no timeout, waited for ever)."""
    *told, turn = run_script(_HANDLERS_CLOSE_JUST_BEFORE_THE_WAIT, timeout_s=60)
    event_id = turn.removeprefix("turn ")
    assert told == [f"close: {[event_id]}", f"wait: {[event_id]}"]
