"""A history answer and how each kind is made: a verified history (certified or
fallback), a failure, a stored checkpoint that cannot be rendered, ``NOT_PROMOTED``.

Every reader of the API (response_reader.py, conversation_reader.py,
cached_histories.py, full_reads.py, decision_wait.py) answers with these, so an answer
is counted in ``ratchet_api_history_outcomes_total`` in one place for every path."""

from __future__ import annotations

from dataclasses import dataclass

from ratchet.domain.history import CheckpointRecord, HistoryFailure
from ratchet.metric_children import child
from services.api import metrics
from services.api.answer_budget import Pin, Reservation
from services.api.cache import CachedHistory, HistoryCache
from services.api.models import FAILURE_HTTP_STATUS, HistoryBody
from services.api.render import RenderedHistory, conversation_head_seq, failure_body, history_parts


@dataclass(frozen=True)
class Answer:
    """A history answer: the JSON body (in parts, sent in slices: slow_readers.py), its
    status, and the fields the log line names."""

    status_code: int
    outcome: str
    reason: str | None
    head_seq: int | None
    detail: str | None
    parts: tuple[bytes, ...]
    # The bytes of ``parts`` that are this answer's own copy (not the cache's), and the
    # answer budget's reservation of them until written (answer_budget.py).
    own_bytes: int = 0
    held: Reservation | Pin | None = None
    # The cache's entry whose bytes ``parts`` shares (pinned while written: service.py).
    shares: CachedHistory | None = None
    # The partition of the verified history answered (None: not a history).
    partition_key: str | None = None

    @property
    def payload(self) -> bytes:
        """The whole JSON body."""
        return b"".join(self.parts)

    @classmethod
    def of(cls, body: HistoryBody, status_code: int) -> Answer:
        return cls(
            status_code,
            body.outcome,
            body.reason,
            body.head_seq,
            body.detail,
            (body.__pydantic_serializer__.to_json(body),),
        )


def unrenderable_answer(body: HistoryBody, endpoint: str) -> Answer:
    """A stored checkpoint that cannot be rendered (``CORRUPT_HISTORY``): the body
    names the response on the response endpoint, nothing on the Conversation one
    (docs/gateway-protocol.md, section 8: a failure body's ``response_id``)."""
    if endpoint == "conversation":
        body = body.model_copy(update={"response_id": None})
    child(metrics.OUTCOMES, endpoint, body.outcome, body.reason or "").inc()
    return Answer.of(body, 500)


def failure_answer(history: HistoryFailure, endpoint: str) -> Answer:
    reason = str(history.reason)
    body = failure_body(reason, detail=history.detail)
    child(metrics.OUTCOMES, endpoint, "failure", reason).inc()
    return Answer.of(body, _failure_status(reason))


def verified_answer(
    cache: HistoryCache | None,
    rendered: RenderedHistory,
    checkpoint: CheckpointRecord,
    current_head_seq: int,
    fallback,
    endpoint: str,
) -> Answer:
    """``head_seq`` is the response's own seq; a Conversation's current head
    (``current_head_seq``, as verified) is answered beside it. ``cache``: the answer
    shares its cached entry's bytes when it is that rendering (None: no cache)."""
    outcome = "certified" if fallback is None else "fallback"
    reason = None if fallback is None else str(fallback)
    child(metrics.OUTCOMES, endpoint, outcome, reason or "").inc()
    own = checkpoint.seq
    parts = history_parts(
        rendered, own, conversation_head_seq(checkpoint, current_head_seq), fallback
    )
    cached = None if cache is None else cache.get(
        checkpoint.tenant_id, checkpoint.response_id)
    shared = cached is not None and cached.rendered.items_json is rendered.items_json
    own_bytes = 0 if shared else sum(len(part) for part in parts)
    return Answer(200, outcome, reason, own, None, parts, own_bytes,
                  shares=cached if shared else None,
                  partition_key=checkpoint.partition_key)


def not_promoted(response_id: str, detail: str) -> Answer:
    body = failure_body("NOT_PROMOTED", response_id=response_id, detail=detail)
    child(metrics.OUTCOMES, "response", "failure", "NOT_PROMOTED").inc()
    return Answer.of(body, 409)


def _failure_status(reason: str) -> int:
    return FAILURE_HTTP_STATUS.get(reason, 500)
