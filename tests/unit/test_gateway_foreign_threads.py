"""The gateway producer's failures per thread, for threads ``threading`` did not start,
and a turn librdkafka refused half-way (session 45).

docs/service.md, section 3: delivery failures are raised on the next ``flush`` of each
thread, once per thread; a sending thread is told the failures reported from its send
on, a thread's first flush every failure no live thread that sent before it has flushed
past; a thread that ended keeps nothing.

1. Session 44 kept a thread's place by its ``threading.Thread`` object. A thread started
   outside ``threading`` (``_thread.start_new_thread``, a C extension's thread calling
   in) is the dummy ``Thread`` Python 3.11 registers for its ident and never forgets, so
   the next such thread given the same ident took the ended one's place: it was told
   failures reported before it sent, or not told one a sender had not flushed past; and
   the ended thread's place was never dropped, so the failures after it were kept for
   nobody (up to ``MAX_KEPT_FAILURES``), and a new thread's first flush raised them all.
2. ``EventNotQueued`` from ``send_turn`` named only the event refused: which events of
   the turn were queued before it was the caller's guess.

Real threads; no broker (librdkafka is replaced by ``FakeKafka``).
"""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, EventNotQueued
from tests.unit.test_gateway_library_open_items import RETRIABLE, run_in_thread, run_with_ident
from tests.unit.test_gateway_library_review import effect_of, gateway

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="waits for a thread's end in /proc (Linux)")


def run_foreign(fn: Callable[[], None]) -> tuple[int, int]:
    """Run ``fn`` in a thread ``threading`` did not start (``_thread.start_new_thread``:
    Python gives it a dummy ``Thread``), wait until its OS thread is gone, re-raise what
    ``fn`` raised; its (ident, native id)."""
    done = threading.Event()
    seen: dict[str, object] = {}

    def body() -> None:
        try:
            seen["ident"], seen["native"] = threading.get_ident(), threading.get_native_id()
            seen["dummy"] = isinstance(threading.current_thread(), threading._DummyThread)
            fn()
        except BaseException as exc:  # handed to the test's thread
            seen["error"] = exc
        finally:
            done.set()

    _thread.start_new_thread(body, ())
    assert done.wait(10)
    deadline = time.monotonic() + 10  # a bound on the wait, not on the product
    while os.path.exists(f"/proc/self/task/{seen['native']}"):
        assert time.monotonic() < deadline, "the foreign thread did not end"
        time.sleep(0.001)
    assert seen["dummy"], "not a thread threading failed to start"
    if "error" in seen:
        raise seen["error"]  # type: ignore[misc]
    return seen["ident"], seen["native"]  # type: ignore[return-value]


def flush_into(producer, told: list[DeliveryError | None]) -> Callable[[], None]:
    def flush() -> None:
        try:
            producer.flush(1)
            told.append(None)
        except DeliveryError as exc:
            told.append(exc)

    return flush


def failed_ids(told: DeliveryError | None) -> list[str]:
    return [] if told is None else [event_id for event_id, _ in told.failures]


# 1. ------------------------------------------------------------------------------------
def test_a_new_foreign_thread_with_a_reused_ident_is_told_only_its_own_failure_once():
    """A foreign thread sends and ends; its event fails. A new foreign thread given the
    same ident sends (its event fails too) and flushes twice: told its own failure,
    once, never the ended thread's (reported before it sent). Sharing the dummy thread,
    it was told the ended thread's failure as its own."""
    producer, kafka = gateway()
    first_turn, second_turn = make_turn(), make_turn()
    ident, _ = run_foreign(lambda: producer.send(first_turn))
    kafka.deliver(0, RETRIABLE)  # the ended thread's event failed
    kafka.poll()
    told: list[DeliveryError | None] = []

    def second() -> None:
        producer.send(second_turn)
        kafka.deliver(0, RETRIABLE)
        flush_into(producer, told)()
        flush_into(producer, told)()

    run_with_ident(ident, second, run=run_foreign)
    assert [failed_ids(exc) for exc in told] == [[second_turn.event_id], []], told
    assert told[0].retryable


def test_a_new_foreign_thread_with_a_reused_ident_is_told_what_a_sender_has_not_flushed_past():
    """This thread sends; its event fails. A foreign thread flushes (told of it) and
    ends; a new foreign thread given the same ident flushes for the first time: it is
    told the failure, which the sender has not flushed past. Sharing the dummy thread,
    it took the ended thread's place, past the failure, and was told nothing."""
    producer, kafka = gateway()
    mine = make_turn()
    producer.send(mine)
    kafka.deliver(0, RETRIABLE)
    told: list[DeliveryError | None] = []
    ident, _ = run_foreign(flush_into(producer, told))
    run_with_ident(ident, flush_into(producer, told), run=run_foreign)
    assert [failed_ids(exc) for exc in told] == [[mine.event_id], [mine.event_id]], told
    with pytest.raises(DeliveryError) as raised:  # and the sender is told, once
        producer.flush(1)
    assert failed_ids(raised.value) == [mine.event_id]
    producer.flush(1)


def test_an_ended_foreign_thread_keeps_no_failures():
    """A foreign thread sends and ends before its event fails. This thread sends and
    flushes past every failure: no live thread needs them, none is kept, and a new
    thread's first flush is told none. The ended thread's place was kept for good: every
    later failure was kept for it, and a new thread's first flush raised them all."""
    producer, kafka = gateway()
    theirs, mine = make_turn(), make_turn()
    run_foreign(lambda: producer.send(theirs))
    producer.send(mine)
    kafka.deliver(0, RETRIABLE)  # the ended thread's event
    kafka.deliver(0, RETRIABLE)  # this thread's
    with pytest.raises(DeliveryError) as raised:
        producer.flush(1)
    assert failed_ids(raised.value) == [theirs.event_id, mine.event_id]
    told: list[DeliveryError | None] = []
    run_in_thread(flush_into(producer, told))
    assert told == [None], f"a new thread was told the ended threads' failures: {told}"
    # No live thread needs them: not kept past the next flush (the flush telling them
    # cannot drop them before it is raised them, session 51).
    assert producer._failure_log == []


def test_foreign_threads_that_ended_leave_no_place_behind():
    """Foreign threads that send and end, one after another: their places are dropped
    (at a flush), however many there were."""
    producer, kafka = gateway()
    for _ in range(20):
        run_foreign(lambda: producer.send(make_turn()))
        kafka.deliver(0)
    producer.flush(1)
    assert len(producer._cursors) == 1  # this thread's


# 2. ------------------------------------------------------------------------------------
@pytest.mark.parametrize("refused_at", [0, 1, 2])
def test_an_event_not_queued_says_which_events_of_the_turn_were_queued(refused_at):
    """librdkafka refuses the ``refused_at``-th event of a turn (a fatal error between
    two ``produce`` calls): the error names the events of the turn queued before it
    (they may still be written) and those never produced, in the turn's order."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    order = [e.event_id for e in effects] + [turn.event_id]
    real_produce = kafka.produce
    calls: list[int] = []

    def produce(*args, **kwargs):
        calls.append(1)
        if len(calls) > refused_at:
            raise KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True))
        real_produce(*args, **kwargs)

    kafka.produce = produce
    with pytest.raises(EventNotQueued) as refused:
        producer.send_turn(turn, effects=effects)
    error = refused.value
    assert error.event_id == order[refused_at]
    assert error.queued == tuple(order[:refused_at])
    assert error.not_queued == tuple(order[refused_at:])
    assert error.fatal and not error.retryable
    assert len(kafka.produced) == refused_at
    for event_id in order:
        assert event_id in str(error)


def test_a_single_event_not_queued_has_nothing_queued():
    producer, kafka = gateway()

    def refuse(*args, **kwargs):
        raise KafkaException(KafkaError(KafkaError._STATE, "not ready", retriable=True))

    kafka.produce = refuse
    turn = make_turn()
    with pytest.raises(EventNotQueued) as refused:
        producer.send(turn)
    assert (refused.value.queued, refused.value.not_queued) == ((), (turn.event_id,))
    assert refused.value.retryable
