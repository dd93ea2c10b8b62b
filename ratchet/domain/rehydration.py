"""What a gateway may reuse when it continues a response (pure, no I/O).

Input: a verified history (or why there is none), the caller's execution
``fingerprint_hash`` and the current time. Output, contract section 5:

- ``Certified``: the complete items plus the checkpoint; the token artifact may be
  reused as is.
- ``Fallback(reason)``: the complete items, but the gateway must re-render tokens.
  A fingerprint change or an expired artifact invalidates token reuse, never the
  logical history, so a fallback always carries every item.
- ``Failure(reason)``: no history can be given (the store's ``HistoryFailure``).

Fallback reasons are checked in this order, the first that applies wins:
``NOT_CERTIFIED`` (the turn was promoted logical-only), ``NO_ARTIFACT`` (none, a
stored artifact whose ``artifact_id`` is empty or only whitespace (``blank``), or a
stored artifact and boundary proof that do not bind each other to the turn:
``proof_binds``, or a stored router receipt that does not cover the artifact:
``receipt_covers``),
``FINGERPRINT_MISMATCH`` (caller's fingerprint differs from the checkpoint's or the
artifact's), ``ARTIFACT_EXPIRED``: the token artifact, its boundary proof or its router
receipt has expired (``expires_at <= now``, the same boundary for all three). Reuse
needs an unexpired artifact with a valid proof (docs/gateway-protocol.md), and a receipt
past its expiry no longer covers the tokens it names; the contract has no other
fallback reason for either, so both are ``ARTIFACT_EXPIRED``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from ratchet.domain.history import (
    FIRST_MS,
    LAST_MS,
    CheckpointRecord,
    HistoryFailure,
    HistoryFailureReason,
    VerifiedHistory,
    utc_ms,
)
from ratchet.domain.validation import blank
from schemas.canonical import parse_json
from schemas.models import Certification, Item

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


class FallbackReason(StrEnum):
    FINGERPRINT_MISMATCH = "FINGERPRINT_MISMATCH"
    ARTIFACT_EXPIRED = "ARTIFACT_EXPIRED"
    NOT_CERTIFIED = "NOT_CERTIFIED"
    NO_ARTIFACT = "NO_ARTIFACT"


@dataclass(frozen=True)
class Certified:
    checkpoint: CheckpointRecord
    items: tuple[Item, ...]
    head_seq: int


@dataclass(frozen=True)
class Fallback:
    reason: FallbackReason
    checkpoint: CheckpointRecord  # for response id / seq only: its artifact is not reusable
    items: tuple[Item, ...]
    head_seq: int


@dataclass(frozen=True)
class Failure:
    reason: HistoryFailureReason
    detail: str = ""


Rehydration = Certified | Fallback | Failure


def rehydrate(
    history: VerifiedHistory | HistoryFailure, fingerprint_hash: str | None, now: datetime
) -> Rehydration:
    """Decide certified / fallback / failure for one read (see the module docstring)."""
    if isinstance(history, HistoryFailure):
        return Failure(history.reason, history.detail)
    reason = fallback_reason(history.checkpoint, fingerprint_hash, now)
    if reason is None:
        return Certified(history.checkpoint, history.items, history.head_seq)
    return Fallback(reason, history.checkpoint, history.items, history.head_seq)


def fallback_reason(
    checkpoint: CheckpointRecord, fingerprint_hash: str | None, now: datetime
) -> FallbackReason | None:
    """Why the checkpoint's token artifact cannot be reused, or None if it can."""
    if checkpoint.certification is not Certification.CERTIFIED:
        return FallbackReason.NOT_CERTIFIED
    artifact = checkpoint.token_artifact
    if artifact is None or blank(artifact.artifact_id) or (
        checkpoint.boundary_proof is None
    ) or not proof_binds(
        checkpoint.boundary_proof, checkpoint.fingerprint_hash, artifact.token_count,
        artifact.token_hash, artifact.safe_append_boundary,
    ) or not receipt_covers(checkpoint.router_receipt, artifact.token_count):
        return FallbackReason.NO_ARTIFACT
    bound = fingerprint_hash == checkpoint.fingerprint_hash == artifact.fingerprint_hash
    if fingerprint_hash is None or not bound:
        return FallbackReason.FINGERPRINT_MISMATCH
    if artifact.expires_at is not None and utc_ms(now) >= artifact.expires_at:
        return FallbackReason.ARTIFACT_EXPIRED
    now_ms = (utc_ms(now) - _EPOCH) // _MILLISECOND  # exact: no float rounding
    for record in (checkpoint.boundary_proof, checkpoint.router_receipt):
        if record is not None and now_ms >= record_expires_at_ms(record):
            return FallbackReason.ARTIFACT_EXPIRED
    return None


@functools.lru_cache(maxsize=4096)
def proof_binds(proof_json: str, fingerprint_hash: str | None, token_count: int,
                token_hash: str, safe_append_boundary: int) -> bool:
    """Whether a stored boundary proof binds the stored artifact to the turn, as the
    processor checked before it certified the turn (``validation.check_boundary``):
    the turn's fingerprint, counts that add up to the artifact's, the artifact's token
    hash, a safe append boundary inside it. Stored cells bound by no digest are checked
    again on every read: a proof or artifact damaged after promotion must not be
    offered for reuse (CONTRACT section 1.5), so it reads as ``NO_ARTIFACT``, like a
    missing proof. Cached: a stored record never changes."""
    try:
        proof = parse_json(proof_json.encode("utf-8"))
    except ValueError:
        return False
    if not isinstance(proof, dict):
        return False
    counts = [proof.get(k) for k in ("prefix_count", "append_count", "combined_count")]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts):
        return False
    prefix, append, combined = counts
    return (
        fingerprint_hash is not None
        and proof.get("fingerprint_hash") == fingerprint_hash
        and prefix + append == combined == token_count
        and proof.get("combined_hash") == token_hash
        and 0 <= safe_append_boundary <= token_count
    )


def receipt_covers(receipt_json: str | None, token_count: int) -> bool:
    """Whether a stored router receipt (if any) covers the stored artifact, as the
    processor checked before it kept it (``validation.check_boundary``, from session
    52): named by a ``receipt_id``, ``issuer`` and ``router_key_format`` that are not
    empty nor only whitespace (``blank``, since session 53), ``covered_tokens`` in 0..the artifact's ``token_count``.
    Checked on every read, like the proof: a receipt stored before session 52 was
    checked for its expiry only, and its cell is bound by no digest. Its router key
    format cannot be compared with the fingerprint's here: the row keeps the
    fingerprint's hash, not its components (the processor's check is the gate)."""
    return receipt_json is None or _receipt_covers(receipt_json, token_count)


@functools.lru_cache(maxsize=4096)
def _receipt_covers(receipt_json: str, token_count: int) -> bool:
    try:
        receipt = parse_json(receipt_json.encode("utf-8"))
    except ValueError:
        return False
    if not isinstance(receipt, dict):
        return False
    named = all(isinstance(receipt.get(k), str) and not blank(receipt[k])
                for k in ("receipt_id", "issuer", "router_key_format"))
    covered = receipt.get("covered_tokens")
    return (named and isinstance(covered, int) and not isinstance(covered, bool)
            and 0 <= covered <= token_count)


@functools.lru_cache(maxsize=4096)
def record_expires_at_ms(record_json: str) -> int:
    """The ``expires_at`` (epoch millis) of a checkpoint's stored boundary proof or router
    receipt (the canonical JSON the processor validated). Cached: every read asks
    again, and a stored record never changes. Both records require their expiry (a
    ``timestamp-millis`` long, never null: ``schemas/BoundaryProof.avsc``,
    ``RouterReceipt.avsc``), so the processor keeps only integers within years 1 to
    9999 (``FIRST_MS``..``LAST_MS``: any other turn is dead-lettered or refused
    ``CORRUPT``). Anything else is damage and counts as expired (0): a record that is
    not a JSON object, an ``expires_at`` that is null or missing (it read as "never
    expires" until session 53's outside review), not an integer, or off the calendar
    (e.g. 10^30, which would otherwise never expire). Reuse fails closed."""
    try:
        record = parse_json(record_json.encode("utf-8"))
    except ValueError:
        return 0
    if not isinstance(record, dict):
        return 0
    value = record.get("expires_at")
    readable = isinstance(value, int) and not isinstance(value, bool) and (
        FIRST_MS <= value <= LAST_MS)
    return value if readable else 0
