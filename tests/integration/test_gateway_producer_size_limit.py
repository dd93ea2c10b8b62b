"""The gateway library at the size limit, with the real registry and Kafka (an outside
review of the library, session 48).

CONTRACT section 4: the documented maximum turn travels end to end; above it the gateway
library refuses before producing. ``schemas/limits.py``: the maximum is one event value
(5-byte header + Avro body) of ``MAX_EVENT_BYTES``. The unit tests pin the comparison
with a serde of made-up sizes and the e2e ones move an 8 MiB turn and one 64 KiB above
the maximum; these take a real turn encoded by the registry's schema to exactly the
maximum (produced, acknowledged with an offset, read back whole) and to one byte above
it (``EventTooLarge``, nothing written), under a topic prefix of their own.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ratchet.samples import make_turn
from schemas.avro import EventSerde, register_schemas, registry_client
from schemas.limits import MAX_EVENT_BYTES
from services.gateway import items
from services.gateway.errors import EventTooLarge
from services.gateway.producer import GatewayProducer
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration

PARTS = 8  # messages of ~1.3 MiB each


@pytest.fixture(scope="module")
def own(settings, kafka_admin):
    """Settings under a topic prefix of this module's, its topics made as the worker
    makes them (their size limits), deleted afterwards; the schemas registered."""
    register_schemas(registry_client(settings.schema_registry_url))  # idempotent
    prefix = f"rgw3size{id(settings):x}."
    mine = dataclasses.replace(settings, topic_prefix=prefix)
    topics = list(vars(ensure_topics(mine)).values())
    yield mine
    kafka_admin.delete_topics(topics)


def turn_of_value_size(serde: EventSerde, topic: str, size: int):
    """A turn whose encoded value (header and body) is exactly ``size`` bytes: ``PARTS``
    messages, the first one's text lengthened or shortened by what is missing."""
    rest = size // PARTS - 200  # each message's text; the first takes up the difference
    first = rest
    for _ in range(10):
        turn = make_turn([items.message("x" * (first if i == 0 else rest),
                                        item_id=f"msg_{i}") for i in range(PARTS)])
        value = serde.encode(turn, topic)
        if len(value) == size:
            return turn, value
        first += size - len(value)  # a varint may grow or shrink: try again
    raise AssertionError(f"no turn of exactly {size} bytes: {len(value)}")


def _end_offsets(settings, topic: str) -> dict[int, int]:
    """Each partition's end offset. A topic this module has just made may not have
    elected its partitions' leaders yet (the broker answers NOT_LEADER_FOR_PARTITION
    or LEADER_NOT_AVAILABLE for a moment): those are asked again, for up to 30 s."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"{topic}-probe"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: _end_offset(consumer, TopicPartition(topic, p)) for p in partitions}
    finally:
        consumer.close()


_ELECTING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}


def _end_offset(consumer: Consumer, partition: TopicPartition) -> int:
    deadline = time.monotonic() + 30
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=10)[1]
        except KafkaException as failure:
            if failure.args[0].code() not in _ELECTING or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _read_back(settings, topic: str, before: dict[int, int]) -> list[bytes]:
    """The values written to ``topic`` after ``before``."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"{topic}-reader", "enable.auto.commit": False,
                         "fetch.message.max.bytes": 32 * 1024 * 1024})
    after = _end_offsets(settings, topic)
    wanted = {p: (before[p], after[p]) for p in after if after[p] > before[p]}
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in wanted.items()])
    values: list[bytes] = []
    try:
        while len(values) < sum(end - start for start, end in wanted.values()):
            message = consumer.poll(30)
            assert message is not None, "the written record was not read back"
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        consumer.close()
    return values


def test_a_turn_of_exactly_the_maximum_value_is_produced_and_read_back_whole(own):
    topic = own.topic("gateway-events")
    with GatewayProducer(own, config={"log_level": 0}) as producer:
        turn, value = turn_of_value_size(producer._serde, topic, MAX_EVENT_BYTES)
        before = _end_offsets(own, topic)
        producer.send(turn)
        producer.flush(60)  # raises DeliveryError / FlushTimeout if not acknowledged
    assert _read_back(own, topic, before) == [value]


def test_a_turn_one_byte_above_the_maximum_is_refused_and_nothing_is_written(own):
    topic = own.topic("gateway-events")
    with GatewayProducer(own, config={"log_level": 0}) as producer:
        turn, _ = turn_of_value_size(producer._serde, topic, MAX_EVENT_BYTES + 1)
        before = _end_offsets(own, topic)
        with pytest.raises(EventTooLarge) as refused:
            producer.send(turn)
        producer.flush(60)
    assert refused.value.size == MAX_EVENT_BYTES + 1 and not refused.value.retryable
    assert _end_offsets(own, topic) == before
