"""One sequential lane per Kafka partition: order within, parallelism across.

Why not Faust's own knobs (see docs/processor.md for the full reasoning):

* ``concurrency=1`` keeps order but serialises *all* partitions behind the slowest
  event: one conversation whose write is retrying would stall every other one.
* ``concurrency=N`` lets N actors share one queue: order within a partition is
  lost, and acks come out of order (faust-streaming issue 606 commits past a
  one-offset gap, i.e. it can commit an offset that was never processed).
* ``isolated_partitions=True`` (an actor per partition) crashes when several
  workers rebalance (faust-streaming issue 529) and cancels an actor mid-event on
  revocation.

So the Faust agent only *dispatches*: it reads raw events (acks disabled) and
appends each to the lane of its partition without waiting. Each lane is an asyncio
task that processes its events one at a time and acks them strictly in offset
order, after the outcome is durable and published. Faust therefore only ever sees
contiguous acks per partition, and commits exactly what was finished.

Memory stays bounded: at most ``max_queued`` events wait in all lanes together;
beyond that the dispatcher waits for room (Faust then stops fetching). One slow
partition can hold up the others only once its own backlog reaches that bound.
(Pausing just the full partition with ``Consumer.pause_partitions`` was tried and
dropped: with faust-streaming 0.15.3 + aiokafka 0.14 a resumed partition was never
fetched again; see docs/processor.md.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

from streams.retry import LaneStopped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    """One event for a lane: its payload and how to ack it once fully handled."""

    payload: Any
    ack: Callable[[], Any]


class Lane:
    """A queue and the task that drains it in order."""

    def __init__(self, key: Hashable, handle: Callable[[Any, Lane], Awaitable[None]],
                 on_drained: Callable[[Lane], None]) -> None:
        self.key = key
        self.queue: asyncio.Queue[Work] = asyncio.Queue()
        self.stopping = False
        self._handle = handle
        self._on_drained = on_drained
        self._idle = asyncio.Event()
        self._idle.set()
        # The event in flight and since when (loop time) it is handled; None when idle.
        self.current: Any = None
        self.busy_since: float | None = None
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"lane-{key}")

    async def _run(self) -> None:
        while not self.stopping:
            work = await self.queue.get()
            self._on_drained(self)  # one less queued: room for the dispatcher
            if self.stopping:
                break
            self._idle.clear()
            self.current, self.busy_since = work.payload, asyncio.get_running_loop().time()
            try:
                done = await self._handle_until_done(work)
            finally:
                self.current = self.busy_since = None
                self._idle.set()
            if not done:
                break
            work.ack()
            self._on_drained(self)

    async def _handle_until_done(self, work: Work) -> bool:
        """Handle one event; False if the lane stopped first (the event stays unacked).

        The handler retries infrastructure failures itself. Anything else escaping it
        is a bug: it is logged and retried after a pause, never acked and never
        skipped, because acking past it would commit an offset that was not handled.
        """
        while True:
            try:
                await self._handle(work.payload, self)
                return True
            except LaneStopped:
                log.info("lane %s stopped with an event in flight (left unacked)", self.key)
                return False
            except Exception:
                log.exception("lane %s: unexpected error; retrying the same event", self.key)
                await asyncio.sleep(1.0)
                if self.stopping:
                    return False

    async def stop(self, grace_s: float) -> None:
        """Finish the event in flight (up to ``grace_s``), drop the queued ones unacked."""
        self.stopping = True
        while not self.queue.empty():
            self.queue.get_nowait()
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            log.warning("lane %s: event in flight did not finish in %.1fs", self.key, grace_s)
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


class PartitionLanes:
    """Route work to the lane of its partition; pause partitions whose lane is full."""

    def __init__(self, handle: Callable[[Any, Lane], Awaitable[None]], *,
                 max_queued: int = 2000) -> None:
        self._handle = handle
        self._max_queued = max_queued
        self._lanes: dict[Hashable, Lane] = {}
        self._room = asyncio.Event()
        self._room.set()

    def queued(self) -> int:
        return sum(lane.queue.qsize() for lane in self._lanes.values())

    def has_room(self) -> bool:
        """True while ``submit`` would not wait (the dispatcher, so fetching, can go on)."""
        return self.queued() < self._max_queued

    async def submit(self, key: Hashable, payload: Any, ack: Callable[[], Any]) -> None:
        """Queue ``payload`` on lane ``key`` (created on first use).

        Returns at once unless ``max_queued`` events already wait in the lanes.
        """
        while self.queued() >= self._max_queued:
            self._room.clear()
            await self._room.wait()
        lane = self._lanes.get(key)
        if lane is None or lane.stopping:
            lane = self._lanes[key] = Lane(key, self._handle, self._on_handled)
        lane.queue.put_nowait(Work(payload, ack))

    def _on_handled(self, lane: Lane) -> None:
        if not self._room.is_set():
            self._room.set()

    def depth(self, key: Hashable) -> int:
        lane = self._lanes.get(key)
        return 0 if lane is None else lane.queue.qsize()

    def in_flight(self, key: Hashable) -> tuple[Any, float] | None:
        """The payload in flight on lane ``key`` and its seconds so far (None: idle)."""
        lane = self._lanes.get(key)
        if lane is None or lane.busy_since is None:
            return None
        return lane.current, asyncio.get_running_loop().time() - lane.busy_since

    @property
    def keys(self) -> list[Hashable]:
        return list(self._lanes)

    async def stop(self, keys: list[Hashable] | None = None, grace_s: float = 10.0) -> None:
        """Stop the given lanes (all by default) in parallel; see ``Lane.stop``."""
        chosen = list(self._lanes) if keys is None else [k for k in keys if k in self._lanes]
        lanes = [self._lanes.pop(k) for k in chosen]
        await asyncio.gather(*(lane.stop(grace_s) for lane in lanes))

    async def wait_idle(self) -> None:
        """Wait until every lane has handled everything queued so far (tests, bench)."""
        while any(not lane.queue.empty() or not lane._idle.is_set()
                  for lane in self._lanes.values()):
            await asyncio.sleep(0.01)
