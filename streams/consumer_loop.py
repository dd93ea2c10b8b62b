"""The worker's Kafka consumer: Faust's, on the worker's own event loop, with batched fetches.

**On the loop.** faust-streaming runs aiokafka's consumer in a dedicated thread with a
second event loop (``ThreadDelegateConsumer``): every fetch the agent asks for crosses
threads twice (a call queued into the consumer's loop, its result posted back), each
crossing a wake-up of the other loop, and the two threads share one interpreter lock. On
a backlog a fetch carries hundreds of records and the crossing is nothing; at a
production pace records arrive one at a time and every record waits for it: ~6 ms of a
paced turn's p50 from produce to dispatch (docs/decisions.md, "Paced latency").

Here the same consumer (faust's ``AIOKafkaConsumerThread``, unchanged: its rebalance
listener, commits, seeks and fetches) is served on the app's loop: mode's thread worker
is replaced by a task, and a call "into the thread" is a plain await. Everything Faust
does with the consumer stays as it was; only the hop goes. ``RATCHET_WORKER_CONSUMER=thread``
restores Faust's default.

**Fetches that wait while records flow** (both consumers; ``RATCHET_FETCH_WAIT_MS``,
docs/decisions.md, "Fetches that wait"). Faust's fetch is answered as soon as one record
is there, so at a production pace every turn costs the broker and the worker a fetch of
its own. Here, while records come closer together than the wait, each fetch asks the
broker to hold it until ``FETCH_MIN_BYTES`` are there or the wait has passed: paced
turns share fetches, a backlog (always past the minimum) is fetched as before. A fetch
that brought none, or one of Faust's that brought records only after the wait (records
sparser than it: a held fetch would come back empty), makes the next one Faust's
again (answered at its first record, held up to 1 500 ms while there is none): an idle
worker does not ask the broker every few milliseconds, a trickle costs one fetch per
record, not two, and the first turn after a quiet spell is not held. Each broker's
fetches follow their own records. 0 keeps Faust's fetches throughout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from mode.utils.futures import maybe_async

log = logging.getLogger(__name__)

# What a held fetch waits for, at most ``fetch_wait_ms``: ~38 TurnCompleted records of
# ~1.7 KB. A backlog has more at once and is answered at once.
FETCH_MIN_BYTES = 64 * 1024


def pace_fetches(fetcher: Any, wait_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> bool:
    """Make a started aiokafka ``Fetcher`` hold its fetches (``FETCH_MIN_BYTES`` or
    ``wait_ms``) while records flow, broker by broker: a fetch from a broker whose
    previous fetch was held and brought records, or was one of the fetcher's own (the
    parameters it started with) and brought records within ``wait_ms`` of being sent,
    is held; any other keeps the fetcher's own. aiokafka builds one fetch request per
    broker from the fetcher's two values and hands each to ``_proc_fetch_request``,
    which sends it and takes its answer (True: records were added); the request carries
    the two values until it is sent, so they are set there, on the request, and the
    fetcher's own stay as they are. Each broker has its own state: a quiet broker's
    empty answer does not end a busy one's holding. False, and the fetcher left as it
    was, if this aiokafka has no such members (an upgrade:
    ``tests/unit/test_consumer_loop.py`` checks the installed one)."""
    if not (all(hasattr(fetcher, name) for name in
                ("_proc_fetch_request", "_fetch_min_bytes", "_fetch_max_wait_ms"))
            and _requests_carry_fetch_values()):
        return False
    answer: Callable[..., Awaitable[bool]] = fetcher._proc_fetch_request
    flowing: set[Any] = set()  # brokers (node ids) whose next fetch is held

    async def answered(assignment: Any, node_id: Any, request: Any) -> bool:
        held = node_id in flowing
        if held:
            request._min_bytes, request._max_wait_ms = FETCH_MIN_BYTES, wait_ms
        sent = clock()
        brought = await answer(assignment, node_id, request)
        if brought and (held or (clock() - sent) * 1000 < wait_ms):
            flowing.add(node_id)
        else:
            flowing.discard(node_id)
        return brought

    fetcher._proc_fetch_request = answered
    return True


def _requests_carry_fetch_values() -> bool:
    """Whether this aiokafka's fetch request keeps the two values ``pace_fetches`` sets
    as the members it is sent with (``FetchRequest.build`` reads them)."""
    from aiokafka.protocol.fetch import FetchRequest

    request = FetchRequest(1500, 1, 1024, 0, [])
    return (getattr(request, "_max_wait_ms", None), getattr(request, "_min_bytes", None)) \
        == (1500, 1)


class _LoopTask:
    """Stands in for mode's ``WorkerThread``: serves the service on its parent loop."""

    def __init__(self, service: Any) -> None:
        self.service = service
        # Held here: the loop keeps only a weak reference to a task.
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = self.service.parent_loop.create_task(self.service._serve(),
                                                         name="kafka-consumer")

    def stop(self) -> None:
        """Nothing to join: ``_serve`` ends on the loop once the service is stopped."""


class SeekOutdated(Exception):
    """A seek was not made: the consumer's assignment changed after it was asked for."""


class _BatchedFetches(faust_aiokafka.AIOKafkaConsumerThread):
    """Faust's consumer thread whose aiokafka consumer holds fetches while records flow
    (``pace_fetches``, the app's ``fetch_wait_ms``); Faust has no setting for it.

    Its seeks expire. With Faust's thread, a seek is a call queued into the consumer's
    thread; a caller that stops waiting for it (``asyncio.wait_for`` timed out) leaves
    it queued, and it would still run later, perhaps after the partition was revoked
    and assigned again: it would then move the new assignment's position past records
    no lane took (lost once a commit passes them). So a seek runs only if its caller
    still waits and no rebalance began on the consumer's thread since it was asked
    for; otherwise it raises ``SeekOutdated`` (the parking and the watchdog treat it as
    a failed seek: they check the partition is still theirs before trying again).
    On the loop (``_ConsumerOnLoop``) the seek runs in the caller's own step: it is
    never queued, and the checks always pass."""

    _rebalances = 0  # rebalances begun, counted on the consumer's thread

    async def on_start(self) -> None:
        await super().on_start()  # builds and starts the aiokafka consumer (its fetcher)
        wait_ms = getattr(self.app, "fetch_wait_ms", 0)
        if wait_ms and not pace_fetches(self._consumer._fetcher, wait_ms):
            log.warning("this aiokafka's fetcher has not the members RATCHET_FETCH_WAIT_MS "
                        "uses: every fetch is answered at its first record")

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self._rebalances += 1  # before anything of the revocation happens
        await super().on_partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any, generation_id: int = 0) -> None:
        self._rebalances += 1
        await super().on_partitions_assigned(assigned, generation_id)

    async def seek_wait(self, partitions: Any) -> None:
        consumer = self._ensure_consumer()
        asked = (self._rebalances, [False])  # the count then; whether the caller left
        try:
            await self.call_thread(self._seek_if_current, consumer, partitions, asked)
        except BaseException:  # timed out, cancelled or failed: a queued call must not seek
            asked[1][0] = True
            raise

    async def _seek_if_current(self, consumer: Any, partitions: Any,
                               asked: tuple[int, list[bool]]) -> None:
        count, left = asked
        if left[0]:
            return  # nobody waits for it any more
        if self._rebalances != count:
            raise SeekOutdated(f"a rebalance began after the seek to {dict(partitions)} "
                               "was asked for")
        await self._seek_wait(consumer, partitions)


class _ConsumerOnLoop(_BatchedFetches):
    async def call_thread(self, fun: Any, *args: Any, **kwargs: Any) -> Any:
        # What mode's method queue does in the consumer's thread, without the queue.
        return await maybe_async(fun(*args, **kwargs))

    async def _gather_remaining_tasks(self) -> None:
        # mode cancels every task left on the thread's loop when the thread ends: here
        # that loop is the worker's, and its tasks (lanes, timers) are not ours.
        pass


class _ParkingSupport:
    """What a parked partition's resumption needs of Faust's consumer
    (streams/parking.py):

    * ``batches_begun``: the fetched batches Faust's drain has begun to go through; it
      takes one at a time, so once the count has moved, the batch it was in is done;
    * ``hold_partitions``: pause, and also take the partitions out of Faust's own flow
      control (``_buffered_partitions``): Faust hands over records of a partition in
      that set even when paused, and puts it back into the fetch set when its stream
      buffer drains (``on_buffer_drop``);
    * ``may_hand_over``: whether Faust would still hand over records of a partition (in
      its fetch set, or in that flow control's set)."""

    batches_begun = 0

    async def getmany(self, timeout: float) -> Any:
        self.batches_begun += 1
        async for item in super().getmany(timeout):  # type: ignore[misc]
            yield item

    def hold_partitions(self, tps: Any) -> None:
        self.pause_partitions(tps)  # type: ignore[attr-defined]
        self._buffered_partitions.difference_update(tps)  # type: ignore[attr-defined]

    def may_hand_over(self, tp: Any) -> bool:
        return (tp in self._get_active_partitions()  # type: ignore[attr-defined]
                or tp in self._buffered_partitions)  # type: ignore[attr-defined]


async def commit_acked(consumer: Any) -> None:
    """Commit every offset acked so far. Faust's ``commit`` called while another commit
    is in flight (its periodic one) waits for that one and commits nothing itself: the
    acks that came after it would wait for the next period, which a revocation or a
    stop does not leave them. So twice: the second commits what the first did not."""
    for _ in range(2):
        await consumer.commit()


class _SettleBeforeRevoke:
    """Settle the revoked partitions and commit their acks before Faust forgets them.

    Faust's ``Consumer.on_partitions_revoked`` drops its acks of the revoked partitions
    before the app's revoke handler runs: every event finished since the last periodic
    commit was handled again by the partition's next owner, its outcomes published
    twice, on every rebalance (an eager one revokes every partition). Session 42
    committed first, here, with the lanes still running: an event acked while that
    commit was on its way to the broker was dropped all the same (CI, session 43: two
    outcomes published twice across one rebalance on a loaded machine). So the app's
    ``settle_revoked`` runs first (its lanes finish the events in flight and drop the
    queued ones: nothing of those partitions is acked after it), then everything acked
    is committed, still in the old generation (``commit_acked``), and only then does
    Faust forget (``tests/unit/test_commit_before_revoke.py``)."""

    async def on_partitions_revoked(self, revoked: Any) -> None:
        settle = getattr(self.app, "settle_revoked", None)
        failed: Exception | None = None
        if settle is not None:
            try:
                await settle(revoked)
            except Exception as exc:
                # Raised on, it reached aiokafka, which logs a rebalance listener's error
                # and goes on: nothing committed, Faust never told, lanes of partitions
                # now another worker's maybe running on (session 45). As Faust does with
                # its app's revoke handler (so did this one before session 44): crash,
                # and the supervisor starts the worker again from the committed offsets.
                log.error("settling the revoked partitions failed: the worker stops",
                          exc_info=True)
                failed = exc
        try:
            try:
                await commit_acked(self)
            except Exception as exc:  # the broker away: the next owner re-reads them
                log.warning("commit before the revocation failed: %r", exc)
            await super().on_partitions_revoked(revoked)  # type: ignore[misc]
        finally:
            if failed is not None:
                # Last: what was acked is committed and Faust told first. The crash
                # crashes the consumer's thread too, whose method queue then serves one
                # more call at most: a commit after it (the thread consumer's) could
                # wait for ever (an outside review, session 45).
                await self.app.crash(failed)


class _LoopConsumer(_SettleBeforeRevoke, _ParkingSupport, faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerOnLoop(self, loop=self.loop, thread_loop=self.loop,
                               Worker=_LoopTask, beacon=self.beacon)


class _ThreadConsumer(_SettleBeforeRevoke, _ParkingSupport, faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _BatchedFetches(self, loop=self.loop, beacon=self.beacon)


class _LoopTransport(faust_aiokafka.Transport):
    Consumer = _LoopConsumer


class _ThreadTransport(faust_aiokafka.Transport):
    Consumer = _ThreadConsumer


class WorkerApp(faust.App):
    """A ``faust.App`` whose Kafka consumer holds fetches for ``fetch_wait_ms`` (set
    before the worker starts; 0: Faust's own fetches), in Faust's consumer thread."""

    fetch_wait_ms: int = 0
    # Called by the consumer on a revocation before anything else of it (see
    # ``_SettleBeforeRevoke``): ``await settle_revoked(revoked_partitions)``.
    settle_revoked: Callable[[Any], Awaitable[None]] | None = None

    def _new_transport(self) -> faust_aiokafka.Transport:
        return _ThreadTransport(self.conf.broker_consumer, self)


class LoopConsumerApp(WorkerApp):
    """The same, with the Kafka consumer on the app's event loop."""

    def _new_transport(self) -> faust_aiokafka.Transport:
        return _LoopTransport(self.conf.broker_consumer, self)
