"""A fake Kafka for the decision notifier's unit tests (services/api/notifier.py), and
the scenario steps they share: a notifier built on it, followed from its end, and a
waiter woken or not.

``FakeBroker``: one log per topic, and hooks a test uses to act at one consumer's
moments. ``FakeConsumer``: a consumer positioned at ``OFFSET_END`` starts at the log's
end as of its first poll (librdkafka resolves a logical offset when it first fetches);
a position past a log's end is reset to the end silently, or with
``auto.offset.reset=error`` is an ``_AUTO_OFFSET_RESET`` error (as librdkafka does).
Subclasses change what the metadata or a partition's end says. A partition added to a
topic needs the real broker: ``tests/integration/test_notifier_partitions.py``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

from confluent_kafka import OFFSET_END, KafkaError, KafkaException

from services.api import notifier as notifier_module
from services.api.notifier import DecisionNotifier
from services.api.waiters import PromotionWaiters, Ticket

TOPICS = {"ck": "promoted", "rj": "rejected"}
BOUND_S = 10  # a bound on a wait that ends at once when the notifier is right


class FakeBroker:
    """Topic logs, and hooks the test uses to act at one consumer's moments."""

    def __init__(self) -> None:
        self.logs: dict[str, list[bytes]] = {topic: [] for topic in TOPICS}
        self.consumers = 0
        self.on_connect: dict[int, Callable[[], None]] = {}  # consumer number -> at list_topics
        self.crash_consumer: int | None = None  # its first poll raises

    def produce(self, topic: str, value: bytes) -> None:
        self.logs[topic].append(value)


class FakeConsumer:
    broker: FakeBroker

    def __init__(self, config: dict) -> None:
        self.broker.consumers += 1
        self.number = self.broker.consumers
        self.positions: dict[str, int] = {}
        self.pending_end: set[str] = set()
        self.reset_is_error = config.get("auto.offset.reset") == "error"

    def list_topics(self, timeout: float = -1) -> SimpleNamespace:
        hook = self.broker.on_connect.pop(self.number, None)
        if hook is not None:
            hook()
        return SimpleNamespace(topics={
            topic: SimpleNamespace(error=None, partitions={0: None}) for topic in TOPICS
        })

    def get_watermark_offsets(self, tp, timeout: float = -1, cached: bool = False):
        return 0, len(self.broker.logs[tp.topic])

    def assign(self, partitions) -> None:
        for tp in partitions:
            if tp.offset == OFFSET_END:
                self.pending_end.add(tp.topic)  # resolved at the first fetch
            else:
                self.positions[tp.topic] = tp.offset

    def incremental_assign(self, partitions) -> None:
        self.assign(partitions)

    def poll(self, timeout: float):
        if self.broker.crash_consumer == self.number:
            self.broker.crash_consumer = None
            raise KafkaException("broker connection lost")
        for topic in list(self.pending_end):
            self.positions[topic] = len(self.broker.logs[topic])
            self.pending_end.discard(topic)
        for topic, position in self.positions.items():
            log = self.broker.logs[topic]
            if position > len(log):  # out of range: the topic was created again
                if self.reset_is_error:
                    return SimpleNamespace(
                        error=lambda: KafkaError(KafkaError._AUTO_OFFSET_RESET),
                        topic=lambda t=topic: t, value=lambda: None)
                self.positions[topic] = len(log)  # librdkafka's default: to the end
                continue
            if position < len(log):
                self.positions[topic] = position + 1
                value = self.broker.logs[topic][position]
                return SimpleNamespace(error=lambda: None, topic=lambda t=topic: t,
                                       value=lambda v=value: v)
        threading.Event().wait(min(timeout, 0.01))
        return None

    def position(self, partitions):
        return []

    def assignment(self):
        return []

    def close(self) -> None:
        pass


def fake_kafka(monkeypatch, consumer: type[FakeConsumer] = FakeConsumer) -> FakeBroker:
    """A new broker, and the notifier's ``Consumer`` replaced by ``consumer`` on it."""
    broker = FakeBroker()
    FakeConsumer.broker = broker
    monkeypatch.setattr(notifier_module, "Consumer", consumer)
    return broker


def partition_meta(leader: int) -> SimpleNamespace:
    """A partition's metadata naming ``leader`` (-1: none)."""
    return SimpleNamespace(leader=leader, error=None)


def topics_meta(partitions: dict[str, dict[int, Any]]) -> SimpleNamespace:
    """``list_topics``'s answer: each topic's partitions and their metadata."""
    return SimpleNamespace(topics={
        topic: SimpleNamespace(error=None, partitions=partitions[topic]) for topic in TOPICS})


def notifier_of(waiters: PromotionWaiters, **options: Any) -> DecisionNotifier:
    """A notifier of ``TOPICS`` on the fake (its records are response ids), polling
    every 10 ms."""
    options.setdefault("poll_timeout_s", 0.01)
    return DecisionNotifier("fake:9092", TOPICS, waiters,
                            lambda topic, value: value.decode(), **options)


@contextlib.asynccontextmanager
async def following(notifier: DecisionNotifier, bound_s: float = BOUND_S
                    ) -> AsyncIterator[bool]:
    """The notifier started, positioned and everyone woken; yields whether it was
    positioned within ``bound_s``. Stopped at the end."""
    notifier.start()
    try:
        loop = asyncio.get_running_loop()
        positioned = await loop.run_in_executor(None, notifier.wait_assigned, bound_s)
        await asyncio.sleep(0.1)  # positioned (and everyone woken)
        yield positioned
    finally:
        notifier.stop()


async def woken(ticket: Ticket, bound_s: float = BOUND_S) -> bool:
    """Whether ``ticket``'s waiter is woken within ``bound_s``."""
    try:
        await asyncio.wait_for(ticket.event.wait(), bound_s)
    except TimeoutError:
        return False
    return True


def decision_wakes_its_waiter(broker: FakeBroker, bound_s: float = BOUND_S,
                              **options: Any) -> bool:
    """A notifier followed from its end: a promotion of ``resp_1`` published on the
    checkpoints topic wakes the request waiting for it, within ``bound_s``."""
    async def scenario() -> bool:
        waiters = PromotionWaiters()
        async with following(notifier_of(waiters, **options), bound_s) as positioned:
            if not positioned:
                return False
            ticket = waiters.register("resp_1")
            broker.produce("ck", b"resp_1")
            return await woken(ticket, bound_s)

    return asyncio.run(scenario())
