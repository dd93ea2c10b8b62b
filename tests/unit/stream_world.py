"""streams/app.py's own dispatch agent and rebalance handlers driven with the real
PromotionProcessor on the in-memory store and ledger (no Kafka): a fake Faust stream,
consumer and producer stand in for the broker. (Written by an outside review of the
worker's stream layer, 2026-12-04.)"""
from __future__ import annotations

import asyncio
import functools
import pickle
from dataclasses import dataclass, field, replace

from faust.types import TP

from ratchet.samples import NOW_MS
from ratchet.settings import Settings
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams import app as app_module
from streams.app import Runtime, create_app
from streams.consumer_loop import commit_acked
from streams.health import Health
from streams.lanes import PartitionLanes
from streams.processor import PromotionProcessor
from streams.retry import Backoff
from tests.unit.test_processor_rules import TOPICS, PickleCodec, kafka_key

TOPIC = TOPICS.gateway_events


@dataclass
class Msg:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    timestamp: float = 0.0

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


@dataclass
class Ev:
    message: Msg
    acks: list

    def ack(self) -> None:
        self.acks.append((self.message.partition, self.message.offset))


class FakeStream:
    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def noack(self):
        return self

    async def events(self):
        while True:
            yield await self.queue.get()


class FakeConsumer:
    def __init__(self) -> None:
        self.commits = 0
        # ("pause" | "resume" | "seek", partition, offset or None), in order
        self.calls: list[tuple[str, int, int | None]] = []

    def pause_partitions(self, tps):
        self.calls += [("pause", tp.partition, None) for tp in tps]

    def resume_partitions(self, tps):
        self.calls += [("resume", tp.partition, None) for tp in tps]

    async def seek_wait(self, partitions):
        self.calls += [("seek", tp.partition, offset) for tp, offset in partitions.items()]

    async def commit(self, *a, **k):
        self.commits += 1
        return True

    def assignment(self):
        return set()


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        self.sent.append((topic, key, pickle.loads(value)))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


@dataclass
class World:
    app: object
    runtime: Runtime
    stream: FakeStream
    producer: FakeProducer
    consumer: FakeConsumer
    acks: list = field(default_factory=list)
    handled: list = field(default_factory=list)  # (partition, offset) when handling starts

    def event(self, model, offset: int, partition: int = 0) -> Ev:
        return Ev(Msg(TOPIC, partition, offset, kafka_key(model), pickle.dumps(model)), self.acks)

    async def revoke(self, *partitions: int) -> None:
        """What the worker's consumer does on a revocation before Faust forgets the
        partitions' acks (``streams/consumer_loop.py``, ``_SettleBeforeRevoke``)."""
        await self.app.settle_revoked({TP(TOPIC, p) for p in partitions})
        await commit_acked(self.app.consumer)

    async def until_acked(self, count: int, *, polls: int) -> None:
        """Let the lanes run until ``count`` events are acked, or ``polls`` short sleeps
        passed (the test's assertions then say what was not)."""
        for _ in range(polls):
            if len(self.acks) >= count:
                return
            await asyncio.sleep(0.01)

    def outcomes(self, response_id: str) -> list:
        return [m for _t, _k, m in self.producer.sent
                if getattr(m, "response_id", None) == response_id]


def build(tmp_path, monkeypatch, *, max_queued: int = 2000, window: int = 1,
          store=None, ledger=None, gate=None, grace_s: float = 2.0,
          lane_max_bytes: int = Settings.lane_max_bytes,
          fetch_wait_ms: int = Settings.fetch_wait_ms, lane_share: int | None = 4) -> World:
    """``gate(record) -> awaitable | None``: awaited before the record is handled.
    ``lane_share``: see ``PartitionLanes`` (None: no lane is full on its own, so the
    dispatcher waits at the bounds of all lanes together instead of parking)."""
    monkeypatch.setattr(app_module, "PartitionLanes",
                        functools.partial(PartitionLanes, max_queued=max_queued,
                                          lane_share=lane_share))
    settings = replace(Settings(), home=tmp_path, partitions=2, lane_window=window,
                       lane_max_bytes=lane_max_bytes, fetch_wait_ms=fetch_wait_ms)
    processor = PromotionProcessor(store or MemoryCheckpointStore(StoreOptions()),
                                   ledger or MemoryLedger(), PickleCodec(), TOPICS,
                                   clock_ms=lambda: NOW_MS)
    runtime = Runtime(processor=processor, codec=PickleCodec(), health=Health(),
                      topics=TOPICS, backoff=Backoff(base_s=0.01, cap_s=0.05))
    app = create_app(settings, runtime, stall_after_s=0, shutdown_grace_s=grace_s)
    world = World(app, runtime, FakeStream(), FakeProducer(), FakeConsumer())
    app.producer = world.producer
    app.consumer = world.consumer
    inner = processor.handle_async

    async def handle_async(record, in_thread):
        world.handled.append((record.partition, record.offset))
        if gate is not None:
            waiting = gate(record)
            if waiting is not None:
                await waiting
        return await inner(record, in_thread)

    processor.handle_async = handle_async
    return world


def dispatch_task(world: World) -> asyncio.Task:
    agent = next(iter(world.app.agents.values()))
    return asyncio.ensure_future(agent.fun(world.stream))
