"""HTTP bodies of the rehydration service (CONTRACT section 5), published in OpenAPI.

Item content: an item's ``content`` is stored as bytes of canonical JSON. Over HTTP it
is the SAME canonical JSON as a UTF-8 string (``content``), never re-encoded, so
``sha256(content.encode("utf-8")) == content_digest`` holds byte for byte and the
gateway renders exactly what was certified. Parse it with ``json.loads`` to use it.
Why not a parsed object: re-serialising on either side (float formatting, key order,
escaping) could change the bytes the digest and the token artifact were computed on.
Why not base64: the content is valid UTF-8 JSON by construction; a string keeps the
payload readable and a third smaller.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Outcome = Literal["certified", "fallback", "failure"]
FALLBACK_REASONS = ("FINGERPRINT_MISMATCH", "ARTIFACT_EXPIRED", "NOT_CERTIFIED", "NO_ARTIFACT")
FAILURE_REASONS = (
    "NOT_FOUND",
    "NOT_PROMOTED",
    "EXPIRED",
    "CORRUPT_HISTORY",
    "MISSING_HISTORY",
    "UNKNOWN_ITEM_TYPE",
    "UNSUPPORTED_FORMAT",
)
# CONTRACT section 5: the HTTP status of each failure reason; integrity failures are 500.
FAILURE_HTTP_STATUS = {
    "NOT_FOUND": 404,
    "NOT_PROMOTED": 409,
    "EXPIRED": 410,
    "CORRUPT_HISTORY": 500,
    "MISSING_HISTORY": 500,
    "UNKNOWN_ITEM_TYPE": 500,
    "UNSUPPORTED_FORMAT": 500,
}


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True)


class HistoryItem(_Body):
    item_id: str
    type: str
    role: str | None = None
    call_id: str | None = None
    content: str = Field(
        description="The item's canonical JSON, exactly as certified (UTF-8 text). "
        "sha256(content as UTF-8) == content_digest."
    )
    content_digest: str = Field(description="sha256 hex of the canonical JSON bytes.")
    format_version: int


class CheckpointBody(_Body):
    """What a gateway may reuse (certified only): all bound to ``fingerprint_hash``."""

    seq: int
    fingerprint_hash: str
    expires_at: str | None = Field(None, description="The token artifact's expiry, ISO-8601 "
                                   "UTC; reuse is refused from then on, or from the boundary "
                                   "proof's or router receipt's own expires_at if earlier.")
    token_artifact: dict[str, Any] | None = None
    router_receipt: dict[str, Any] | None = None
    boundary_proof: dict[str, Any] | None = None


class HistoryBody(_Body):
    outcome: Outcome
    reason: str | None = Field(
        None,
        description="null when certified; a fallback reason "
        f"({', '.join(FALLBACK_REASONS)}) or a failure reason ({', '.join(FAILURE_REASONS)}).",
    )
    head_seq: int | None = Field(
        None, description="Sequence number of the response the history ends with."
    )
    conversation_head_seq: int | None = Field(
        None,
        description="Conversation mode: the Conversation's current head seq (equal to "
        "head_seq on the conversation endpoint); null in chain mode.",
    )
    response_id: str | None = Field(None, description="The response the history ends with.")
    items: list[HistoryItem] | None = Field(
        None, description="The COMPLETE ordered history (certified and fallback only)."
    )
    checkpoint: CheckpointBody | None = Field(None, description="Certified only.")
    detail: str | None = Field(None, description="Human-readable explanation of a failure.")


class StatusBody(_Body):
    response_id: str
    state: Literal["promoted", "rejected", "unknown"]
    reason: str | None = Field(None, description="Rejection reason (CONTRACT section 4).")
    seq: int | None = Field(None, description="Promoted sequence number, when promoted.")
    existing_response_id: str | None = Field(
        None,
        description="DUPLICATE: the response the request was promoted as (answer with it); "
                    "IDEMPOTENCY_KEY_REUSED: the response the key promoted; CONFLICT: the "
                    "response id itself when it is bound to another request (null when "
                    "the head conflicts).",
    )


class ErrorBody(_Body):
    """Typed error for requests that never reached the domain."""

    # CORRUPT_HISTORY: the status endpoint's answer for a damaged checkpoint row, and
    # the claims API's for a damaged request claim;
    # MISSING_HISTORY: for a promoted response whose turn row is gone.
    error: Literal["INVALID_REQUEST", "UNAVAILABLE", "INTERNAL", "CORRUPT_HISTORY",
                   "MISSING_HISTORY"]
    detail: Any = None
    retryable: bool = False


class HealthBody(_Body):
    status: Literal["ok", "degraded"]
    store: bool | None  # None: not checked (the liveness probe never reads the store)
    notifier: bool
