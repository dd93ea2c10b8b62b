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
task that processes its events one at a time (or up to a window of them, never two
of one Kafka key: ``Lane``) and acks them strictly in offset order, after the
outcome is durable and published. Faust therefore only ever sees
contiguous acks per partition, and commits exactly what was finished.

Memory stays bounded: at most ``max_queued`` events wait in all lanes together, and
the events the lanes hold (waiting or in flight) carry at most ``max_bytes`` of record
bytes, except one event alone larger than that (it runs on its own: a valid turn is
never refused for its size). Beyond either bound the dispatcher waits for room (Faust
then stops fetching). Each lane also has a share of both bounds (``lane_share``: a
quarter): a lane at its share takes no more, and the dispatcher parks its partition
instead (``streams/parking.py``), so one slow partition cannot fill the bounds by itself
and hold up the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from streams.retry import LaneStopped

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    """One event for a lane: its payload, how to ack it once fully handled, and its
    order key (the Kafka record key: events of one key are handled one at a time, in
    offset order)."""

    payload: Any
    ack: Callable[[], Any]
    order_key: Hashable = None
    size: int = 0  # bytes it holds (the record's key and value), for the byte bound


class Lane:
    """A queue and the tasks that drain it.

    Up to ``window`` events are in flight at once, never two of one order key: an
    event waits for the previous event of its key (a Conversation's or a chain's
    events share their Kafka key, so each is still handled strictly in order). Acks
    go out strictly in offset order: an event finished early waits for every earlier
    one. ``window=1`` handles the partition one event at a time.
    """

    def __init__(self, key: Hashable, handle: Callable[[Any, Lane], Awaitable[None]],
                 on_drained: Callable[[Lane], None], window: int = 1) -> None:
        self.key = key
        self.queue: asyncio.Queue[Work] = asyncio.Queue()
        self.stopping = False
        self._handle = handle
        self._on_drained = on_drained
        self._window = asyncio.Semaphore(max(1, window))
        # In offset order: (work, its task, loop time it was started); acked from the left.
        self._unacked: deque[tuple[Work, asyncio.Task[bool], float]] = deque()
        self._last_of_key: dict[Hashable, asyncio.Task[bool]] = {}
        self._acking = True  # False once an event stayed unhandled: never ack past it
        self._idle = asyncio.Event()
        self._idle.set()
        self.held_bytes = 0  # of the events queued or in flight, until acked or dropped
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"lane-{key}")

    @property
    def unacked(self) -> int:
        """Events started and not yet acked."""
        return len(self._unacked)

    @property
    def current(self) -> Any:
        """The oldest event in flight (None when idle)."""
        return self._unacked[0][0].payload if self._unacked else None

    @property
    def busy_since(self) -> float | None:
        """Since when (loop time) the oldest event in flight is handled."""
        return self._unacked[0][2] if self._unacked else None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping:
            # A free slot first: an event waiting for one stays queued (and counted).
            await self._window.acquire()
            work = await self.queue.get()
            self._on_drained(self)  # one less queued: room for the dispatcher
            if self.stopping:
                self.held_bytes -= work.size
                self._window.release()
                break
            previous = self._last_of_key.get(work.order_key)
            task = loop.create_task(self._after(previous, work))
            self._last_of_key[work.order_key] = task
            self._unacked.append((work, task, loop.time()))
            self._idle.clear()
            task.add_done_callback(self._settle)

    async def _after(self, previous: asyncio.Task[bool] | None, work: Work) -> bool:
        """Handle ``work`` once the previous event of its key is done; False if it was
        not handled (the lane stopped), and then neither is anything after it."""
        try:
            if previous is not None and not await asyncio.shield(previous):
                return False
            return await self._handle_until_done(work)
        finally:
            self._window.release()
            if self._last_of_key.get(work.order_key) is asyncio.current_task():
                del self._last_of_key[work.order_key]

    def _settle(self, _: asyncio.Task[bool]) -> None:
        """Ack the finished events at the head of the offset order."""
        while self._unacked and self._unacked[0][1].done():
            work, task, _started = self._unacked.popleft()
            self.held_bytes -= work.size
            handled = not task.cancelled() and task.exception() is None and task.result()
            if not handled:
                self._acking = False
            if self._acking:
                work.ack()
        if not self._unacked:
            self._idle.set()
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
        """Finish the events in flight (up to ``grace_s``), drop the queued ones unacked."""
        self.stopping = True
        while not self.queue.empty():
            self.held_bytes -= self.queue.get_nowait().size
        try:
            await asyncio.wait_for(self._idle.wait(), grace_s)
        except TimeoutError:
            log.warning("lane %s: events in flight did not finish in %.1fs", self.key, grace_s)
        self._acking = False  # whatever is still running now is left unacked
        for _work, task, _started in list(self._unacked):
            task.cancel()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*(t for _w, t, _s in self._unacked), return_exceptions=True)


class PartitionLanes:
    """Route work to the lane of its partition; pause partitions whose lane is full."""

    def __init__(self, handle: Callable[[Any, Lane], Awaitable[None]], *,
                 max_queued: int = 2000, max_bytes: int = 16 * 1024 * 1024,
                 window: int = 1, lane_share: int | None = 4) -> None:
        self._handle = handle
        self._max_queued = max_queued
        self._max_bytes = max_bytes
        self._window = window
        # One lane's share of both bounds (``lane_full``); None: no lane is ever full
        # on its own, only the bounds of all lanes together apply.
        self._lane_share = lane_share
        if lane_share is not None:
            self._lane_max_queued = max(1, max_queued // lane_share)
            self._lane_max_bytes = max(1, max_bytes // lane_share)
        self._lane_room: dict[Hashable, asyncio.Event] = {}
        self._lanes: dict[Hashable, Lane] = {}
        # Lanes being stopped: no longer routed to, but their events in flight (up to
        # the stop's grace) still hold their bytes.
        self._stopping: set[Lane] = set()
        self._room = asyncio.Event()
        self._room.set()
        self._waiting = 0  # submits waiting for room
        # Keys stopped and not reopened (a revoked partition), and how many times each
        # key was stopped: work offered for a closed key, or taken before a stop of its
        # key, is refused (``submit``), never run on a new lane out of order.
        self._closed: set[Hashable] = set()
        self._all_closed = False
        self._generations: dict[Hashable, int] = {}

    def queued(self) -> int:
        return sum(lane.queue.qsize() for lane in self._lanes.values())

    def held_bytes(self) -> int:
        """Record bytes of the events queued or in flight in all lanes, those of lanes
        still stopping included."""
        return sum(lane.held_bytes for lane in (*self._lanes.values(), *self._stopping))

    def has_room(self, size: int = 0) -> bool:
        """True while ``submit`` of an event of ``size`` bytes would not wait (the
        dispatcher, so fetching, can go on) and no submit is waiting for room."""
        return not self._waiting and self._fits(size)

    def generation(self, key: Hashable) -> int:
        """How many times lane ``key`` was stopped: pass it to ``submit`` with work taken
        now, so that a stop while the work waits for room refuses it."""
        return self._generations.get(key, 0)

    def reopen(self, keys: Iterable[Hashable]) -> None:
        """Accept work for ``keys`` again (partitions assigned)."""
        self._closed.difference_update(keys)

    def lane_full(self, key: Hashable, size: int = 0) -> bool:
        """True when lane ``key`` holds its share of the bounds: ``max_queued //
        lane_share`` events queued, or record bytes that an event of ``size`` would take
        past ``max_bytes // lane_share`` (a lane holding nothing takes any one event).
        Not queued then: the dispatcher parks the partition (streams/parking.py)."""
        lane = self._lanes.get(key)
        if self._lane_share is None or lane is None or lane.stopping:
            return False
        if lane.queue.qsize() >= self._lane_max_queued:
            return True
        return lane.held_bytes > 0 and lane.held_bytes + size > self._lane_max_bytes

    async def lane_room(self, key: Hashable, size: int = 0) -> None:
        """Return once lane ``key`` is down to half its share of events and of bytes,
        counting an event of ``size`` bytes (or holds nothing, or has no lane, or its
        lane is stopping): half, so that a slow lane is not parked again at once."""
        try:
            while True:
                lane = self._lanes.get(key)
                if lane is None or lane.stopping or self._lane_share is None or (
                        lane.queue.qsize() <= self._lane_max_queued // 2
                        and (lane.held_bytes == 0
                             or lane.held_bytes + size <= self._lane_max_bytes // 2)):
                    return
                room = self._lane_room.setdefault(key, asyncio.Event())
                room.clear()
                await room.wait()
        finally:
            self._lane_room.pop(key, None)

    def _fits(self, size: int) -> bool:
        if self.queued() >= self._max_queued:
            return False
        held = self.held_bytes()
        return held == 0 or held + size <= self._max_bytes

    async def submit(self, key: Hashable, payload: Any, ack: Callable[[], Any],
                     order_key: Hashable = None, generation: int | None = None,
                     size: int = 0) -> bool:
        """Queue ``payload`` (``size`` bytes) on lane ``key`` (created on first use);
        ``order_key``: see ``Lane``. Returns at once unless the lanes are full: waits
        while ``max_queued`` events wait in them, or while they hold events and this
        one's ``size`` would take their bytes past ``max_bytes``.

        False, nothing queued and ``ack`` never called, when the key is closed (stopped
        and not reopened: its partition was revoked, or every lane stopped) or was
        stopped since ``generation``: a record the dispatcher held while the lanes were
        full must not run after its queued predecessors were dropped (it would be
        decided out of order, and its ack would let the offsets before it be committed).
        """
        while True:
            if (self._all_closed or key in self._closed
                    or (generation is not None and generation != self.generation(key))):
                return False  # checked first: a closed key never waits for room
            if self._fits(size):
                break
            self._room.clear()
            self._waiting += 1
            try:
                await self._room.wait()
            finally:
                self._waiting -= 1
        lane = self._lanes.get(key)
        if lane is None or lane.stopping:
            lane = self._lanes[key] = Lane(key, self._handle, self._on_handled, self._window)
        lane.queue.put_nowait(Work(payload, ack, order_key, size))
        lane.held_bytes += size
        return True

    def _on_handled(self, lane: Lane) -> None:
        if not self._room.is_set():
            self._room.set()
        room = self._lane_room.get(lane.key)
        if room is not None:  # a parked partition waits for its lane (``lane_room``)
            room.set()

    def depth(self, key: Hashable) -> int:
        """Events queued on lane ``key``, not yet started."""
        lane = self._lanes.get(key)
        return 0 if lane is None else lane.queue.qsize()

    def owed(self, key: Hashable) -> int:
        """Events of lane ``key`` not yet acked: queued, in flight, or finished behind an
        earlier one still in flight (the consumer-lag gauge counts them)."""
        lane = self._lanes.get(key)
        return 0 if lane is None else lane.queue.qsize() + lane.unacked

    def in_flight(self, key: Hashable) -> tuple[Any, float] | None:
        """The payload in flight on lane ``key`` and its seconds so far (None: idle)."""
        lane = self._lanes.get(key)
        if lane is None or lane.busy_since is None:
            return None
        return lane.current, asyncio.get_running_loop().time() - lane.busy_since

    @property
    def keys(self) -> list[Hashable]:
        return list(self._lanes)

    async def stop(self, keys: Iterable[Hashable] | None = None,
                   grace_s: float = 10.0) -> None:
        """Stop the given lanes (all by default) in parallel, see ``Lane.stop``, and
        close their keys (all keys, for good, by default) until ``reopen``."""
        if keys is None:
            self._all_closed = True
            chosen = list(self._lanes)
        else:
            keys = list(keys)
            self._closed.update(keys)
            chosen = [k for k in keys if k in self._lanes]
        for key in chosen if keys is None else keys:
            self._generations[key] = self.generation(key) + 1
        self._room.set()  # a submit waiting for room re-checks (and finds its key closed)
        for key in chosen:  # and so does a parked partition waiting for its lane
            if (room := self._lane_room.get(key)) is not None:
                room.set()
        lanes = [self._lanes.pop(k) for k in chosen]
        self._stopping.update(lanes)
        try:
            await asyncio.gather(*(lane.stop(grace_s) for lane in lanes))
        finally:
            self._stopping.difference_update(lanes)
            self._room.set()  # their bytes are given back

    async def wait_idle(self) -> None:
        """Wait until every lane has handled everything queued so far (tests, bench)."""
        while any(not lane.queue.empty() or not lane._idle.is_set()
                  for lane in self._lanes.values()):
            await asyncio.sleep(0.01)
