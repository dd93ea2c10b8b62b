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
``NOT_CERTIFIED`` (the turn was promoted logical-only), ``NO_ARTIFACT``,
``FINGERPRINT_MISMATCH`` (caller's fingerprint differs from the checkpoint's or the
artifact's), ``ARTIFACT_EXPIRED``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from ratchet.domain.history import (
    CheckpointRecord,
    HistoryFailure,
    HistoryFailureReason,
    VerifiedHistory,
    utc_ms,
)
from schemas.models import Certification, Item


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
    if artifact is None:
        return FallbackReason.NO_ARTIFACT
    bound = fingerprint_hash == checkpoint.fingerprint_hash == artifact.fingerprint_hash
    if fingerprint_hash is None or not bound:
        return FallbackReason.FINGERPRINT_MISMATCH
    if artifact.expires_at is not None and utc_ms(now) >= artifact.expires_at:
        return FallbackReason.ARTIFACT_EXPIRED
    return None
