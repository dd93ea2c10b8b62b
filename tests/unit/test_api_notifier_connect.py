"""The decision notifier's connect and restarts (services/api/notifier.py), session 44.

- Partitions whose leader cannot answer do not delay the others: their ends were asked
  one after another, each waiting out its 10 s timeout, so a topic with several
  leaderless partitions kept every waiter from being woken for tens of seconds. A
  partition the metadata names no leader for is not asked; the others are asked at once.
- A restart for changed topics (``TopicsChanged``) waits a bounded, growing, jittered
  delay after the first: topics that kept changing (or metadata that kept disagreeing)
  restarted the consumer in a tight loop.

Kafka is ``tests/unit/notifier_world.py``'s fake, with partitions beyond the first."""

from __future__ import annotations

import contextlib
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.api import metrics
from services.api import notifier as notifier_module
from services.api.waiters import PromotionWaiters
from tests.unit.notifier_world import (
    FakeConsumer,
    decision_wakes_its_waiter,
    fake_kafka,
    notifier_of,
    partition_meta,
    topics_meta,
)

BOUND_S = 30  # a bound on waits that end at once when the notifier is right
EXTRA = (1, 2, 3, 4)  # the rejections topic's partitions beyond 0, whose leader is away


class AwayLeaders(FakeConsumer):
    """Partitions ``EXTRA`` of the rejections topic cannot answer for their end.
    ``leader``: what the metadata says of them (-1: none; else a broker that is
    away, the metadata not caught up). An ask of their end waits ``gate`` (the test's
    stand-in for librdkafka's wait up to the timeout), then fails."""

    leader = -1
    gate: threading.Barrier | threading.Event
    asked: list[int]
    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()

    def list_topics(self, timeout: float = -1):
        return topics_meta({"ck": {0: partition_meta(1)},
                            "rj": {0: partition_meta(1),
                                   **{p: partition_meta(self.leader) for p in EXTRA}}})

    def get_watermark_offsets(self, tp, timeout: float = -1, cached: bool = False):
        if tp.partition == 0:
            return super().get_watermark_offsets(tp, timeout, cached)
        cls = type(self)
        with cls.lock:
            cls.asked.append(tp.partition)
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            if isinstance(cls.gate, threading.Barrier):
                with contextlib.suppress(threading.BrokenBarrierError):
                    cls.gate.wait(timeout)
            else:
                cls.gate.wait()
        finally:
            with cls.lock:
                cls.in_flight -= 1
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))


@pytest.fixture
def away(monkeypatch) -> type[AwayLeaders]:
    fake_kafka(monkeypatch, AwayLeaders)
    AwayLeaders.asked, AwayLeaders.in_flight, AwayLeaders.most_in_flight = [], 0, 0
    return AwayLeaders


def test_partitions_with_no_leader_do_not_delay_the_others_decisions(away):
    """Four partitions the metadata names no leader for, whose asks would not end in
    this test: a decision on a partition with a leader wakes its waiter. Before, the
    connect asked their ends one after another, 10 s each (here: never answered)."""
    away.leader, away.gate = -1, threading.Event()
    try:
        assert decision_wakes_its_waiter(FakeConsumer.broker, BOUND_S, topics_check_s=0.05), (
            "a decision on a partition with a leader woke nobody")
    finally:
        away.gate.set()


def test_partitions_whose_leader_is_away_are_asked_at_once(away):
    """The metadata still names a leader for four partitions, but it is away: their
    ends are asked at once, so the connect waits one timeout, not one per partition
    (before: 4 x 10 s, every waiter delayed 40 s). The asks pass the gate only all
    together; one after another, each waits out its timeout."""
    away.leader, away.gate = 1, threading.Barrier(len(EXTRA))
    woken = decision_wakes_its_waiter(FakeConsumer.broker, BOUND_S, topics_check_s=0.05)
    assert sorted(set(away.asked)) == list(EXTRA)
    assert away.most_in_flight == len(EXTRA), "the partitions' ends were asked one by one"
    assert woken, "a decision on a partition with a leader woke nobody"


class ChangingTopics(FakeConsumer):
    """Every topics check finds another partition count than the connect did (a topic
    that keeps changing, or brokers whose metadata keeps disagreeing)."""

    def list_topics(self, timeout: float = -1):
        self.looks = getattr(self, "looks", 0) + 1
        count = 1 if self.looks == 1 else 2
        return topics_meta({topic: {p: partition_meta(1) for p in range(count)}
                            for topic in ("ck", "rj")})


def test_restarts_for_changing_topics_back_off(monkeypatch):
    """Topics that change at every check: the notifier restarts at once the first
    time, then after delays growing to a bound, each shown in the gauge and counted.
    Before, it restarted in a tight loop (no delay at all)."""
    fake_kafka(monkeypatch, ChangingTopics)
    delays: list[float] = []

    class Recorded(notifier_module.RestartBackoff):
        def next_delay(self, ran_s: float) -> float:
            delay = super().next_delay(ran_s)
            delays.append(delay)
            if len(delays) >= 6:
                done.set()
            return delay

    done = threading.Event()
    restarts = metrics.NOTIFIER_RESTARTS.labels("topics_changed")
    before = restarts._value.get()
    notifier = notifier_of(
        PromotionWaiters(), poll_timeout_s=0.001, topics_check_s=0.001,
        restart_backoff=Recorded(first_s=0.01, max_s=0.04, steady_s=60, rand=lambda: 1.0))
    notifier.start()
    try:
        assert done.wait(BOUND_S), "the notifier did not restart six times"
    finally:
        notifier.stop()
    assert delays[:6] == [0.0, 0.01, 0.02, 0.04, 0.04, 0.04]
    assert restarts._value.get() - before == len(delays)
    assert metrics.NOTIFIER_RESTART_DELAY._value.get() == delays[-1]


def test_the_restart_delay_is_jittered_bounded_and_starts_over_after_a_steady_run():
    backoff = notifier_module.RestartBackoff(first_s=1.0, max_s=8.0, steady_s=60,
                                             rand=lambda: 0.0)
    assert [backoff.next_delay(0.1) for _ in range(7)] == [0.0, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.next_delay(60.0) == 0.0  # followed 60 s: the count starts over
    assert backoff.next_delay(0.1) == 0.5
    draws = iter([0.0, 0.5, 1.0])
    jittered = notifier_module.RestartBackoff(first_s=2.0, max_s=30, rand=lambda: next(draws))
    jittered.next_delay(0)
    assert [jittered.next_delay(0) for _ in range(3)] == [1.0, 3.0, 8.0]

