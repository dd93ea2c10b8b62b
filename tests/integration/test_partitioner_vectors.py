"""The partition of each key in docs/vectors/partition-keys.json is where the gateway
library's producer really puts it (crc32(key) mod partitions, librdkafka's default), so a
gateway in another language that follows the vectors shares partitions with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from services.gateway.producer import PRODUCER_DEFAULTS

pytestmark = pytest.mark.integration

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "vectors" / "partition-keys.json"
PARTITIONS = 12


def test_gateway_producer_places_each_vector_key_on_its_partition(settings, kafka_admin,
                                                                  unique_name):
    topic = settings.topic(unique_name("partitioner"))
    kafka_admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
    try:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, **PRODUCER_DEFAULTS})
        cases = json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]
        placed: dict[str, int] = {}
        for case in cases:
            producer.produce(topic, key=bytes.fromhex(case["key_hex"]), value=b"v",
                             on_delivery=lambda err, msg, k=case["key"]: placed.__setitem__(
                                 k, -1 if err else msg.partition()))
        assert producer.flush(30) == 0
        assert placed == {c["key"]: c[f"partition_of_{PARTITIONS}"] for c in cases}
    finally:
        kafka_admin.delete_topics([topic])
