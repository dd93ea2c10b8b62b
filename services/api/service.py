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

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from services.api import metrics
from services.api.models import HistoryBody, StatusBody
from services.api.render import failure_body, history_outcome_body
from services.api.waiters import PromotionWaiters
from services.ledger.base import Ledger, ResponseState
from services.store.base import CheckpointStore

log = logging.getLogger("ratchet.api")

WAIT_MS_CAP = 10_000


@dataclass(frozen=True)
class Answer:
    body: HistoryBody
    status_code: int


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RehydrationService:
    """Thin orchestration over the store (histories) and the ledger (rejections)."""

    def __init__(
        self,
        store: CheckpointStore,
        ledger: Ledger | None,
        waiters: PromotionWaiters,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._waiters = waiters
        self._clock = clock

    # -- endpoints -----------------------------------------------------------------------

    async def conversation_history(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str
    ) -> Answer:
        answer = await run_in_threadpool(
            self._read_conversation, tenant_id, conversation_id, fingerprint_hash
        )
        self._log("conversation", answer, tenant_id=tenant_id, conversation_id=conversation_id)
        return answer

    async def response_history(
        self, tenant_id: str, response_id: str, fingerprint_hash: str, wait_ms: int
    ) -> Answer:
        wait_ms = min(max(wait_ms, 0), WAIT_MS_CAP)
        if wait_ms == 0:
            answer = await run_in_threadpool(
                self._read_response, tenant_id, response_id, fingerprint_hash
            )
        else:
            answer = await self._wait_for_decision(
                tenant_id, response_id, fingerprint_hash, wait_ms
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
        self, tenant_id: str, response_id: str, fingerprint_hash: str, wait_ms: int
    ) -> Answer:
        deadline = time.monotonic() + wait_ms / 1000
        ticket = self._waiters.register(response_id)
        metrics.WAITING.inc()
        try:
            answer = await run_in_threadpool(
                self._read_response, tenant_id, response_id, fingerprint_hash
            )
            while _still_pending(answer):
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await self._waiters.wait(ticket, remaining)
                if not woken:
                    # One last read at the deadline covers a notifier that was down.
                    metrics.WAITS.labels("timeout").inc()
                    answer = await run_in_threadpool(
                        self._read_response, tenant_id, response_id, fingerprint_hash
                    )
                    if _still_pending(answer):
                        return _not_promoted(response_id, f"no decision within {wait_ms} ms")
                    return answer
                metrics.WAITS.labels(f"woken_{ticket.decision}").inc()
                # Clear BEFORE re-reading: a decision published after this re-arms the event.
                ticket.event.clear()
                answer = await run_in_threadpool(
                    self._read_response, tenant_id, response_id, fingerprint_hash
                )
            return answer
        finally:
            metrics.WAITING.dec()
            self._waiters.release(ticket)

    # -- reads (blocking; run in the thread pool) ----------------------------------------

    def _read_conversation(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str
    ) -> Answer:
        now = self._clock()
        with _timed("conversation"):
            history = self._store.read_history(tenant_id, conversation_id=conversation_id, now=now)
        return self._decide(history, fingerprint_hash, now, "conversation")

    def _read_response(self, tenant_id: str, response_id: str, fingerprint_hash: str) -> Answer:
        now = self._clock()
        with _timed("response"):
            history = self._store.read_history(tenant_id, response_id=response_id, now=now)
        if (
            isinstance(history, HistoryFailure)
            and history.reason is HistoryFailureReason.NOT_FOUND
            and self._ledger is not None
        ):
            recorded = self._ledger.status(tenant_id, response_id)
            if recorded.status is ResponseState.REJECTED:
                return _not_promoted(response_id, f"rejected: {recorded.reason}")
        return self._decide(history, fingerprint_hash, now, "response")

    def _decide(
        self,
        history: VerifiedHistory | HistoryFailure,
        fingerprint_hash: str,
        now: datetime,
        endpoint: str,
    ) -> Answer:
        body, status_code = history_outcome_body(history, fingerprint_hash, now)
        metrics.OUTCOMES.labels(endpoint, body.outcome, body.reason or "").inc()
        return Answer(body, status_code)

    def _log(self, endpoint: str, answer: Answer, **ids: object) -> None:
        body = answer.body
        level = logging.ERROR if answer.status_code >= 500 else logging.INFO
        log.log(
            level,
            "history %s",
            body.outcome,
            extra={
                "ctx": {
                    "endpoint": endpoint,
                    "outcome": body.outcome,
                    "reason": body.reason,
                    "http_status": answer.status_code,
                    "head_seq": body.head_seq,
                    "detail": body.detail if answer.status_code >= 500 else None,
                    **ids,
                }
            },
        )


def _still_pending(answer: Answer) -> bool:
    """Only "nothing known yet" is worth waiting for; anything else is final."""
    return answer.body.outcome == "failure" and answer.body.reason == "NOT_FOUND"


def _not_promoted(response_id: str, detail: str) -> Answer:
    body = failure_body("NOT_PROMOTED", response_id=response_id, detail=detail)
    metrics.OUTCOMES.labels("response", "failure", "NOT_PROMOTED").inc()
    return Answer(body, 409)


class _timed:
    """Observe the lookup latency of one store read."""

    def __init__(self, endpoint: str) -> None:
        self._endpoint = endpoint

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        metrics.LOOKUP_SECONDS.labels(self._endpoint).observe(time.perf_counter() - self._start)


__all__ = ["Answer", "RehydrationService", "WAIT_MS_CAP"]
