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

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import Answer, not_promoted
from services.api.answer_budget import AnswerBudget
from services.api.cache import HistoryCache
from services.api.cached_histories import CachedHistories
from services.api.conversation_reader import ConversationReader
from services.api.full_reads import FullReads
from services.api.models import StatusBody
from services.api.response_reader import ResponseLookup, ResponseReader
from services.api.slow_readers import SLICE_BYTES
from services.api.status_reader import StatusReader
from services.api.waiters import PromotionWaiters
from services.ledger.base import Ledger, ResponseState
from services.store.base import CheckpointStore

log = logging.getLogger("ratchet.api")

WAIT_MS_CAP = 10_000


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
        self._ledger = ledger
        self._waiters = waiters
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

    # -- endpoints -----------------------------------------------------------------------

    async def conversation_history(
        self,
        tenant_id: str,
        conversation_id: str,
        fingerprint_hash: str,
        *,
        use_cache: bool = True,
    ) -> Answer:
        answer = await self._conversations.read(
            tenant_id, conversation_id, fingerprint_hash, use_cache)
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
        Conversation id or chain root), never trusted (``_response_miss``)."""
        wait_ms = min(max(wait_ms, 0), WAIT_MS_CAP)
        lookup = ResponseLookup(tenant_id, response_id, fingerprint_hash, use_cache, partition_key)
        if wait_ms == 0:
            answer = await self._responses.read(lookup)
        else:
            answer = await self._wait_for_decision(lookup, wait_ms)
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
        except Exception:
            return False
        return True

    async def prewarm(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        """Extend the cache by a just-promoted response if its parent's history is
        cached (cached_histories.py). True if it is cached now."""
        return await self._histories.prewarm(tenant_id, partition_key, response_id)

    # -- wait_ms: one look, maybe one wait, one more read (see waiters.py) ----------------

    async def _wait_for_decision(self, lookup: ResponseLookup, wait_ms: int) -> Answer:
        deadline = time.monotonic() + wait_ms / 1000
        ticket = self._waiters.register(lookup.response_id)
        metrics.WAITING.inc()
        try:
            answer = None if await self._undecided(lookup) else await self._responses.read(lookup)
            while answer is None or _still_pending(answer):
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await self._waiters.wait(ticket, remaining)
                if not woken:
                    # One last read at the deadline covers a notifier that was down.
                    child(metrics.WAITS, "timeout").inc()
                    answer = await self._responses.read(lookup)
                    if _still_pending(answer):
                        return not_promoted(
                            lookup.response_id, f"no decision within {wait_ms} ms"
                        )
                    return answer
                child(metrics.WAITS, f"woken_{ticket.decision}").inc()
                # Clear BEFORE re-reading: a decision published after this re-arms the event.
                ticket.event.clear()
                lookup = _with_record_hint(lookup, ticket.found_in)
                answer = await self._responses.read(lookup)
            return answer
        finally:
            metrics.WAITING.dec()
            self._waiters.release(ticket)

    async def _undecided(self, lookup: ResponseLookup) -> bool:
        """True when nothing about the response is decided yet. Two reads at once: the
        response's claim and the ledger's status (a rejection). No claim means no
        promotion (a response id is claimed before its promotion batch is sent); a claim
        costs one more read, the turn row where the claim says.

        Why: a gateway waits right after producing its turn, so its first look nearly
        always finds nothing, mostly not even the claim. Made one after another, as a
        lookup makes them, its reads are 3-4 round trips, each waking the driver's I/O
        thread and the event loop (~0.3 ms of the API's CPU each on this host); made at
        once they share the wake-ups. Anything found (a row, a recorded decision, an
        error) returns False and the ordinary lookup answers, reading again: the look
        only ever decides "wait". That is safe because the request registered first: a
        decision published after the look wakes it (waiters.py)."""
        tenant_id, response_id = lookup.tenant_id, lookup.response_id
        if self._cache is not None and lookup.use_cache and (
            self._cache.get(tenant_id, response_id) is not None
            or self._cache.location(tenant_id, response_id) is not None
        ):
            return False  # verified here before: decided
        reads: list[Any] = [self._store.locate_async(tenant_id, response_id)]
        if self._ledger is not None:
            reads.append(self._ledger.status_async(tenant_id, response_id))
        look = _first_look(await asyncio.gather(*reads, return_exceptions=True))
        if isinstance(look, str):  # claimed: the turn row where the claim says decides
            # No row there: in flight or refused (or, after storage damage, promoted
            # and lost: ``turn_lost`` is not asked on this hot path, the read at the
            # wait's deadline answers such a turn MISSING_HISTORY).
            try:
                look = await self._store.read_turn_async(tenant_id, look, response_id) is None
            except Exception:  # noqa: BLE001 - the ordinary lookup reads again and reports it
                look = False
        child(metrics.WAIT_FIRST_LOOKS, "undecided" if look else "found").inc()
        return look

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


def _with_record_hint(lookup: ResponseLookup, found_in: tuple[str, str] | None) -> ResponseLookup:
    """The lookup with the partition the decision record named, when the caller named
    none and the record is of the caller's tenant. Like a gateway's hint it is only
    where the read looks first (``_response_miss``: the turn row must be found there,
    else the claim decides); it spares the claim's read."""
    if lookup.partition_key is not None or found_in is None or found_in[0] != lookup.tenant_id:
        return lookup
    return replace(lookup, partition_key=found_in[1])


def _first_look(found: list[Any]) -> bool | str:
    """What ``_undecided``'s reads found, given in their order: the claim's partition
    and, with a ledger, the response's status. True: nothing decided; False: a decision
    or a failed read; a partition key: claimed there, the turn row still to be read."""
    if any(isinstance(result, BaseException) for result in found):
        return False  # the ordinary lookup reads again and reports the failure
    located, *status = found
    if status and status[0].status is not ResponseState.UNKNOWN:
        return False  # a recorded decision
    return True if located is None else str(located)


def _still_pending(answer: Answer) -> bool:
    """Only "nothing known yet" is worth waiting for; anything else is final."""
    return answer.outcome == "failure" and answer.reason == "NOT_FOUND"


__all__ = ["Answer", "RehydrationService", "WAIT_MS_CAP"]
