"""Fetch watchdog: notice an assigned partition whose records never reach the worker.

Why this exists: see docs/processor.md, "Fetch watchdog". In short, with faust-streaming
0.15.3 on aiokafka 0.14 a partition can stay assigned, with records waiting on the
broker, without a single record being handed to our agent. Nothing logs it and nothing
recovers from it; the group simply stops making progress on that partition.

The module has two halves:

* ``FetchWatchdog``: the pure decision ("which partitions are stalled?") over plain
  figures, tested with fakes in ``tests/unit/test_fetch_watchdog.py``;
* ``probe_partitions`` / ``describe``: read those figures (and, for the log, the
  internal state of Faust's and aiokafka's consumers) from a running app. Reading only;
  the recovery itself lives in ``streams/app.py``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PartitionFigures:
    """What the worker knows about one assigned partition at one instant.

    ``next_offset``: the next offset the worker needs (last dispatched + 1, or the
    consumer's position if nothing was dispatched since the assignment); ``None`` when
    unknown (position still being reset). ``end_offset``: the broker's end offset
    (high-water mark); ``None`` when unknown.
    """

    tp: Hashable
    next_offset: int | None
    end_offset: int | None

    @property
    def owed(self) -> int:
        """Records on the broker the worker has not received (0 when unknown)."""
        if self.next_offset is None or self.end_offset is None:
            return 0
        return max(0, self.end_offset - self.next_offset)


@dataclass(frozen=True)
class Stall:
    tp: Hashable
    next_offset: int | None
    end_offset: int | None
    idle_s: float
    attempt: int  # 1 for the first report of this stall, 2 if one recovery did not help...


class FetchWatchdog:
    """Decide which assigned partitions are starved of records.

    A partition is *stalled* when, for ``stall_after_s`` seconds in a row, it owed
    records (end offset beyond the next offset the worker needs) and its next offset
    did not move, while the worker could take more work (``room``) and was not
    rebalancing or paused on purpose (``settled``). Time spent without room or
    unsettled never counts: then the worker itself, not the fetcher, holds the
    partition back.

    ``observe`` is called periodically with fresh figures. A reported stall starts a
    fresh delay (the recovery gets ``stall_after_s`` to show its effect) and counts an
    attempt; any progress of the partition sets its attempts back to zero. ``reset``
    forgets partitions (call it on every assignment change).
    """

    def __init__(self, stall_after_s: float = 15.0) -> None:
        if stall_after_s <= 0:
            raise ValueError("stall_after_s must be positive")
        self.stall_after_s = stall_after_s
        # tp -> (next offset last seen, since when it owed records without moving)
        self._marks: dict[Hashable, tuple[int | None, float]] = {}
        self._attempts: dict[Hashable, int] = {}

    def reset(self, tps: Iterable[Hashable] | None = None) -> None:
        """Forget the progress marks and attempts of ``tps`` (all by default)."""
        if tps is None:
            self._marks.clear()
            self._attempts.clear()
        else:
            for tp in tps:
                self._marks.pop(tp, None)
                self._attempts.pop(tp, None)

    def observe(self, now: float, figures: Iterable[PartitionFigures], *, room: bool,
                settled: bool) -> list[Stall]:
        figures = list(figures)
        current = {f.tp for f in figures}
        self.reset([tp for tp in self._marks if tp not in current])  # no longer assigned
        stalls = []
        for f in figures:
            mark = self._marks.get(f.tp)
            moved = mark is None or mark[0] != f.next_offset
            if moved or f.owed == 0:
                self._attempts.pop(f.tp, None)
            if moved or f.owed == 0 or not room or not settled:
                # Progress, nothing owed, or the worker holds the partition back:
                # the clock starts (again) now.
                self._marks[f.tp] = (f.next_offset, now)
                continue
            idle_s = now - mark[1]
            if idle_s >= self.stall_after_s:
                attempt = self._attempts[f.tp] = self._attempts.get(f.tp, 0) + 1
                stalls.append(Stall(f.tp, f.next_offset, f.end_offset, idle_s, attempt))
                self._marks[f.tp] = (f.next_offset, now)
        return stalls


# --- reading the figures from a running Faust app (aiokafka driver) ------------------

class EndOffsets:
    """The broker's end offsets, read with a client of our own (confluent-kafka).

    Deliberately not through Faust's consumer: its calls run on the aiokafka thread
    through a two-worker method queue, and the watchdog must not be able to delay or
    wedge the consumer it watches. Blocking: call it from a thread.
    """

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient({"bootstrap.servers": bootstrap})

    def query(self, tps: Iterable[Any], timeout_s: float = 5.0) -> dict[Any, int]:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        tps = list(tps)
        if not tps:
            return {}
        futures = self._admin.list_offsets(
            {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in tps},
            request_timeout=timeout_s)
        by_key = {(tp.topic, tp.partition): tp for tp in tps}
        return {by_key[(k.topic, k.partition)]: f.result(timeout=timeout_s).offset
                for k, f in futures.items()}


def _aiokafka_consumer(app: Any) -> Any | None:
    thread = getattr(app.consumer, "_thread", None)
    return getattr(thread, "_consumer", None)


def _tp_state(aioconsumer: Any, tp: Any) -> Any | None:
    from aiokafka.structs import TopicPartition

    try:
        assignment = aioconsumer._fetcher._subscriptions.subscription.assignment
        return assignment.state_value(TopicPartition(tp.topic, tp.partition))
    except Exception:  # no subscription/assignment yet, or rebalancing
        return None


def position_of(app: Any, tp: Any) -> int | None:
    """aiokafka's next offset to hand to Faust for ``tp`` (cached, non-blocking)."""
    aioconsumer = _aiokafka_consumer(app)
    state = None if aioconsumer is None else _tp_state(aioconsumer, tp)
    if state is None or not state.has_valid_position:
        return None
    return state.position


def first_needed_offset(app: Any, tp: Any) -> int | None:
    """The offset a partition needs when nothing was dispatched since its assignment:
    the committed offset Faust sought to (its ``_read_offset``), else aiokafka's
    position. Not the position first: records Faust dropped have already moved it."""
    read_offsets = getattr(app.consumer, "_read_offset", None)
    committed = read_offsets.get(tp) if read_offsets is not None else None
    return committed if committed is not None else position_of(app, tp)


def describe(app: Any, tp: Any, *, now_ms: int) -> str:
    """One line of Faust's and aiokafka's internal state for ``tp`` (for the log).

    Reads private attributes of faust-streaming 0.15 / aiokafka 0.14; on any other
    version it says what it could not read instead of failing.
    """
    try:
        return _describe(app, tp, now_ms)
    except Exception as exc:
        return f"(internal state unreadable: {exc!r})"


def _describe(app: Any, tp: Any, now_ms: int) -> str:
    consumer = app.consumer
    parts = [
        f"faust active={tp in (consumer._active_partitions or ())}",
        f"paused={tp in consumer._paused_partitions}",
        f"buffered={tp in consumer._buffered_partitions}",
        f"flow_active={consumer.flow_active}",
        f"read_offset={consumer._read_offset.get(tp)}",
    ]
    aioconsumer = _aiokafka_consumer(app)
    if aioconsumer is None:
        parts.append("aiokafka consumer=none")
        return " ".join(parts)
    state = _tp_state(aioconsumer, tp)
    if state is None:
        parts.append("aiokafka state=none")
    else:
        last = "never" if state.timestamp is None else f"{(now_ms - state.timestamp) / 1000:.1f}s ago"
        parts += [
            f"aiokafka status={state._status}",
            f"position={state._position}",
            f"highwater={state.highwater}",
            f"last_fetch_response={last}",
            f"paused={state.paused}",
        ]
    fetcher = aioconsumer._fetcher
    from aiokafka.structs import TopicPartition

    buffered = fetcher._records.get(TopicPartition(tp.topic, tp.partition))
    parts += [
        f"client_buffer={type(buffered).__name__ if buffered is not None else None}",
        f"in_flight_nodes={sorted(fetcher._in_flight)}",
        f"fetch_task_done={fetcher._fetch_task.done()}",
    ]
    return " ".join(parts)
