"""The Faust app of the promotion processor: one thin agent over the gateway events.

The agent only dispatches: each raw record goes, without waiting, to the lane of its
partition (``streams/lanes.py``). A lane handles its records one at a time:

    decode -> decide (pure domain) -> write durably -> publish -> ack

Commit order, for every gateway event (this is the one place it is written down):

1. **Durable write.** ``PromotionProcessor.handle_async`` (its fast path on the event
   loop, everything else through ``handle`` in a worker thread) makes the
   outcome durable first: the store's single-partition LWT batch for a promotion,
   the ledger's decision/effect/cancellation rows otherwise. A persistence failure
   is retried here with capped exponential backoff; the lane (so the partition)
   waits, the worker reports ``degraded``, and nothing is published meanwhile.
2. **Publish.** ``CheckpointPromoted`` / ``PromotionRejected`` (+ ``EffectOrphaned``,
   or a ``DeadLetter``) are sent and we wait for the broker's acknowledgement
   (``acks=all``). A publish failure is retried like a persistence failure.
3. **Ack.** Only then does the lane ack the event, in offset order; Faust commits
   the highest contiguous acked offset of each partition.

A crash between any two steps redelivers the event; step 1 then finds its earlier
result (the store's duplicate detection, the ledger's first decision) and step 2
publishes the same outcome again. Nothing is ever promoted twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import faust
from faust.types import TP

from ratchet.settings import Settings
from schemas.limits import CLIENT_MAX_BYTES
from services.cassandra_loop import LoopSession
from streams import metrics
from streams.consumer_loop import LoopConsumerApp, WorkerApp, commit_acked
from streams.fetchwatch import (
    EndOffsets,
    FetchWatchdog,
    PartitionFigures,
    describe,
    first_needed_offset,
)
from streams.health import Health
from streams.lanes import Lane, PartitionLanes
from streams.parking import Parking
from streams.processor import Handled, PromotionProcessor
from streams.records import EventCodec, RawRecord
from streams.retry import Backoff, PublishUnavailable, retry_until_done
from streams.topics import Topics

log = logging.getLogger(__name__)

# Faust's stream buffer and aiokafka's fetch size (see create_app): what a worker holds
# of records it has fetched but not yet queued in its lanes. A fetch of 1 MiB cost ~10 %
# of the backlog rate on small turns; 4 MiB and a buffer of 8 cost nothing measurable
# (docs/decisions.md, "Worker memory").
STREAM_BUFFER_RECORDS = 8
FETCH_BYTES_PER_PARTITION = 4 * 1024 * 1024

GROUP_ID = "ratchet-promoter"


@dataclass
class Runtime:
    """Everything the agent needs, built once per worker process."""

    processor: PromotionProcessor
    codec: EventCodec
    health: Health
    topics: Topics
    backoff: Backoff = field(default_factory=Backoff)
    # Outcomes published so far (tests and the bench read it).
    published: int = 0
    # Why the worker stopped itself (the fetch watchdog gave up); the exit code says so.
    fatal: str | None = None
    # The C++ driver's session of the loop path (services/cassandra_loop.py), if used.
    loop_session: LoopSession | None = None


def create_app(settings: Settings, runtime: Runtime, *, group_id: str = GROUP_ID,
               commit_interval_s: float = 1.0, shutdown_grace_s: float = 20.0,
               stall_after_s: float = 15.0, watch_interval_s: float = 5.0,
               starve_partition: int | None = None) -> faust.App:
    """Build the Faust app; ``runtime`` holds the processor and its collaborators."""
    # The consumer on the worker's loop unless told otherwise (streams/consumer_loop.py).
    app_class = LoopConsumerApp if settings.worker_consumer == "loop" else WorkerApp
    app = app_class(
        group_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        store="memory://",
        # Faust creates its data dir even with the memory store; by default that is
        # "<group>-data" in the current directory (a checkout fills with them).
        datadir=str(_faust_datadir(settings, group_id)),
        topic_partitions=settings.partitions,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=commit_interval_s,
        # Bytes per partition per fetch: a record larger than this still comes, alone
        # (the broker returns the first record batch whole, KIP-74; tested up to the
        # topic's limit in tests/integration/test_worker_memory.py). A fetch buffered
        # per partition at the topic's limit could hold 12 x 34 MiB of records a worker
        # had not asked for yet (docs/decisions.md, "Worker memory").
        consumer_max_fetch_size=FETCH_BYTES_PER_PARTITION,
        # Outcomes up to the topics' limits (schemas/limits.py): a publish must never
        # fail on size below them (aiokafka's default is 1 MiB).
        producer_max_request_size=CLIENT_MAX_BYTES,
        producer_acks=-1,
        # Every request of the producer waits this for Kafka's answer, not Faust's 1 200
        # s: its bootstrap (a Kafka that accepts and never answers ended a start only
        # after 20 minutes; now one line, exit 1) and each publish, whose failure at the
        # bound is retried like any other, its record unacked (step 2 above).
        producer_request_timeout=float(settings.kafka_request_timeout_s),
        # A crashed worker's partitions move to the others within ~10 s (default 60 s).
        broker_session_timeout=10.0,
        broker_heartbeat_interval=2.0,
        # Faust must not wait for "all streams empty" on rebalance/stop: events queued
        # in lanes are tracked but intentionally dropped unacked (see settle_revoked).
        stream_wait_empty=False,
        # Records fetched but not yet dispatched to the lanes: the lanes are the worker's
        # buffer (bounded in events and bytes, RATCHET_LANE_MAX_BYTES), this is only the
        # hand-off to them. Faust's default (4 096) held 4 096 records more whenever the
        # lanes were full: 40 GiB of 10 MiB turns.
        stream_buffer_maxsize=STREAM_BUFFER_RECORDS,
    )
    # Before the worker starts: its consumer is built then (streams/consumer_loop.py).
    app.fetch_wait_ms = settings.fetch_wait_ms
    gateway_events = app.topic(runtime.topics.gateway_events, key_type=bytes, value_type=bytes,
                               partitions=settings.partitions)
    # One thread per event in flight off the fast path (``handle_async``): the store
    # and ledger drivers block there.
    executor = ThreadPoolExecutor(max_workers=settings.partitions * settings.lane_window + 4,
                                  thread_name_prefix="promote")

    async def handle(record: RawRecord, lane: Lane) -> None:
        """Steps 1 and 2 of the commit order for one record (the lane acks after)."""
        loop = asyncio.get_running_loop()

        async def durable_then_published() -> Handled:
            handled = await runtime.processor.handle_async(record, in_thread)
            if all(runtime.codec.encodes_offline(o.model) for o in handled.outbound):
                encoded = _encode(runtime, handled)
            else:  # the registry is asked once per record type: not on the loop
                encoded = await loop.run_in_executor(executor, _encode, runtime, handled)
            await _publish(app, encoded)
            return handled

        def in_thread(handle: Callable[[], Handled]) -> Awaitable[Handled]:
            return loop.run_in_executor(executor, handle)

        handled = await retry_until_done(durable_then_published, lane=lane_label(record),
                                         health=runtime.health, backoff=runtime.backoff,
                                         stopping=lambda: lane.stopping)
        runtime.health.count(handled.kind)
        metrics.observe_published([o.model for o in handled.outbound])
        runtime.published += 1

    lanes = PartitionLanes(handle, window=settings.lane_window,
                           max_bytes=settings.lane_max_bytes)
    # Partitions whose lane is full wait out of the fetch (streams/parking.py).
    parking = Parking(lanes, lambda: app.consumer)
    # Last offset dispatched per partition since its assignment (lag gauge, watchdog).
    fetched: dict[TP, int] = {}
    starved: set[TP] = set()  # (test hook, see dispatch)
    watchdog = FetchWatchdog(stall_after_s=stall_after_s or 15.0)
    app.lanes = lanes  # type: ignore[attr-defined] - for tests and the bench
    app.parking = parking  # type: ignore[attr-defined]
    app.runtime = runtime  # type: ignore[attr-defined]
    app.watchdog = watchdog  # type: ignore[attr-defined]

    @app.agent(gateway_events, concurrency=1)
    async def dispatch(stream: faust.Stream) -> None:
        """Route every raw event to its partition's lane; acks are the lane's job."""
        async for event in stream.noack().events():
            message = event.message
            # Taken before any wait: a revocation while this record waits for room in
            # the lanes refuses it (``PartitionLanes.submit``).
            generation = lanes.generation(message.tp)
            record = RawRecord(message.topic, message.partition, message.offset,
                               message.key, message.value,
                               int(message.timestamp * 1000) if message.timestamp else None)
            last = fetched.get(message.tp)
            if last is None:
                # Once per partition and assignment: proves the partition is fetched.
                log.info("partition %s: first record since assignment at offset %d",
                         message.partition, message.offset)
            elif message.offset <= last:
                # Already in its lane (a watchdog seek can race a fetch in flight): the
                # first copy is handled and acked, this one is not dispatched again.
                continue
            if not parking.admits(message.tp, message.offset):
                continue  # its partition is parked: fetched again once its lane has room
            size = len(message.key or b"") + len(message.value or b"")
            if lanes.lane_full(message.tp, size):
                # Faust's own TP: its consumer asserts that type in its fetch set (a
                # message's tp is aiokafka's, equal to it as a key).
                parking.park(TP(message.topic, message.partition), message.offset, size)
                continue
            fetched[message.tp] = message.offset
            # Ordered by Kafka key: a Conversation's (a chain's) events one at a time.
            if not await lanes.submit(message.tp, record, event.ack, order_key=message.key,
                                      generation=generation, size=size):
                # Its partition was revoked (or the worker is stopping) before it could
                # be queued: not ours to decide, and never acked (the partition's owner
                # reads it again from the committed offset).
                if fetched.get(message.tp) == message.offset:
                    del fetched[message.tp]
                continue
            if message.partition == starve_partition and message.tp not in starved:
                # Fault injection for tests only (RATCHET_TEST_STARVE_PARTITION): take the
                # partition out of Faust's fetch set once, leaving it assigned: the
                # symptom of the upstream stall, for the watchdog to recover from.
                starved.add(message.tp)
                log.warning("test hook: partition %s taken out of the fetch set",
                            message.partition)
                app.consumer.pause_partitions([message.tp])

    def ours(tps: set[TP]) -> list[int]:
        return sorted(tp.partition for tp in tps if tp.topic == gateway_events.get_topic_name())

    async def settle_revoked(revoked: set[TP]) -> None:
        """Finish in-flight events of revoked partitions, drop the queued ones. Called by
        the consumer before Faust forgets the partitions' acks, which it then commits
        (``streams/consumer_loop.py``, ``_SettleBeforeRevoke``): nothing of them is
        acked after this, so nothing acked is lost to the revocation."""
        log.info("partitions revoked: %s (lanes with queued events: %s)", ours(revoked),
                 {tp.partition: lanes.depth(tp) for tp in lanes.keys if lanes.depth(tp)})
        for tp in revoked:
            fetched.pop(tp, None)
        parking.forget(revoked)
        watchdog.reset(revoked)
        # Every revoked partition is closed, with a lane or not: a record of it still in
        # the stream is not ours to decide.
        await lanes.stop(revoked, grace_s=shutdown_grace_s)

    app.settle_revoked = settle_revoked

    @app.on_partitions_assigned.connect
    async def on_assigned(_app: faust.App, assigned: set[TP], **_: object) -> None:
        log.info("partitions assigned: %s (generation %s)", ours(assigned),
                 app.consumer_generation_id)
        for tp in [tp for tp in fetched if tp not in assigned]:
            del fetched[tp]
        lanes.reopen(assigned)
        watchdog.reset()

    @app.on_before_shutdown.connect
    async def on_shutdown(_app: faust.App, **_: object) -> None:
        """SIGTERM: finish the events in flight, commit what was acked, then exit."""
        log.info("shutting down: finishing events in flight")
        parking.forget(list(parking.paused()))
        await lanes.stop(grace_s=shutdown_grace_s)
        await commit_acked(app.consumer)
        if runtime.loop_session is not None:
            await runtime.loop_session.close()
        executor.shutdown(wait=False, cancel_futures=True)
        runtime.health.remove()

    @app.timer(interval=2.0)
    async def heartbeat() -> None:
        runtime.health.write()
        _update_lag(app, lanes, fetched)

    if stall_after_s > 0:
        guard = FetchGuard(app, lanes, fetched, watchdog, gateway_events.get_topic_name(),
                           EndOffsets(settings.kafka_bootstrap), parked=parking.paused)

        @app.timer(interval=watch_interval_s)
        async def fetch_watch() -> None:
            """See streams/fetchwatch.py: find assigned partitions that are not fetched."""
            await guard.check()

    return app


class FetchGuard:
    """Acts on the fetch watchdog's verdicts (streams/fetchwatch.py, docs/processor.md).

    A stalled partition is first recovered inside the process: it is put back into
    Faust's fetch set and its fetch position is moved to the next offset the worker
    needs (which also drops whatever aiokafka buffered for it). No record is skipped
    (the seek goes to the last dispatched offset + 1) and none is dispatched twice
    (the agent drops offsets already in a lane). If ``max_recoveries`` attempts in a
    row do not move the partition, the worker stops itself with a non-zero exit code
    so that its supervisor restarts it, which always works: a new consumer starts from
    the committed offsets.
    """

    EXIT_CODE = 75  # EX_TEMPFAIL: restart me

    def __init__(self, app: faust.App, lanes: PartitionLanes, fetched: dict[TP, int],
                 watchdog: FetchWatchdog, topic: str, end_offsets: EndOffsets, *,
                 max_recoveries: int = 2, clock: Callable[[], float] = time.monotonic,
                 stop: Callable[[], None] | None = None,
                 parked: Callable[[], set[TP]] = set) -> None:
        self.app, self.lanes, self.fetched, self.watchdog = app, lanes, fetched, watchdog
        # Partitions the worker paused itself (streams/parking.py): not stalled.
        self._parked = parked
        self.topic, self.end_offsets, self.max_recoveries = topic, end_offsets, max_recoveries
        self._clock = clock
        # Default: Faust's graceful stop (lanes finish, commit, leave the group).
        self._stop = stop or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        # Partition -> offset of its event in flight reported hung (the offset, not the
        # record: a turn of up to 16 MiB stayed alive after it; dropped once the lane is
        # idle or the partition no longer assigned).
        self._reported_hangs: dict[TP, object] = {}

    def _settled(self, since: int | None = None) -> bool:
        """Not rebalancing, and (``since``: a ``_rebalances()`` count) no rebalance
        began since: offsets taken before a rebalance are not the new assignment's."""
        return (not self.app.rebalancing and self.app.consumer.flow_active
                and (since is None or self._rebalances() == since))

    def _rebalances(self) -> int:
        """Rebalances begun so far (Faust's count)."""
        return getattr(self.app, "rebalancing_count", 0)

    async def check(self) -> None:
        consumer = self.app.consumer
        # Every figure below belongs to the assignment of now: a seek with one taken
        # before a rebalance (revoked, its lane's queued records dropped unacked, assigned
        # again from the committed offset) would skip those records.
        since = self._rebalances()
        if not self._settled():
            # Rebalancing: nothing to judge, and the assignment is about to change.
            self.watchdog.reset()
            return
        assigned = [tp for tp in consumer.assignment() if tp.topic == self.topic]
        parked = self._parked()
        tps = [tp for tp in assigned if tp not in parked]
        try:
            end_offsets = await asyncio.to_thread(self.end_offsets.query, tps)
        except Exception as exc:  # broker away: judge next time
            log.info("fetch watchdog: no end offsets (%r)", exc)
            return
        self._report_hung_lanes(assigned)
        figures = []
        for tp in tps:
            last = self.fetched.get(tp)
            next_offset = last + 1 if last is not None else first_needed_offset(self.app, tp)
            figures.append(PartitionFigures(tp, next_offset, end_offsets.get(tp)))
        stalls = self.watchdog.observe(self._clock(), figures, room=self.lanes.has_room(),
                                       settled=self._settled(since))
        now_ms = int(time.time() * 1000)
        for stall in stalls:
            log.warning("fetch watchdog: partition %s owes records (next offset %s, end offset"
                        " %s) but none was dispatched for %.0fs (attempt %d); %s",
                        stall.tp.partition, stall.next_offset, stall.end_offset, stall.idle_s,
                        stall.attempt, describe(self.app, stall.tp, now_ms=now_ms))
        if any(s.attempt > self.max_recoveries for s in stalls):
            self._give_up([s.tp.partition for s in stalls])
            return
        for stall in stalls:
            if not self._settled(since):
                # A rebalance began meanwhile (during the previous stall's seek, say): its
                # offset is the old assignment's; Faust sought to the committed ones.
                return
            await self._recover(stall.tp, stall.next_offset, since)

    async def _recover(self, tp: TP, offset: int | None, since: int | None = None) -> None:
        if offset is None:
            return
        consumer = self.app.consumer
        if tp in self._parked():
            return  # parked since the check began: its resumption seeks and resumes it
        try:
            # On the consumer's own thread: drops aiokafka's buffered records of tp
            # and makes it fetch from ``offset``. Before the resume, as a parked
            # partition's resumption does (streams/parking.py says why).
            await asyncio.wait_for(consumer.seek_wait({tp: offset}), 10)
        except Exception as exc:
            log.warning("fetch watchdog: seeking partition %s to %d failed: %r",
                        tp.partition, offset, exc)
            return
        finally:
            # Parked during the seek: left to the parking. A rebalance begun during it:
            # the partition may be another worker's now (Faust's resume would put it
            # back into the set it fetches from all the same), and Faust sets the fetch
            # state of its new assignment itself.
            if tp not in self._parked() and (since is None or self._rebalances() == since):
                consumer.resume_partitions([tp])  # back into the set Faust fetches from
        log.warning("fetch watchdog: partition %s resumed and seeked to offset %d",
                    tp.partition, offset)

    def _give_up(self, partitions: list[int]) -> None:
        runtime = self.app.runtime  # type: ignore[attr-defined]
        if runtime.fatal:
            return
        runtime.fatal = f"partitions {partitions} not fetched despite recovery"
        log.error("fetch watchdog: %s; stopping the worker (exit %d) so that it is restarted",
                  runtime.fatal, self.EXIT_CODE)
        self._stop()

    def _report_hung_lanes(self, tps: list[TP]) -> None:
        """Once per event: a lane whose event in flight does not finish. Not a fetch
        problem (a persistence outage logs its own warning; anything else is a hang),
        but the same symptom from outside, so it is named here."""
        health = self.app.runtime.health  # type: ignore[attr-defined]
        for tp in [tp for tp in self._reported_hangs if tp not in tps]:
            del self._reported_hangs[tp]  # revoked
        for tp in tps:
            busy = self.lanes.in_flight(tp)
            if busy is None:
                self._reported_hangs.pop(tp, None)
                continue
            if busy[1] < self.watchdog.stall_after_s:
                continue
            if health.is_retrying(f"{tp.topic}[{tp.partition}]"):
                continue  # a persistence outage: the retry loop has said so already
            offset = getattr(busy[0], "offset", None)
            if tp in self._reported_hangs and self._reported_hangs[tp] == offset:
                continue
            self._reported_hangs[tp] = offset
            log.warning("lane %s: event at offset %s in flight for %.0fs", tp.partition,
                        getattr(busy[0], "offset", "?"), busy[1])


def _faust_datadir(settings: Settings, group_id: str) -> Path:
    """Where Faust keeps its (here unused) table data: under RATCHET_HOME, not the cwd.

    Faust creates only the last directory level itself, so the parent is made here.
    """
    parent = settings.home / "faust"
    parent.mkdir(parents=True, exist_ok=True)
    return parent / group_id


def _update_lag(app: faust.App, lanes: PartitionLanes, fetched: dict[TP, int]) -> None:
    """Consumer lag per assigned partition: records not yet fetched plus those its lane
    has not acked (queued or in flight), i.e. everything the worker still owes. An event
    in flight was left out: a partition whose one event retried through a storage
    outage read 0 (an operator's review, session 38). A partition no record of which
    was fetched since its assignment has no sample (its position is not known without
    asking the consumer).

    Only cached, non-blocking figures are used (the high watermark of the last fetch and
    the last offset dispatched): asking the consumer for its position can wait on a
    rebalance, and nothing on the worker's path may wait on a metric.
    """
    metrics.CONSUMER_LAG.clear()
    for tp in app.consumer.assignment():
        last = fetched.get(tp)
        try:
            highwater = app.consumer.highwater(tp)
        except Exception:  # rebalancing: no figure rather than a wrong one
            continue
        if last is None or highwater is None:
            continue
        owed = max(0, highwater - (last + 1)) + lanes.owed(tp)
        metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(owed)


def lane_label(record: RawRecord) -> str:
    return f"{record.topic}[{record.partition}]"


def _encode(runtime: Runtime, handled: Handled) -> list[tuple[str, bytes | None, bytes]]:
    """The outcomes of step 1 as wire bytes, ready for step 2."""
    try:
        encoded = [(o.topic, o.key, runtime.codec.encode(o.topic, o.model))
                   for o in handled.outbound]
    except Exception as exc:  # registry unreachable: retry like persistence
        raise PublishUnavailable(f"encoding outcome: {exc}") from exc
    return encoded


async def _publish(app: faust.App, messages: list) -> None:
    """Step 2: send every outcome and wait until the broker has them all."""
    if not messages:
        return
    try:
        futures = [await app.producer.send(topic, key, value, None, None, None)
                   for topic, key, value in messages]
        await asyncio.gather(*futures)
    except Exception as exc:
        raise PublishUnavailable(f"publishing outcome: {exc}") from exc
