"""The gateway producer's waits for reports and ``Delivery.wait`` of session 48,
reviewed from outside (session 48, rreva; its report pump taken out by rgw4).

docs/service.md, section 3: a signal handler's ``close`` inside a call of its own thread
closes (session 45); a ``Delivery``'s ``wait`` raises every failure of its own events.
Ways these broke with session 48's report pump, and what still holds without it:

- A signal handler's ``close`` in a thread waiting for reports hung (it joined a pump
  waiting for a lock its own thread held) or left the wait its whole timeout (the
  close notified no one). The wait now polls itself: a handler's close inside its poll
  is finished as the poll returns, one just before its poll makes that poll return at
  once; either way the wait raises the purged turn.
- ``wait`` read its failures, then how many events were not reported: a report landing
  between the two reads was in neither, so a wait that timed out as that event failed
  returned as if it had been written.
- A cancelled ``wait_async`` kept an executor thread; it now holds none.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, FlushTimeout
from services.gateway.producer import Delivery
from tests.unit.producer_process import run_script
from tests.unit.test_gateway_library_review import gateway

TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)

# Each script's end: the main thread sends a turn and waits for it (the signal lands in
# that wait), then prints what the handler and the wait were told, and the turn's id.
_SEND_WAIT_AND_TELL = '''
turn = make_turn()
sent = producer.send(turn)
# never its timeout: done once closed
told.append(f"wait: {outcome(lambda: sent.wait(timeout_s=600), 'written')}")
for line in told:
    print(line)
print("turn", turn.event_id)
'''

_HANDLERS_CLOSE_INSIDE_THE_WAITS_POLL = '''
import signal

told = []


def handler(signum, frame):
    try:
        producer.close(timeout_s=0)
        told.append("close: nothing")
    except DeliveryError as exc:
        told.append(f"close: {[eid for eid, _ in exc.failures]}")


class Client:
    """The real client; the signal lands in the wait's first poll."""

    def __init__(self, real):
        self._real = real

    def poll(self, timeout=0):
        if timeout and not told:
            signal.raise_signal(signal.SIGUSR1)  # the handler runs before this returns
        return self._real.poll(timeout)

    def __len__(self):
        return len(self._real)

    def __getattr__(self, name):
        return getattr(self._real, name)


signal.signal(signal.SIGUSR1, handler)
producer = unreachable({})
producer._producer = Client(producer._producer)
''' + _SEND_WAIT_AND_TELL


def test_a_handlers_close_while_its_thread_waits_in_a_poll_does_not_hang():
    """``Delivery.wait`` in the main thread polls; SIGUSR1's handler closes the
    producer inside that poll (a delivery-report call: the close refuses sends and
    returns, raising nothing). The poll's return finishes the close (the turn purged),
    and the wait raises the purged turn, not its 600 s. Session 48's version landed the
    signal where the wait started its report pump: the close hung (a join) or the wait
    ran out its timeout; the pump is gone (rgw4), the wait's own poll is where a
    handler lands now (the real client, in a process of its own)."""
    *told, turn = run_script(_HANDLERS_CLOSE_INSIDE_THE_WAITS_POLL, timeout_s=60)
    event_id = turn.removeprefix("turn ")
    assert told == ["close: nothing", f"wait: {[event_id]}"]


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


def test_a_cancelled_wait_async_ends_at_once():
    """A coroutine awaiting its ``Delivery`` is cancelled (what ``asyncio.run`` does to
    its task at Ctrl-C); the broker never answers. The wait must end with it and
    ``asyncio.run`` return: it ran in the loop's executor before, and ``asyncio.run``
    waits for those threads, so the process stayed up to the wait's ``timeout_s`` after
    Ctrl-C (here 600 s)."""
    producer, kafka = gateway()
    plain_poll = kafka.poll
    polled = threading.Event()

    def poll(timeout=0):  # librdkafka's poll waits its timeout for a report: none here
        polled.set()
        time.sleep(timeout)
        return plain_poll(0)

    kafka.poll = poll
    told: list[str] = []

    async def main() -> None:
        sent = producer.send(make_turn())
        polled.clear()  # the send's own poll: wait for the wait's
        waiting = asyncio.create_task(sent.wait_async(600))
        while not polled.is_set():  # the wait serves reports
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
        assert not runner.is_alive(), "asyncio.run waited for the cancelled wait"
        assert told == ["cancelled"]
    finally:
        with pytest.raises(DeliveryError):  # purged: told to the thread's close
            producer.close(timeout_s=0)


class _NoThreads(ThreadPoolExecutor):
    """A loop's executor that refuses work: what uses it fails."""

    def submit(self, *args, **kwargs):
        raise RuntimeError("wait_async used the loop's executor")


def test_wait_async_holds_no_executor_thread():
    """Awaited ``Delivery``s hold none of the loop's executor threads (session 48's ran
    ``wait`` there: with 2 cores, 6 threads, a seventh concurrent wait started only when
    one ended, its timeout counted from then). Eight waits on a loop whose executor
    refuses work: each told its own outcome."""
    producer, kafka = gateway()
    turns = [make_turn() for _ in range(8)]
    told: dict[str, object] = {}

    async def request(turn, sent):
        try:
            await sent.wait_async(5)
            told[turn.event_id] = "written"
        except DeliveryError as exc:
            told[turn.event_id] = [eid for eid, _ in exc.failures]

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(_NoThreads(max_workers=1))
        waits = [asyncio.create_task(request(turn, producer.send(turn))) for turn in turns]
        await asyncio.sleep(0)  # every wait started
        for _ in turns[:4]:
            kafka.deliver(0)
        for _ in turns[4:]:
            kafka.deliver(0, TIMED_OUT)
        await asyncio.gather(*waits)

    asyncio.run(main())
    assert told == {**{t.event_id: "written" for t in turns[:4]},
                    **{t.event_id: [t.event_id] for t in turns[4:]}}
    with pytest.raises(DeliveryError):  # the thread's flushes are told them as before
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
''' + _SEND_WAIT_AND_TELL


def test_a_handlers_close_just_before_its_thread_waits_is_seen():
    """SIGUSR1's handler closes the producer between the wait's last check and its
    ``wait`` (its thread holds ``_room``; the close notifies no one). The wait must
    still see the close and raise the purged turn, not wait out its 600 s (a send's
    wait for room, which has no timeout, waited for ever)."""
    *told, turn = run_script(_HANDLERS_CLOSE_JUST_BEFORE_THE_WAIT, timeout_s=60)
    event_id = turn.removeprefix("turn ")
    assert told == [f"close: {[event_id]}", f"wait: {[event_id]}"]
