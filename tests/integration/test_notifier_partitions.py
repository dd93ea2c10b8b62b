"""A partition added to a decision topic is followed: a decision published in it wakes
its waiter (an outside review, session 43: the notifier was assigned the partitions it
found at its start, and a decision in a partition added later woke nobody, every such
``wait_ms`` request answered at its deadline). Real Kafka."""

from __future__ import annotations

import asyncio
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions, NewTopic

from services.api.notifier import DecisionNotifier
from services.api.waiters import PromotionWaiters

BOUND_S = 60  # a bound on waits that end within a few seconds when the notifier is right


def test_a_decision_in_a_partition_added_later_wakes_its_waiter(settings, kafka_admin):
    topic = f"rapi-notifier-partitions-{uuid.uuid4().hex[:8]}"
    kafka_admin.create_topics([NewTopic(topic, num_partitions=1,
                                        replication_factor=1)])[topic].result(30)

    async def scenario() -> str | None:
        waiters = PromotionWaiters()
        notifier = DecisionNotifier(settings.kafka_bootstrap, {topic: "promoted"}, waiters,
                                    decode_response_id=lambda _t, value: value.decode(),
                                    topics_check_s=0.5)
        notifier.start()
        loop = asyncio.get_running_loop()
        try:
            assert await loop.run_in_executor(None, notifier.wait_assigned, 30)
            ticket = waiters.register("resp_in_partition_1")
            kafka_admin.create_partitions([NewPartitions(topic, 2)])[topic].result(30)
            producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
            producer.list_topics(topic, timeout=10)
            deadline = loop.time() + BOUND_S
            # The decision is published in the new partition, again until it wakes the
            # waiter (a wake-up of everyone as the notifier follows the new partition
            # counts as one only if the decision is its own).
            while loop.time() < deadline:
                producer.produce(topic, b"resp_in_partition_1", partition=1)
                producer.flush(10)
                try:
                    await asyncio.wait_for(ticket.event.wait(), 1)
                except TimeoutError:
                    continue
                if ticket.decision == "promoted":
                    return ticket.decision
                ticket.event.clear()
            return ticket.decision
        finally:
            notifier.stop()

    try:
        assert asyncio.run(scenario()) == "promoted", "no decision of the new partition"
    finally:
        kafka_admin.delete_topics([topic])
