"""The decision notifier's connect, restarts and the calls beside its poll
(services/api/notifier.py), sessions 44 and 45.

- Partitions whose leader cannot answer do not delay the others: their ends were asked
  one after another, each waiting out its 10 s timeout, so a topic with several
  leaderless partitions kept every waiter from being woken for tens of seconds. A
  partition the metadata names no leader for is not asked; the others are asked at once.
- A partition whose leader is named but away (stale metadata) no longer holds the
  connect for its ask's timeout: the others are followed, and it once its end is read
  (session 45).
- The topics check runs beside the poll: while it waits for brokers that do not
  answer, decisions still wake their waiters (session 45).
- A restart, whatever its cause (changed topics, missing topics, a failed consumer),
  waits a bounded, growing, jittered delay after the first: topics that kept changing
  restarted the consumer in a tight loop (session 44), the other causes waited a fixed
  2 s (session 45).

Kafka is ``tests/unit/notifier_world.py``'s fake, with partitions beyond the first."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.api import metrics
from services.api import notifier as notifier_module
from services.api.waiters import PromotionWaiters
from tests.unit.notifier_world import (
    FakeConsumer,
    decision_wakes_its_waiter,
    fake_kafka,
    following,
    notifier_of,
    partition_meta,
    topics_meta,
    woken,
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


class StaleLeaders(FakeConsumer):
    """The metadata names a leader for every partition, but the rejections topic's
    leader is away: an ask of its end waits for ``gate`` (the test's stand-in for
    librdkafka's wait up to the timeout), then answers if ``answers`` else fails."""

    gate: threading.Event
    answers = True

    def list_topics(self, timeout: float = -1):
        return topics_meta({"ck": {0: partition_meta(1)},
                            "rj": {p: partition_meta(2) for p in range(4)}})

    def get_watermark_offsets(self, tp, timeout: float = -1, cached: bool = False):
        if tp.topic == "rj":
            type(self).gate.wait()
            if not type(self).answers:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return super().get_watermark_offsets(tp, timeout, cached)


@pytest.mark.parametrize("its_ask", ["answers", "fails"])
def test_a_partition_whose_named_leader_is_away_does_not_hold_the_others_up(
        monkeypatch, its_ask):
    """Stale metadata: the rejections topic's leader is named but away, its asks do not
    end until the test opens the gate. A decision on the checkpoints topic wakes its
    waiter meanwhile. The asks then answer, or fail (their timeout) and the partitions
    are asked again at a later topics check once the leader is back: either way the
    rejections topic is followed. Before, the connect waited for every ask
    (librdkafka's 10 s timeout; here: until the gate opens, never)."""
    broker = fake_kafka(monkeypatch, StaleLeaders)
    StaleLeaders.gate, StaleLeaders.answers = threading.Event(), its_ask == "answers"

    async def scenario() -> tuple[bool, bool]:
        waiters = PromotionWaiters()
        async with following(notifier_of(waiters, topics_check_s=0.05),
                             BOUND_S) as positioned:
            ticket = waiters.register("resp_1")
            broker.produce("ck", b"resp_1")
            promoted = positioned and await woken(ticket, BOUND_S)
            StaleLeaders.gate.set()  # the asks end: answered, or failed
            await asyncio.sleep(0.2)
            StaleLeaders.answers = True  # the leader is back (a topics check asks again)
            await asyncio.sleep(0.3)  # followed (everyone woken then)
            rejected = waiters.register("resp_2")
            broker.produce("rj", b"resp_2")
            return promoted, await woken(rejected, BOUND_S)

    promoted, followed_later = _run_opening(StaleLeaders.gate, scenario)
    assert promoted, "a decision on a partition whose leader answers woke nobody"
    assert followed_later, "the partition whose leader answered later is not followed"


class HangingCheck(FakeConsumer):
    """Brokers that stop answering after the connect: a topics check's metadata request
    waits for ``gate`` (the test's stand-in for its 5 s timeout, which comes again at
    every check while they do not answer), then says ``partitions`` per topic."""

    gate: threading.Event
    checking: threading.Event
    partitions = 1

    def list_topics(self, timeout: float = -1):
        self.looks = getattr(self, "looks", 0) + 1
        if self.looks > 1:
            type(self).checking.set()
            type(self).gate.wait()
        return topics_meta({topic: {p: partition_meta(1) for p in range(self.partitions)}
                            for topic in ("ck", "rj")})


def test_a_topics_check_waiting_on_the_brokers_does_not_hold_decisions_up(monkeypatch):
    """While a topics check waits for its metadata, a decision delivered by the poll
    wakes its waiter; what the check finds once it answers still counts (a partition
    added: the consumer restarts to follow it). Before, the check ran on the poll
    thread: no decision was delivered until it ended (librdkafka's 5 s; here: never)."""
    broker = fake_kafka(monkeypatch, HangingCheck)
    HangingCheck.gate, HangingCheck.checking = threading.Event(), threading.Event()
    HangingCheck.partitions = 1

    async def scenario() -> tuple[bool, bool]:
        waiters = PromotionWaiters()
        loop = asyncio.get_running_loop()
        async with following(notifier_of(waiters, topics_check_s=0.01), BOUND_S):
            assert await loop.run_in_executor(None, HangingCheck.checking.wait, BOUND_S)
            ticket = waiters.register("resp_1")
            broker.produce("ck", b"resp_1")
            promoted = await woken(ticket, 2)
            HangingCheck.partitions = 2  # a partition added, seen once the check answers
            HangingCheck.gate.set()
            restarted = await loop.run_in_executor(
                None, lambda: _until(lambda: broker.consumers >= 2))
            return promoted, restarted

    promoted, restarted = _run_opening(HangingCheck.gate, scenario)
    assert promoted, "a decision waited for the topics check"
    assert restarted, "the partition the check found added was not followed"


def _run_opening(gate: threading.Event, scenario):
    """``asyncio.run(scenario())``, ``gate`` opened at the end whatever happened (a
    thread beside the poll, or the poll itself before session 45, may wait on it)."""
    try:
        return asyncio.run(scenario())
    finally:
        gate.set()


def _until(condition, bound_s: float = BOUND_S) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


class BrokenConnection(FakeConsumer):
    """Every consumer's first poll fails (a broken broker connection)."""

    def poll(self, timeout: float):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker connection lost"))


class NoTopics(FakeConsumer):
    """The decision topics do not exist (an API started before the worker)."""

    def list_topics(self, timeout: float = -1):
        return SimpleNamespace(topics={})


@pytest.mark.parametrize(("consumer", "cause"), [(ChangingTopics, "topics_changed"),
                                                 (BrokenConnection, "failed"),
                                                 (NoTopics, "topics_missing")])
def test_restarts_back_off_whatever_their_cause(monkeypatch, caplog, consumer, cause):
    """Topics that change at every check, a consumer that keeps failing, or topics that
    stay missing: the notifier restarts at once the first time, then after delays
    growing to a bound, each shown in the gauge, counted by cause and logged with its
    delay. Before, changed topics restarted in a tight loop (session 44), and the other
    causes after a fixed 2 s every time, the backoff never asked (session 45)."""
    fake_kafka(monkeypatch, consumer)
    delays: list[float] = []
    done = threading.Event()

    class Recorded(notifier_module.RestartBackoff):
        def next_delay(self, ran_s: float) -> float:
            delay = super().next_delay(ran_s)
            delays.append(delay)
            if len(delays) >= 6:
                done.set()
            return delay

    restarts = metrics.NOTIFIER_RESTARTS.labels(cause)
    before = restarts._value.get()
    caplog.set_level(logging.INFO, logger="ratchet.api.notifier")
    notifier = notifier_of(
        PromotionWaiters(), poll_timeout_s=0.001, topics_check_s=0.001,
        restart_backoff=Recorded(first_s=0.01, max_s=0.04, steady_s=60, rand=lambda: 1.0))
    notifier.start()
    try:
        assert done.wait(BOUND_S), "the notifier did not restart six times (backing off)"
    finally:
        notifier.stop()
    assert delays[:6] == [0.0, 0.01, 0.02, 0.04, 0.04, 0.04]
    assert restarts._value.get() - before == len(delays)
    assert metrics.NOTIFIER_RESTART_DELAY._value.get() == delays[-1]
    logged = [r.ctx for r in caplog.records if hasattr(r, "ctx") and "cause" in r.ctx]
    assert [c["restart_delay_s"] for c in logged[:6]] == delays[:6]
    assert {c["cause"] for c in logged} == {cause}
