"""Follows the decision topics and wakes ``wait_ms`` requests (see ``waiters``).

Design:
- one confluent-kafka consumer per API process, in a daemon thread (the poll thread);
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
- what may wait on a broker runs beside the poll, never in it (``_Beside``): the
  connect's first metadata request and the topics check (the same call, up to 5 s),
  and every ask of a partition's end (up to 10 s each, at most ``END_QUERIES`` at
  once). The poll thread starts them and takes what they found between two polls (the
  connect looks at the stop flag meanwhile); it alone assigns, wakes and restarts.
  Before session 45 the topics check ran on the poll thread: while the brokers did not
  answer, every decision's wake-up waited for it; before session 46 the connect's
  first metadata request did (up to 10 s): a stop waited out its join then;
- a stop is not a failure: what fails once the stop is asked (the brokers away while
  the API stops) is neither logged as an error nor restarted nor counted (session 46);
- a partition whose end is not read when it connects is followed once it is, everyone
  woken then: one the metadata names no leader for is not asked (looked at again at
  each topics check); the others are asked at once, and the connect waits for them
  only ``CONNECT_WAIT_S`` once one end is read. An ask still running then (a leader
  named but away: stale metadata) goes on beside the poll, its partition followed when
  it answers, or looked at again at the topics checks when it fails (session 45;
  before, such a partition held the connect for its 10 s timeout, and session 43 had
  one such wait per partition);
- a restart (changed topics, topics missing, any failure of the consumer) waits a
  bounded, jittered, growing delay after the first (``RestartBackoff``): topics that
  kept changing restarted the consumer in a tight loop (session 44), and the other
  causes waited a fixed 2 s (session 45);
- a promotion record that woke no waiting request is also handed to ``on_promoted``
  (the cache pre-warmer, which only schedules: the consumer never waits on a storage
  read); a woken request reads the promoted row itself.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from services.api import metrics
from services.api.waiters import PromotionWaiters

log = logging.getLogger("ratchet.api.notifier")
KAFKA_LOG = logging.getLogger("ratchet.api.kafka")

# How often the followed topics' partitions are compared with the broker's (one metadata
# request, beside the poll): a partition added to a decision topic is followed within this.
TOPICS_CHECK_S = 10.0
TOPICS_CHECK_TIMEOUT_S = 5.0
# How long the end of one partition is waited for (beside the poll, at most
# ``END_QUERIES`` asks at once, one thread each), and how long the connect waits for
# the asks still running once one end is read: the others are followed when they answer.
END_TIMEOUT_S = 10.0
END_QUERIES = 32
CONNECT_WAIT_S = 1.0
# How often the connect looks at the stop flag while it waits for its metadata or
# the first end.
_TAKE_S = 0.05

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
        connect_wait_s: float = CONNECT_WAIT_S,
    ) -> None:
        """``topics`` maps a full topic name to the decision it carries
        (``promoted`` or ``rejected``). ``topics_check_s``: how often the topics'
        partitions are compared with the ones followed (``TopicsChanged``);
        ``restart_backoff``: the delays between restarts (``RestartBackoff``);
        ``connect_wait_s``: how long the connect waits for the ends still asked once
        one is read."""
        self._bootstrap = bootstrap
        self._topics = topics
        self._waiters = waiters
        self._decode = decode_response_id
        self._poll_timeout_s = poll_timeout_s
        self._on_promoted = on_promoted
        self._topics_check_s = topics_check_s
        self._connect_wait_s = connect_wait_s
        self._backoff = restart_backoff if restart_backoff is not None else RestartBackoff()
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread: threading.Thread | None = None
        self._following_since: float | None = None

    @property
    def up(self) -> bool:
        return self._assigned.is_set() and not self._stop.is_set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decision-notifier", daemon=True)
        self._thread.start()

    def wait_assigned(self, timeout_s: float) -> bool:
        """True once the consumer is positioned at the end of every partition it could
        read (the others are followed once they can be)."""
        return self._assigned.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stops the poll thread; True once it has ended (within ``timeout_s``)."""
        self._stop.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._following_since = None
            try:
                self._consume()
            except Exception as exc:
                if self._stop.is_set():
                    # A call the stop came during failed after it (brokers away while
                    # the API stops): not a failure to report nor a restart (before
                    # session 46, logged ``failed; restarting`` at error level).
                    log.debug("decision notifier stopped; its consumer failed meanwhile: %r",
                              exc)
                    break
                self._restart_after(exc)
        # Not following once stopped (the gauge stayed 1 before session 46).
        self._assigned.clear()
        metrics.NOTIFIER_UP.set(0)

    def _restart_after(self, exc: Exception) -> None:
        if isinstance(exc, TopicsChanged):
            # Followed again (positioned at the new ends, everyone woken).
            self._restart_later("topics_changed", exc)
        elif isinstance(exc, TopicsMissing):
            # An API started before the worker created the topics (a first start):
            # expected, and said once per retry without a traceback.
            self._restart_later("topics_missing", exc)
        else:  # a broken broker connection must not kill waiting
            self._restart_later("failed", exc)

    def _restart_later(self, cause: str, exc: Exception) -> None:
        """The next consumer after a delay (``RestartBackoff``: at once the first time,
        then growing, jittered; the count starts over after a consumer that followed
        the topics ``steady_s``), counted, shown and logged. Every cause alike: before
        session 45 a broken connection and missing topics waited a fixed 2 s."""
        followed_s = (0.0 if self._following_since is None
                      else time.monotonic() - self._following_since)
        delay = self._backoff.next_delay(followed_s)
        metrics.NOTIFIER_RESTARTS.labels(cause).inc()
        metrics.NOTIFIER_RESTART_DELAY.set(delay)
        ctx = {"ctx": {"cause": cause, "restart_delay_s": round(delay, 3),
                       "restarts_in_a_row": self._backoff.restarts}}
        if cause == "topics_changed":
            log.warning("decision topics changed; following them again in %.2f s: %s",
                        delay, exc, extra=ctx)
        elif cause == "topics_missing":
            log.warning("decision notifier waiting for its topics (the worker creates "
                        "them at its start); retrying in %.2f s: %s", delay, exc, extra=ctx)
        else:
            log.error("decision notifier failed; restarting in %.2f s", delay,
                      exc_info=exc, extra=ctx)
        if cause != "topics_changed":
            # Anyone waiting may have missed a decision the broken consumer had not
            # delivered; the next connect wakes everyone again once positioned.
            self._waiters.notify_all()
        if delay > 0 or cause != "topics_changed":
            # Not following meanwhile: a waiter's deadline read covers it, and the next
            # connect wakes everyone once positioned.
            metrics.NOTIFIER_UP.set(0)
            self._assigned.clear()
            self._stop.wait(delay)

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
        beside = _Beside(consumer)
        try:
            self._follow(consumer, beside)
        finally:
            beside.close()  # closes the consumer once nothing beside the poll uses it

    def _follow(self, consumer: Consumer, beside: _Beside) -> None:
        state = self._connect(consumer, beside)
        if state is None:
            return  # stopped while connecting
        # A decision published before these ends is one this consumer never sees,
        # and a request may have registered and read before it was published (the
        # API serves while the notifier connects or reconnects): such a request is
        # woken now, its re-read sees the decision (an outside review, session 43).
        self._waiters.notify_all()
        self._assigned.set()
        self._following_since = time.monotonic()
        metrics.NOTIFIER_UP.set(1)
        log.info("decision notifier assigned", extra={"ctx": {"topics": list(self._topics)}})
        polls = 0
        next_check = time.monotonic() + self._topics_check_s
        while not self._stop.is_set():
            msg = consumer.poll(self._poll_timeout_s)
            polls += 1
            if polls % 50 == 0:
                self._report_lag(consumer)
            self._take(consumer, beside, state)
            if not beside.checking and time.monotonic() >= next_check:
                beside.check_topics()
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

    def _connect(self, consumer: Consumer, beside: _Beside) -> _Following | None:
        """Positions the consumer at the end of every partition whose end it reads now
        (``assign``): the others are followed later (``_take``). One partition must not
        keep the notifier from following the others (it restarted for ever, an outside
        review, session 43), nor hold their waiters up: a partition the metadata names
        no leader for is not asked (its ask would only wait out its timeout); the
        others' ends are asked at once, beside this thread (asked one after another,
        each partition whose leader could not answer added its 10 s, session 44), and
        once one is read the asks still running are waited for ``connect_wait_s``, no
        longer: a leader the metadata names but that is away (stale metadata) cost the
        connect its 10 s timeout (session 45). Nothing read once every ask ended:
        ``KafkaException``. None: stopped meanwhile."""
        meta = self._first_look(beside)
        if meta is None:
            return None
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
        state = _Following(_partition_counts(partitions + unread), unread)
        # The end as of now, not ``OFFSET_END``: librdkafka resolves a logical offset at
        # its first fetch, later, so a record published in between would be skipped
        # after the wake-up of ``_follow``.
        beside.ask_ends(partitions)
        assignment: list[TopicPartition] = []
        enough_at = None
        while beside.asking and not self._stop.is_set():
            if enough_at is not None and time.monotonic() >= enough_at:
                break
            wait_s = _TAKE_S if enough_at is None else min(
                _TAKE_S, max(0.0, enough_at - time.monotonic()))
            read, failed, error = _ended(beside.take(wait_s))
            assignment += read
            state.unread += failed
            if error is not None:
                state.error = error
            if assignment and enough_at is None:
                enough_at = time.monotonic() + self._connect_wait_s
        if self._stop.is_set():
            return None
        if not assignment:
            raise state.error if state.error is not None else KafkaException(
                KafkaError(KafkaError.LEADER_NOT_AVAILABLE,
                           f"no decision partition has a leader: {_names(state.unread)}"))
        consumer.assign(assignment)
        if state.unread or beside.asking:
            log.warning("decision partitions not followed until their end can be read "
                        "(looked at again every %.0f s): %s", self._topics_check_s,
                        _names(state.unread + beside.asking),
                        extra={"ctx": {"error": "no leader" if state.error is None
                                       else str(state.error),
                                       "still_asked": _names(beside.asking)}})
        return state

    def _first_look(self, beside: _Beside) -> Any:
        """The topics' metadata as the connect's first request reads it, beside this
        thread (the topics check's call, up to ``TOPICS_CHECK_TIMEOUT_S``), the stop
        flag looked at meanwhile; None: stopped. Its failure is the connect's
        (raised). Before session 46 it ran on this thread, up to 10 s while the
        brokers did not answer: a stop then waited out its join with the thread still
        in the request."""
        beside.check_topics()
        while not self._stop.is_set():
            for result in beside.take(_TAKE_S):
                if isinstance(result, _Checked):
                    if result.error is not None:
                        raise result.error
                    return result.meta
        return None

    def _take(self, consumer: Consumer, beside: _Beside, state: _Following) -> None:
        """What ended beside the poll since the last look (never waits): partitions
        whose end was read are added to the assignment, positioned there, and every
        waiter woken (a decision published there before this position is one the
        consumer never sees); a topics check's metadata is compared with what is
        followed (``TopicsChanged``) and starts the asks of the unread partitions it
        names a leader for (all of them when the check failed)."""
        ended = beside.take(0)
        read, failed, _ = _ended(ended)
        state.unread += failed
        if read:
            consumer.incremental_assign(read)
            self._waiters.notify_all()
            log.info("decision partitions followed: %s", _names(read))
        for result in ended:
            if not isinstance(result, _Checked):
                continue
            if result.error is not None and not isinstance(result.error, KafkaException):
                raise result.error
            meta = result.meta  # None: the look failed, says nothing; the next looks again
            if meta is not None:
                _check_topics(meta, state.followed)
            asked: list[TopicPartition] = []
            left: list[TopicPartition] = []
            for tp in state.unread:
                about = None if meta is None else _partition_meta(meta, tp)
                (asked if meta is None or _has_leader(about) else left).append(tp)
            state.unread = left
            beside.ask_ends(asked)

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


@dataclass
class _Following:
    """The poll thread's view of what one consumer follows: the partition count of each
    topic when it connected, the partitions not followed and not being asked, and the
    last error of an ask."""

    followed: dict[str, int]
    unread: list[TopicPartition]
    error: KafkaException | None = None


@dataclass(frozen=True)
class _EndRead:
    """An ask of one partition's end that ended: its end (``tp.offset``), or ``error``."""

    tp: TopicPartition
    error: Exception | None = None


@dataclass(frozen=True)
class _Checked:
    """A topics check that ended: the metadata read, or None and the look's ``error``."""

    meta: Any
    error: Exception | None = None


class _Beside:
    """The calls on one consumer that may wait on a broker, run beside its poll, each in
    a daemon thread of its own: the metadata request (the connect's first, then each
    topics check) and the asks of partitions' ends (at
    most ``END_QUERIES`` asking at once). What they found is queued for the poll thread
    (``take``); ``asking`` and ``checking`` are the poll thread's own bookkeeping (it
    alone starts and takes). Daemon threads, not an executor's: the interpreter joins
    an executor's threads at exit, and an API stopping while the brokers do not answer
    would wait out their timeouts.

    librdkafka's calls are thread-safe (a metadata request or a watermark query beside
    ``poll``), but closing a consumer destroys the handle under a call still in it:
    ``close`` leaves the consumer open until every call started here has ended, and the
    last to end closes it."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer
        self._slots = threading.Semaphore(END_QUERIES)
        self._lock = threading.Lock()
        self._running = 0  # threads started and not ended
        self._closing = False
        self._found: queue.SimpleQueue[_EndRead | _Checked] = queue.SimpleQueue()
        self._asked: dict[tuple[str, int], TopicPartition] = {}
        self.checking = False

    @property
    def asking(self) -> list[TopicPartition]:
        """The partitions whose end is being asked (not taken yet)."""
        return list(self._asked.values())

    def ask_ends(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            key = (tp.topic, tp.partition)
            if key in self._asked:
                continue
            self._asked[key] = tp
            self._start("decision-end", self._ask_end, tp)

    def check_topics(self) -> None:
        self.checking = True
        self._start("decision-topics-check", self._check)

    def take(self, timeout_s: float) -> list[_EndRead | _Checked]:
        """What ended, waiting up to ``timeout_s`` for the first (0: no wait)."""
        ended: list[_EndRead | _Checked] = []
        try:
            ended.append(self._found.get(timeout=timeout_s) if timeout_s > 0
                         else self._found.get_nowait())
            while True:
                ended.append(self._found.get_nowait())
        except queue.Empty:
            pass
        for result in ended:
            if isinstance(result, _Checked):
                self.checking = False
            else:
                self._asked.pop((result.tp.topic, result.tp.partition), None)
        return ended

    def close(self) -> None:
        """Closes the consumer now if nothing runs beside its poll, else the last call
        to end closes it (each ends within its timeout); asks not begun are dropped."""
        with self._lock:
            self._closing = True
            idle = self._running == 0
        if idle:
            self._consumer.close()

    def _start(self, name: str, call: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._running += 1
        threading.Thread(target=self._run, args=(call, *args), name=name,
                         daemon=True).start()

    def _run(self, call: Callable[..., None], *args: Any) -> None:
        try:
            if not self._closing:
                call(*args)
        finally:
            with self._lock:
                self._running -= 1
                last = self._closing and self._running == 0
            if last:
                try:
                    self._consumer.close()
                except Exception:  # noqa: BLE001 - nothing left to tell; the next consumer runs
                    log.warning("closing a decision consumer failed", exc_info=True)

    def _ask_end(self, tp: TopicPartition) -> None:
        with self._slots:
            if self._closing:
                return
            try:
                _, high = self._consumer.get_watermark_offsets(tp, timeout=END_TIMEOUT_S,
                                                               cached=False)
            except Exception as exc:  # noqa: BLE001 - handed to the poll thread (``_ended``)
                self._found.put(_EndRead(tp, exc))
                return
        self._found.put(_EndRead(TopicPartition(tp.topic, tp.partition, high)))

    def _check(self) -> None:
        try:
            meta = self._consumer.list_topics(timeout=TOPICS_CHECK_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - handed to the poll thread (``_take``)
            self._found.put(_Checked(None, exc))
            return
        self._found.put(_Checked(meta))


class RestartBackoff:
    """The delays between restarts of the consumer, whatever their cause (changed
    topics, topics missing, a failure): none for the first (a partition added is
    followed at once), then ``first_s`` doubling up to
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


def _ended(ended: list[_EndRead | _Checked]
           ) -> tuple[list[TopicPartition], list[TopicPartition], KafkaException | None]:
    """The asks of ``ended`` split: the partitions positioned at their end, the ones
    whose end could not be read, and the last such error. Any other error of an ask is
    the consumer's failure (raised: the notifier restarts)."""
    read: list[TopicPartition] = []
    failed: list[TopicPartition] = []
    error: KafkaException | None = None
    for result in ended:
        if not isinstance(result, _EndRead):
            continue
        if result.error is None:
            read.append(result.tp)
        elif isinstance(result.error, KafkaException):
            error = result.error
            failed.append(result.tp)
        else:
            raise result.error
    return read, failed, error


def _check_topics(meta: Any, followed: dict[str, int]) -> None:
    """``TopicsChanged`` when a topic's partitions are not the ones followed (a
    partition added: its decisions would wake nobody; a topic deleted)."""
    for topic, count in followed.items():
        info = meta.topics.get(topic)
        if info is None:
            raise TopicsChanged(f"topic {topic} is gone")
        if info.error is None and len(info.partitions) != count:
            raise TopicsChanged(f"topic {topic} has {len(info.partitions)} partitions, "
                                f"{count} followed")


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
