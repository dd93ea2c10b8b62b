"""Idempotent producer of gateway events, with typed delivery errors raised on ``flush``.

Why these settings: ``enable.idempotence=true`` + ``acks=all`` make librdkafka's own
retries safe (no duplicates, no reordering within a partition), so a turn's
``ToolEffect``s, produced first with the same key, stay ordered before its
``TurnCompleted`` - the order the processor relies on (CONTRACT section 2).

Delivery is asynchronous. Failures reported by delivery callbacks are raised by the
next ``flush`` of each thread as ``DeliveryError`` (``retryable`` when sending the events
again can help: a broker's retriable error, a timeout, a purge at close). A gateway must
not report a turn as persisted before its ``flush`` returned - and even then, persisted
is not promoted: ask the rehydration API with ``wait_ms`` for that. Leaving the ``with``
block closes the producer: it flushes and raises as ``flush`` does.

    with GatewayProducer(settings) as producer:
        producer.send_turn(turn, effects=effects)
        producer.flush()            # raises DeliveryError / FlushTimeout

A thread serving several requests (coroutines on an event loop) confirms each one by its
own ``Delivery`` instead: ``flush`` tells each failure once per thread, to whichever
request flushes first (session 48).

    sent = producer.send_turn(turn, effects=effects)
    await sent.wait_async()         # its own events' DeliveryError / FlushTimeout
"""

from __future__ import annotations

import _thread
import asyncio
import functools
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.serialization import SerializationError

from ratchet.domain.bounds import container_problem, effect_field_problem, elements_of
from ratchet.domain.validation import PROMOTABLE_STATUSES
from ratchet.settings import Settings
from schemas.avro import EventSerde, encode_key, registry_client
from schemas.avro_ranges import range_check
from schemas.errors import RegistryUnavailable, SerdeError
from schemas.ids import unservable_id
from schemas.keys import MissingChainRoot
from schemas.limits import CLIENT_MAX_BYTES, MAX_EVENT_BYTES, MAX_EVENT_ELEMENTS
from schemas.models import GatewayEvent, ToolEffect, TurnCompleted, record_name
from services.gateway.errors import (
    ChainRootUnknown,
    DeliveryError,
    EffectKeyedApart,
    EffectOfAnotherTurn,
    EventBeyondLimits,
    EventNotEncoded,
    EventNotQueued,
    EventTooLarge,
    FlushTimeout,
    GatewayError,
    ProducerClosed,
    ProducerMisconfigured,
    UnservableId,
)
from services.gateway.kafka_calls import interruptible

# librdkafka's reports of events purged by ``close`` (queued, or sent and unanswered).
_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)

# The longest one of librdkafka's polls lasts while a send waits for room in its full
# queue or a ``Delivery`` waits for its reports. Such a wait serves the reports itself
# and checks between polls for what no poll returns on: a ``close`` of another thread
# (seen within this bound) and a report another thread's poll served. Session 48 woke
# them at once with a condition and a report-pumping thread; that saved at most this
# bound and brought a deadlock (a signal handler's close while its thread held the
# condition and another thread's send waited for room), so it was taken out (rgw4).
_WAIT_POLL_S = 0.1

# A ``Delivery.wait_async``'s first pause between non-blocking polls (librdkafka's
# ``linger.ms``); each later one doubles, up to ``_WAIT_POLL_S``.
_FIRST_ASYNC_PAUSE_S = 0.005

# Delivery failures kept for the flushes of threads that have not been raised them yet.
# Beyond it the oldest are dropped: a thread that sent and never flushes (a pool's worker
# whose flushes happen elsewhere) kept every later failure for the process's life. A
# flush that would have listed dropped ones says how many (``DeliveryError.forgotten``).
MAX_KEPT_FAILURES = 10_000

# The fields naming the request an effect is recorded for: ``send_turn`` refuses an
# effect whose value of one of them is not its turn's (``EffectOfAnotherTurn``).
_REQUEST_FIELDS = ("tenant_id", "idempotency_key", "response_id", "conversation_id",
                   "chain_root_id")

PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    # No compression: the processor consumes with aiokafka (Faust), which can read
    # lz4/snappy/zstd batches only with optional native libraries; a batch it cannot
    # decompress stops the partition. gzip would be safe but costs CPU on every turn.
    "compression.type": "none",
    # Give up (and report) after 30 s rather than librdkafka's 5 min default.
    "delivery.timeout.ms": 30_000,
    # Above the protocol's maximum event: ``send`` refuses larger events itself, typed.
    "message.max.bytes": CLIENT_MAX_BYTES,
    # Never create the topic by producing to it: with the broker's auto-creation on (the
    # local stack's), a wrong topic prefix silently created a one-partition topic nobody
    # consumes, and ``flush`` reported every event written. Off, such an event fails:
    # ``DeliveryError`` naming the topic (session 43).
    "allow.auto.create.topics": False,
}


# The settings the guarantees rest on (the module's docstring, CONTRACT section 2), under
# each of librdkafka's names for them, and the values a ``config`` may give them: another
# is ``ProducerMisconfigured`` naming the property and the value. The compression is
# free: the worker reads every codec (cramjam), the default is a matter of CPU.
# Each value listed was tried on a real ``Producer`` (confluent-kafka 2.16, librdkafka
# 2.16; ``tests/unit/test_gateway_producer_guaranteed.py``): none is one the client
# refuses. Until session 52 ``delivery.report.only.error`` listed ``"false"``, which
# confluent-kafka refuses (it reads that property itself, a ``bool`` only). librdkafka
# also reads ``1``, ``"1"``, ``"t"`` as true (``0``, ``"0"``, ``"f"`` as false) and any
# text starting ``-1`` as ``acks=-1``: refused here all the same (the message says what
# to give), as a float or a number of another type is.
GUARANTEED: dict[str, tuple[object, ...]] = {
    "enable.idempotence": (True, "true"),
    "acks": ("all", "-1", -1),
    "request.required.acks": ("all", "-1", -1),
    "allow.auto.create.topics": (False, "false"),
    # Successes must be reported: one without an offset is not a confirmed write.
    # confluent-kafka takes a ``bool`` here and nothing else (no text).
    "delivery.report.only.error": (False,),
}


def _checked(config: dict[str, Any]) -> dict[str, Any]:
    """``config``, once it gives no guaranteed setting another value."""
    for name, value in config.items():
        allowed = GUARANTEED.get(name)
        if allowed is not None and not _among(value, allowed):
            raise ProducerMisconfigured(
                f"config {name}={value!r}: the gateway protocol's delivery guarantees need "
                f"{name} to be one of {', '.join(map(repr, allowed))}; no producer made")
    return config


def _among(value: object, allowed: tuple[object, ...]) -> bool:
    """``value`` is one of ``allowed``: of the same Python type (``0`` is no ``False``,
    ``1.0`` no ``True``: equal in Python, refused by the client, they passed a set's
    check before session 52), text whatever its case (librdkafka reads it so)."""
    if isinstance(value, str):
        value = value.lower()
    return any(type(value) is type(given) and value == given for given in allowed)


class GatewayProducer:
    """One Kafka producer per gateway process; thread-safe like the underlying client."""

    def __init__(
        self,
        settings: Settings,
        serde: EventSerde | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.topic = settings.topic("gateway-events")
        # The registry client this producer made (none given a serde): ``close``
        # releases it (its HTTP session stayed open before session 44).
        self._registry: Any = None
        try:
            if serde is None:
                self._registry = registry_client(settings.schema_registry_url)
            self._serde = serde or EventSerde(self._registry)
            # Only ratchet's serde takes the event's dump the checks made (``_encoded``);
            # another given (a caller's, a test's stand-in) is called as before.
            self._serde_takes_data = isinstance(self._serde, EventSerde)
        except ValueError as exc:  # confluent-kafka's "Invalid url"
            raise ProducerMisconfigured(f"schema_registry_url "
                                        f"{settings.schema_registry_url!r}: {exc}") from exc
        try:
            self._producer = Producer(
                {"bootstrap.servers": settings.kafka_bootstrap, **PRODUCER_DEFAULTS,
                 **_checked(config or {})}
            )
        # A property librdkafka does not know or take; or one confluent-kafka reads
        # itself and takes as one Python type only (``delivery.report.only.error``: a
        # ``bool``), whose ``TypeError`` left untyped before session 51.
        except (KafkaException, TypeError) as exc:
            if self._registry is not None:
                self._registry.close()
            raise ProducerMisconfigured(f"librdkafka refused the config: {exc.args[0]}; "
                                        "no producer made") from exc
        # Reentrant, as ``_sending``: a signal handler's ``close`` while its thread holds
        # it (serving a delivery report, reading its failures) waited for ever.
        self._lock = threading.RLock()
        # Delivery failures, numbered in the order reported; each thread's cursor is the
        # number of the first one its flush has not raised (``_failures_for``). Keyed by
        # the thread object, held weakly: keyed by ident before session 44, a thread
        # that ended left its cursor to the next thread given the same ident (Python
        # reuses them), which was then told failures it never produced, or not told
        # failures a thread that sent before it had not flushed past.
        # A thread started outside ``threading`` is its ident and OS thread id (session
        # 45): as its dummy ``Thread``, the next such thread given the same ident took
        # its place (``_Places``).
        # Each with the ``Delivery`` of its event (``_logged_failure``).
        self._failure_log: list[tuple[int, str, KafkaError, Delivery | None]] = []
        # The next failure's number is the last logged one's plus one (``_next_failure``):
        # appending a failure counts it, in one step. Counted apart (session 50), a Ctrl-C
        # between the append and the count gave the next failure the same number, and a
        # thread that had flushed past the first was told it again with the second.
        # Saved by ``_failures_for`` before it trims: a trim may leave an older entry last
        # (one kept while its ``Delivery`` does not know), and the numbers go on from
        # the saved one, not from that entry's (``_next_failure``).
        self._next_at_trim = 0
        # Counts the log's changes (an append, a trim's store): a trim stores its list
        # only if none came while it was built (``_failures_for``).
        self._log_changes = 0
        self._first_kept = 0
        self._cursors = _Places()
        self._closed = False
        # ``close`` against ``send``s in other threads. Reentrant: a signal handler's
        # ``close`` while its thread is inside a send (holding it, up to
        # ``delivery.timeout.ms`` while librdkafka's queue is full) waited for it for ever
        # before session 45; that send then refuses what it had not queued.
        self._sending = threading.RLock()
        # The first ``close``'s release ended: done, or interrupted (an exception out of
        # librdkafka's flush, SIGINT's ``KeyboardInterrupt``), when a later ``close``
        # does it (``_release_unfinished``). ``_released``: the Kafka client is closed.
        self._closed_done = threading.Event()
        self._released = False
        self._client_closed = False  # the Kafka client's ``close`` returned
        self._releasing: threading.Thread | None = None  # the thread inside ``_release``
        self._release_lock = threading.Lock()
        # A ``close`` began (set before it waits for ``_sending``): a send of another
        # thread waiting for room in librdkafka's full queue gives up (``_queue``), or
        # the close waited for that send until a queued event was delivered or timed
        # out, ``delivery.timeout.ms`` for each event of the turn, whatever its
        # ``timeout_s`` (for ever with a queue that never drains; session 46).
        self._closing = threading.Event()
        self._closer: threading.Thread | None = None  # the thread of the first ``close``
        # How many of librdkafka's calls that run delivery reports (``poll``, ``flush``)
        # each thread is inside (``_served``), and the timeout of a first ``close`` asked
        # for inside one of them: librdkafka cannot be flushed or closed from inside its
        # own callback (confluent-kafka asserts and aborts the process, or its close
        # waits for itself), so that close is finished once the call returns
        # (``_finish_close``; a signal handler's, session 45).
        self._serving = threading.local()
        self._close_pending: float | None = None
        # The events handed to librdkafka (by ``Delivery`` and id), until their report
        # ran to its end, each with a weak reference to the report librdkafka holds:
        # confluent-kafka drops a report an exception ends (Ctrl-C, a signal handler's
        # exception) and raises the exception out of the ``poll`` / ``flush`` that ran
        # it. So an event whose report is gone while the event is not reported was
        # lost: failed by the next ``flush`` or ``Delivery.wait`` once such an
        # exception came out (``_reports_may_be_cut``, ``_fail_lost``; session 49: only
        # the close told it before), and every one left once the client is closed and
        # can report nothing more (``_fail_unreported``; an outside review, session 48).
        self._handed_over: dict[tuple[Delivery, str], weakref.ref[Callable[..., None]]] = {}
        self._reports_may_be_cut = False

    @property
    def _next_failure(self) -> int:
        """The number the next failure logged gets: past every number given, never one
        a flush may have passed. From the last entry alone, a trim that kept an older
        entry (its ``Delivery`` not knowing) and dropped newer ones gave a later failure
        a dropped one's number, below the cursor of the thread told that one, whose next
        flush then did not list it (an outside review, session 51)."""
        log = self._failure_log
        return max(log[-1][0] + 1, self._next_at_trim) if log else self._next_at_trim

    def __enter__(self) -> GatewayProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc_value: BaseException | None, *tb: object) -> None:
        """``close``: raises what was not delivered, unless the block is already raising:
        its error is the one to see, and what the close raised is told as a note on it
        (``add_note``; until session 52 it was swallowed, told to no one)."""
        if exc_type is None:
            self.close()
            return
        try:
            self.close()
        except GatewayError as error:
            if exc_value is not None:
                exc_value.add_note(_block_note(error))

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued event (at most ``timeout_s``), release the Kafka client
        (its threads and sockets) and the registry client it made (not one of a ``serde``
        given: the caller's), then raise as ``flush`` does: ``DeliveryError``.
        Events still queued at the timeout are purged and listed in it (retryable: they
        may or may not have been written; sending them again is safe).
        Leaving the ``with`` block closes; ``send`` after ``close`` (or while another
        thread closes) is ``ProducerClosed``, ``flush`` after it raises what is left.
        Before session 43 leaving the block flushed for 10 s and raised nothing: a turn
        never written left the block as if it had been. A ``close`` while another
        thread closes waits for that one to end, then raises as ``flush`` does for its
        own thread (before session 44 it returned at once, raising nothing: a thread
        whose events were then purged was told they were all delivered); a signal
        handler's inside librdkafka's poll or flush of its thread returns at once
        instead (the other close's close of the client waits for that call: session
        48's outside review found them waiting for each other). A signal
        handler's ``close`` inside a send of its thread closes at once (the send refuses
        what it had not queued); inside a delivery report (librdkafka's ``poll`` or
        ``flush``) it refuses sends and returns, and that call finishes the close as it
        returns (session 45: the process waited for ever, or aborted). A send of
        another thread waiting for room in librdkafka's full queue is ended once its
        poll returns, within 0.1 s (``ProducerClosed`` naming the events of its turn
        queued before it, which this close purges): it waited for that send, whatever
        ``timeout_s``, before session 46. A ``flush`` of another thread is ended by the purge and raises what it
        purged. A send that starts once a close began (this call's first line) is
        ``ProducerClosed`` naming its events, nothing queued (it could take the send
        lock before this close and have its events purged, before session 47). A close
        interrupted before it released the client (Ctrl-C in librdkafka's flush) leaves
        that to the next ``close`` (it returned at once before session 47)."""
        self._closing.set()  # before waiting for ``_sending``: see ``_queue``
        with self._sending:
            first = not self._closed
            self._closed = True
            if first:
                self._closer = threading.current_thread()
                if getattr(self._serving, "depth", 0):
                    # A signal handler's, inside a delivery report of this thread's poll
                    # or flush: sends are refused from now on, and that call finishes
                    # the close once it returns (``_finish_close``); what was not
                    # delivered is raised by it (a flush) or by the thread's next flush
                    # or close. It aborted the process, or waited for ever, before.
                    self._close_pending = timeout_s
                    return
        if not first:
            if self._in_reports():
                # A signal handler's, inside librdkafka's poll or flush of its thread (a
                # ``Delivery.wait``'s, a ``flush``'s): never wait there. Another
                # thread's release closes the client, and confluent-kafka's close waits
                # for every call inside it, this one too: waiting for that release
                # here waited for ever (an outside review, session 48). That call
                # ends once the client is purged or closed and raises what was not
                # delivered; so does this thread's next flush or close.
                return
            # Never wait for itself (a signal handler's close inside the first close).
            if threading.current_thread() is not self._closer:
                self._closed_done.wait()
            self._release_unfinished(timeout_s)
            self._raise_failures(pending=0)
            return
        self._release(timeout_s)
        self._raise_failures(pending=0)

    def _release_unfinished(self, timeout_s: float) -> None:
        """A later close's part: the release an earlier close began and did not finish
        (interrupted: a ``KeyboardInterrupt`` out of librdkafka's flush). Such a close
        returned at once before session 47, raising nothing, the events still queued
        in an open client: never delivered or reported, and nobody told. Not inside
        the release of its own thread (a signal handler's), nor while a close asked
        for inside a delivery report is pending (that call finishes it)."""
        if (self._released or self._close_pending is not None or self._in_reports()
                or self._releasing is threading.current_thread()):
            return
        self._release(timeout_s)

    def _release(self, timeout_s: float) -> None:
        """The close's work: flush, purge, release the clients; once, whoever calls it
        (``_release_lock``)."""
        with self._release_lock:
            if self._released:
                return
            self._close_pending = None
            self._releasing = threading.current_thread()
            try:
                if not self._client_closed:
                    # Each runs reports: Ctrl-C inside one is ``KeyboardInterrupt``, as
                    # in ``_served``.
                    interruptible(self._producer.flush, timeout_s)
                    self._producer.purge()
                    # Serves the purged events' reports: failures.
                    interruptible(self._producer.flush, 0)
                    interruptible(self._producer.close)
                    # A release cut after this line (Ctrl-C in ``_fail_unreported``)
                    # is finished by the next close without the client: it flushed
                    # the closed client, confluent-kafka's ``RuntimeError`` (session
                    # 50).
                    self._client_closed = True
                self._fail_unreported()
                self._released = True
            except BaseException:
                self._reports_may_be_cut = True  # see ``_served``
                raise
            finally:
                self._releasing = None
                try:
                    if self._registry is not None:
                        self._registry.close()
                        self._registry = None
                finally:
                    # Whatever the cleanup raises (a second Ctrl-C): a close of another
                    # thread waits for this, for ever if never set (session 47).
                    self._closed_done.set()

    def _fail_unreported(self) -> None:
        """Once the client is closed: each event handed to it whose ``Delivery`` never
        had its report is a failure, retryable (it may or may not be written), told to
        the threads' flushes and its ``Delivery``. Its report was ended by an exception
        before it recorded anything (Ctrl-C in its first lines): before, it was told to
        no one (the next flush and the close returned as if it were written) and its
        ``Delivery`` said ``FlushTimeout`` for ever. Each is taken out by its failure's
        last line, as in ``_fail_lost``: the dict swapped out first, a Ctrl-C here lost
        the events after it (session 50)."""
        for delivery, event_id in list(self._handed_over):
            self._fail_as_lost(event_id, delivery)
        self._handed_over.clear()

    def _fail_lost(self) -> None:
        """Once an exception came out of a librdkafka call that runs reports: each
        event handed over whose report librdkafka no longer holds (its weak reference
        is dead: confluent-kafka dropped it) and that is not reported was lost, a
        failure as in ``_fail_unreported``. A report still to come, or running in
        another thread, is held by the client. Nothing is looked at otherwise: a
        flag's check is all a ``flush`` or ``wait`` pays."""
        if not self._reports_may_be_cut:
            return
        self._reports_may_be_cut = False  # before the look: a later cut sets it again
        try:
            # Each is taken out by its failure's last line (``_record``), not before: a
            # second Ctrl-C inside the failure left it out, never told (an outside
            # review, session 49). Failed once whoever else looks (``_record``).
            for key, report in list(self._handed_over.items()):
                if report() is None and key in self._handed_over:
                    self._fail_as_lost(key[1], key[0])
        except BaseException:  # a second Ctrl-C: the rest is looked at next time
            self._reports_may_be_cut = True
            raise

    def _dropped(self, key: tuple[Delivery, str], report: weakref.ref[Any]) -> None:
        """The weak reference's callback, as confluent-kafka frees ``report``: inside
        the librdkafka call that ran it, before that call counts its event done. Still
        handed over, its event was not reported: the report was cut. Flagged here, a
        flush of another thread waiting for that event cannot return before the flag
        (set only once the exception came out of the call that ran it, such a flush
        could look first and return as if the event were written: an outside review,
        session 49). A report that ran to its end took its event out: its weak
        reference is gone before it, and this is not called."""
        if self._handed_over.get(key) is report:
            self._reports_may_be_cut = True

    def _served(self, call: Callable[[float], int], timeout_s: float) -> int:
        """librdkafka's ``call`` (``poll`` or ``flush``: they run delivery reports),
        then the close a signal handler asked for inside one of them
        (``_finish_close``)."""
        self._serving.depth = getattr(self._serving, "depth", 0) + 1
        try:
            # Ctrl-C inside a report: ``KeyboardInterrupt``, not confluent-kafka's
            # ``SystemError`` (``services.gateway.kafka_calls``; session 50).
            return interruptible(call, timeout_s)
        except BaseException:
            # Out of librdkafka's call: it may have ended a report inside it, which
            # confluent-kafka then drops (``_fail_lost``). Or it came between reports
            # (confluent-kafka checks for signals while it waits): nothing is lost.
            self._reports_may_be_cut = True
            raise
        finally:
            self._serving.depth -= 1
            self._finish_close()

    def _in_reports(self) -> bool:
        """Whether this thread is inside one of librdkafka's calls that run delivery
        reports (``_served``): a send there (a signal handler's) must not ``poll``, as
        confluent-kafka's call from inside its own callback leaves the outer call
        without its state and its next report aborts the process (session 45, rfix3)."""
        return bool(getattr(self._serving, "depth", 0))

    def _finish_close(self) -> None:
        """The close asked for inside a delivery report, once this thread (its own) is
        out of every librdkafka call that runs them."""
        if (self._close_pending is not None and not self._serving.depth
                and threading.current_thread() is self._closer):
            self._release(self._close_pending)

    def send(self, event: GatewayEvent) -> Delivery:
        """Queue one event (keyed by its partition key); delivery is reported on flush,
        and by the ``Delivery`` returned (its own failures only, session 48).
        Refused before producing: an id the API could never serve (``UnservableId``), a
        continued chain's event without ``chain_root_id`` (``ChainRootUnknown``), a
        value above the protocol maximum (``EventTooLarge``), a turn beyond the
        protocol's bounds on array items and on its contents' arrays and objects
        (``EventBeyondLimits``), an event the registry could not encode
        (``EventNotEncoded``); an event librdkafka refuses to queue is
        ``EventNotQueued``."""
        ids = (event.event_id,)
        self._refuse_once_closing(ids)
        return self._produce((event, self._prepare(event, ids)))

    def send_turn(self, turn: TurnCompleted, effects: Iterable[ToolEffect] = ()) -> Delivery:
        """The turn's tool effects first, then the turn (same key: same partition, in order).
        Every event is checked and encoded before the first is produced: a turn or an
        effect that ``send`` would refuse (an id, a bound, the size, the encoding), an
        effect keyed apart from its turn (``EffectKeyedApart``) or an effect of another
        request (its tenant, idempotency key, response id, Conversation or chain root not
        the turn's: ``EffectOfAnotherTurn``) is refused with nothing of the turn
        produced. A ``close`` in another thread comes before the turn
        (``ProducerClosed``, nothing produced) or after it, never between its events.
        ``EventNotQueued`` (librdkafka's own refusal) names the event refused, the
        events of the turn queued before it (``queued``: they may be written; after a
        fatal error they fail on ``flush``) and those never produced (``not_queued``).
        Then send the turn, effects and all, again (safe: effects are deduplicated by
        ``effect_id``, a turn by its ``response_id``), with a new producer if ``fatal``;
        never the turn alone, whose effects may not be written. Effects whose turn never
        comes are recorded and wait for it (docs/gateway-protocol.md, section 1)."""
        effects = tuple(effects)
        ids = tuple(event.event_id for event in (*effects, turn))
        self._refuse_once_closing(ids)
        # The turn's own refusals first, before encoding anything; checked once (its
        # second check before its encoding, until session 50, dumped it twice more).
        turn_data = self._check(turn)
        for effect in effects:
            key = _key_of(effect)
            if key != turn.partition_key:
                raise EffectKeyedApart(effect.effect_id, key, turn.partition_key)
            apart = [(name, getattr(effect, name), getattr(turn, name))
                     for name in _REQUEST_FIELDS
                     if getattr(effect, name) != getattr(turn, name)]
            if apart:
                raise EffectOfAnotherTurn(effect.effect_id, apart)
        values = [self._prepare(effect, ids) for effect in effects]
        return self._produce(*zip(effects, values, strict=True),
                             (turn, self._encoded(turn, turn_data, ids)))

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued event; raise every delivery failure reported since the
        calling thread's last flush (``DeliveryError``, listing the events by id: with
        one producer shared by threads, other threads' events may be among them), else
        ``FlushTimeout`` if events are still in flight. A thread's first flush raises
        every failure no thread that sent before it has flushed past yet. Inside a
        delivery report of its thread (a signal handler's flush) it cannot wait: it
        raises what it knows at once, the events in flight as ``FlushTimeout``
        (librdkafka's flush from inside its own callback aborted the process). An
        event whose report an exception ended (Ctrl-C inside it: confluent-kafka drops
        it) is a retryable failure here (``_fail_lost``); before session 49 only the
        ``close`` told it, and this returned as if it were written."""
        if self._in_reports():
            self._fail_lost()
            self._raise_failures(pending=0 if self._released
                                 else len(self._producer))
            return
        try:
            pending = self._served(self._producer.flush, timeout_s)
        except RuntimeError:  # confluent-kafka's "Producer has been closed"
            if not self._closed:
                raise
            pending = 0  # ``close`` purged what was in flight; its reports are failures
        if self._released:
            pending = 0  # closed meanwhile (a signal handler's): purged, reported
        self._fail_lost()
        self._raise_failures(pending=pending)

    def _raise_failures(self, pending: int) -> None:
        """Raise the thread's failures since its last flush (``_failures_for``), else
        ``FlushTimeout`` if ``pending``. The thread's cursor moves past them only as the
        error is raised: a Ctrl-C anywhere before leaves them to its next flush (moved
        first, before session 51, they were lost for the thread). A signal handler's
        flush inside this one takes them over (its mark replaces this one's): it names
        them, and this flush then does not (an outside review, session 51)."""
        place, mark, end, failures, forgotten = self._failures_for()
        error: GatewayError | None = None
        if failures or forgotten:
            error = DeliveryError(
                [(event_id, str(err)) for event_id, err in failures],
                # Failures no longer listed cannot be sent again by id: not retryable.
                retryable=not forgotten and all(err.retriable() and not err.fatal()
                                                for _, err in failures),
                pending=pending,
                forgotten=forgotten,
            )
        elif pending:
            error = FlushTimeout(pending)
        if error is None:
            if place.telling is mark:
                place.cursor = end
            return
        # Checked, moved and raised in one line with no call: CPython runs a signal's
        # handler only at a call, a function's first line or a jump back, so none runs
        # between the move and the raise (a handler there saw the failures told and
        # the Ctrl-C lost them); and none between the check and the move (a handler's
        # flush there named them, then this one again).
        if place.telling is mark: place.cursor = end; raise error  # noqa: E701, E702
        if pending:  # its failures told by a handler's flush inside this one
            raise FlushTimeout(pending)

    def _check(self, event: GatewayEvent) -> dict[str, Any]:
        """The refusals that need no encoding; the event's ``to_avro()``, checked, which
        its encoding writes (dumped once: twice per event before session 50)."""
        problem = unservable_id(event)  # an empty id too
        if problem:
            raise UnservableId(f"event {event.event_id}: {problem}")
        if not _key_of(event):  # no empty id passes the pattern: never, but not produced
            raise UnservableId(f"event {event.event_id} has an empty partition key")
        if isinstance(event, TurnCompleted | ToolEffect):
            beyond = beyond_limits(event)
            if beyond is not None:
                raise EventBeyondLimits(event.event_id, beyond)
        # An int beyond 32 bits, a long beyond 64, a timestamp outside years 1 to 9999:
        # the processor dead-letters such a record (CORRUPT_PAYLOAD), so it gets no
        # decision. Produced before session 48 (one beyond 64 bits leaked fastavro's
        # OverflowError); checked with the processor's own check of a decoded record.
        record = record_name(event)
        data = event.to_avro()
        outside = range_check(record)(data)
        if outside is not None:
            raise EventBeyondLimits(event.event_id, f"{record}{outside}")
        return data

    def _refuse_once_closing(self, ids: Sequence[str]) -> None:
        """``ProducerClosed`` naming the call's events (``ids``) once a ``close`` began:
        before a send is checked or encoded (the registry client may be closed), and
        again as it takes the send lock (``_produce``)."""
        if self._closing.is_set():
            raise ProducerClosed(
                f"the producer is closed: event{'s' if len(ids) > 1 else ''} "
                f"{', '.join(ids)} not produced; send the whole turn again with a new one")

    def _prepare(self, event: GatewayEvent, ids: Sequence[str]) -> bytes:
        """The event's value, once every local check passed (nothing is produced);
        ``ids``: the events of the call, named if a close began meanwhile."""
        self._refuse_once_closing(ids)
        return self._encoded(event, self._check(event), ids)

    def _encoded(self, event: GatewayEvent, data: dict[str, Any], ids: Sequence[str]
                 ) -> bytes:
        """The value of ``event``, whose checks passed and gave ``data`` (``_check``)."""
        self._refuse_once_closing(ids)
        try:
            value = (self._serde.encode(event, self.topic, data) if self._serde_takes_data
                     else self._serde.encode(event, self.topic))
        except RegistryUnavailable as exc:
            raise EventNotEncoded(event.event_id, str(exc), retryable=True) from exc
        except (SerdeError, SerializationError, struct.error) as exc:
            # SerializationError, struct.error: the registry's answer was not a schema
            # id (a garbage answer); they leaked raw before session 43.
            raise EventNotEncoded(event.event_id, f"{type(exc).__name__}: {exc}",
                                  retryable=False) from exc
        if len(value) > MAX_EVENT_BYTES:
            raise EventTooLarge(event.event_id, len(value))
        return value

    def _produce(self, *events: tuple[GatewayEvent, bytes]) -> Delivery:
        """Queue ``events`` (each with its value) in order, under one hold of
        ``_sending``: a ``close`` in another thread comes before the first or after the
        last, never between (before session 44 it could come between a turn's effects,
        queuing some and refusing the rest ``ProducerClosed``). Their ``Delivery``."""
        delivery = Delivery(self, tuple(event.event_id for event, _ in events))
        with self._lock:
            # A sending thread is raised every failure reported from now on by its
            # flushes (``_failures_for``).
            self._cursors.setdefault(self._next_failure)
        with self._sending:
            # Never once a ``close`` began (``_closing``, set before it waits for this
            # lock), not only once it closed: a send that took the lock while a close
            # waited for it queued its events and returned as if they were on their
            # way, and that close then purged them (before session 47).
            ids = [event.event_id for event, _ in events]
            self._refuse_once_closing(ids)
            for at, (event, value) in enumerate(events):
                if self._closed:  # by a signal handler of this thread, inside this send
                    raise _closed_while_sending(event.event_id, ids[:at])
                # A refusal names the events of the call handed over before it and
                # those never produced (session 45): the turn is sent again whole.
                # The report is made in the call, held by no variable here: only
                # librdkafka holds it once ``_queue`` returned (``_fail_lost``).
                key = (delivery, event.event_id)
                report = self._queue(event, value,
                                     self._on_delivery(event.event_id, delivery),
                                     functools.partial(self._dropped, key),
                                     queued=tuple(ids[:at]), not_queued=tuple(ids[at:]))
                # Kept once queued (kept before, a close while the send waited for room
                # failed an event it never queued); a report another thread's poll
                # served meanwhile is not kept, one it cut meanwhile is flagged.
                self._handed_over[key] = report
                if event.event_id not in delivery._unreported:
                    self._handed_over.pop(key, None)
                elif report() is None:
                    self._reports_may_be_cut = True
                self._serve_reports()
        return delivery

    def _serve_reports(self, timeout_s: float = 0) -> None:
        """librdkafka's ``poll``; nothing once a signal handler's ``close`` of this
        thread closed the client (its flush served them), nor inside a delivery report
        of this thread (``_in_reports``: the call it runs in serves them)."""
        if self._in_reports():
            return
        try:
            self._served(self._producer.poll, timeout_s)
        except RuntimeError:  # confluent-kafka's "Producer has been closed"
            if not self._closed:
                raise

    def _queue(self, event: GatewayEvent, value: bytes,
               callback: Callable[[KafkaError | None, Any], None],
               dropped: Callable[[weakref.ref[Any]], None], *,
               queued: tuple[str, ...], not_queued: tuple[str, ...]
               ) -> weakref.ref[Callable[[KafkaError | None, Any], None]]:
        """Hand ``event`` to librdkafka with its report ``callback``; a weak reference
        to that report (``_handed_over``), calling ``dropped`` as it is freed."""
        while True:
            if self._closed:  # a signal handler's close while the queue was full
                raise _closed_while_sending(event.event_id, queued)
            try:
                self._producer.produce(self.topic, value=value,
                                       key=encode_key(event.partition_key),
                                       on_delivery=callback)
                return weakref.ref(callback, dropped)
            except BufferError:  # local queue full: let deliveries drain, then retry
                if self._closing.is_set():
                    # Another thread's close waits for this send's lock: waiting for
                    # room would hold it up to delivery.timeout.ms per event (session
                    # 46). Its purge reports what this call queued before.
                    raise _closed_while_sending(event.event_id, queued) from None
                if self._in_reports():
                    # Only serving reports makes room, and not from inside one (a
                    # signal handler's send): it looped for ever (session 45, rfix3).
                    raise EventNotQueued(
                        event.event_id, "librdkafka's queue is full and this send runs "
                        "inside a delivery report of its thread (a signal handler's), "
                        "where it cannot wait for room", retryable=True, fatal=False,
                        queued=queued, not_queued=not_queued) from None
                self._serve_reports(_WAIT_POLL_S)
                if self._closing.is_set():
                    # Room made and a close begun during that poll: the close wins, the
                    # event is not queued for it to purge (session 48).
                    raise _closed_while_sending(event.event_id, queued) from None
            except RuntimeError:  # "Producer has been closed": by a handler, just now
                if not self._closed:
                    raise
                raise _closed_while_sending(event.event_id, queued) from None
            except KafkaException as exc:
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) \
                    else None
                raise EventNotQueued(
                    event.event_id, str(err if err is not None else exc),
                    retryable=err is not None and err.retriable() and not err.fatal(),
                    fatal=err is None or err.fatal(), queued=queued,
                    not_queued=not_queued) from exc

    def _failures_for(self) -> tuple[_Place, object, int, list[tuple[str, KafkaError]],
                                     int]:
        """The calling thread's place, its mark, the number its cursor moves to once it
        is raised them, the failures reported since its last flush and how many more of
        them were dropped (``MAX_KEPT_FAILURES``). Nothing is told yet: the cursor moves
        as they are raised (``_raise_failures``). A
        failure is kept until every live thread that sent or flushed has been raised it
        (or the bound drops it): before session 43, the first flush took every failure,
        so a thread whose event failed could flush after another thread and be told
        nothing. A thread is its place in ``_Places``: a thread that ended is dropped,
        and a new one never takes its place, whatever its ident."""
        with self._lock:
            # A thread's first flush starts where every live thread's cursor is; with
            # none, where those that ended since the last flush were (told past there).
            ended = min(self._cursors.values(), default=self._first_kept)
            self._cursors.drop_ended()
            self._first_kept = min(self._cursors.values(), default=ended)
            place = self._cursors.place(self._first_kept)
            # Before the cursor is read: a flush of this thread from here on (a signal
            # handler's) reads it after, names these too and replaces the mark, so this
            # flush names none of them.
            place.telling = mark = object()
            # Before the trim: the numbers go on from there (``_next_failure``).
            self._next_at_trim = self._next_failure
            # A failure every thread was told leaves (one this flush tells, at the next
            # flush), unless its report was cut before its ``Delivery`` knew (the event
            # is still unreported under the lock only then): the look finishes that
            # report with it (``_logged_failure``). Dropped, the look told the event
            # again as a lost report (session 50's "Left").
            # Stored only if the log did not change while it was built: a signal
            # handler's flush of this thread after the call building it (where CPython
            # runs a handler) logged failures, and its own trim, that this stale list
            # threw away (failures never told to the other threads: rrevr, session 51).
            # Skipped, the next flush trims.
            changes = self._log_changes
            kept = [f for f in self._failure_log if f[0] >= self._first_kept
                    or (f[3] is not None and f[1] in f[3]._unreported)]
            if self._log_changes == changes:  # no call between the check and the store
                self._failure_log = kept; self._log_changes += 1  # noqa: E702
            start = place.cursor
            oldest = self._failure_log[0][0] if self._failure_log else self._next_failure
            failures = [(event_id, err) for seq, event_id, err, _ in self._failure_log
                        if seq >= start]
            return (place, mark, self._next_failure, failures, max(0, oldest - start))

    def _on_delivery(self, event_id: str, delivery: Delivery | None = None
                     ) -> Callable[[KafkaError | None, Any], None]:
        """The report librdkafka runs for ``event_id``: a ``partial`` of ``_report``,
        which nothing but the client holds (no frame refers to it, so the traceback of
        an exception that ended it cannot keep it alive): once the client dropped it,
        its weak reference is dead (``_fail_lost``)."""
        return functools.partial(self._report, event_id, delivery)

    def _report(self, event_id: str, delivery: Delivery | None, err: KafkaError | None,
                msg: Message | None) -> None:
        if err is None and (msg is None or msg.offset() is None):
            # A "success" without an offset is not a confirmed write: librdkafka
            # reports a batch the broker answered DUPLICATE_SEQUENCE_NUMBER as
            # delivered, and we have seen such events missing from the log (test
            # rigs producing right after topic creation, CHANGELOG.md). Fail
            # closed: a retryable DeliveryError; sending the event again is safe,
            # the processor dedupes redelivered events.
            err = KafkaError(KafkaError.DUPLICATE_SEQUENCE_NUMBER,
                             "reported delivered without an offset: not confirmed "
                             "written; send the event again", retriable=True)
        if err is not None:
            err = self._explained(err)
        self._record(event_id, delivery, err)

    def _fail_as_lost(self, event_id: str, delivery: Delivery) -> None:
        """The event's report never ran to its end: failed (``_lost_report``), or
        finished with the failure that report had logged before it was cut."""
        self._record(event_id, delivery, self._explained(_lost_report()), lost=True)

    def _record(self, event_id: str, delivery: Delivery | None, err: KafkaError | None,
                *, lost: bool = False) -> None:
        """The event's outcome, told once: logged for the threads' flushes (a failure),
        then its ``Delivery``, then out of ``_handed_over``. Under the lock, checked
        there: a close's ``_fail_unreported`` and a look of another thread, each past
        its own check, failed one event twice (session 50). ``lost``: a look's, after
        an exception ended the event's report, perhaps after that report logged its own
        failure: that failure is the event's (the look added a lost report's too,
        naming the event twice, session 50)."""
        with self._lock:
            if delivery is not None and event_id not in delivery._unreported:
                self._handed_over.pop((delivery, event_id), None)  # told already
                return
            logged = self._logged_failure(event_id, delivery) if lost else None
            if logged is not None:
                err = logged
            elif err is not None:
                # Numbered and appended to the log as it is once numbered: a signal
                # handler's flush while the number was read (``_next_failure`` is a
                # call, where CPython runs one) logged another failure under the same
                # number, or stored a trimmed log and this one went to the old list,
                # dropped (an outside review, session 51, rrevr). Counted as changed
                # (``_log_changes``) with no call before the append: a trim being built
                # skips its store.
                while True:
                    changes = self._log_changes
                    entry = (self._next_failure, event_id, err, delivery)
                    if self._log_changes == changes: self._log_changes += 1; break  # noqa: E701, E702
                self._failure_log.append(entry)
                if len(self._failure_log) > MAX_KEPT_FAILURES:
                    del self._failure_log[:len(self._failure_log) - MAX_KEPT_FAILURES]
                    self._first_kept = max(self._first_kept, self._failure_log[0][0])
            if delivery is not None:
                delivery._reported(event_id, err)
                # Last: one ended before this line is failed (``_fail_lost``).
                self._handed_over.pop((delivery, event_id), None)

    def _logged_failure(self, event_id: str, delivery: Delivery | None
                        ) -> KafkaError | None:
        """The failure the event's own report logged, if it did (newest first: a cut
        report's is recent). Looked for only after a cut (``lost``), never per report."""
        for _, logged_id, err, logged_by in reversed(self._failure_log):
            if logged_id == event_id and logged_by is delivery:
                return err
        return None

    def _explained(self, err: KafkaError) -> KafkaError:
        """librdkafka's report, with what to do where its own text does not say it. An
        event that timed out or was purged may or may not be written: retryable (send
        it again; the processor dedupes), which librdkafka does not flag (session 43:
        a gateway treating ``retryable`` as the rule failed every turn of a broker
        outage for good)."""
        code = err.code()
        if code in _PURGED:
            return KafkaError(code, "the producer was closed before the broker "
                              "acknowledged it: it may or may not be written; send it "
                              "again with a new producer", retriable=True)
        if code == KafkaError._MSG_TIMED_OUT:
            return KafkaError(code, "no broker acknowledged it within delivery.timeout.ms: "
                              "it may or may not be written; send it again once Kafka is "
                              "reachable", retriable=True)
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return KafkaError(code, f"topic {self.topic!r} does not exist: check the topic "
                              "prefix (RATCHET_TOPIC_PREFIX); ratchet's worker creates its "
                              "topics", fatal=err.fatal())
        return err


def _lost_report() -> KafkaError:
    """The failure of an event whose report an exception ended (``_fail_lost``)."""
    return KafkaError(KafkaError._INTR, "its delivery report never ran to its end (an "
                      "exception inside it, such as Ctrl-C): it may or may not be "
                      "written; send it again", retriable=True)


def _closed_while_sending(event_id: str, queued: Sequence[str]) -> ProducerClosed:
    """A signal handler's ``close`` inside a send of its thread: ``event_id`` and the
    call's later events not produced, ``queued`` (the call's events handed over before
    it) reported by that close. Every such refusal names them and asks for the whole
    turn again (a close while the send waited for room in librdkafka's queue named
    nothing, an outside review of session 45: the turn alone could be sent again)."""
    return ProducerClosed(
        f"the producer was closed while it sent: event {event_id} not produced (queued "
        f"before it, and reported by close: {', '.join(queued) or 'none'}); send the "
        "whole turn again with a new one")


# Linux lists a process's live OS threads here: a thread started outside ``threading``
# that ended is gone from it (elsewhere such a thread's place lasts until its ident is
# given to another thread).
_TASKS = "/proc/self/task"
_HAVE_TASKS = os.path.isdir(_TASKS)


class Delivery:
    """The delivery of the events one ``send`` / ``send_turn`` queued (``event_ids``):
    ``wait`` raises their failures, and only theirs, however many callers share the
    thread. ``flush`` tells each *thread* each failure once, so with coroutines on one
    event loop (or requests served in turn by one thread) one's flush could be told
    another's failure and the other's flush then returned as if its turn were written
    (session 48); a gateway confirming a turn per request waits for its ``Delivery``.
    Its events' failures are still told to the threads' flushes as before."""

    def __init__(self, producer: GatewayProducer, event_ids: tuple[str, ...]) -> None:
        self.event_ids = event_ids
        self._producer = producer
        self._failures: list[tuple[str, KafkaError]] = []
        self._unreported = set(event_ids)

    def _reported(self, event_id: str, err: KafkaError | None) -> None:
        """Its event's report (``err`` already explained); called under the producer's
        lock (``_record``), which tells each event once."""
        if err is not None and all(told != event_id for told, _ in self._failures):
            # Not twice: a report cut between these lines is finished by a look.
            self._failures.append((event_id, err))
        self._unreported.discard(event_id)

    def done(self) -> bool:
        """Every event of it was reported (delivered or failed)."""
        return not self._unreported

    def wait(self, timeout_s: float = 30.0) -> None:
        """Return once every event of it was acknowledged with an offset; raise
        ``DeliveryError`` listing those that failed (``pending``: those not reported
        yet), else ``FlushTimeout`` with those not reported within ``timeout_s``. It
        serves the reports itself, as ``flush`` does (librdkafka's poll, at most 0.1 s
        at a time, once at least: a report another thread served is seen within that);
        after ``close`` it raises what the close's purge reported, and a close of
        another thread while it waits is told with that purge (a send or wait begun
        after it raises at once); inside a
        delivery report of its thread (a signal handler's) it raises what it knows at
        once, as ``flush`` does. A report of it an exception ended (Ctrl-C) is its
        retryable failure, as in ``flush`` (session 49: ``FlushTimeout`` for ever)."""
        producer = self._producer
        deadline = time.monotonic() + timeout_s
        # Polls once at least, as ``flush`` does: ``wait(0)`` served no report, so the
        # broker's answers librdkafka held were ``FlushTimeout`` (an outside review,
        # session 48).
        while self._waits_on():
            remaining = deadline - time.monotonic()
            producer._serve_reports(min(max(remaining, 0.0), _WAIT_POLL_S))
            if remaining <= 0:
                break
        self._raise_outcome()

    async def wait_async(self, timeout_s: float = 30.0) -> None:
        """``wait`` on an event loop: non-blocking polls between pauses of the loop
        (5 ms, doubling up to 0.1 s), so no thread is held while it waits and a
        cancellation (``asyncio.run``'s task at Ctrl-C) ends it at once; another
        thread's close is seen at the end of its pause (at most 0.1 s). Session 48's
        ran ``wait`` in the loop's executor: each awaited ``Delivery`` held one of its
        few threads (a later one started only when one ended), and a cancelled one
        waited on until an outside review woke it."""
        deadline = time.monotonic() + timeout_s
        pause = _FIRST_ASYNC_PAUSE_S
        while self._waits_on():
            self._producer._serve_reports()
            remaining = deadline - time.monotonic()
            if not self._waits_on() or remaining <= 0:
                break
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, _WAIT_POLL_S)
        self._raise_outcome()

    def _waits_on(self) -> bool:
        """Reports can still come and be served here: not every event reported, not
        inside a delivery report of this thread (its poll cannot be entered again),
        the client not released (its close served every report: purged ones too)."""
        producer = self._producer
        producer._fail_lost()  # a report of it an exception ended: failed, so reported
        return not (self.done() or producer._in_reports() or producer._released)

    def _raise_outcome(self) -> None:
        """Raise what is known of it: failures, else events not reported."""
        # Not reported yet, then failures: a report adds its failure before it marks
        # its event reported, so one landing between the reads is in the second. Read
        # the other way round, it was in neither and a wait that timed out returned as
        # if its failed event were written (an outside review, session 48).
        unreported = set(self._unreported)
        failures = list(self._failures)
        pending = len(unreported.difference(event_id for event_id, _ in failures))
        if failures:
            raise DeliveryError([(event_id, str(err)) for event_id, err in failures],
                                retryable=all(err.retriable() and not err.fatal()
                                              for _, err in failures), pending=pending)
        if pending:
            raise FlushTimeout(pending)


class _Place:
    """A thread's cursor into the producer's failures (the number of the first one its
    flushes have not raised), and the mark of the flush of it telling them
    (``_raise_failures``). Slots: reading and writing them runs no Python code, so
    ``_raise_failures`` checks, moves and raises with no point a signal handler runs at."""

    __slots__ = ("cursor", "telling")

    def __init__(self, cursor: int) -> None:
        self.cursor = cursor
        self.telling: object = None


class _Places:
    """Each thread's place: its cursor into the producer's failures (callers hold its lock).

    A thread ``threading`` started (the main thread too) is its ``Thread`` object, held
    weakly (session 44: by ident before, and Python reuses idents). A thread started
    outside it (``_thread.start_new_thread``, a C extension's thread calling in through
    ``PyGILState_Ensure``) is its ident and its OS thread id (session 45): Python 3.11
    gives it a dummy ``Thread`` registered for its ident and never dropped, and its
    ``is_alive`` is always true, so keyed by that object the next such thread given the
    same ident took the ended one's place (told failures reported before it sent, or
    not told one a sender had not flushed past), and an ended one's place held every
    later failure for nobody. Not a ``threading.local``: a C thread that enters Python
    once per call gets a fresh thread state, and fresh locals, each time, so its place
    would vanish between its send and its flush. An ident belongs to one live thread at
    a time, so a place under the caller's ident with another OS thread id is an ended
    thread's: replaced. An ended foreign thread's place is also dropped at a flush once
    its OS thread id is gone from ``/proc/self/task`` (Linux; an OS thread id is reused
    only after the kernel's ids wrap around)."""

    def __init__(self) -> None:
        self._threads: weakref.WeakKeyDictionary[threading.Thread, _Place] = (
            weakref.WeakKeyDictionary())
        self._foreign: dict[int, tuple[int, _Place]] = {}  # ident: (OS thread id, place)

    def _caller(self) -> tuple[threading.Thread | None, int, int]:
        """The calling thread: its ``Thread`` (None if ``threading`` did not start it),
        ident and OS thread id. A place under its ident of another thread is dropped."""
        thread = threading.current_thread()
        ident, native = threading.get_ident(), _thread.get_native_id()
        held = self._foreign.get(ident)
        if held is not None and (held[0] != native
                                 or not isinstance(thread, threading._DummyThread)):
            del self._foreign[ident]  # that thread ended: its ident is the caller's
        return (None if isinstance(thread, threading._DummyThread) else thread,
                ident, native)

    def place(self, default: int) -> _Place:
        """The calling thread's place, made at ``default`` if it has none."""
        thread, ident, native = self._caller()
        if thread is not None:
            return self._threads.setdefault(thread, _Place(default))
        held = self._foreign.get(ident)
        if held is None:
            held = self._foreign[ident] = (native, _Place(default))
        return held[1]

    def setdefault(self, cursor: int) -> None:
        self.place(cursor)

    def drop_ended(self) -> None:
        # A thread ended once ``threading`` took it out of its live threads (as its
        # ``run`` returned), not by ``is_alive()``: a Ctrl-C inside that call, after
        # its lock ``acquire`` returned, makes CPython 3.11 (bpo-45274's handler)
        # release the thread's own state lock and mark a live thread stopped for good
        # (``join`` then returns at once); its place was dropped, its failures never
        # told (an outside review, session 51, rrevr). A dict read runs no Python code.
        live = threading._active  # type: ignore[attr-defined]
        for ended in [t for t in list(self._threads) if live.get(t.ident) is not t]:
            del self._threads[ended]
        if _HAVE_TASKS:
            for ident, (native, _) in list(self._foreign.items()):
                if not os.path.exists(f"{_TASKS}/{native}"):
                    del self._foreign[ident]

    def values(self) -> list[int]:
        return [*(place.cursor for place in self._threads.values()),
                *(place.cursor for _, place in self._foreign.values())]

    def __len__(self) -> int:
        return len(self._threads) + len(self._foreign)


def _block_note(error: GatewayError) -> str:
    """The note ``__exit__`` adds to a raising block's error: the close's error, and
    every failed event it holds. Its text names the first ``DeliveryError.LISTED`` only,
    and the close moved the thread past them all: a note of its text alone told the
    rest to no one (rrevy's outside review, session 52)."""
    note = f"leaving the GatewayProducer's block: {error!r}"
    if isinstance(error, DeliveryError) and len(error.failures) > DeliveryError.LISTED:
        note += "; every event not delivered: " + ", ".join(
            f"{event_id}: {err}" for event_id, err in error.failures)
    return note


def beyond_limits(event: TurnCompleted | ToolEffect) -> str | None:
    """Why the gateway library must not produce ``event``, else None (the size is
    checked on the encoded value): a turn beyond the item bound (any status: the
    processor rejects it ``UNSUPPORTED_FORMAT`` before anything else), a promotable
    turn whose contents hold too many arrays and objects (``UNSUPPORTED_FORMAT``; a
    turn of another status is ``NOT_PROMOTABLE_STATUS`` first, and must still be sent
    so its effects are orphaned, a review found), an effect whose output does (the
    processor dead-letters it, as the claims API refuses it), an effect whose
    ``tool_name``, ``call_id`` or ``arguments_digest`` is out of its bound (dead-lettered
    too: produced before session 43, its turn was then ``MISSING_TOOL_EFFECT``)."""
    if isinstance(event, ToolEffect):
        return effect_field_problem(event) or container_problem((event.output,))
    elements = elements_of(event)
    if elements > MAX_EVENT_ELEMENTS:
        return (f"{elements} array items and map entries, above the protocol maximum of "
                f"{MAX_EVENT_ELEMENTS}")
    if event.status not in PROMOTABLE_STATUSES:
        return None
    return container_problem(event.items)


def _key_of(event: GatewayEvent) -> str:
    """The event's partition key; a continued chain without its root has none:
    ``ChainRootUnknown`` (a ``MissingChainRoot`` and a ``GatewayError``)."""
    try:
        return event.partition_key
    except MissingChainRoot as exc:
        raise ChainRootUnknown(exc.response_id, exc.previous_response_id) from None
