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

Kafka is ``tests/unit/notifier_world.py``'s fake. A partition added to a topic needs
the real broker: ``tests/integration/test_notifier_partitions.py``."""

from __future__ import annotations

import asyncio
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.api.waiters import PromotionWaiters
from tests.unit.notifier_world import (
    BOUND_S,
    FakeBroker,
    FakeConsumer,
    fake_kafka,
    following,
    notifier_of,
    woken,
)


@pytest.fixture
def broker(monkeypatch) -> FakeBroker:
    return fake_kafka(monkeypatch)


def test_a_decision_published_while_the_notifier_connects_wakes_its_waiter(broker):
    """The API serves before its notifier is positioned: a request registered and read
    (nothing yet), then its promotion was published, then the notifier took the end."""

    async def scenario() -> bool:
        waiters = PromotionWaiters()
        ticket = waiters.register("resp_1")  # its first read found nothing
        broker.on_connect[1] = lambda: broker.produce("ck", b"resp_1")
        notifier = notifier_of(waiters)
        notifier.start()
        try:
            return await woken(ticket)
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
        notifier = notifier_of(waiters)
        notifier.start()
        try:
            assert await loop.run_in_executor(None, reconnecting.wait, BOUND_S)
            ticket = waiters.register("resp_1")
            registered.set()
            return await woken(ticket)
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
        async with following(notifier_of(waiters)) as positioned:
            assert positioned  # and past the old records
            ticket = waiters.register("resp_1")
            broker.logs["ck"] = [b"resp_1"]  # created again, the promotion in it
            return await woken(ticket)

    assert asyncio.run(scenario()), "the waiter was never woken"


class LeaderlessConsumer(FakeConsumer):
    """The rejections topic's partition has no leader: its end cannot be read (librdkafka
    raises for it), while the checkpoints topic serves."""

    readable: set[str] = {"ck"}

    def get_watermark_offsets(self, tp, timeout: float = -1, cached: bool = False):
        if tp.topic not in self.readable:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return super().get_watermark_offsets(tp, timeout, cached)


def test_a_partition_without_a_leader_does_not_stop_the_others_decisions(monkeypatch):
    """One decision partition without a leader (a broker down in a cluster): the
    notifier follows every other partition (a decision there wakes its own waiter, no
    one else), and the leaderless one once it has a leader again. Before session 43's
    review it restarted for ever (each time waking every waiter, never delivering)."""
    LeaderlessConsumer.readable = {"ck"}
    broker = fake_kafka(monkeypatch, LeaderlessConsumer)

    async def scenario() -> tuple[bool, bool, bool]:
        waiters = PromotionWaiters()
        async with following(notifier_of(waiters, topics_check_s=0.05)) as positioned:
            ticket, bystander = waiters.register("resp_1"), waiters.register("resp_2")
            broker.produce("ck", b"resp_1")
            promoted = positioned and await woken(ticket)
            left_alone = not bystander.event.is_set()
            LeaderlessConsumer.readable = {"ck", "rj"}  # a leader again
            await asyncio.sleep(0.3)  # followed at a topics check (everyone woken then)
            rejected = waiters.register("resp_4")
            broker.produce("rj", b"resp_4")
            return promoted, left_alone, await woken(rejected)

    promoted, left_alone, followed_again = asyncio.run(scenario())
    assert promoted, "a decision on a partition with a leader woke nobody"
    assert left_alone, "another waiter was woken (the notifier restarted)"
    assert followed_again, "the partition that has a leader again is not followed"
