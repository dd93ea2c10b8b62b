"""Timing records end to end: ``RecordClock`` and ``LatencyProbe`` read the outcome
topics from their end offsets and time each record from its produce; ``p50_p99``."""

from __future__ import annotations

import gc
import threading
import time

from confluent_kafka import Consumer, TopicPartition

from ratchet.bench.measure import unique_name
from ratchet.bench.turns import consume_now
from ratchet.settings import Settings


def p50_p99(latencies_ms: list[float]) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, samples) of the latency rows."""
    lat = sorted(latencies_ms)
    if not lat:
        return float("nan"), float("nan"), 0
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], len(lat)


# The broker's answers while a partition has no leader yet (a topic just made, a broker
# just restarted): asked again until it has one.
_NO_LEADER_YET = {"NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE",
                  "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC",
                  "_TIMED_OUT"}


def end_offsets(consumer: Consumer, partitions: list[TopicPartition],
                timeout_s: float = 60.0) -> list[TopicPartition]:
    """Each partition at its end offset (the high watermark the broker reports now);
    waits while a partition has no leader yet, raises after ``timeout_s``."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    placed = []
    for tp in partitions:
        while True:
            try:
                _, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
                break
            except KafkaException as exc:
                if (exc.args[0].name() not in _NO_LEADER_YET
                        or time.monotonic() >= deadline):
                    raise
                time.sleep(0.1)
        placed.append(TopicPartition(tp.topic, tp.partition, high))
    return placed


class RecordClock:
    """When each record was sent and when its outcome arrived, per record. A key's
    records live in one partition and each gets one outcome, published in the order
    they were processed, so the n-th outcome of a key answers its n-th record; that holds
    on one outcome topic, so outcomes of ``rejections_topic`` are counted apart
    (``rejected``): a run whose keys carry several records must have none."""

    def __init__(self, rejections_topic: str | None = None) -> None:
        self.rejections_topic = rejections_topic
        self.reset()

    def reset(self) -> None:
        """Forget every send and arrival (a warm-up's)."""
        self.sent: dict[bytes, list[float]] = {}
        self.arrived: dict[bytes, list[float]] = {}
        self.order: list[tuple[bytes, int]] = []  # (key, n-th record of it), sent order
        self.received = 0
        self.rejected = 0

    def mark_sent(self, key: bytes, at: float) -> None:
        times = self.sent.setdefault(key, [])
        self.order.append((key, len(times)))
        times.append(at)

    def mark_arrived(self, key: bytes, topic: str, at: float) -> None:
        self.arrived.setdefault(key, []).append(at)
        self.received += 1
        self.rejected += topic == self.rejections_topic

    def latencies_ms(self) -> list[float]:
        """Sent -> outcome arrived of every record answered, in ms, in sent order."""
        out = []
        for key, n in self.order:
            arrived = self.arrived.get(key, ())
            if n < len(arrived):
                out.append((arrived[n] - self.sent[key][n]) * 1000)
        return out

    def percentiles(self) -> tuple[float, float, int]:
        """(p50 ms, p99 ms, samples)."""
        return p50_p99(self.latencies_ms())


class LatencyProbe(RecordClock):
    """Produce -> outcome consumed, per record (``RecordClock``): a paced producer marks
    when each record was produced, a consumer (from the topics' end) when outcomes
    arrive."""

    def __init__(self, settings: Settings, topics: list[str],
                 rejections_topic: str | None = None) -> None:
        super().__init__(rejections_topic)
        self.consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                                  "group.id": unique_name("bench-latency"),
                                  "enable.auto.commit": False})
        # Each partition from its end offset as the broker reports it NOW (a ListOffsets
        # answer awaited here): an outcome published after this line is never skipped.
        # Assigning at OFFSET_END left the lookup to the first fetch; when it came late
        # (a broker just restarted, a topic just made), an early outcome fell before
        # the resolved end and was never seen.
        self.consumer.assign(end_offsets(
            self.consumer, [TopicPartition(t, p) for t in topics
                            for p in range(settings.partitions)]))
        # The bench's older objects out of the collector's reach: a gen-2 collection of
        # this process (71 ms seen mid-run) would delay the probe's clock and sends,
        # whichever line it fell in.
        gc.collect()
        gc.freeze()

    def pace(self, send, items: list[tuple[bytes, bytes]], rate: float,
             ready: threading.Event | None = None) -> threading.Thread:
        """Start sending ``items`` at ``rate`` per second with ``send(key, value)``, once
        ``ready`` is set (the consumer under test has its partitions)."""
        def run() -> None:
            if ready is not None:
                ready.wait(60)
            t0 = time.monotonic()
            for i, (key, value) in enumerate(items):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.mark_sent(key, time.monotonic())
                send(key, value)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def collect(self, total: int, timeout_s: float) -> None:
        """Time arrivals until ``total`` outcomes came (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.received < total and time.monotonic() < deadline:
            for msg in consume_now(self.consumer, 0.1):
                if not msg.error():
                    self.mark_arrived(msg.key(), msg.topic(), time.monotonic())

    def close(self) -> None:
        self.consumer.close()
