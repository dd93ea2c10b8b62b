"""A thread's delivery failures are told by one of its flushes, once, whatever lands
while its flush collects them (session 51, rgw8).

Found by an outside review (rrevo, there since session 43): a Ctrl-C after the thread's
cursor moved past its failures and before the ``DeliveryError`` was raised (it was seen
at ``drop_ended``) lost them for the thread: its next flush returned as if every event
were written. And a signal handler's ``flush`` inside the same collection, before the
cursor moved, named them with the one it ran in: twice.

Each run lands at one line of the collection (``_raise_failures``, ``_failures_for``),
the next run at the next line, until a flush runs through every line: a tracer's line
event is where a Python signal handler may run (Ctrl-C's ``KeyboardInterrupt``, or a
handler that flushes). The real client, broker unreachable: a batch of events fails
after ``delivery.timeout.ms`` (200), their reports held as librdkafka runs them; each
run first runs one (its failure logged for the thread's flush), then flushes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer
from tests.unit.test_gateway_producer_lost_report import _Client, _unreachable
from tests.unit.trace_points import landing

# Runs in a sweep, at most: more lines than the collection has.
_RUNS = 60

# Where a flush collects and raises the thread's failures.
_COLLECTION = ("_raise_failures", "_failures_for")


def _landing_at(nth: int, act: Callable[[], None]
                ) -> tuple[Callable[[Callable[[], None]], None], list[str]]:
    """A runner of one flush, traced: ``act`` runs at the ``nth`` line event of the
    collection (as a signal handler would), once; and the lines seen, in order."""
    codes = {getattr(GatewayProducer, name).__code__ for name in _COLLECTION}
    seen: list[str] = []

    def at(frame) -> bool:
        seen.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        return len(seen) == nth

    run, _ = landing(codes, at, lambda frame: act())
    return run, seen


class _Held:
    """A producer whose events all failed (timed out), their reports held: ``failed``
    runs the next one, each with librdkafka's own error and message."""

    def __init__(self) -> None:
        self.producer = _unreachable()
        self.reports: list[tuple[Callable[..., None], object, object]] = []
        self.producer._producer = _Client(
            self.producer._producer,
            lambda report: lambda err, msg: self.reports.append((report, err, msg)))
        self.ids = [self.producer.send(make_turn()).event_ids[0] for _ in range(_RUNS)]
        while len(self.reports) < _RUNS:
            self.producer._producer._real.poll(0.1)

    def failed(self) -> list[str]:
        """The next event's report run: its failure logged for the thread; its id."""
        report, err, msg = self.reports.pop(0)
        report(err, msg)
        return [self.ids.pop(0)]


def _named(call: Callable[[], None]) -> list[str]:
    try:
        call()
    except DeliveryError as exc:
        return [event_id for event_id, _ in exc.failures]
    return []


def _sweep() -> Iterator[int]:
    """1, 2, ... until a run says the flush ran through every line."""
    yield from range(1, _RUNS + 1)


def _ctrl_c() -> None:
    raise KeyboardInterrupt


def test_a_ctrl_c_anywhere_in_the_collection_leaves_the_failures_to_the_next_flush():
    """At each line: the interrupted flush raises ``KeyboardInterrupt``; the thread's
    next flush names the failed event, once. Before, from the line after the cursor
    moved on (``drop_ended`` and on), the next flush returned: lost for the thread."""
    held = _Held()
    producer = held.producer
    landed, lost = [], []
    for nth in _sweep():
        ids = held.failed()
        run, seen = _landing_at(nth, _ctrl_c)
        try:
            run(lambda: producer.flush(0))
        except KeyboardInterrupt:
            at = seen[nth - 1]
        except DeliveryError as exc:  # ran through every line: the last run
            assert [eid for eid, _ in exc.failures] == ids
            break
        else:
            pytest.fail("the flush returned with a failure to tell")
        landed.append(at)
        if _named(lambda: producer.flush(0)) != ids:
            lost.append(at)
    assert len(landed) >= 10, landed  # the sweep went through the collection
    assert lost == [], f"failures lost for the thread after a Ctrl-C at {lost}"
    assert sorted(_named(lambda: producer.close(0))) == sorted(held.ids)  # the rest


@pytest.mark.parametrize("handler_catches", [True, False])
def test_a_handler_s_flush_anywhere_in_the_collection_names_the_failures_once(
        handler_catches):
    """At each line a signal handler flushes. Caught there (it logs the error and
    returns), its flush and the one it ran in name the event once between them; not
    caught, its ``DeliveryError`` ends the flush it ran in. Either way the thread's next
    flush names it no more. Before: a handler's flush before the cursor moved named it
    and the flush it ran in named it again (caught)."""
    held = _Held()
    producer = held.producer
    landed, wrong = [], []
    told: list[list[str]] = []

    def handler() -> None:
        try:
            producer.flush(0)
            told.append([])
        except DeliveryError as exc:
            told.append([eid for eid, _ in exc.failures])
            if not handler_catches:
                raise

    for nth in _sweep():
        ids = held.failed()
        told.clear()
        run, seen = _landing_at(nth, handler)
        outer = _named(lambda: run(lambda: producer.flush(0)))  # noqa: B023
        if not told:  # ran through every line: the last run
            assert outer == ids
            break
        landed.append(seen[nth - 1])
        named = [*told[0], *(outer if handler_catches or not told[0] else []),
                 *_named(lambda: producer.flush(0))]
        if named != ids:
            wrong.append((seen[nth - 1], ids, named))
    assert len(landed) >= 10, landed
    assert wrong == [], f"not named once (line, event, named): {wrong}"
    assert sorted(_named(lambda: producer.close(0))) == sorted(held.ids)  # the rest
