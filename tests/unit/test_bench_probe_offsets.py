"""The latency probe starts each partition at the end offset the broker reports when
the probe is made, asking again while a partition has no leader yet (a topic just
made, a broker just restarted). Before, it assigned "the end" and let the first fetch
resolve it: an outcome published before that resolution was never seen, and a floor
run waited 90 s for it (CI, right after a Kafka restart)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ratchet.bench.probe import end_offsets


class _Consumer:
    def __init__(self, answers: dict[int, list]) -> None:
        self.answers = answers  # partition -> the answers to give, in order
        self.asked: list[int] = []

    def get_watermark_offsets(self, tp, timeout, cached):
        assert cached is False  # the broker's answer, not a cached one
        self.asked.append(tp.partition)
        answer = self.answers[tp.partition].pop(0)
        if isinstance(answer, int):
            raise KafkaException(KafkaError(answer))
        return answer


def test_each_partition_starts_at_its_high_watermark_once_it_has_a_leader():
    consumer = _Consumer({0: [KafkaError.NOT_LEADER_FOR_PARTITION,
                              KafkaError._UNKNOWN_PARTITION, (0, 7)],
                          1: [(2, 3)]})
    placed = end_offsets(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert [(tp.topic, tp.partition, tp.offset) for tp in placed] == [("t", 0, 7), ("t", 1, 3)]
    assert consumer.asked == [0, 0, 0, 1]


def test_another_error_is_raised_at_once():
    consumer = _Consumer({0: [KafkaError.TOPIC_AUTHORIZATION_FAILED, (0, 1)]})
    with pytest.raises(KafkaException):
        end_offsets(consumer, [TopicPartition("t", 0)])
    assert consumer.asked == [0]


def test_a_partition_that_never_gets_a_leader_fails_after_the_timeout():
    consumer = _Consumer({0: [KafkaError.LEADER_NOT_AVAILABLE] * 100})
    with pytest.raises(KafkaException):
        end_offsets(consumer, [TopicPartition("t", 0)], timeout_s=0.25)
    assert 2 <= len(consumer.asked) <= 5
