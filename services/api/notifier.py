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
  others are followed meanwhile, where the notifier restarted for ever;
- a promotion record that woke no waiting request is also handed to ``on_promoted``
  (the cache pre-warmer, which only schedules: the consumer never waits on a storage
  read); a woken request reads the promoted row itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from services.api import metrics
from services.api.waiters import PromotionWaiters

log = logging.getLogger("ratchet.api.notifier")
KAFKA_LOG = logging.getLogger("ratchet.api.kafka")

# How often the followed topics' partitions are compared with the broker's (one metadata
# request): a partition added to a decision topic is followed within this.
TOPICS_CHECK_S = 10.0

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
    ) -> None:
        """``topics`` maps a full topic name to the decision it carries
        (``promoted`` or ``rejected``). ``topics_check_s``: how often the topics'
        partitions are compared with the ones followed (``TopicsChanged``)."""
        self._bootstrap = bootstrap
        self._topics = topics
        self._waiters = waiters
        self._decode = decode_response_id
        self._poll_timeout_s = poll_timeout_s
        self._on_promoted = on_promoted
        self._topics_check_s = topics_check_s
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
            try:
                self._consume()
            except TopicsChanged as exc:
                # Followed again at once: positioned at the new ends, everyone woken.
                log.warning("decision topics changed; following them again: %s", exc)
            except TopicsMissing as exc:
                # An API started before the worker created the topics (a first start):
                # expected, and said once per retry without a traceback.
                log.warning("decision notifier waiting for its topics (the worker creates "
                            "them at its start); retrying in 2 s: %s", exc)
                self._down_for_a_while()
            except Exception:  # a broken broker connection must not kill waiting
                log.exception("decision notifier failed; restarting in 2 s")
                self._down_for_a_while()

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
                    self._check_topics(consumer, followed)
                    if unread:
                        unread = self._follow_unread(consumer, unread)
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
        for ever, an outside review, session 43). None readable: ``KafkaException``."""
        meta = consumer.list_topics(timeout=10)
        assignment: list[TopicPartition] = []
        unread: list[TopicPartition] = []
        error: KafkaException | None = None
        for topic in self._topics:
            info = meta.topics.get(topic)
            if info is None:
                raise TopicsMissing(f"topic {topic} does not exist")
            if info.error is not None:
                raise TopicsMissing(f"topic {topic} is not available: {info.error}")
            for partition in info.partitions:
                # The end as of now, not ``OFFSET_END``: librdkafka resolves a logical
                # offset at its first fetch, later, so a record published in between
                # would be skipped after the wake-up of ``_consume``.
                try:
                    _, end = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=10, cached=False)
                except KafkaException as exc:
                    error = exc
                    unread.append(TopicPartition(topic, partition))
                    continue
                assignment.append(TopicPartition(topic, partition, end))
        if not assignment and error is not None:
            raise error
        if unread:
            log.warning("decision partitions not followed until their end can be read "
                        "(looked at again every %.0f s): %s", self._topics_check_s,
                        _names(unread), extra={"ctx": {"error": str(error)}})
        return assignment, unread

    def _follow_unread(self, consumer: Consumer,
                       unread: list[TopicPartition]) -> list[TopicPartition]:
        """Adds to the assignment the ``unread`` partitions whose end can be read now,
        positioned there, then wakes every waiter (a decision published there before
        this position is one the consumer never sees). The ones still unread."""
        added, left = [], []
        for tp in unread:
            try:
                _, end = consumer.get_watermark_offsets(tp, timeout=1, cached=False)
            except KafkaException:
                left.append(tp)
                continue
            added.append(TopicPartition(tp.topic, tp.partition, end))
        if added:
            consumer.incremental_assign(added)
            self._waiters.notify_all()
            log.info("decision partitions followed: %s", _names(added))
        return left

    def _check_topics(self, consumer: Consumer, followed: dict[str, int]) -> None:
        """``TopicsChanged`` when a topic's partitions are not the ones followed (a
        partition added: its decisions would wake nobody; a topic deleted). A failed
        look says nothing: the next one looks again."""
        try:
            meta = consumer.list_topics(timeout=5)
        except KafkaException:
            return
        for topic, count in followed.items():
            info = meta.topics.get(topic)
            if info is None:
                raise TopicsChanged(f"topic {topic} is gone")
            if info.error is None and len(info.partitions) != count:
                raise TopicsChanged(f"topic {topic} has {len(info.partitions)} partitions, "
                                    f"{count} followed")

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


def _names(partitions: list[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions)


def _found_in(record: Any) -> tuple[str, str] | None:
    """(tenant id, partition key) of a decision record: where its response lives."""
    tenant_id = getattr(record, "tenant_id", None)
    partition_key = getattr(record, "partition_key", None)
    if isinstance(tenant_id, str) and isinstance(partition_key, str):
        return tenant_id, partition_key
    return None
