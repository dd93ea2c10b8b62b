"""The worker fetches 4 MiB per partition (streams/app.py, FETCH_BYTES_PER_PARTITION:
what it holds of records it has not asked for yet), and still takes a record of up to
the topic's limit: the broker returns a partition's first record batch whole however
large (KIP-74). Here a 15 MiB record (undecodable: a dead letter, with all its bytes)
sits between two small turns of one partition, and everything after it is promoted.
Real Kafka, Cassandra and registry."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from ratchet.samples import make_turn
from schemas.limits import CLIENT_MAX_BYTES, TOPIC_MAX_MESSAGE_BYTES
from streams.app import FETCH_BYTES_PER_PARTITION
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration


def _turn(conv: str, head: int):
    return make_turn(conversation_id=conv, expected_head_seq=head,
                     response_id=f"resp_{uuid.uuid4().hex[:12]}",
                     idempotency_key=f"idem_{uuid.uuid4().hex[:12]}",
                     now_ms=int(time.time() * 1000))


def test_a_record_far_larger_than_the_fetch_size_is_taken_and_the_partition_goes_on(
        settings, tmp_path):
    rig = Rig(isolated_settings(settings, "bigrec", partitions=1, home=tmp_path / "home"))
    worker = None
    try:
        conv = f"conv_{uuid.uuid4().hex[:10]}"
        big = b"\x07" + b"x" * (TOPIC_MAX_MESSAGE_BYTES - 64 * 1024)
        assert len(big) > 3 * FETCH_BYTES_PER_PARTITION
        first, after = _turn(conv, 0), _turn(conv, 1)
        rig.send(first)
        raw = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                        "message.max.bytes": CLIENT_MAX_BYTES, "acks": "all"})
        raw.produce(rig.topics.gateway_events, key=conv.encode(), value=big)
        assert raw.flush(60) == 0
        rig.send(after)
        worker = rig.worker(tmp_path)  # the backlog is there before it starts
        assert rig.collector.outcome(first.response_id, timeout_s=90).seq == 1
        assert rig.collector.outcome(after.response_id, timeout_s=90).seq == 2
        assert worker.alive(), worker.log_tail(2000)
        [letter] = rig.collector.dead_letters
        assert letter.model.value == big
    finally:
        if worker is not None:
            worker.terminate()
        rig.close()
