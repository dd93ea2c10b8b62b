"""Plain records that cross the processor's boundary, free of Faust and Kafka types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schemas.models import DeadLetterReason, Frozen, GatewayEvent, TurnCompleted


@dataclass(frozen=True)
class RawRecord:
    """One consumed Kafka record, undecoded (the processor decodes it itself)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Outbound:
    """One record to publish; ``model`` is encoded by the publisher's codec."""

    topic: str
    key: bytes | None
    model: Frozen


class DecodeFailed(Exception):
    """A consumed record cannot become a gateway event; it goes to the dead letters."""

    def __init__(self, reason: DeadLetterReason, error: str, schema_id: int | None = None):
        super().__init__(error)
        self.reason = reason
        self.error = error
        self.schema_id = schema_id


class TurnBeyondLimits(Exception):
    """A ``TurnCompleted`` record beyond a limit of one gateway event that decoding
    never built in full (``schemas.limits.MAX_EVENT_ELEMENTS``): ``turn`` is its fields
    without its arrays, enough to reject it ``UNSUPPORTED_FORMAT``."""

    def __init__(self, turn: TurnCompleted, detail: str) -> None:
        super().__init__(detail)
        self.turn = turn
        self.detail = detail


class EventCodec(Protocol):
    """Turns wire bytes into gateway events and outcome models into wire bytes."""

    def decode(self, record: RawRecord) -> GatewayEvent:
        """Decode one gateway-events record or raise ``DecodeFailed`` (or
        ``TurnBeyondLimits``: a turn to reject without building it in full)."""
        ...

    def encode(self, topic: str, model: Frozen) -> bytes:
        """Encode an outcome model (Confluent wire format) for ``topic``."""
        ...

    def decodes_offline(self, record: RawRecord) -> bool:
        """True when ``decode`` would not wait on a remote call (a schema registry):
        the event loop may run it."""
        ...

    def encodes_offline(self, model: Frozen) -> bool:
        """True when ``encode`` would not wait on a remote call (see above)."""
        ...
