"""Idempotent producer of gateway events, with typed delivery errors raised on ``flush``.

Why these settings: ``enable.idempotence=true`` + ``acks=all`` make librdkafka's own
retries safe (no duplicates, no reordering within a partition), so a turn's
``ToolEffect``s, produced first with the same key, stay ordered before its
``TurnCompleted`` - the order the processor relies on (CONTRACT section 2).

Delivery is asynchronous. Failures reported by delivery callbacks are collected and
raised, once, by the next ``flush`` as ``DeliveryError`` (``retryable`` when every
broker error was retriable). A gateway must not report a turn as persisted before its
``flush`` returned - and even then, persisted is not promoted: ask the rehydration API
with ``wait_ms`` for that.

    with GatewayProducer(settings) as producer:
        producer.send_turn(turn, effects=effects)
        producer.flush()            # raises DeliveryError / FlushTimeout
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from ratchet.domain.bounds import container_problem, elements_of
from ratchet.domain.validation import PROMOTABLE_STATUSES
from ratchet.settings import Settings
from schemas.avro import EventSerde, encode_key, registry_client
from schemas.ids import unservable_id
from schemas.limits import CLIENT_MAX_BYTES, MAX_EVENT_BYTES, MAX_EVENT_ELEMENTS
from schemas.models import GatewayEvent, ToolEffect, TurnCompleted
from services.gateway.errors import (
    DeliveryError,
    EventBeyondLimits,
    EventTooLarge,
    FlushTimeout,
    UnservableId,
)

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
}


class GatewayProducer:
    """One Kafka producer per gateway process; thread-safe like the underlying client."""

    def __init__(
        self,
        settings: Settings,
        serde: EventSerde | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.topic = settings.topic("gateway-events")
        self._serde = serde or EventSerde(
            registry_client(settings.schema_registry_url)
        )
        self._producer = Producer(
            {"bootstrap.servers": settings.kafka_bootstrap, **PRODUCER_DEFAULTS, **(config or {})}
        )
        self._lock = threading.Lock()
        self._failures: list[tuple[str, KafkaError]] = []

    def __enter__(self) -> GatewayProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._producer.flush(10)

    def send(self, event: GatewayEvent) -> None:
        """Queue one event (keyed by its partition key); delivery is reported on flush.
        Refused before producing: an id the API could never serve (``UnservableId``), a
        value above the protocol maximum (``EventTooLarge``), a turn beyond the
        protocol's bounds on array items and on its contents' arrays and objects
        (``EventBeyondLimits``)."""
        key = event.partition_key  # raises MissingChainRoot for a chain without its root
        if not key:
            raise ValueError(f"event {event.event_id} has an empty partition key")
        problem = unservable_id(event)
        if problem:
            raise UnservableId(f"event {event.event_id}: {problem}")
        if isinstance(event, TurnCompleted | ToolEffect):
            beyond = beyond_limits(event)
            if beyond is not None:
                raise EventBeyondLimits(event.event_id, beyond)
        value = self._serde.encode(event, self.topic)
        if len(value) > MAX_EVENT_BYTES:
            raise EventTooLarge(event.event_id, len(value))
        callback = self._on_delivery(event.event_id)
        while True:
            try:
                self._producer.produce(
                    self.topic, value=value, key=encode_key(key), on_delivery=callback
                )
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.1)
        self._producer.poll(0)

    def send_turn(self, turn: TurnCompleted, effects: Iterable[ToolEffect] = ()) -> None:
        """The turn's tool effects first, then the turn (same key: same partition, in order).
        A turn with an id the API could never serve, or beyond the protocol's bounds, is
        refused before any of its effects is produced."""
        problem = unservable_id(turn)
        if problem:
            raise UnservableId(f"event {turn.event_id}: {problem}")
        beyond = beyond_limits(turn)
        if beyond is not None:
            raise EventBeyondLimits(turn.event_id, beyond)
        for effect in effects:
            if effect.partition_key != turn.partition_key:
                raise ValueError(f"effect {effect.effect_id} is keyed apart from its turn")
            self.send(effect)
        self.send(turn)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for every queued event; raise what failed since the last flush."""
        pending = self._producer.flush(timeout_s)
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            raise DeliveryError(
                [(event_id, str(err)) for event_id, err in failures],
                retryable=all(err.retriable() and not err.fatal() for _, err in failures),
            )
        if pending:
            raise FlushTimeout(pending)

    def _on_delivery(self, event_id: str):
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is None and msg.offset() is None:
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
                with self._lock:
                    self._failures.append((event_id, err))

        return report


def beyond_limits(event: TurnCompleted | ToolEffect) -> str | None:
    """Why the gateway library must not produce ``event``, else None (the size is
    checked on the encoded value): a turn beyond the item bound (any status: the
    processor rejects it ``UNSUPPORTED_FORMAT`` before anything else), a promotable
    turn whose contents hold too many arrays and objects (``UNSUPPORTED_FORMAT``; a
    turn of another status is ``NOT_PROMOTABLE_STATUS`` first, and must still be sent
    so its effects are orphaned, a review found), an effect whose output does (the
    processor dead-letters it, as the claims API refuses it)."""
    if isinstance(event, ToolEffect):
        return container_problem((event.output,))
    elements = elements_of(event)
    if elements > MAX_EVENT_ELEMENTS:
        return (f"{elements} array items and map entries, above the protocol maximum of "
                f"{MAX_EVENT_ELEMENTS}")
    if event.status not in PROMOTABLE_STATUSES:
        return None
    return container_problem(event.items)
