"""Partitions held out of the fetch while their lane is full.

The lanes bound what a worker holds (``streams/lanes.py``): 2 000 events and 16 MiB of
records in all. Bounded that way alone, a partition whose events are slow (a write that
keeps failing, a hot Conversation) fills the bounds by itself; the dispatcher then waits
for room and every other partition waits with it. So each lane also has a share of the
bounds (a quarter), and a record that finds its lane at its share is not queued: its
partition is **parked**.

* **Park** at record P (the first record not queued): the partition is paused in the
  consumer (Faust fetches it no more), and every record of it that still arrives
  (fetched before the pause) is dropped, unacked.
* **Resume** once the lane is down to half its share and could take P: the partition's
  fetch position is moved back to P (a seek, which also drops what aiokafka buffered of
  it: a partition only resumed in Faust was found never fetched again,
  docs/decisions.md), and then it is put back into the fetch set (the order matters:
  ``Parking._resume_when_room``). Nothing is taken twice into the lane and nothing is
  skipped: until P itself comes again, any later record of the partition (one taken
  from Faust before the pause, still on its way to the dispatcher) is dropped too.
  If P no longer exists when it is fetched again (the topic's retention deleted it
  during a very long parking), the partition stays unfetched: the fetch watchdog's
  seeks to P fail the same way and it stops the worker for a restart, which starts
  from the committed offset.

Dropped records are never acked, so their offsets are not committed before they are
handled; a crash while parked loses nothing (the next owner reads from the committed
offset). A revocation forgets the partition (``forget``): its new owner, or this worker
once it is assigned again, starts from the committed offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from streams import metrics
from streams.lanes import PartitionLanes

log = logging.getLogger(__name__)


class Parking:
    """Which partitions are parked, at which record, and their resumption.

    ``consumer()`` returns the Faust consumer (``pause_partitions``,
    ``resume_partitions``, ``seek_wait``); it is looked up at each use because Faust
    builds it when the worker starts."""

    def __init__(self, lanes: PartitionLanes, consumer: Callable[[], Any], *,
                 seek_timeout_s: float = 10.0, retry_s: float = 1.0) -> None:
        self._lanes = lanes
        self._consumer = consumer
        self._seek_timeout_s = seek_timeout_s
        self._retry_s = retry_s
        # Partition -> the first record not queued (P above), from its parking until P
        # comes again.
        self._at: dict[Hashable, int] = {}
        self._paused: set[Hashable] = set()  # waiting for room: nothing of it is taken
        self._resumers: dict[Hashable, asyncio.Task[None]] = {}

    def paused(self) -> set[Hashable]:
        """Partitions paused here (the fetch watchdog leaves them alone)."""
        return set(self._paused)

    def admits(self, tp: Hashable, offset: int) -> bool:
        """Whether the dispatcher may take this record: False while its partition is
        paused, and after its resumption for any record but P until P comes."""
        at = self._at.get(tp)
        if at is None:
            return True
        if tp in self._paused or offset != at:
            return False
        del self._at[tp]  # P again: the partition flows as before
        log.info("partition %s: resumed at offset %d", getattr(tp, "partition", tp), offset)
        return True

    def park(self, tp: Hashable, offset: int, size: int = 0) -> None:
        """Park ``tp`` at record ``offset`` (``size`` bytes), whose lane is full."""
        self._at[tp] = offset
        self._paused.add(tp)
        _hold(self._consumer(), tp)
        metrics.PARTITION_PARKS.inc()
        log.info("partition %s: lane full, parked at offset %d until it has room",
                 getattr(tp, "partition", tp), offset)
        self._resumers[tp] = asyncio.get_running_loop().create_task(
            self._resume_when_room(tp, offset, size, self._lanes.generation(tp)),
            name=f"resume-{getattr(tp, 'partition', tp)}")

    async def _quiet(self, tp: Hashable) -> None:
        """Return once Faust hands over nothing more of ``tp`` that it fetched before
        now: held (``_hold``) through a whole batch of its drain begun after the hold,
        and still held after it (its flow control may have put it back meanwhile)."""
        while True:
            consumer = self._consumer()
            _hold(consumer, tp)
            begun = getattr(consumer, "batches_begun", None)
            if begun is None:
                return  # a consumer that does not count (tests' fakes)
            while consumer.batches_begun <= begun:
                await asyncio.sleep(0.005)  # the drain is still in that batch
            if not consumer.may_hand_over(tp):
                return

    async def _resume_when_room(self, tp: Hashable, offset: int, size: int,
                                generation: int) -> None:
        """Once its lane has room: seek while still paused, then resume.

        The order is what keeps Faust's own bookkeeping right. Faust's drain hands over
        only records of partitions in its fetch set, checked record by record, and
        remembers the offset of each one it hands over (its read offset; a record below
        it is dropped as already read, a jump above it is noted as a gap that commits
        may pass). While paused, nothing of the partition is handed over; the seek sets
        the read offset and the fetch position to P and drops what aiokafka buffered of
        it; only then is it fetchable again, so the first record of it that Faust hands
        over is P, from the seek's fetch. A record of it in a batch the drain was going
        through while it was fetchable would be handed over once resumed (the check is
        record by record), and Faust's own flow control can make it fetchable again
        while parked: so the resumption first holds it through a whole batch
        (``_quiet``)."""
        me = asyncio.current_task()
        try:
            await self._lanes.lane_room(tp, size)
            if not self._still_ours(tp, me, generation):
                return
            await self._quiet(tp)
            while self._still_ours(tp, me, generation):
                consumer = self._consumer()
                try:
                    await asyncio.wait_for(consumer.seek_wait({tp: offset}),
                                           self._seek_timeout_s)
                except Exception as exc:  # the broker away: still paused, try again
                    log.warning("partition %s: seeking to offset %d failed (%r); retrying",
                                getattr(tp, "partition", tp), offset, exc)
                    await asyncio.sleep(self._retry_s)
                    continue
                if not self._still_ours(tp, me, generation):
                    return  # superseded or stopped during the seek
                self._paused.discard(tp)  # from here on P is taken (``admits``)
                consumer.resume_partitions([tp])
                return
        finally:
            if self._resumers.get(tp) is me:
                del self._resumers[tp]

    def _still_ours(self, tp: Hashable, me: asyncio.Task[None] | None,
                    generation: int) -> bool:
        """Whether resumer ``me`` still has ``tp`` to resume: not parked again since
        (the newer parking resumes it), and its lane not stopped (then its parking is
        forgotten: the next owner starts from the committed offset)."""
        if self._resumers.get(tp) is not me:
            return False
        if self._lanes.generation(tp) != generation:
            self.forget([tp])
            return False
        return True

    def forget(self, tps: Iterable[Hashable]) -> None:
        """The partitions were revoked (or the worker stops): no resumption, no P."""
        for tp in tps:
            self._at.pop(tp, None)
            self._paused.discard(tp)
            task = self._resumers.pop(tp, None)
            if task is not None and task is not asyncio.current_task():
                task.cancel()


def _hold(consumer: Any, tp: Hashable) -> None:
    """Pause ``tp``, out of Faust's flow control too where the consumer offers it."""
    hold = getattr(consumer, "hold_partitions", None)
    (hold or consumer.pause_partitions)([tp])
