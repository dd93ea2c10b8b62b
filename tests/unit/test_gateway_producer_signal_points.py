"""A signal's handler at the points CPython 3.11 runs one inside a flush's collection of
its failures that the line-by-line sweep (``test_gateway_producer_told_once.py``) does
not reach: after a call returns, mid-line, and inside the functions the collection
calls (an outside review of rgw8, session 51, rrevr).

Found with ``signal.setitimer`` firing every 0.2 ms over 5,000 flushes of failed events
(a handler raising ``KeyboardInterrupt``): 410 to 723 failures were never told to the
flushing thread. A Ctrl-C inside ``Thread.is_alive()`` (``drop_ended``), after its
``lock.acquire(False)`` returned, makes CPython 3.11's handler for such an interrupt
(bpo-45274) release the thread's own state lock and mark a live thread stopped: its
place was dropped as an ended thread's. And a handler's flush after the trim's list was
built and before it was stored had its failures thrown away by that store.

Each test lands once, with an opcode tracer, at one such point (the instruction after a
``CALL``: where CPython 3.11 checks for a pending signal), as a signal's handler would.
"""

from __future__ import annotations

import dis
import threading
from collections.abc import Callable
from types import CodeType

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, GatewayError
from services.gateway.producer import GatewayProducer
from tests.unit.test_gateway_library_open_items import RETRIABLE
from tests.unit.test_gateway_library_review import FakeKafka, gateway
from tests.unit.trace_points import landing


def _after_call(code: CodeType, call_line: int | None = None) -> set[int]:
    """Offsets of the instructions right after a ``CALL`` in ``code`` (on ``call_line``
    if given): where CPython 3.11 runs a pending signal's handler."""
    ins = list(dis.get_instructions(code))
    return {after.offset for before, after in zip(ins, ins[1:], strict=False)
            if before.opname == "CALL"
            and (call_line is None or before.positions.lineno == call_line)}


class _Kafka(FakeKafka):
    """``FakeKafka`` with librdkafka's count of events not reported yet (a flush inside
    a delivery report, a handler's, says them ``FlushTimeout``)."""

    def __len__(self) -> int:
        return len(self.queued) + len(self.reports)


def _producer() -> tuple[GatewayProducer, _Kafka]:
    producer, _ = gateway()
    kafka = producer._producer = _Kafka()
    return producer, kafka


def _named(call: Callable[[], None]) -> list[str]:
    """The events the call's ``DeliveryError`` names (none: it returned, or raised
    ``FlushTimeout`` for events still queued)."""
    try:
        call()
    except DeliveryError as exc:
        return [event_id for event_id, _ in exc.failures]
    except GatewayError:
        pass
    return []


class _Waiting:
    """A thread that sends one event, waits to be told to flush, flushes once."""

    def __init__(self, producer: GatewayProducer) -> None:
        self.sent, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.told: list[list[str]] = []
        self.alive_seen: list[bool] = []

        def body() -> None:
            self.event_id = producer.send(make_turn()).event_ids[0]
            self.sent.set()
            self.go.wait(10)
            self.alive_seen.append(self.thread.is_alive())
            self.told.append(_named(lambda: producer.flush(0)))
            self.done.set()

        self.thread = threading.Thread(target=body)
        self.thread.start()
        assert self.sent.wait(10)

    def flush(self) -> list[str]:
        self.go.set()
        assert self.done.wait(10)  # not ``join``: it returns at once for a thread
        return self.told[0]        # marked stopped


def test_a_ctrl_c_inside_the_liveness_check_of_a_thread_leaves_it_its_failures():
    """A thread sent; its event failed. Another thread's flush is interrupted (Ctrl-C)
    as it checks whether the sender is alive, right after ``is_alive()``'s lock
    ``acquire`` returned: the sender is still alive, and its flush is told its failure.
    Before: that Ctrl-C marked the live sender stopped (``is_alive()`` false for good),
    the next flush dropped its place as an ended thread's, and the sender's flush was
    told nothing: its failed turn taken as written."""
    producer, kafka = _producer()
    sender = _Waiting(producer)
    kafka.deliver(0, RETRIABLE)
    code = threading.Thread._wait_for_tstate_lock.__code__
    acquire_line = next(i.positions.lineno for i in dis.get_instructions(code)
                        if i.argval == "acquire")

    def ctrl_c(frame) -> None:
        if frame.f_locals.get("self") is sender.thread:
            raise KeyboardInterrupt
    offsets = _after_call(code, acquire_line)
    run, landed = landing({code}, lambda frame: frame.f_lasti in offsets, ctrl_c,
                          opcodes=True)
    try:
        run(lambda: producer.flush(0))
    except KeyboardInterrupt:
        pass
    except DeliveryError:
        pass  # never checked the sender's liveness that way: nothing to land on
    _named(lambda: producer.flush(0))  # this thread's next flush (drops ended places)
    assert sender.flush() == [sender.event_id], (
        f"the sender was not told its failure (Ctrl-C landed: {landed})")
    assert sender.alive_seen == [True], "a live thread was marked stopped"


def _call_points() -> list[tuple[CodeType, int]]:
    """Every point right after a call in the collection (``_raise_failures``,
    ``_failures_for``) and in the logging of a failure (``_record``), and the first
    instruction of the failure's numbering (``_next_failure``, a property: a call)."""
    codes = [GatewayProducer._raise_failures.__code__,
             GatewayProducer._failures_for.__code__, GatewayProducer._record.__code__]
    numbering = GatewayProducer._next_failure.fget.__code__  # type: ignore[attr-defined]
    # The instruction after its ``RESUME`` (a tracer sees no opcode event for that one):
    # where the handler CPython runs at ``RESUME`` leaves off.
    ins = list(dis.get_instructions(numbering))
    first = next(ins[n + 1].offset for n, i in enumerate(ins) if i.opname == "RESUME")
    return [*((code, offset) for code in codes for offset in sorted(_after_call(code))),
            (numbering, first)]


def test_a_handler_s_flush_after_any_call_of_the_collection_loses_no_failure():
    """At each such point (``_call_points``), in turn (a fresh producer each):
    this thread's flush has served a report (``first`` failed); there a signal handler's
    flush serves another (``second``, this thread's too) and is told what it is told.
    Between the handler's flush, the flush it ran in and this thread's next flush each
    is named once; another live thread that sent before both is told both. Before: a
    handler's flush after the trimmed log was built and before it was stored had
    ``second`` thrown away by that store: never told to the other thread."""
    points = _call_points()
    wrong, landings = [], 0
    for code, offset in points:
        producer, kafka = _producer()
        other = _Waiting(producer)
        first = producer.send(make_turn()).event_ids[0]
        second = producer.send(make_turn()).event_ids[0]
        kafka.deliver(1, RETRIABLE)  # ``first``, served by the outer flush
        handler_told: list[str] = []

        def handler(frame, kafka=kafka, producer=producer, told=handler_told) -> None:
            kafka.deliver(1, RETRIABLE)  # ``second``, served by the handler's flush
            told.extend(_named(lambda: producer.flush(0)))
        run, landed = landing({code}, lambda frame, offset=offset: frame.f_lasti == offset,
                              handler, opcodes=True)
        outer = _named(lambda: run(lambda: producer.flush(0)))  # noqa: B023
        mine = sorted([*handler_told, *outer, *_named(lambda: producer.flush(0))])  # noqa: B023
        theirs = sorted(other.flush())
        if not landed:  # a point of a path not taken here
            continue
        landings += 1
        if mine != sorted([first, second]) or theirs != mine:
            wrong.append((code.co_name, offset, bool(landed), len(mine), len(theirs)))
    assert landings >= 10, (landings, points)
    assert wrong == [], f"(function, offset, landed, told here, told there): {wrong}"


def test_threading_s_live_threads_are_what_drop_ended_reads():
    """``_Places.drop_ended`` reads ``threading._active`` (ident: ``Thread``), not
    ``is_alive()``: pinned here, a Python that renames or empties it fails this, not a
    flush. A thread is in it while it runs and out of it once joined. Checked on
    CPython 3.11.7 (this venv) and, the body run alone, 3.12.1 and 3.13.0 (session 52;
    pyproject asks ``>=3.11``)."""
    assert threading._active[threading.get_ident()] is threading.current_thread()  # type: ignore[attr-defined]
    inside: list[bool] = []

    def body() -> None:
        inside.append(threading._active.get(threading.get_ident())  # type: ignore[attr-defined]
                      is threading.current_thread())
    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)
    assert inside == [True]
    assert threading._active.get(thread.ident) is not thread  # type: ignore[attr-defined]


def test_no_call_between_the_check_of_the_mark_and_the_raise():
    """rgw8's claim, pinned on the running Python's bytecode: from the load of the
    flush's mark to the ``raise`` of its error (the cursor's move between) no
    instruction calls (a call is where CPython runs a signal's handler; so are a
    function's ``RESUME`` and a backward jump). ``telling`` and ``cursor`` are slots:
    their loads and stores run no Python code."""
    ins = list(dis.get_instructions(GatewayProducer._raise_failures))
    raise_at = next(n for n, i in enumerate(ins)
                    if i.opname == "RAISE_VARARGS" and ins[n - 1].argval == "error")
    check_at = max(n for n, i in enumerate(ins[:raise_at]) if i.argval == "telling")
    window = [i.opname for i in ins[check_at:raise_at + 1]]
    assert "STORE_ATTR" in window, window  # the cursor's move is inside it
    assert not [op for op in window if "CALL" in op or op in ("RESUME", "JUMP_BACKWARD")
                ], window
