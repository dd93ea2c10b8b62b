"""What each endpoint does, without HTTP: read, verify, decide, maybe wait once.

The rules live in the domain (``ratchet.domain.history`` verifies a stored history,
``ratchet.domain.rehydration`` decides certified / fallback / failure); this module
only sequences I/O around them and maps "not in the store" to the right failure:

- the response is in the store: the domain's answer, whatever it is;
- not in the store but the ledger recorded a rejection for this tenant: ``NOT_PROMOTED``
  (409) with the rejection reason in ``detail``;
- not known at all: ``NOT_FOUND`` (404) - the same answer as another tenant's id;
- not known, and the caller asked to wait (``wait_ms > 0``) and nothing was decided in
  time: ``NOT_PROMOTED`` (409). By waiting, the caller says it produced the turn; "not
  promoted (yet)" is the truthful answer, and it leaks nothing about other tenants
  (an id promoted for another tenant waits out its full ``wait_ms`` too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.concurrency import run_in_threadpool

from ratchet.domain.history import (
    CheckpointRecord,
    HistoryFailure,
    HistoryFailureReason,
    VerifiedHistory,
    utc_ms,
)
from ratchet.domain.rehydration import fallback_reason
from services.api import metrics
from services.api.cache import CachedHistory, HistoryCache, lineage_stamps
from services.api.models import FAILURE_HTTP_STATUS, HistoryBody, StatusBody
from services.api.render import (
    RenderedHistory,
    conversation_head_seq,
    failure_body,
    history_json,
    render_history,
)
from services.api.waiters import PromotionWaiters
from services.ledger.base import Ledger, ResponseState
from services.store.base import CheckpointStore
from services.store.stamps import CassandraStamps, PartitionStamp

log = logging.getLogger("ratchet.api")

WAIT_MS_CAP = 10_000


@dataclass(frozen=True)
class Answer:
    """A history answer: the JSON body, its status, and the fields the log line names."""

    status_code: int
    outcome: str
    reason: str | None
    head_seq: int | None
    detail: str | None
    payload: bytes

    @classmethod
    def of(cls, body: HistoryBody, status_code: int) -> Answer:
        return cls(
            status_code,
            body.outcome,
            body.reason,
            body.head_seq,
            body.detail,
            body.__pydantic_serializer__.to_json(body),
        )


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RehydrationService:
    """Thin orchestration over the store (histories) and the ledger (rejections).

    With a ``HistoryCache`` and ``CassandraStamps`` (the production wiring), verified
    histories are cached and every hit is revalidated by one stamp query (cache.py);
    without them (in-memory tests), every lookup is a full store read as before."""

    def __init__(
        self,
        store: CheckpointStore,
        ledger: Ledger | None,
        waiters: PromotionWaiters,
        clock: Callable[[], datetime] = _utc_now,
        *,
        cache: HistoryCache | None = None,
        stamps: CassandraStamps | None = None,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._waiters = waiters
        self._clock = clock
        self._cache = cache if cache is not None and cache.enabled and stamps else None
        self._stamps = stamps

    # -- endpoints -----------------------------------------------------------------------

    async def conversation_history(
        self,
        tenant_id: str,
        conversation_id: str,
        fingerprint_hash: str,
        *,
        use_cache: bool = True,
    ) -> Answer:
        start = time.perf_counter()
        if self._cache is None:
            answer = await run_in_threadpool(
                self._read_conversation, tenant_id, conversation_id, fingerprint_hash, None
            )
        else:
            answer = await self._cached_conversation(
                tenant_id, conversation_id, fingerprint_hash, use_cache
            )
        metrics.LOOKUP_SECONDS.labels("conversation").observe(time.perf_counter() - start)
        self._log("conversation", answer, tenant_id=tenant_id, conversation_id=conversation_id)
        return answer

    async def response_history(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        wait_ms: int,
        *,
        use_cache: bool = True,
    ) -> Answer:
        wait_ms = min(max(wait_ms, 0), WAIT_MS_CAP)
        if wait_ms == 0:
            answer = await self._response(tenant_id, response_id, fingerprint_hash, use_cache)
        else:
            answer = await self._wait_for_decision(
                tenant_id, response_id, fingerprint_hash, wait_ms, use_cache
            )
        self._log(
            "response",
            answer,
            tenant_id=tenant_id,
            response_id=response_id,
            wait_ms=wait_ms or None,
        )
        return answer

    def status(self, tenant_id: str, response_id: str) -> StatusBody:
        """Promoted (the store is the truth), else what the ledger recorded, else unknown."""
        checkpoint = self._store.get_checkpoint(tenant_id, response_id)
        if checkpoint is not None:
            body = StatusBody(response_id=response_id, state="promoted", seq=checkpoint.seq)
        elif self._ledger is not None:
            recorded = self._ledger.status(tenant_id, response_id)
            body = StatusBody(
                response_id=response_id,
                state=recorded.status.value,
                reason=recorded.reason,
                seq=recorded.seq,
                existing_response_id=recorded.existing_response_id,
            )
        else:
            body = StatusBody(response_id=response_id, state="unknown")
        metrics.STATUS_ANSWERS.labels(body.state, body.reason or "").inc()
        return body

    def store_ok(self) -> bool:
        try:
            self._store.get_checkpoint("ratchet-healthz", "ratchet-healthz")
        except Exception:
            return False
        return True

    # -- wait_ms: one read, maybe one wait, one more read (see waiters.py) ----------------

    async def _wait_for_decision(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        wait_ms: int,
        use_cache: bool,
    ) -> Answer:
        deadline = time.monotonic() + wait_ms / 1000
        ticket = self._waiters.register(response_id)
        metrics.WAITING.inc()
        try:
            answer = await self._response(tenant_id, response_id, fingerprint_hash, use_cache)
            while _still_pending(answer):
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await self._waiters.wait(ticket, remaining)
                if not woken:
                    # One last read at the deadline covers a notifier that was down.
                    metrics.WAITS.labels("timeout").inc()
                    answer = await self._response(
                        tenant_id, response_id, fingerprint_hash, use_cache
                    )
                    if _still_pending(answer):
                        return _not_promoted(response_id, f"no decision within {wait_ms} ms")
                    return answer
                metrics.WAITS.labels(f"woken_{ticket.decision}").inc()
                # Clear BEFORE re-reading: a decision published after this re-arms the event.
                ticket.event.clear()
                answer = await self._response(tenant_id, response_id, fingerprint_hash, use_cache)
            return answer
        finally:
            metrics.WAITING.dec()
            self._waiters.release(ticket)

    # -- cached lookups (event loop; only a miss takes the thread pool) -------------------

    async def _response(
        self, tenant_id: str, response_id: str, fingerprint_hash: str, use_cache: bool
    ) -> Answer:
        start = time.perf_counter()
        try:
            if self._cache is None:
                return await run_in_threadpool(
                    self._read_response, tenant_id, response_id, fingerprint_hash, None, None
                )
            return await self._cached_response(tenant_id, response_id, fingerprint_hash, use_cache)
        finally:
            metrics.LOOKUP_SECONDS.labels("response").observe(time.perf_counter() - start)

    async def _cached_response(
        self, tenant_id: str, response_id: str, fingerprint_hash: str, use_cache: bool
    ) -> Answer:
        assert self._cache is not None and self._stamps is not None
        entry = self._cache.get(tenant_id, response_id) if use_cache else None
        if entry is not None:
            partition_key: str | None = entry.partition_key
        else:
            partition_key = self._cache.location(tenant_id, response_id)
            if partition_key is None:
                partition_key = await self._stamps.locate(tenant_id, response_id)
        if partition_key is None:
            # Nothing promoted under this id (yet): the plain read decides (NOT_FOUND,
            # rejected, or a promotion that landed just now), and nothing is cached.
            metrics.HISTORY_CACHE.labels("response", "miss" if use_cache else "bypass").inc()
            return await run_in_threadpool(
                self._read_response, tenant_id, response_id, fingerprint_hash, None, None
            )
        # The stamp is taken BEFORE the full read: a history is cached with a stamp no
        # newer than what was verified, so a write in between makes the next hit stale.
        stamp = await self._stamps.stamp(tenant_id, partition_key)
        if entry is not None:
            answer = self._hit(entry, stamp, fingerprint_hash, "response")
            if answer is not None:
                return answer
        self._count_miss("response", use_cache, entry, response_id, tenant_id)
        return await run_in_threadpool(
            self._read_response, tenant_id, response_id, fingerprint_hash, partition_key, stamp
        )

    async def _cached_conversation(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str, use_cache: bool
    ) -> Answer:
        assert self._cache is not None and self._stamps is not None
        # One query answers both "which response is the head?" and "is it unchanged?".
        stamp = await self._stamps.stamp(tenant_id, conversation_id)
        entry = None
        if use_cache and stamp is not None and stamp.head is not None:
            entry = self._cache.get(tenant_id, stamp.head.response_id)
            if entry is not None and (
                entry.partition_key != conversation_id or entry.checkpoint.seq != stamp.head.seq
            ):
                entry = None  # a full read reports what is wrong with this head
            if entry is not None:
                answer = self._hit(entry, stamp, fingerprint_hash, "conversation")
                if answer is not None:
                    return answer
        self._count_miss(
            "conversation", use_cache, entry, stamp.head.response_id if entry else "", tenant_id
        )
        return await run_in_threadpool(
            self._read_conversation, tenant_id, conversation_id, fingerprint_hash, stamp
        )

    def _hit(
        self,
        entry: CachedHistory,
        stamp: PartitionStamp | None,
        fingerprint_hash: str,
        endpoint: str,
    ) -> Answer | None:
        """The answer from a cached history, or None if only a full read may answer."""
        if stamp is None:
            return None
        now = self._clock()
        expires = entry.checkpoint.logical_expires_at
        if expires is not None and utc_ms(now) >= expires:
            return None  # the full read answers EXPIRED, with its detail
        head_seq = entry.head_seq(stamp)
        if head_seq is None:
            return None
        metrics.HISTORY_CACHE.labels(endpoint, "hit").inc()
        return self._verified_answer(
            entry.rendered,
            entry.checkpoint,
            head_seq,
            fallback_reason(entry.checkpoint, fingerprint_hash, now),
            endpoint,
        )

    def _count_miss(
        self,
        endpoint: str,
        use_cache: bool,
        entry: CachedHistory | None,
        response_id: str,
        tenant_id: str,
    ) -> None:
        assert self._cache is not None
        if not use_cache:
            result = "bypass"
        elif entry is not None:
            result = "stale"
            self._cache.discard(tenant_id, response_id)
            self._cache_gauges()
        else:
            result = "miss"
        metrics.HISTORY_CACHE.labels(endpoint, result).inc()

    # -- full reads (blocking; run in the thread pool) -----------------------------------

    def _read_conversation(
        self,
        tenant_id: str,
        conversation_id: str,
        fingerprint_hash: str,
        stamp: PartitionStamp | None,
    ) -> Answer:
        now = self._clock()
        history = self._store.read_history(tenant_id, conversation_id=conversation_id, now=now)
        return self._decide(history, fingerprint_hash, now, "conversation", stamp)

    def _read_response(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        partition_key: str | None,
        stamp: PartitionStamp | None,
    ) -> Answer:
        now = self._clock()
        history = self._store.read_history(
            tenant_id, response_id=response_id, now=now, partition_key=partition_key
        )
        if (
            isinstance(history, HistoryFailure)
            and history.reason is HistoryFailureReason.NOT_FOUND
            and self._ledger is not None
        ):
            recorded = self._ledger.status(tenant_id, response_id)
            if recorded.status is ResponseState.REJECTED:
                return _not_promoted(response_id, f"rejected: {recorded.reason}")
        return self._decide(history, fingerprint_hash, now, "response", stamp)

    def _decide(
        self,
        history: VerifiedHistory | HistoryFailure,
        fingerprint_hash: str,
        now: datetime,
        endpoint: str,
        stamp: PartitionStamp | None,
    ) -> Answer:
        if isinstance(history, HistoryFailure):
            reason = str(history.reason)
            body = failure_body(reason, detail=history.detail)
            metrics.OUTCOMES.labels(endpoint, "failure", reason).inc()
            return Answer.of(body, _failure_status(reason))
        rendered = render_history(history)
        if isinstance(rendered, HistoryBody):  # stored bytes that are not UTF-8 JSON
            metrics.OUTCOMES.labels(endpoint, rendered.outcome, rendered.reason or "").inc()
            return Answer.of(rendered, 500)
        self._fill(history, rendered, stamp)
        return self._verified_answer(
            rendered,
            history.checkpoint,
            history.head_seq,
            fallback_reason(history.checkpoint, fingerprint_hash, now),
            endpoint,
        )

    def _verified_answer(
        self,
        rendered: RenderedHistory,
        checkpoint: CheckpointRecord,
        current_head_seq: int,
        fallback,
        endpoint: str,
    ) -> Answer:
        """``head_seq`` is the response's own seq; a Conversation's current head
        (``current_head_seq``, as verified) is answered beside it."""
        outcome = "certified" if fallback is None else "fallback"
        reason = None if fallback is None else str(fallback)
        metrics.OUTCOMES.labels(endpoint, outcome, reason or "").inc()
        own = checkpoint.seq
        body = history_json(
            rendered, own, conversation_head_seq(checkpoint, current_head_seq), fallback
        )
        return Answer(200, outcome, reason, own, None, body)

    def _fill(
        self, history: VerifiedHistory, rendered: RenderedHistory, stamp: PartitionStamp | None
    ) -> None:
        """Cache a verified history if the stamp taken before its read covers it."""
        if self._cache is None or stamp is None:
            return
        checkpoint = history.checkpoint
        cells = lineage_stamps(history, stamp)
        if cells is None:
            return
        tenant_id = checkpoint.tenant_id
        for turn in history.lineage:
            self._cache.remember_location(tenant_id, turn.response_id, turn.partition_key)
        self._cache.put(
            checkpoint.response_id,
            CachedHistory(
                tenant_id=tenant_id,
                partition_key=checkpoint.partition_key,
                checkpoint=checkpoint,
                lineage_stamps=cells,
                rendered=rendered,
                # The JSON dominates; ~200 bytes per turn for its stamp and bookkeeping.
                nbytes=len(rendered.items_json)
                + len(rendered.checkpoint_json)
                + 200 * len(history.lineage)
                + 1024,
            ),
        )
        self._cache_gauges()

    def _cache_gauges(self) -> None:
        assert self._cache is not None
        metrics.HISTORY_CACHE_BYTES.set(self._cache.nbytes)
        metrics.HISTORY_CACHE_ENTRIES.set(len(self._cache))

    def _log(self, endpoint: str, answer: Answer, **ids: object) -> None:
        level = logging.ERROR if answer.status_code >= 500 else logging.INFO
        log.log(
            level,
            "history %s",
            answer.outcome,
            extra={
                "ctx": {
                    "endpoint": endpoint,
                    "outcome": answer.outcome,
                    "reason": answer.reason,
                    "http_status": answer.status_code,
                    "head_seq": answer.head_seq,
                    "detail": answer.detail if answer.status_code >= 500 else None,
                    **ids,
                }
            },
        )


def _still_pending(answer: Answer) -> bool:
    """Only "nothing known yet" is worth waiting for; anything else is final."""
    return answer.outcome == "failure" and answer.reason == "NOT_FOUND"


def _not_promoted(response_id: str, detail: str) -> Answer:
    body = failure_body("NOT_PROMOTED", response_id=response_id, detail=detail)
    metrics.OUTCOMES.labels("response", "failure", "NOT_PROMOTED").inc()
    return Answer.of(body, 409)


def _failure_status(reason: str) -> int:
    return FAILURE_HTTP_STATUS.get(reason, 500)


__all__ = ["Answer", "RehydrationService", "WAIT_MS_CAP"]
