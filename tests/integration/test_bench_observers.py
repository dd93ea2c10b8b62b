"""The bench's own observers of the end-to-end run, on the real broker.

``ratchet bench processor`` counts the worker's outcomes to close its window. The
counter is paused outside its waits and fetches lazily, and the bench's rig runs no
decoding collector (docs/benchmarks.md, "The bench's own observers"): what it saves
must not cost a single outcome, across pauses and resumes.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from ratchet.bench.processor import OutcomeCounter
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration


def _produce(settings, topic: str, count: int, tag: str) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    for i in range(count):
        producer.produce(topic, key=f"{tag}-{i}".encode(), value=b"outcome")
    assert producer.flush(30) == 0


def test_counter_counts_every_outcome_across_its_pauses(settings, tmp_path):
    bench = isolated_settings(settings, "observers", partitions=2, home=tmp_path / "home")
    rig = Rig(bench, collect=False)
    counter = OutcomeCounter(bench, rig)
    try:
        _produce(bench, rig.topics.checkpoints, 7, "a")
        _produce(bench, rig.topics.rejections, 2, "b")
        counter.wait_for(9, 30)
        assert (counter.count, counter.rejected) == (9, 2)
        # Produced while the counter is paused (between two measured windows): counted
        # by the next wait, once each.
        _produce(bench, rig.topics.checkpoints, 5, "c")
        counter.wait_for(14, 30)
        assert (counter.count, counter.rejected) == (14, 2)
        with pytest.raises(TimeoutError, match="14/15 outcomes"):
            counter.wait_for(15, 1)  # nothing more was published: no phantom count
    finally:
        counter.consumer.close()
        rig.close()


def test_rig_without_collector_still_removes_its_topics(settings, tmp_path):
    bench = isolated_settings(settings, "nocollect", partitions=2, home=tmp_path / "home")
    rig = Rig(bench, collect=False)
    assert rig.collector is None
    topic = rig.topics.checkpoints
    rig.close()
    admin = AdminClient({"bootstrap.servers": bench.kafka_bootstrap})
    deadline = time.monotonic() + 10  # the broker's metadata may lag its deletion
    while topic in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)
    assert topic not in admin.list_topics(timeout=10).topics
