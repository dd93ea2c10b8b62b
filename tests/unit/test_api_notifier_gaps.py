"""The decision notifier leaves no window in which a decision wakes nobody
(services/api/notifier.py, waiters.py).

A waiting request reads once after it registers; anything published after that read
must wake it. The notifier follows the topics from their end, so a decision published
before it is positioned (the API serves while the notifier connects, and again while it
reconnects after a broken connection) is one it never sees: pinned here, a waiter that
registered before the notifier was positioned is woken once it is (its re-read finds
what was published meanwhile), on a first start and after a restart; and a decision
published in a topic created again (deleted and created under the notifier) wakes its
waiter, where librdkafka's reset to the end skipped it.

Kafka is a fake (``FakeBroker``): one log per topic, a consumer positioned at
``OFFSET_END`` starts at the log's end as of its first poll (librdkafka resolves a
logical offset when it first fetches); a position past a log's end is reset to the end
silently, or with ``auto.offset.reset=error`` is an ``_AUTO_OFFSET_RESET`` error (as
librdkafka does). A partition added to a topic needs the real broker:
``tests/integration/test_notifier_topics_missing.py``."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_END, KafkaError, KafkaException

from services.api import notifier as notifier_module
from services.api.notifier import DecisionNotifier
from services.api.waiters import PromotionWaiters

TOPICS = {"ck": "promoted", "rj": "rejected"}
BOUND_S = 10  # a bound on a wait that ends at once when the notifier is right


class FakeBroker:
    """Topic logs, and hooks the test uses to act at one consumer's moments."""

    def __init__(self) -> None:
        self.logs: dict[str, list[bytes]] = {topic: [] for topic in TOPICS}
        self.consumers = 0
        self.on_connect: dict[int, callable] = {}  # consumer number -> run at list_topics
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


@pytest.fixture
def broker(monkeypatch) -> FakeBroker:
    broker = FakeBroker()
    FakeConsumer.broker = broker
    monkeypatch.setattr(notifier_module, "Consumer", FakeConsumer)
    return broker


def _notifier(waiters: PromotionWaiters) -> DecisionNotifier:
    return DecisionNotifier("fake:9092", TOPICS, waiters,
                            lambda topic, value: value.decode(), poll_timeout_s=0.01)


async def _woken(ticket) -> bool:
    try:
        await asyncio.wait_for(ticket.event.wait(), BOUND_S)
    except TimeoutError:
        return False
    return True


def test_a_decision_published_while_the_notifier_connects_wakes_its_waiter(broker):
    """The API serves before its notifier is positioned: a request registered and read
    (nothing yet), then its promotion was published, then the notifier took the end."""

    async def scenario() -> bool:
        waiters = PromotionWaiters()
        ticket = waiters.register("resp_1")  # its first read found nothing
        broker.on_connect[1] = lambda: broker.produce("ck", b"resp_1")
        notifier = _notifier(waiters)
        notifier.start()
        try:
            return await _woken(ticket)
        finally:
            notifier.stop()

    assert asyncio.run(scenario()), "the waiter was never woken"


def test_a_decision_published_while_the_notifier_reconnects_wakes_its_waiter(broker):
    """The notifier's connection broke (it woke everyone then); a request registered
    and read while it was down, its promotion was published before the new consumer
    was positioned."""

    async def scenario() -> bool:
        waiters = PromotionWaiters()
        loop = asyncio.get_running_loop()
        reconnecting, registered = threading.Event(), threading.Event()

        def second_connect() -> None:
            reconnecting.set()
            registered.wait(BOUND_S)  # the request registers and reads while down
            broker.produce("ck", b"resp_1")

        broker.on_connect[2] = second_connect
        broker.crash_consumer = 1
        notifier = _notifier(waiters)
        notifier.start()
        try:
            assert await loop.run_in_executor(None, reconnecting.wait, BOUND_S)
            ticket = waiters.register("resp_1")
            registered.set()
            return await _woken(ticket)
        finally:
            notifier.stop()

    assert asyncio.run(scenario()), "the waiter was never woken"



def test_a_decision_published_in_a_topic_created_again_wakes_its_waiter(broker):
    """The checkpoints topic was deleted and created again under the notifier, and a
    promotion published in it before the notifier's next fetch: its old position is
    past the new log's end."""

    async def scenario() -> bool:
        broker.logs["ck"] = [b"old_1", b"old_2", b"old_3"]
        waiters = PromotionWaiters()
        notifier = _notifier(waiters)
        notifier.start()
        try:
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, notifier.wait_assigned, BOUND_S)
            await asyncio.sleep(0.1)  # positioned (and everyone woken): past the old records
            ticket = waiters.register("resp_1")
            broker.logs["ck"] = [b"resp_1"]  # created again, the promotion in it
            return await _woken(ticket)
        finally:
            notifier.stop()

    assert asyncio.run(scenario()), "the waiter was never woken"


class LeaderlessConsumer(FakeConsumer):
    """The rejections topic's partition has no leader: its end cannot be read (librdkafka
    raises for it), while the checkpoints topic serves. Assigned partitions are added
    with ``incremental_assign`` once readable."""

    readable: set[str] = {"ck"}

    def get_watermark_offsets(self, tp, timeout: float = -1, cached: bool = False):
        if tp.topic not in self.readable:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return super().get_watermark_offsets(tp, timeout, cached)

    def incremental_assign(self, partitions) -> None:
        self.assign(partitions)


def test_a_partition_without_a_leader_does_not_stop_the_others_decisions(broker, monkeypatch):
    """One decision partition without a leader (a broker down in a cluster): the
    notifier follows every other partition (a decision there wakes its own waiter, no
    one else), and the leaderless one once it has a leader again. Before session 43's
    review it restarted for ever (each time waking every waiter, never delivering)."""
    LeaderlessConsumer.readable = {"ck"}
    monkeypatch.setattr(notifier_module, "Consumer", LeaderlessConsumer)

    async def scenario() -> tuple[bool, bool, bool]:
        waiters = PromotionWaiters()
        notifier = DecisionNotifier("fake:9092", TOPICS, waiters,
                                    lambda topic, value: value.decode(),
                                    poll_timeout_s=0.01, topics_check_s=0.05)
        notifier.start()
        try:
            loop = asyncio.get_running_loop()
            positioned = await loop.run_in_executor(None, notifier.wait_assigned, BOUND_S)
            await asyncio.sleep(0.1)
            ticket, bystander = waiters.register("resp_1"), waiters.register("resp_2")
            broker.produce("ck", b"resp_1")
            woken = positioned and await _woken(ticket)
            left_alone = not bystander.event.is_set()
            LeaderlessConsumer.readable = {"ck", "rj"}  # a leader again
            await asyncio.sleep(0.3)  # followed at a topics check (everyone woken then)
            rejected = waiters.register("resp_4")
            broker.produce("rj", b"resp_4")
            return woken, left_alone, await _woken(rejected)
        finally:
            notifier.stop()

    woken, left_alone, followed_again = asyncio.run(scenario())
    assert woken, "a decision on a partition with a leader woke nobody"
    assert left_alone, "another waiter was woken (the notifier restarted)"
    assert followed_again, "the partition that has a leader again is not followed"
