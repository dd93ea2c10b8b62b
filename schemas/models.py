"""Python models mirroring the ``.avsc`` files in this folder (the source of truth).

``tests/unit/test_model_schema_drift.py`` fails if a model and its schema drift apart.

Conventions:
* Every model is frozen (``extra="forbid"``): an event is a fact, never edited.
* Avro ``timestamp-millis`` fields are ``EpochMillis`` ints (UTC epoch milliseconds),
  the unit of Kafka timestamps and of ``validate_turn(now_ms=...)``. The serde reads
  them as the longs they are (``writer_schema.timestamps_as_longs``; their range is
  ``avro_ranges``'); an aware datetime (a writer's ``timestamp-micros``, which fastavro
  reads as one) is converted by the validator.
* Arrays are tuples so that the models stay immutable.
* Enums are ``StrEnum`` whose values are exactly the Avro symbols.
* ``to_avro()`` gives the dict fastavro writes; ``from_avro(d)`` validates a decoded dict.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from schemas.keys import partition_key

# Item encodings this version can decode; anything else is UNSUPPORTED_FORMAT.
SUPPORTED_FORMAT_VERSIONS = frozenset({1})
# Fingerprint component sets / canonical encodings this version understands.
SUPPORTED_FINGERPRINT_VERSIONS = frozenset({1})
CURRENT_FINGERPRINT_VERSION = 1


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _to_epoch_millis(value: Any) -> Any:
    """An aware datetime (fastavro reads a writer's timestamp-micros as one) as epoch
    milliseconds, floored; the models keep ints."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("naive datetime: timestamps must be timezone-aware (UTC)")
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return value


EpochMillis = Annotated[int, BeforeValidator(_to_epoch_millis)]
"""UTC epoch milliseconds; Avro ``{"type": "long", "logicalType": "timestamp-millis"}``."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    def to_avro(self) -> dict[str, Any]:
        """The dict fastavro writes (enums are ``str`` subclasses, tuples are sequences)."""
        return self.model_dump()

    @classmethod
    def from_avro(cls, data: dict[str, Any]) -> Self:
        """Validate a dict decoded by fastavro (datetimes become epoch millis)."""
        return cls.model_validate(data)


# --- enums -------------------------------------------------------------------------


class TurnStatus(StrEnum):
    """Responses API status of a response (``io.ratchet.TurnStatus``)."""

    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"
    CANCELLED = "cancelled"
    IN_PROGRESS = "in_progress"
    QUEUED = "queued"


Status = TurnStatus


class Truncation(StrEnum):
    DISABLED = "disabled"
    AUTO = "auto"


class ToolEffectStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class Certification(StrEnum):
    """``certified``: tokens are reusable; ``logical_only``: only the logical history is."""

    CERTIFIED = "certified"
    LOGICAL_ONLY = "logical_only"


class RejectionReason(StrEnum):
    """The 16 rejection codes of CONTRACT section 4 (``PromotionRejected.reason``)."""

    DUPLICATE = "DUPLICATE"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    CONFLICT = "CONFLICT"
    OUT_OF_ORDER = "OUT_OF_ORDER"
    PARENT_NOT_PROMOTED = "PARENT_NOT_PROMOTED"
    TENANT_MISMATCH = "TENANT_MISMATCH"
    NOT_PROMOTABLE_STATUS = "NOT_PROMOTABLE_STATUS"
    CANCELLED = "CANCELLED"
    CORRUPT = "CORRUPT"
    UNKNOWN_ITEM_TYPE = "UNKNOWN_ITEM_TYPE"
    UNSUPPORTED_FORMAT = "UNSUPPORTED_FORMAT"
    INCOMPLETE_FINGERPRINT = "INCOMPLETE_FINGERPRINT"
    UNPAIRED_TOOL_CALL = "UNPAIRED_TOOL_CALL"
    MISSING_TOOL_EFFECT = "MISSING_TOOL_EFFECT"
    DUPLICATE_TOOL_EFFECT = "DUPLICATE_TOOL_EFFECT"
    INVALID_BOUNDARY_PROOF = "INVALID_BOUNDARY_PROOF"


class OrphanReason(StrEnum):
    ATTEMPT_SUPERSEDED = "ATTEMPT_SUPERSEDED"
    TURN_REJECTED = "TURN_REJECTED"
    TURN_NOT_PROMOTABLE = "TURN_NOT_PROMOTABLE"
    TURN_CANCELLED = "TURN_CANCELLED"
    EFFECT_CONFLICT = "EFFECT_CONFLICT"
    UNKNOWN = "UNKNOWN"


class DeadLetterReason(StrEnum):
    """Why a record could not be decoded (``DecodeError.reason``)."""

    NULL_VALUE = "NULL_VALUE"
    BAD_MAGIC_BYTE = "BAD_MAGIC_BYTE"
    TRUNCATED = "TRUNCATED"
    UNKNOWN_SCHEMA_ID = "UNKNOWN_SCHEMA_ID"
    SCHEMA_MISMATCH = "SCHEMA_MISMATCH"
    UNEXPECTED_RECORD_TYPE = "UNEXPECTED_RECORD_TYPE"
    CORRUPT_PAYLOAD = "CORRUPT_PAYLOAD"
    INVALID_EVENT = "INVALID_EVENT"
    UNKNOWN = "UNKNOWN"


# --- building blocks ---------------------------------------------------------------


class Item(Frozen):
    """One model-visible item of a Responses history (``content`` is canonical JSON)."""

    item_id: str
    type: str
    role: str | None = None
    call_id: str | None = None
    content: bytes
    content_digest: str
    format_version: int = 1

    def digest_ok(self) -> bool:
        return sha256_hex(self.content) == self.content_digest


class Fingerprint(Frozen):
    """Execution fingerprint (CONTRACT 1.2). Build it with ``ratchet.domain.fingerprint``.

    Components are optional here so that an incomplete fingerprint can be *represented*
    and then rejected as INCOMPLETE_FINGERPRINT by validation, not lost as a dead letter.
    """

    fingerprint_version: int = CURRENT_FINGERPRINT_VERSION
    model_name: str | None = None
    model_weights_revision: str | None = None
    tokenizer_name: str | None = None
    tokenizer_revision: str | None = None
    renderer_name: str | None = None
    renderer_version: str | None = None
    chat_template_digest: str | None = None
    chat_template_args: str | None = None
    reasoning_parser: str | None = None
    reasoning_flags: str | None = None
    tool_parser: str | None = None
    instructions_digest: str | None = None
    tools_digest: str | None = None
    lora_name: str | None = None
    lora_revision: str | None = None
    multimodal_input_digests: tuple[str, ...] = ()
    cache_salt_digest: str | None = None
    block_hash_format: str | None = None
    router_key_format: str | None = None
    block_size: int | None = None
    item_format_version: int | None = None


class EffectiveConfig(Frozen):
    instructions_digest: str
    tools_digest: str
    tool_choice: str | None = None
    truncation: Truncation
    truncated: bool


class TokenArtifact(Frozen):
    artifact_id: str
    token_hash: str
    token_count: int
    safe_append_boundary: int
    fingerprint_hash: str
    expires_at: EpochMillis


class RouterReceipt(Frozen):
    receipt_id: str
    router_key_format: str
    covered_tokens: int
    expires_at: EpochMillis
    issuer: str


class BoundaryProof(Frozen):
    prefix_hash: str
    prefix_count: int
    append_hash: str
    append_count: int
    combined_hash: str
    combined_count: int
    boundary_kind: str
    fingerprint_hash: str
    expires_at: EpochMillis


class Subturn(Frozen):
    index: int
    ephemeral_artifact_ref: str | None = None
    effect_ids: tuple[str, ...] = ()


class StreamInfo(Frozen):
    streamed: bool
    client_disconnected: bool


# --- events --------------------------------------------------------------------------


class EventHeader(Frozen):
    """Fields every ratchet event carries (CONTRACT section 3, "Common")."""

    event_id: str
    tenant_id: str
    conversation_id: str | None = None
    chain_root_id: str | None = None
    response_id: str
    produced_at: EpochMillis


class GatewayEventHeader(EventHeader):
    """Header of the events gateways publish; their Kafka key is derived from it."""

    @property
    def partition_key(self) -> str:
        """CONTRACT section 2 (``schemas.keys.partition_key``): the event's Kafka key."""
        return partition_key(self)


class TurnCompleted(GatewayEventHeader):
    idempotency_key: str
    request_digest: str
    attempt: int
    previous_response_id: str | None = None
    expected_head_seq: int | None = None
    status: TurnStatus
    incomplete_reason: str | None = None
    input_items: tuple[Item, ...]
    output_items: tuple[Item, ...]
    effective_config: EffectiveConfig
    fingerprint: Fingerprint
    fingerprint_hash: str
    boundary_proof: BoundaryProof | None = None
    token_artifact: TokenArtifact | None = None
    router_receipt: RouterReceipt | None = None
    subturns: tuple[Subturn, ...] = ()
    tool_effect_ids: tuple[str, ...] = ()
    stream: StreamInfo
    expires_at: EpochMillis | None = None
    gateway_id: str | None = None  # added after v1 (backward compatible: default null)

    @property
    def items(self) -> tuple[Item, ...]:
        """Input then output items: the order pairing is checked in."""
        return self.input_items + self.output_items


class ToolEffect(GatewayEventHeader):
    effect_id: str
    idempotency_key: str
    attempt: int
    subturn_index: int
    call_id: str
    tool_name: str
    arguments_digest: str
    status: ToolEffectStatus
    output: Item
    executed_at: EpochMillis


class TurnCancelled(GatewayEventHeader):
    idempotency_key: str
    cancelled_at: EpochMillis


class OutcomeHeader(EventHeader):
    """Header of the events ratchet publishes: the common fields + the partition key."""

    partition_key: str


class CheckpointPromoted(OutcomeHeader):
    idempotency_key: str
    request_digest: str
    attempt: int
    previous_response_id: str | None = None
    seq: int
    certification: Certification
    fingerprint_hash: str
    artifact_id: str | None = None
    artifact_expires_at: EpochMillis | None = None
    item_count: int
    promoted_at: EpochMillis
    expires_at: EpochMillis | None = None


class PromotionRejected(OutcomeHeader):
    idempotency_key: str
    request_digest: str | None = None
    attempt: int
    reason: RejectionReason
    detail: str
    head_seq: int | None = None
    existing_response_id: str | None = None


class EffectOrphaned(OutcomeHeader):
    effect_id: str
    idempotency_key: str
    attempt: int
    subturn_index: int
    tool_name: str
    call_id: str
    arguments_digest: str
    output_digest: str | None = None
    reason: OrphanReason
    rejection_reason: RejectionReason | None = None
    detail: str | None = None
    orphaned_at: EpochMillis
    effect_completed: bool | None = None


_AVRO_INT = range(-(2**31), 2**31)


class DeadLetter(Frozen):
    """Always encodable, whatever the record it is about (a dead letter that cannot be
    published would stall its partition): a ``schema_id`` outside the Avro ``int`` (a
    header's id is unsigned 32-bit) becomes null and is named at the start of ``error``,
    and text in ``error`` that is not UTF-8 (lone surrogates, e.g. from a registry
    schema's ``"\\udc80"`` escape) is backslash-escaped."""

    key: bytes | None = None
    value: bytes | None = None
    error: str
    reason: DeadLetterReason
    source_topic: str
    source_partition: int
    source_offset: int
    schema_id: int | None = None
    dead_lettered_at: EpochMillis

    @model_validator(mode="before")
    @classmethod
    def _encodable(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        schema_id, error = data.get("schema_id"), data.get("error")
        if isinstance(schema_id, int) and schema_id not in _AVRO_INT and isinstance(error, str):
            data = {**data, "schema_id": None,
                    "error": f"schema id {schema_id} (beyond DeadLetter.schema_id): {error}"}
        error = data.get("error")
        if isinstance(error, str) and not error.isascii():
            try:
                error.encode("utf-8")
            except UnicodeEncodeError:
                data = {**data, "error": error.encode("utf-8", "backslashreplace").decode("utf-8")}
        return data


GatewayEvent = TurnCompleted | ToolEffect | TurnCancelled

# Avro record name -> model; the serde and the drift test both use it.
MODELS_BY_RECORD: dict[str, type[Frozen]] = {
    "Item": Item,
    "Fingerprint": Fingerprint,
    "EffectiveConfig": EffectiveConfig,
    "TokenArtifact": TokenArtifact,
    "RouterReceipt": RouterReceipt,
    "BoundaryProof": BoundaryProof,
    "Subturn": Subturn,
    "StreamInfo": StreamInfo,
    "TurnCompleted": TurnCompleted,
    "ToolEffect": ToolEffect,
    "TurnCancelled": TurnCancelled,
    "CheckpointPromoted": CheckpointPromoted,
    "PromotionRejected": PromotionRejected,
    "EffectOrphaned": EffectOrphaned,
    "DeadLetter": DeadLetter,
}
ENUMS_BY_NAME: dict[str, type[StrEnum]] = {
    "TurnStatus": TurnStatus,
    "Truncation": Truncation,
    "ToolEffectStatus": ToolEffectStatus,
    "Certification": Certification,
    "RejectionReason": RejectionReason,
    "OrphanReason": OrphanReason,
    "DeadLetterReason": DeadLetterReason,
}


def record_name(model: Frozen | type[Frozen]) -> str:
    """The Avro record name of a model (class or instance)."""
    cls = model if isinstance(model, type) else type(model)
    name = _RECORD_OF_MODEL.get(cls)
    if name is None:
        raise KeyError(f"{cls.__name__} is not an Avro record model")
    return name


# The other way round, looked up by class (the exact class, as before): a gateway's
# send asked it four times an event, a scan of the table each (session 50).
_RECORD_OF_MODEL: dict[type[Frozen], str] = {cls: name for name, cls in MODELS_BY_RECORD.items()}
