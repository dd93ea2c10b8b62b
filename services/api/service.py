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

``RehydrationService`` is the endpoints' facade: it builds the collaborators that do
the work and answers each request through them, then logs the answer and pins the
cache's bytes it shares while it is written. Where each part lives:

- response_reader.py: a response's lookup (cache, extension, full read, rejection);
- conversation_reader.py: a Conversation's lookup (head read, cache, full read);
- decision_wait.py: ``wait_ms``, the wait for a promotion or rejection;
- status_reader.py: ``/status``;
- cached_histories.py: hits, known expiries, head backing, extension, pre-warm;
- full_reads.py: the answer budget's wait around a full read, a shared read's answers;
- answer.py: ``Answer`` and each kind of answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import Answer
from services.api.answer_budget import AnswerBudget
from services.api.cache import HistoryCache
from services.api.cached_histories import CachedHistories
from services.api.conversation_reader import ConversationReader
from services.api.decision_wait import WAIT_MS_CAP, DecisionWait
from services.api.full_reads import FullReads
from services.api.models import StatusBody
from services.api.response_reader import ResponseLookup, ResponseReader
from services.api.slow_readers import SLICE_BYTES
from services.api.status_reader import StatusReader
from services.api.waiters import PromotionWaiters
from services.ledger.base import Ledger
from services.store.base import CheckpointStore, CorruptPartition

log = logging.getLogger("ratchet.api")


def _utc_now() -> datetime:
    return datetime.now(UTC)


class RehydrationService:
    """Thin orchestration over the store (histories) and the ledger (rejections).

    With a ``HistoryCache`` (the production wiring), verified histories are served
    from memory (cache.py): a chain-mode response hit reads nothing, a hit on a
    Conversation (either endpoint) reads its head (one row, which must be backed), a
    history grown by new turns reads only those. Without one, every lookup is a full
    store read."""

    def __init__(
        self,
        store: CheckpointStore,
        ledger: Ledger | None,
        waiters: PromotionWaiters,
        clock: Callable[[], datetime] = _utc_now,
        *,
        cache: HistoryCache | None = None,
        answers: AnswerBudget | None = None,
    ) -> None:
        self._store = store
        self._answers = answers
        self._cache = cache if cache is not None and cache.enabled else None
        if self._cache is not None and answers is not None:
            self._cache.on_evict = answers.evicted  # see _pinned
        self._status = StatusReader(store, ledger)
        self._histories = CachedHistories(store, self._cache, clock)
        full_reads = FullReads(self._cache, self._histories, answers)
        self._responses = ResponseReader(
            store, ledger, self._cache, self._histories, full_reads, answers, clock)
        self._conversations = ConversationReader(
            store, self._cache, self._histories, full_reads, clock)
        self._decisions = DecisionWait(waiters, store, ledger, self._cache, self._responses.read)

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
            answer = await self._conversations.read_in_full(
                tenant_id, conversation_id, fingerprint_hash
            )
        else:
            answer = await self._conversations.read(
                tenant_id, conversation_id, fingerprint_hash, use_cache
            )
        child(metrics.LOOKUP_SECONDS, "conversation").observe(time.perf_counter() - start)
        self._log("conversation", answer, tenant_id=tenant_id, conversation_id=conversation_id)
        return self._pinned(answer)

    async def response_history(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        wait_ms: int,
        *,
        use_cache: bool = True,
        partition_key: str | None = None,
    ) -> Answer:
        """``partition_key``: the caller's hint of the response's partition (its
        Conversation id or chain root), never trusted (response_reader.py,
        ``_response_miss``)."""
        wait_ms = min(max(wait_ms, 0), WAIT_MS_CAP)
        lookup = ResponseLookup(tenant_id, response_id, fingerprint_hash, use_cache, partition_key)
        if wait_ms == 0:
            answer = await self._responses.read(lookup)
        else:
            answer = await self._decisions.wait(lookup, wait_ms)
        self._log(
            "response",
            answer,
            tenant_id=tenant_id,
            response_id=response_id,
            wait_ms=wait_ms or None,
        )
        return self._pinned(answer)

    def status(self, tenant_id: str, response_id: str) -> StatusBody:
        """The response's state (status_reader.py)."""
        return self._status.status(tenant_id, response_id)

    def store_ok(self) -> bool:
        try:
            self._store.get_checkpoint("ratchet-healthz", "ratchet-healthz")
        except CorruptPartition:
            # The store answered: a damaged row under these ids (a gateway may use
            # them) is that tenant's, not a reason to take the API out of service.
            return True
        except Exception:
            return False
        return True

    async def prewarm(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        """Extend the cache by a just-promoted response if its parent's history is
        cached (cached_histories.py). True if it is cached now."""
        return await self._histories.prewarm(tenant_id, partition_key, response_id)

    # -- the answer's pin and log line ---------------------------------------------------

    def _pinned(self, answer: Answer) -> Answer:
        """``answer`` holding its cache entry's bytes while it is written, if it is more
        than one slice of them (one slice is written at once: nothing waits on a
        reader). Should the cache let the entry go meanwhile, the answer budget counts
        those bytes until the answer is written (answer_budget.py)."""
        entry = answer.shares
        if entry is None or self._answers is None or self._cache is None:
            return answer
        if sum(len(part) for part in answer.parts) <= SLICE_BYTES:
            return answer
        cache, items = self._cache, entry.rendered.items_json
        return replace(answer, held=self._answers.pin(items, lambda: cache.holds(entry, items)))

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


__all__ = ["Answer", "RehydrationService", "WAIT_MS_CAP"]
