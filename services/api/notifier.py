"""Follows the decision topics and wakes ``wait_ms`` requests (see ``waiters``).

Design:
- one confluent-kafka consumer per API process, in a daemon thread;
- it ``assign``s every partition of ``ratchet.checkpoints`` and ``ratchet.rejections``
  at its end as read when it connects (the high watermark, a concrete offset): only
  decisions made from then on are delivered, and once positioned (on every connect,
  the first one and each restart) it wakes every waiter, because a decision published
  before that is durable but may have come after a waiting request's read (the API
  serves while the notifier connects);
- no consumer group offsets are committed (``enable.auto.commit=false``): every API
  replica needs every decision for its own waiters, and a restart loses nothing;
- each record is decoded to learn its ``response_id``; a record that cannot be
  decoded wakes every waiter (a spurious wake-up costs one read, a lost one a timeout);
- a woken request learns the partition the record names (``Ticket.found_in``);
- the topics are followed again (positioned, everyone woken) when they change under it:
  a partition added (its partitions are compared every ``TOPICS_CHECK_S``), a topic
  deleted, or a position the broker no longer has (a topic created again; librdkafka
  would jump to the end silently, ``auto.offset.reset`` is ``error``);
- a partition whose end cannot be read when it connects (no leader) is followed once
  it can be (looked at again every ``TOPICS_CHECK_S``, everyone woken then): the
  others are followed meanwhile, where the notifier restarted for ever. A partition
  the metadata names no leader for is not asked at all, and the others' ends are asked
  at once (``_ends``): each partition whose leader cannot answer cost the connect its
  10 s timeout one after another, every waiter delayed tens of seconds (session 44);
- a restart for changed topics (``TopicsChanged``) waits a bounded, jittered, growing
  delay after the first (``RestartBackoff``): topics that keep changing, or metadata
  that keeps disagreeing, restarted the consumer in a tight loop (session 44);
- a promotion record that woke no waiting request is also handed to ``on_promoted``
  (the cache pre-warmer, which only schedules: the consumer never waits on a storage
  read); a woken request reads the promoted row itself.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from services.api import metrics
from services.api.waiters import PromotionWaiters

log = logging.getLogger("ratchet.api.notifier")
KAFKA_LOG = logging.getLogger("ratchet.api.kafka")

# How often the followed topics' partitions are compared with the broker's (one metadata
# request): a partition added to a decision topic is followed within this.
TOPICS_CHECK_S = 10.0
# How long the end of one partition is waited for when the notifier connects, and when
# it looks again at a partition it could not read; the ends are asked at once, at most
# ``END_QUERIES`` at a time (one thread each, for the length of the ask).
END_TIMEOUT_S = 10.0
FOLLOW_UP_TIMEOUT_S = 1.0
END_QUERIES = 32

# (topic, raw value) -> the decoded record (it has a ``response_id``), or raises when
# the record cannot be decoded.
ResponseIdDecoder = Callable[[str, bytes], Any]


class DecisionNotifier:
    """Background consumer of promotions and rejections; ``start``/``stop`` it once."""

    def __init__(
        self,
        bootstrap: str,
        topics: dict[str, str],
        waiters: PromotionWaiters,
        decode_response_id: ResponseIdDecoder,
        poll_timeout_s: float = 0.2,
        on_promoted: Callable[[Any], None] | None = None,
        topics_check_s: float = TOPICS_CHECK_S,
        restart_backoff: RestartBackoff | None = None,
    ) -> None:
        """``topics`` maps a full topic name to the decision it carries
        (``promoted`` or ``rejected``). ``topics_check_s``: how often the topics'
        partitions are compared with the ones followed (``TopicsChanged``);
        ``restart_backoff``: the delays between such restarts (``RestartBackoff``)."""
        self._bootstrap = bootstrap
        self._topics = topics
        self._waiters = waiters
        self._decode = decode_response_id
        self._poll_timeout_s = poll_timeout_s
        self._on_promoted = on_promoted
        self._topics_check_s = topics_check_s
        self._backoff = restart_backoff if restart_backoff is not None else RestartBackoff()
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def up(self) -> bool:
        return self._assigned.is_set() and not self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-notifier", daemon=True)
        self._thread.start()

    def wait_assigned(self, timeout_s: float) -> bool:
        """True once the consumer is positioned at the end of every partition."""
        return self._assigned.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._consume()
            except TopicsChanged as exc:
                # Followed again (positioned at the new ends, everyone woken), at once
                # the first time, then after a growing delay (``RestartBackoff``).
                self._restart_later(exc, time.monotonic() - started)
            except TopicsMissing as exc:
                # An API started before the worker created the topics (a first start):
                # expected, and said once per retry without a traceback.
                log.warning("decision notifier waiting for its topics (the worker creates "
                            "them at its start); retrying in 2 s: %s", exc)
                self._down_for_a_while()
            except Exception:  # a broken broker connection must not kill waiting
                log.exception("decision notifier failed; restarting in 2 s")
                self._down_for_a_while()

    def _restart_later(self, exc: TopicsChanged, ran_s: float) -> None:
        delay = self._backoff.next_delay(ran_s)
        metrics.NOTIFIER_RESTARTS.labels("topics_changed").inc()
        metrics.NOTIFIER_RESTART_DELAY.set(delay)
        log.warning("decision topics changed; following them again in %.2f s: %s", delay,
                    exc, extra={"ctx": {"restart_delay_s": round(delay, 3),
                                        "restarts_in_a_row": self._backoff.restarts}})
        if delay > 0:
            # Not following meanwhile: a waiter's deadline read covers it, and the next
            # connect wakes everyone once positioned.
            metrics.NOTIFIER_UP.set(0)
            self._assigned.clear()
            self._stop.wait(delay)

    def _down_for_a_while(self) -> None:
        metrics.NOTIFIER_UP.set(0)
        self._assigned.clear()
        # Anyone waiting may have missed a decision while we were down.
        self._waiters.notify_all()
        self._stop.wait(2.0)

    def _consume(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "ratchet-api-notifier",  # required by librdkafka; never committed
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                "topic.metadata.refresh.interval.ms": 30000,
                # A position the broker no longer has (a topic deleted and created
                # again) is an error here, not a silent jump to the end past the
                # decisions published since: the notifier follows the topics again.
                "auto.offset.reset": "error",
                # librdkafka's own lines (a broker down: one per reconnect) through
                # Python logging, so the API's log stays JSON lines (services/api/logs.py).
                "logger": KAFKA_LOG,
            }
        )
        try:
            assignment, unread = self._end_of_every_partition(consumer)
            consumer.assign(assignment)
            followed = _partition_counts(assignment + unread)
            # A decision published before these ends is one this consumer never sees,
            # and a request may have registered and read before it was published (the
            # API serves while the notifier connects or reconnects): such a request is
            # woken now, its re-read sees the decision (an outside review, session 43).
            self._waiters.notify_all()
            self._assigned.set()
            metrics.NOTIFIER_UP.set(1)
            log.info("decision notifier assigned", extra={"ctx": {"topics": list(self._topics)}})
            polls = 0
            next_check = time.monotonic() + self._topics_check_s
            while not self._stop.is_set():
                msg = consumer.poll(self._poll_timeout_s)
                polls += 1
                if polls % 50 == 0:
                    self._report_lag(consumer)
                if time.monotonic() >= next_check:
                    meta = self._check_topics(consumer, followed)
                    if unread:
                        unread = self._follow_unread(consumer, unread, meta)
                    next_check = time.monotonic() + self._topics_check_s
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().fatal():
                        raise KafkaException(msg.error())
                    if msg.error().code() == KafkaError._AUTO_OFFSET_RESET:
                        raise TopicsChanged(f"position lost: {msg.error()}")
                    continue
                self._handle(msg.topic(), msg.value())
        finally:
            consumer.close()

    def _end_of_every_partition(
        self, consumer: Consumer
    ) -> tuple[list[TopicPartition], list[TopicPartition]]:
        """Every partition at its end, and the partitions whose end could not be read (no
        leader: a broker down in a cluster). Those are followed later (``_follow_unread``):
        one of them must not keep the notifier from following the others (it restarted
        for ever, an outside review, session 43). A partition the metadata names no
        leader for is not asked (its ask would only wait out its timeout), the others'
        ends are asked at once (``_ends``): asked one after another, each partition whose
        leader could not answer added its 10 s to the connect (session 44). None
        readable: ``KafkaException``."""
        meta = consumer.list_topics(timeout=10)
        partitions: list[TopicPartition] = []
        unread: list[TopicPartition] = []
        for topic in self._topics:
            info = meta.topics.get(topic)
            if info is None:
                raise TopicsMissing(f"topic {topic} does not exist")
            if info.error is not None:
                raise TopicsMissing(f"topic {topic} is not available: {info.error}")
            for partition, about in info.partitions.items():
                tp = TopicPartition(topic, partition)
                (partitions if _has_leader(about) else unread).append(tp)
        # The end as of now, not ``OFFSET_END``: librdkafka resolves a logical offset at
        # its first fetch, later, so a record published in between would be skipped
        # after the wake-up of ``_consume``.
        assignment, failed, error = _ends(consumer, partitions, END_TIMEOUT_S)
        unread += failed
        if not assignment:
            raise error if error is not None else KafkaException(
                KafkaError(KafkaError.LEADER_NOT_AVAILABLE,
                           f"no decision partition has a leader: {_names(unread)}"))
        if unread:
            log.warning("decision partitions not followed until their end can be read "
                        "(looked at again every %.0f s): %s", self._topics_check_s,
                        _names(unread),
                        extra={"ctx": {"error": "no leader" if error is None else str(error)}})
        return assignment, unread

    def _follow_unread(self, consumer: Consumer, unread: list[TopicPartition],
                       meta: Any) -> list[TopicPartition]:
        """Adds to the assignment the ``unread`` partitions whose end can be read now,
        positioned there, then wakes every waiter (a decision published there before
        this position is one the consumer never sees). Only those ``meta`` (the topics
        check's metadata; None: not read) names a leader for are asked, all at once
        (the poll waits meanwhile, ``FOLLOW_UP_TIMEOUT_S`` at most, not that per
        partition). The ones still unread."""
        asked, left = [], []
        for tp in unread:
            about = None if meta is None else _partition_meta(meta, tp)
            (asked if meta is None or _has_leader(about) else left).append(tp)
        added, failed, _ = _ends(consumer, asked, FOLLOW_UP_TIMEOUT_S)
        if added:
            consumer.incremental_assign(added)
            self._waiters.notify_all()
            log.info("decision partitions followed: %s", _names(added))
        return left + failed

    def _check_topics(self, consumer: Consumer, followed: dict[str, int]) -> Any:
        """``TopicsChanged`` when a topic's partitions are not the ones followed (a
        partition added: its decisions would wake nobody; a topic deleted). A failed
        look says nothing: the next one looks again. The metadata read, or None."""
        try:
            meta = consumer.list_topics(timeout=5)
        except KafkaException:
            return None
        for topic, count in followed.items():
            info = meta.topics.get(topic)
            if info is None:
                raise TopicsChanged(f"topic {topic} is gone")
            if info.error is None and len(info.partitions) != count:
                raise TopicsChanged(f"topic {topic} has {len(info.partitions)} partitions, "
                                    f"{count} followed")
        return meta

    def _handle(self, topic: str, value: bytes | None) -> None:
        decision = self._topics.get(topic, "unknown")
        try:
            record = self._decode(topic, value or b"")
            response_id = record if isinstance(record, str) else record.response_id
        except Exception as exc:
            metrics.NOTIFIER_RECORDS.labels(topic, "undecodable").inc()
            log.warning(
                "undecodable decision record; waking all waiters",
                extra={"ctx": {"topic": topic, "error": repr(exc)}},
            )
            self._waiters.notify_all()
            return
        metrics.NOTIFIER_RECORDS.labels(topic, "decoded").inc()
        woken = self._waiters.notify(response_id, decision, _found_in(record))
        if decision != "promoted" or self._on_promoted is None or isinstance(record, str):
            return
        if woken:
            # The woken request reads this very row: warming beside it would read and
            # verify it twice (the answer is the same either way).
            metrics.PREWARM.labels("woken").inc()
            return
        self._on_promoted(record)

    def _report_lag(self, consumer: Consumer) -> None:
        try:
            positions = consumer.position(consumer.assignment())
            lag: dict[str, int] = {}
            for tp in positions:
                _, high = consumer.get_watermark_offsets(tp, cached=True)
                if tp.offset >= 0 and high >= 0:
                    lag[tp.topic] = lag.get(tp.topic, 0) + max(0, high - tp.offset)
            for topic, value in lag.items():
                metrics.NOTIFIER_LAG.labels(topic).set(value)
        except KafkaException:
            pass


class RestartBackoff:
    """The delays between restarts for changed topics (``TopicsChanged``): none for the
    first (a partition added is followed at once), then ``first_s`` doubling up to
    ``max_s``, each drawn between half and all of that (jitter: replicas restarted by the
    same change do not reconnect together). A consumer that followed the topics for
    ``steady_s`` before the change starts the count over. One thread's (the notifier's)."""

    def __init__(self, first_s: float = 1.0, max_s: float = 30.0, steady_s: float = 60.0,
                 rand: Callable[[], float] = random.random) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.steady_s = steady_s
        self._rand = rand
        self.restarts = 0  # in a row

    def next_delay(self, ran_s: float) -> float:
        """The delay before the restart after a consumer that ran ``ran_s``."""
        if ran_s >= self.steady_s:
            self.restarts = 0
        self.restarts += 1
        if self.restarts == 1:
            return 0.0
        ceiling = min(self.max_s, self.first_s * 2 ** (self.restarts - 2))
        return ceiling * (0.5 + 0.5 * self._rand())


class TopicsMissing(KafkaException):
    """A decision topic the notifier follows does not exist (yet)."""


class TopicsChanged(Exception):
    """The decision topics are no longer what the consumer follows: a partition was
    added, a topic is gone, or a position was lost (a topic created again)."""


def _partition_counts(assignment: list[TopicPartition]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for tp in assignment:
        counts[tp.topic] = counts.get(tp.topic, 0) + 1
    return counts


def _ends(consumer: Consumer, partitions: list[TopicPartition], timeout_s: float
          ) -> tuple[list[TopicPartition], list[TopicPartition], KafkaException | None]:
    """The end (high watermark) of each partition, asked at once (``END_QUERIES``
    threads; librdkafka's query is thread-safe): the partitions positioned at their end,
    the ones whose end could not be read, and the last such error. Returns once every
    ask has ended (each within ``timeout_s``): none is left running on the consumer."""
    if not partitions:
        return [], [], None
    with ThreadPoolExecutor(min(len(partitions), END_QUERIES),
                            thread_name_prefix="decision-ends") as pool:
        asks = [(tp, pool.submit(consumer.get_watermark_offsets, tp, timeout=timeout_s,
                                 cached=False)) for tp in partitions]
    read: list[TopicPartition] = []
    failed: list[TopicPartition] = []
    error: KafkaException | None = None
    for tp, ask in asks:
        exc = ask.exception()
        if exc is None:
            read.append(TopicPartition(tp.topic, tp.partition, ask.result()[1]))
        elif isinstance(exc, KafkaException):
            error = exc
            failed.append(tp)
        else:
            raise exc
    return read, failed, error


def _has_leader(about: Any) -> bool:
    """Whether a partition's metadata names a leader (librdkafka: -1 when none; its
    ``error`` may be a follower replica's, the leader serving). No metadata: asked."""
    return about is None or about.leader >= 0


def _partition_meta(meta: Any, tp: TopicPartition) -> Any:
    info = meta.topics.get(tp.topic)
    return None if info is None else info.partitions.get(tp.partition)


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions)


def _found_in(record: Any) -> tuple[str, str] | None:
    """(tenant id, partition key) of a decision record: where its response lives."""
    tenant_id = getattr(record, "tenant_id", None)
    partition_key = getattr(record, "partition_key", None)
    if isinstance(tenant_id, str) and isinstance(partition_key, str):
        return tenant_id, partition_key
    return None
