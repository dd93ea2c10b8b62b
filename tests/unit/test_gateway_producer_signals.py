"""The gateway producer used by a signal handler while its own thread is inside the
producer (outside reviews of session 44's and session 45's fixes, session 45).

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

2. (rfix3) A signal handler may use the gateway producer while its thread is inside the
   producer (session 45 made its locks reentrant so that a handler's ``close`` there
   does not wait for ever). A handler that *sends* (a cancellation on SIGTERM, then
   ``close``) while its thread is inside librdkafka's ``poll`` or ``flush`` runs inside
   a delivery report: the send served reports itself (``poll``), and confluent-kafka's
   ``poll`` from inside its own callback leaves the outer call without its call state:
   the next report of that call aborts the process (``CallState_get: Assertion `cs !=
   NULL' failed``). A send there must queue its event and leave the reports to the call
   it runs in; with librdkafka's queue full it cannot wait for room there (only serving
   reports makes room): ``EventNotQueued``, retryable.

No broker is needed: librdkafka is replaced by ``FakeKafka``, except where the real
client is needed: each such case in a process of its own (an abort ends the process),
an unreachable broker: every event times out and is reported by ``flush``.
"""

from __future__ import annotations

import contextlib
import signal
import threading

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, FlushTimeout, GatewayError, ProducerClosed
from tests.unit.producer_process import run_script
from tests.unit.test_gateway_library_review import effect_of, gateway

RETRIABLE = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not enough replicas", retriable=True)


def run_in_daemon(fn) -> threading.Thread:
    """``fn`` in a thread of its own, joined for at most 10 s (a hang stays behind)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(10)
    return thread


def _flushed_in_daemon(producer) -> tuple[threading.Thread, list[GatewayError | None]]:
    """``producer.flush()`` in a daemon thread (``run_in_daemon``), and what it raised
    (``None``: it returned), kept: a ``GatewayError`` does not escape the thread."""
    flushed: list[GatewayError | None] = []

    def flush() -> None:
        try:
            producer.flush()
            flushed.append(None)
        except GatewayError as exc:
            flushed.append(exc)
    return run_in_daemon(flush), flushed


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
    thread, flushed = _flushed_in_daemon(producer)
    assert not thread.is_alive(), "the handler's close waited for the lock its thread held"
    # Inside a delivery report librdkafka cannot be flushed or closed (the test below):
    # the handler's close returns, and the flush it ran in finishes it and raises.
    assert handler == [None]
    assert isinstance(flushed[0], DeliveryError)
    assert [eid for eid, _ in flushed[0].failures] == [turn.event_id]
    assert kafka.closed


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
    thread, flushed = _flushed_in_daemon(producer)
    assert not thread.is_alive(), "the handler's close waited for the lock its thread held"
    assert isinstance(handler[0], DeliveryError)
    assert {eid for eid, _ in handler[0].failures} == {first.event_id, second.event_id}
    assert kafka.closed
    # The flush waited before the handler ran: ``second`` was still queued (``FakeKafka``
    # delivers nothing by itself), so it timed out with one event in flight. The
    # handler's close then named both failures: the flush names none again, it says
    # only that one event was in flight when it gave up (``_raise_failures``).
    assert isinstance(flushed[0], FlushTimeout), flushed
    assert flushed[0].pending == 1


# A signal handler's close inside librdkafka's own delivery report, with the real client:
# in a process of its own (confluent-kafka aborts the process on a flush from inside its
# callback, and its close there waits for itself).
_CLOSE_IN_A_REPORT = """
producer = unreachable({"message.timeout.ms": 300})
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
    lines = run_script(_CLOSE_IN_A_REPORT, timeout_s=60)
    assert "handler: ['returned']" in lines, lines  # deferred: nothing of it raised there
    assert "flush: both" in lines, lines  # timed out or purged: both told, retryable
    assert "send after: ProducerClosed" in lines, lines


# 2. ------------------------------------------------------------------------------------
_SEND_IN_A_REPORT = """
config = {"message.timeout.ms": 300}
if sys.argv[1] == "full":
    config["queue.buffering.max.messages"] = 3
producer = unreachable(config)
explained, handled = producer._explained, []
late = make_turn()


def report_with_a_signal(err):  # a signal handler sends while a delivery report runs
    if not handled:
        try:
            if sys.argv[1] == "flush":
                producer.flush(1)
                handled.append("flushed")
            else:
                producer.send(late)
                handled.append("queued")
        except Exception as exc:
            handled.append(f"{type(exc).__name__} retryable={exc.retryable}")
    return explained(err)


producer._explained = report_with_a_signal
turns = [make_turn() for _ in range(3)]
for turn in turns:
    producer.send(turn)
told = set()
for _ in range(3):  # the late event, if queued, may be reported by the next flush
    try:
        producer.flush(20)
        break
    except DeliveryError as exc:
        told |= {eid for eid, _ in exc.failures}
print("handler:", handled)
ids = {t.event_id for t in turns}
print("flush:", "all" if told == ids | ({late.event_id} if handled == ["queued"] else set())
      else sorted(told))
sys.stdout.flush()
"""


def _run(case: str) -> list[str]:
    return run_script(_SEND_IN_A_REPORT, case, timeout_s=60)


def test_a_signal_handlers_send_inside_a_delivery_report_queues_without_aborting():
    """The handler's send is queued (no ``poll`` from inside the report) and its event
    reported like any other; the process goes on (it aborted)."""
    lines = _run("room")
    assert "handler: ['queued']" in lines, lines
    assert "flush: all" in lines, lines


def test_a_signal_handlers_send_inside_a_delivery_report_with_the_queue_full_is_refused():
    """librdkafka's queue full inside a delivery report: the send cannot wait for room
    (serving reports there aborts the process): refused, retryable, nothing produced;
    the flush it ran in still reports every event queued before."""
    lines = _run("full")
    assert "handler: ['EventNotQueued retryable=True']" in lines, lines
    assert "flush: all" in lines, lines


def test_a_signal_handlers_flush_inside_a_delivery_report_does_not_abort():
    """A handler's ``flush`` there cannot wait (librdkafka's flush from inside its own
    callback aborts the process): it raises at once what it knows, ``FlushTimeout``
    with the events still in flight (retryable); the flush it ran in goes on and
    reports every event."""
    lines = _run("flush")
    assert "handler: ['FlushTimeout retryable=True']" in lines, lines
    assert "flush: all" in lines, lines


# A close mid-turn names the events of the turn queued before it (the merge of session
# 45: "a close mid-turn names the events queued before it"), so that the caller sends
# the whole turn again, never the turn alone, whose effects the close purged.
def test_a_signal_handlers_close_while_a_turn_waits_for_room_names_what_was_queued():
    """librdkafka's queue full at the turn's second effect: the send waits for room, and
    a signal handler's close runs in its thread meanwhile (SIGUSR1 sent to it while the
    send polls: the handler runs inside that ``poll``, so the close refuses sends and
    is finished as the poll returns, raising nothing there; the purged effect is told
    by the thread's next flush). The send's ``ProducerClosed`` names the effect queued
    before it and asks for the whole turn again (it said "create a new one", naming
    nothing: the caller could send the turn alone)."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    plain_produce, plain_poll = kafka.produce, kafka.poll

    def produce_until_full(topic, value, key, on_delivery):
        if kafka.produced:
            raise BufferError("Local: Queue full")
        plain_produce(topic, value, key, on_delivery)

    sender = threading.main_thread().ident  # signal handlers run in the main thread
    signalled = []

    def poll_with_a_signal(timeout=0):
        if timeout and not signalled:  # the send waits for room: a signal arrives
            signalled.append(True)
            signal.pthread_kill(sender, signal.SIGUSR1)
        return plain_poll(0)

    kafka.produce, kafka.poll = produce_until_full, poll_with_a_signal
    closed = []

    def handler(*_):  # as a gateway's: what the close raises is its own to handle
        try:
            producer.close(timeout_s=0)
        except DeliveryError as exc:
            closed.append([eid for eid, _ in exc.failures])

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        producer.send_turn(turn, effects=effects)
        refused = None
    except ProducerClosed as exc:
        refused = exc
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert threading.current_thread().ident == sender and signalled
    assert closed == []  # inside the poll: finished as it returned, raising nothing
    assert refused is not None
    assert kafka.closed and len(kafka.produced) == 1
    assert effects[0].event_id in str(refused), str(refused)  # queued, then purged
    assert "whole turn" in str(refused), str(refused)
    with pytest.raises(DeliveryError) as purged:  # told to the thread's next flush
        producer.flush(0)
    assert [eid for eid, _ in purged.value.failures] == [effects[0].event_id]


# 3. ------------------------------------------------------------------------------------
# A close interrupted (SIGINT's ``KeyboardInterrupt`` raised out of librdkafka's flush,
# as confluent-kafka does between its flush's chunks), then closed again, with the real
# client: the queued event is neither delivered nor reported until a close releases.
_CLOSE_INTERRUPTED = """
import _thread

producer = unreachable({"message.timeout.ms": 30_000})
first = make_turn()
producer.send(first)
threading.Timer(0.5, _thread.interrupt_main).start()  # Ctrl-C as the close waits
try:
    producer.close(timeout_s=20)
    print("close: returned")
except KeyboardInterrupt:
    print("close: KeyboardInterrupt")
start = time.monotonic()
try:
    producer.close(timeout_s=1)
    print("again: returned")
except DeliveryError as exc:
    print("again: DeliveryError", [eid == first.event_id for eid, _ in exc.failures],
          exc.retryable)
print("again took under 10 s:", time.monotonic() - start < 10)
print("queued:", len(producer._producer))
try:
    producer._producer.poll(0)
    print("client: open")
except RuntimeError:  # confluent-kafka's "Producer has been closed"
    print("client: closed")
try:
    producer.send(make_turn())
except Exception as exc:
    print("send after:", type(exc).__name__)
sys.stdout.flush()
"""


def test_a_close_again_after_a_close_interrupted_by_ctrl_c_releases_and_reports():
    """Ctrl-C while ``close`` waits for the queued events: ``KeyboardInterrupt`` out of
    it, the client still open with the event queued. The next ``close`` returned at
    once, raising nothing (the first close had begun): the event was never delivered,
    purged or reported, and the client never released. Now a close after an
    interrupted one does the release: it waits its own ``timeout_s``, purges the event
    and raises it (retryable), and the client is closed."""
    lines = run_script(_CLOSE_INTERRUPTED, timeout_s=60)
    assert "close: KeyboardInterrupt" in lines, lines
    assert "again: DeliveryError [True] True" in lines, lines
    assert "again took under 10 s: True" in lines, lines
    assert "queued: 0" in lines, lines
    assert "client: closed" in lines, lines
    assert "send after: ProducerClosed" in lines, lines


def test_a_second_ctrl_c_in_an_interrupted_close_does_not_hang_another_threads_close():
    """Ctrl-C twice (a user's habit): the first out of librdkafka's flush in the first
    close, the second while that close's cleanup releases the registry client. The
    release's end (``_closed_done``) was set after that cleanup, so it was never set,
    and a close of another thread waited for it for ever (an outside review, session
    47). Now it is set first: that close does the release and raises the purged event."""
    producer, kafka = gateway()
    producer.send(turn := make_turn())
    interrupts = iter([KeyboardInterrupt, KeyboardInterrupt])

    def interrupted_flush(timeout=None):
        raise next(interrupts)

    class Registry:
        def close(self):
            with contextlib.suppress(StopIteration):  # the second Ctrl-C, once
                raise next(interrupts)

    kafka.flush, producer._registry = interrupted_flush, Registry()
    with contextlib.suppress(KeyboardInterrupt):
        producer.close()
    del kafka.flush  # the class's flush from now on
    raised: list[BaseException] = []

    def close_elsewhere():
        try:
            producer.close(timeout_s=1)
        except DeliveryError as exc:
            raised.append(exc)

    assert not run_in_daemon(close_elsewhere).is_alive(), "the other thread's close hung"
    assert kafka.closed
    assert [eid for eid, _ in raised[0].failures] == [turn.event_id], raised
