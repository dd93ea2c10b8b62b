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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool

from ratchet.domain.history import (
    NO_ITEMS,
    CheckpointRecord,
    Head,
    HistoryFailure,
    HistoryFailureReason,
    PartitionSnapshot,
    PromotionMode,
    TurnItems,
    VerifiedHistory,
    backs,
    logically_expired,
    verify_extension,
)
from ratchet.domain.rehydration import fallback_reason
from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import (
    Answer,
    failure_answer,
    not_promoted,
    unrenderable_answer,
    verified_answer,
)
from services.api.answer_budget import AnswerBudget
from services.api.cache import CachedHistory, HistoryCache
from services.api.flights import SingleFlight
from services.api.models import HistoryBody, StatusBody
from services.api.render import (
    RenderedHistory,
    render_extension,
    render_history,
)
from services.api.slow_readers import SLICE_BYTES
from services.api.status_reader import StatusReader
from services.api.waiters import PromotionWaiters
from services.ledger.base import Ledger, ResponseState
from services.store.base import CheckpointStore
from services.store.history_answers import no_such_response

log = logging.getLogger("ratchet.api")

WAIT_MS_CAP = 10_000
# Rows a lookup reads one by one back to a cached prefix before it reads the partition
# in full instead (a gateway's continuation is usually one turn past its last lookup).
MAX_EXTENSION_ROWS = 4


class _Recheck:
    """The cache's answer asked again once a full read has room (``_budgeted``), and
    whether it answered. A request counts once in ``ratchet_api_history_cache_total``,
    as what it finally was: a hit when this found its history cached (``_hit`` counts
    it), else a miss. Before, such a request counted as a miss when it queued and a hit
    when it found the history (session 45)."""

    def __init__(self, cached: Callable[[], Awaitable[Answer | None]]) -> None:
        self._cached = cached
        self.answered = False

    async def __call__(self) -> Answer | None:
        found = await self._cached()
        self.answered = found is not None
        return found

    def count_miss(self, endpoint: str) -> None:
        """Counts the request a miss unless the cache answered it."""
        if not self.answered:
            child(metrics.HISTORY_CACHE, endpoint, "miss").inc()


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
        self._clock = clock
        self._cache = cache if cache is not None and cache.enabled else None
        if self._cache is not None and answers is not None:
            self._cache.on_evict = answers.evicted  # see _pinned
        self._status = StatusReader(store, ledger)
        self._response_reads: SingleFlight[_Loaded] = SingleFlight("response")
        self._conversation_reads: SingleFlight[_Loaded] = SingleFlight("conversation")

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
            answer = await self._read_conversation_async(
                tenant_id, conversation_id, fingerprint_hash
            )
        else:
            answer = await self._cached_conversation(
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
        Conversation id or chain root), never trusted (``_response_miss``)."""
        wait_ms = min(max(wait_ms, 0), WAIT_MS_CAP)
        lookup = _Lookup(tenant_id, response_id, fingerprint_hash, use_cache, partition_key)
        if wait_ms == 0:
            answer = await self._response(lookup)
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

    # -- wait_ms: one look, maybe one wait, one more read (see waiters.py) ----------------

    async def _wait_for_decision(self, lookup: _Lookup, wait_ms: int) -> Answer:
        deadline = time.monotonic() + wait_ms / 1000
        ticket = self._waiters.register(lookup.response_id)
        metrics.WAITING.inc()
        try:
            answer = None if await self._undecided(lookup) else await self._response(lookup)
            while answer is None or _still_pending(answer):
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await self._waiters.wait(ticket, remaining)
                if not woken:
                    # One last read at the deadline covers a notifier that was down.
                    child(metrics.WAITS, "timeout").inc()
                    answer = await self._response(lookup)
                    if _still_pending(answer):
                        return not_promoted(
                            lookup.response_id, f"no decision within {wait_ms} ms"
                        )
                    return answer
                child(metrics.WAITS, f"woken_{ticket.decision}").inc()
                # Clear BEFORE re-reading: a decision published after this re-arms the event.
                ticket.event.clear()
                lookup = _with_record_hint(lookup, ticket.found_in)
                answer = await self._response(lookup)
            return answer
        finally:
            metrics.WAITING.dec()
            self._waiters.release(ticket)

    async def _undecided(self, lookup: _Lookup) -> bool:
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

    # -- cached lookups: on the event loop, awaiting the driver's async reads; only an
    # -- extension that must read several rows one by one runs in the thread pool.

    async def _response(self, lookup: _Lookup) -> Answer:
        start = time.perf_counter()
        try:
            if self._cache is None:
                return await self._read_response(
                    lookup.tenant_id, lookup.response_id, lookup.fingerprint_hash,
                    lookup.partition_key,
                )
            return await self._cached_response(lookup)
        finally:
            child(metrics.LOOKUP_SECONDS, "response").observe(time.perf_counter() - start)

    async def _cached_response(self, lookup: _Lookup) -> Answer:
        """A hit: a chain-mode history answers with no storage read at all; a
        Conversation-mode one with ONE head read, because its answer reports the
        Conversation's current head beside the response's own seq and that head must be
        backed by a verified checkpoint (``_conversation_response_hit``). A miss: find
        the partition (``_response_miss``), then extend a cached prefix (only the new
        rows) or read the partition in full."""
        assert self._cache is not None
        tenant_id, response_id, fingerprint_hash = (
            lookup.tenant_id, lookup.response_id, lookup.fingerprint_hash
        )
        if lookup.use_cache:
            entry = self._cache.get(tenant_id, response_id)
            if entry is not None:
                expired = self._expired_hit(entry, "response")
                if expired is not None:
                    return expired
                if entry.checkpoint.mode is PromotionMode.CONVERSATION:
                    answer = await self._conversation_response_hit(entry, fingerprint_hash)
                else:
                    answer = self._hit(entry, entry.checkpoint.seq, fingerprint_hash, "response")
                if answer is not None:
                    return answer
                # A cached history that cannot answer (its head not backed): the full
                # read decides, with its detail.
                child(metrics.HISTORY_CACHE, "response", "miss").inc()
                return await self._read_response(
                    tenant_id, response_id, fingerprint_hash, entry.partition_key
                )
            known = self._cache.expired(tenant_id, response_id)
            if known is not None:
                expired = self._expired_answer(known.expires_at, "response")
                if expired is not None:
                    return expired
        return await self._response_miss(lookup)

    async def _conversation_response_hit(
        self, entry: CachedHistory, fingerprint_hash: str
    ) -> Answer | None:
        """The cached history of a Conversation's response, with the Conversation's
        current head read now (the same one-row read as the Conversation endpoint's).
        The head must be backed: its own verified history is cached, or is loaded now by
        an extension (only its new rows). None: the full read decides (a head that no
        checkpoint backs is ``CORRUPT_HISTORY`` there, as on every endpoint)."""
        assert self._cache is not None
        tenant_id, partition_key = entry.tenant_id, entry.partition_key
        head = await self._store.read_head_async(tenant_id, partition_key)
        if head is None or head.seq < entry.checkpoint.seq or self._head_went_back(
                tenant_id, partition_key, head):
            return None
        if self._head_entry(tenant_id, partition_key, head) is None and not (
                self._cache.head_backed(tenant_id, partition_key, head)):
            backed = await run_in_threadpool(self._back_head, tenant_id, partition_key, head)
            if not backed:
                return None
        return self._hit(entry, head.seq, fingerprint_hash, "response")

    async def _cached_conversation(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str, use_cache: bool
    ) -> Answer:
        """One head read (one row); the head's cached lineage if there is one, else an
        extension from a cached prefix, else the full read."""
        assert self._cache is not None
        if not use_cache:
            child(metrics.HISTORY_CACHE, "conversation", "bypass").inc()
            return await self._read_conversation_async(
                tenant_id, conversation_id, fingerprint_hash
            )
        head = await self._store.read_head_async(tenant_id, conversation_id)
        if head is not None and self._head_went_back(tenant_id, conversation_id, head):
            child(metrics.HISTORY_CACHE, "conversation", "miss").inc()
            return await self._read_conversation_async(
                tenant_id, conversation_id, fingerprint_hash
            )
        if head is not None:
            entry = self._head_entry(tenant_id, conversation_id, head)
            if entry is not None:
                answer = self._hit(entry, head.seq, fingerprint_hash, "conversation")
                if answer is not None:
                    return answer
            known = self._cache.expired(tenant_id, head.response_id)
            if (known is not None and known.partition_key == conversation_id
                    and known.head == head):  # the head names exactly that turn
                expired = self._expired_answer(known.expires_at, "conversation")
                if expired is not None:
                    return expired
        return await self._conversation_miss(tenant_id, conversation_id, fingerprint_hash, head)

    async def _budgeted(
        self,
        key: tuple[str, ...],
        read: Callable[[], Awaitable[Answer]],
        learn_as: Callable[[Answer], tuple[str, ...]] | None = None,
        cached: Callable[[], Awaitable[Answer | None]] | None = None,
    ) -> Answer:
        """``read`` (a full read) once the answer budget has room for what it will cost;
        its answer then holds its own bytes until written (answer_budget.py).
        ``learn_as``: the key the answer's cost is learned under (None: ``key``).
        ``cached``: the cache's answer, or None; asked again once the read has room,
        before reading (a read of the same history may have cached it meanwhile): the
        requests for one history waiting for room behind the read of it (one at a time,
        when its cost is most of the budget) each read it again before session 44."""
        if self._answers is None:
            return await read()
        reservation = await self._answers.reserve(key)
        try:
            found = None if cached is None else await cached()
            if found is not None:
                reservation.release()
                return found
            answer = await read()
        except BaseException:
            reservation.release()
            raise
        # Only a history teaches a lookup's cost: a failure (a poll before promotion
        # answers NOT_FOUND in a few hundred bytes) says nothing of the next read's.
        learned = sum(len(part) for part in answer.parts) if answer.status_code == 200 else None
        reservation.settle(learned, answer.own_bytes,
                           None if learn_as is None else learn_as(answer))
        if reservation.nbytes == 0:
            return answer
        return replace(answer, held=reservation)

    def _head_went_back(self, tenant_id: str, partition_key: str, head: Head) -> bool:
        """The head read is behind a Conversation turn verified here (rolled back onto
        an earlier turn: damage its own cells cannot show, docs/store.md): the full read
        decides, which sees the turns beyond it."""
        assert self._cache is not None
        return self._cache.head_went_back(tenant_id, partition_key, head.seq)

    def _head_entry(self, tenant_id: str, partition_key: str, head: Head) -> CachedHistory | None:
        """The cached verified history of the turn ``head`` names, if it is that
        Conversation's turn at the head's seq: the head is backed (its row is immutable)."""
        assert self._cache is not None
        if not head.response_id:
            return None
        entry = self._cache.get(tenant_id, head.response_id)
        if (
            entry is not None
            and entry.partition_key == partition_key
            and backs(head, entry.checkpoint)
        ):
            return entry
        return None

    def _head_backed(
        self, tenant_id: str, partition_key: str, target: CheckpointRecord, head: Head | None
    ) -> bool:
        """True unless ``target`` is a Conversation's turn whose head is not known to be
        backed: the head names neither ``target`` nor a cached turn at its seq."""
        if target.mode is not PromotionMode.CONVERSATION:
            return True
        assert head is not None  # _extended refuses a Conversation turn without one
        if backs(head, target):
            return True
        assert self._cache is not None
        return self._head_entry(tenant_id, partition_key, head) is not None or (
            self._cache.head_backed(tenant_id, partition_key, head))

    def _back_head(self, tenant_id: str, partition_key: str, head: Head) -> bool:
        """Load and verify the head's turn by extension (blocking): True if its history
        is cached now. False: no cached prefix within reach, or rows the extension cannot
        decide; the caller's full read decides."""
        extended = self._extended(
            tenant_id, partition_key, head.response_id, head, MAX_EXTENSION_ROWS, self._clock()
        )
        return isinstance(extended, tuple)

    async def _conversation_miss(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str, head: Head | None
    ) -> Answer:
        """An extension of a cached prefix (in the thread pool: it may read rows one by
        one), else the full read, which alone waits in the answer budget."""
        assert self._cache is not None
        if head is not None and head.response_id:
            answer = await run_in_threadpool(
                self._extend,
                tenant_id, conversation_id, head.response_id, fingerprint_hash, "conversation", head
            )
            if answer is not None:
                return answer
        recheck = _Recheck(lambda: self._conversation_hit(tenant_id, conversation_id,
                                                          fingerprint_hash, head))
        try:
            return await self._read_conversation_async(
                tenant_id, conversation_id, fingerprint_hash, cached=recheck)
        finally:
            recheck.count_miss("conversation")

    async def _conversation_hit(self, tenant_id: str, conversation_id: str,
                                fingerprint_hash: str, head: Head | None) -> Answer | None:
        """The cached history of ``head``, the Conversation's head read after the
        request arrived (so after any promotion it was told of: never an older turn's
        history), if a read cached it since; else None. No read."""
        assert self._cache is not None
        if head is None or self._head_went_back(tenant_id, conversation_id, head):
            return None
        entry = self._head_entry(tenant_id, conversation_id, head)
        return None if entry is None else self._hit(entry, head.seq, fingerprint_hash,
                                                    "conversation")

    async def _response_miss(self, lookup: _Lookup) -> Answer:
        """Find the response's partition and its turn row, then extend a cached prefix
        by that row (and, in the thread pool, any rows between) or read it in full.

        The partition: where this API verified the response before, else the caller's
        hint, else the response's claim (``locate``). A hint is never trusted: the turn
        row must be found there (a response id lives in one partition per tenant, bound
        by its claim), else the claim decides, as without a hint. With a right hint
        the extension reads ONE row."""
        assert self._cache is not None
        tenant_id, response_id = lookup.tenant_id, lookup.response_id
        verified = self._cache.location(tenant_id, response_id)
        partition_key = verified or lookup.partition_key
        if not lookup.use_cache:
            child(metrics.HISTORY_CACHE, "response", "bypass").inc()
            return await self._read_response(
                tenant_id, response_id, lookup.fingerprint_hash, partition_key
            )
        row = None
        if partition_key is not None and self._cache.extendable(tenant_id, partition_key):
            row = await self._store.read_turn_async(tenant_id, partition_key, response_id)
            if row is None and verified is None:  # a wrong hint, or nothing promoted yet
                hinted = partition_key
                partition_key = await self._store.locate_async(tenant_id, response_id)
                if partition_key is None or (
                    partition_key == hinted
                    and not await self._store.turn_lost_async(tenant_id, response_id,
                                                              partition_key)
                ):
                    # Claimed nowhere, or where its row is not (yet): not promoted. A
                    # full read would read the claim (and that partition) again to say
                    # so; a waiting request asks this once per wait. A promoted turn
                    # whose row is gone (``turn_lost``): the full read answers it.
                    child(metrics.HISTORY_CACHE, "response", "miss").inc()
                    return await self._absent(tenant_id, response_id, no_such_response())
                if partition_key != hinted:
                    row = await self._read_turn_if_extendable(tenant_id, partition_key,
                                                              response_id)
        elif partition_key is None:
            partition_key = await self._store.locate_async(tenant_id, response_id)
            if partition_key is not None:
                row = await self._read_turn_if_extendable(tenant_id, partition_key, response_id)
        if row is not None and partition_key is not None:
            answer = await self._extend_from(lookup, partition_key, row)
            if answer is not None:
                return answer
        recheck = _Recheck(lambda: self._response_hit(lookup))
        try:
            return await self._read_response(
                tenant_id, response_id, lookup.fingerprint_hash, partition_key,
                cached=recheck,
            )
        finally:
            recheck.count_miss("response")

    async def _response_hit(self, lookup: _Lookup) -> Answer | None:
        """The cached history's answer for ``lookup`` (what ``_cached_response``
        answers from the cache, a Conversation response's head read now), else None.
        A response's verified history never changes: a cached one is what a full read
        would answer, whenever the request arrived."""
        assert self._cache is not None
        entry = self._cache.get(lookup.tenant_id, lookup.response_id)
        if entry is None:
            return None
        expired = self._expired_hit(entry, "response")
        if expired is not None:
            return expired
        if entry.checkpoint.mode is PromotionMode.CONVERSATION:
            return await self._conversation_response_hit(entry, lookup.fingerprint_hash)
        return self._hit(entry, entry.checkpoint.seq, lookup.fingerprint_hash, "response")

    async def _read_turn_if_extendable(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        assert self._cache is not None
        if not self._cache.extendable(tenant_id, partition_key):
            return None
        return await self._store.read_turn_async(tenant_id, partition_key, response_id)

    async def _extend_from(
        self, lookup: _Lookup, partition_key: str, row: PartitionSnapshot
    ) -> Answer | None:
        """``_extend`` starting from a turn row already read: on the event loop when the
        row alone links to a cached prefix (and, in a Conversation, is the head it was
        read with), else in the thread pool, which reads the rows in between."""
        assert self._cache is not None
        args = (
            lookup.tenant_id, partition_key, lookup.response_id, lookup.fingerprint_hash,
            "response", None, MAX_EXTENSION_ROWS, row,
        )
        turn = row.checkpoints.get(lookup.response_id)
        if turn is None:
            return None  # an undecodable row: the full read reports it
        if row.head is not None and self._head_went_back(lookup.tenant_id, partition_key,
                                                         row.head):
            return None  # rolled back: the full read sees the turns beyond the head
        parent = None if turn.parent_response_id is None else (
            self._cache.get(lookup.tenant_id, turn.parent_response_id)
        )
        one_row = (
            parent is not None
            and parent.partition_key == partition_key
            and parent.linked
            and (
                turn.mode is not PromotionMode.CONVERSATION
                or (
                    row.head is not None
                    and backs(row.head, turn)
                )
            )
        )
        if one_row:
            # One row at most: should another thread evict the parent meanwhile, the
            # extension gives up (the full read answers) instead of reading the rows
            # before it with the blocking driver here, on the event loop.
            return self._extend(*args[:6], max_rows=1, first=row)
        return await run_in_threadpool(self._extend, *args)

    def _hit(
        self, entry: CachedHistory, current_head_seq: int, fingerprint_hash: str, endpoint: str
    ) -> Answer | None:
        """The answer from a cached history, or None if only a full read may answer.
        ``current_head_seq``: the Conversation's backed head (chain mode: ignored)."""
        expired = self._expired_hit(entry, endpoint)
        if expired is not None:
            return expired
        now = self._clock()
        child(metrics.HISTORY_CACHE, endpoint, "hit").inc()
        return verified_answer(
            self._cache,
            entry.rendered,
            entry.checkpoint,
            current_head_seq,
            fallback_reason(entry.checkpoint, fingerprint_hash, now),
            endpoint,
        )

    def _expired_hit(self, entry: CachedHistory, endpoint: str) -> Answer | None:
        """``EXPIRED`` from a cached history past its logical expiry, or None. What the
        full read answers first for it, before the lineage and the head (rule 2,
        ``verify_history``): its stored expiry never changes, so the answer needs no
        read (an outside review, session 36: every request for an expired response or
        Conversation was a full partition read, 36 ms beside a 4 MB history)."""
        return self._expired_answer(entry.checkpoint.logical_expires_at, endpoint)

    def _expired_answer(self, expires: datetime | None, endpoint: str) -> Answer | None:
        """``EXPIRED`` (a hit) for a response known to expire at ``expires`` if that has
        passed, else None: a cached history's (``_expired_hit``), or one a read here found
        expired (``HistoryCache.expired``: the full read's first answer after the row's
        own damage and tenant, and a stored expiry never changes; session 42)."""
        if expires is None or not logically_expired(expires, self._clock()):
            return None
        child(metrics.HISTORY_CACHE, endpoint, "hit").inc()
        return failure_answer(
            HistoryFailure(HistoryFailureReason.EXPIRED, f"expired at {expires.isoformat()}"),
            endpoint)

    # -- extension: only the rows after a cached, verified prefix ------------------------

    def _extend(
        self,
        tenant_id: str,
        partition_key: str,
        response_id: str,
        fingerprint_hash: str,
        endpoint: str,
        head: Head | None,
        max_rows: int = MAX_EXTENSION_ROWS,
        first: PartitionSnapshot | None = None,
    ) -> Answer | None:
        """Read the rows from ``response_id`` back to a cached linked prefix (at most
        ``max_rows``, one row per read), verify them and their link to it, cache and
        answer. None: no cached prefix within reach, rows the extension cannot decide
        (a turn without a lineage digest, an undecodable row), or a Conversation head
        that is not backed: the full read answers instead, so every replica gives the
        same answer. ``first``: the row of ``response_id``, already read."""
        now = self._clock()
        extended = self._extended(
            tenant_id, partition_key, response_id, head, max_rows, now, first
        )
        if extended is None:
            return None
        if isinstance(extended, HistoryFailure):
            child(metrics.HISTORY_CACHE, endpoint, "extended").inc()
            self._remember_expired(extended)
            return failure_answer(extended, endpoint)
        if isinstance(extended, HistoryBody):
            child(metrics.HISTORY_CACHE, endpoint, "extended").inc()
            return unrenderable_answer(extended, endpoint)
        entry, current = extended
        target = entry.checkpoint
        if target.mode is PromotionMode.CONVERSATION:
            # The head read with the rows must be backed, as on a hit.
            assert current is not None  # _extended refuses a Conversation turn without one
            if self._head_entry(tenant_id, partition_key, current) is None and not (
                self._back_head(tenant_id, partition_key, current)
            ):
                return None
        child(metrics.HISTORY_CACHE, endpoint, "extended").inc()
        return verified_answer(
            self._cache,
            entry.rendered,
            target,
            target.seq if current is None else current.seq,
            fallback_reason(target, fingerprint_hash, now),
            endpoint,
        )

    def _extended(
        self,
        tenant_id: str,
        partition_key: str,
        response_id: str,
        head: Head | None,
        max_rows: int,
        now: datetime,
        first: PartitionSnapshot | None = None,
    ) -> tuple[CachedHistory, Head | None] | HistoryFailure | HistoryBody | None:
        """The reads, verification and caching of ``_extend``: the cached entry with the
        Conversation head known (``head``, else the one read with the rows), the failure
        of a loaded row, or None when the extension cannot decide."""
        assert self._cache is not None
        if not self._cache.extendable(tenant_id, partition_key):
            return None
        turns: list[CheckpointRecord] = []
        checkpoints: dict[str, CheckpointRecord] = {}
        items: dict[str, TurnItems] = {}
        current = response_id
        prefix: CachedHistory | None = None
        row_head: Head | None = None
        for _ in range(max_rows):
            snapshot = first if first is not None else self._store.read_turn(
                tenant_id, partition_key, current
            )
            first = None
            if (
                snapshot is None
                or current not in snapshot.checkpoints
                or current in snapshot.damaged
            ):
                # Absent or undecodable (its checkpoint may decode while its items do
                # not): the full read reports it, as CORRUPT_HISTORY on every replica.
                return None
            if row_head is None:
                row_head = snapshot.head
            turn = snapshot.checkpoints[current]
            turns.append(turn)
            checkpoints[current] = turn
            items[current] = snapshot.items.get(current, NO_ITEMS)
            parent = turn.parent_response_id
            if parent is None:
                return None
            cached = self._cache.get(tenant_id, parent)
            if cached is not None and cached.partition_key == partition_key and cached.linked:
                prefix = cached
                break
            current = parent
        if prefix is None:
            return None
        target = turns[0]
        if head is not None and target.mode is not PromotionMode.CONVERSATION:
            # A head names a Conversation's turn; a chain turn of the same partition (a
            # chain whose first response id is the Conversation's id) backs none: the
            # full read answers CORRUPT_HISTORY.
            return None
        known = head if head is not None else row_head
        if target.mode is PromotionMode.CONVERSATION:
            # The checks of a full read that involve the head (history.verify_history).
            if known is None or known.seq < target.seq:
                return None
            if head is not None and not backs(head, target):
                return None
        turns.reverse()
        loaded = PartitionSnapshot(tenant_id, partition_key, row_head, checkpoints, items)
        verified = verify_extension(prefix.checkpoint, turns, loaded, now)
        if verified is None:
            return None
        if not isinstance(verified, HistoryFailure):
            rendered = render_extension(target, prefix.rendered.items_json, verified)
            if not isinstance(rendered, HistoryBody):
                return self._cached(tenant_id, partition_key, turns, rendered, known)
        if not self._head_backed(tenant_id, partition_key, target, known):
            # The full read checks the head's backing before the loaded turns' items and
            # their rendering: it answers, so both give the same failure for the same damage.
            return None
        return verified if isinstance(verified, HistoryFailure) else rendered

    def _cached(
        self,
        tenant_id: str,
        partition_key: str,
        turns: list[CheckpointRecord],
        rendered: RenderedHistory,
        known: Head | None,
    ) -> tuple[CachedHistory, Head | None]:
        """Cache the verified extension ending at ``turns[-1]``; ``_extended``'s answer."""
        assert self._cache is not None
        target = turns[-1]
        self._cache.remember_locations(tenant_id, [t.response_id for t in turns], partition_key)
        entry = CachedHistory(tenant_id, partition_key, target, True, rendered)
        self._cache.put(target.response_id, entry)
        self._cache_gauges()
        return entry, known if target.mode is PromotionMode.CONVERSATION else None

    async def prewarm(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        """Extend the cache by a just-promoted response if its parent's history is
        cached (ONE row read on the event loop, never more). True if it is cached now."""
        if (
            self._cache is None
            or not self._cache.extendable(tenant_id, partition_key)
            or self._cache.get(tenant_id, response_id) is not None
        ):
            return False
        self._cache.remember_location(tenant_id, response_id, partition_key)
        row = await self._store.read_turn_async(tenant_id, partition_key, response_id)
        if row is None:
            return False
        extended = self._extended(
            tenant_id, partition_key, response_id, None, 1, self._clock(), row
        )
        return isinstance(extended, tuple)

    # -- full reads: on the event loop, each shared by the concurrent requests for it ---

    async def _read_conversation_async(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str,
        cached: Callable[[], Awaitable[Answer | None]] | None = None,
    ) -> Answer:
        # Its cost is learned under its partition, as a response's read with the
        # partition known (``_read_response``): both read that partition's rows up to
        # a turn, so the last answer of either endpoint is the next one's best guess.
        # Before session 44 it had a key of its own: a Conversation read after response
        # reads started at the default estimate (an eighth of the budget).
        return await self._budgeted(("partition", tenant_id, conversation_id), lambda: (
            self._read_conversation_now(tenant_id, conversation_id, fingerprint_hash)),
            cached=cached)

    async def _read_conversation_now(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str
    ) -> Answer:
        """The full read, shared with the concurrent requests for the same Conversation
        (``flights.py``); each answers from it with its own fingerprint. On the event
        loop, as a response's (it ran in the thread pool on a cache miss)."""
        loaded = await self._conversation_reads.run(
            (tenant_id, conversation_id),
            lambda: self._load_conversation(tenant_id, conversation_id))
        return self._answer(loaded, fingerprint_hash, "conversation")

    async def _load_conversation(self, tenant_id: str, conversation_id: str) -> _Loaded:
        now = self._clock()
        history = await self._store.read_history_async(
            tenant_id, conversation_id=conversation_id, now=now
        )
        return self._loaded(history, now)

    async def _read_response(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        partition_key: str | None,
        cached: Callable[[], Awaitable[Answer | None]] | None = None,
    ) -> Answer:
        """The full read, on the event loop (the driver's async reads; verification
        and rendering are CPU work the thread pool would not run any sooner).

        Its cost in the answer budget is learned per partition when the partition is
        known (verified here, or the caller's hint; a read that would wait for room first
        finds where the response is, so a wrong hint misjudges a cost only where there
        is room for it): a response id is new each turn, so learned per response a Conversation's
        every read was a lookup not read yet, reserving an eighth of the budget whatever
        its size; the partition's last answer is the next one's best guess. What it cost
        is learned under the partition the history was read from: a wrong hint must not
        teach the partition it names another history's cost (an outside review, session
        43: a large history's cost, learned under a small Conversation named by one
        wrong hint, made that Conversation's reads wait and answer 503)."""
        key = (("response", tenant_id, response_id) if partition_key is None
               else ("partition", tenant_id, partition_key))
        if self._answers is not None and not self._answers.has_room(key):
            # It would wait: first where the response is (the reads a poll before its
            # promotion needs anyway). Promoted nowhere: answered at once, where it
            # waited the budget's 5 s and answered 503 (409 or 404 is the answer).
            # Found in another partition than the hint names (a wrong hint): it waits
            # for that partition's cost and reads there first. Before, a wrong
            # hint naming a large partition made a small history's read wait for the
            # large one's cost and answer 503 (left open in session 43; session 44).
            found = await self._promoted_where(tenant_id, response_id, partition_key)
            if isinstance(found, Answer):
                return found
            if partition_key is not None and found is not None and found != partition_key:
                partition_key, key = found, ("partition", tenant_id, found)

        def learn_as(answer: Answer) -> tuple[str, ...]:
            if partition_key is None or answer.partition_key is None:
                return key
            return ("partition", tenant_id, answer.partition_key)

        return await self._budgeted(
            key,
            lambda: self._read_response_now(
                tenant_id, response_id, fingerprint_hash, partition_key),
            learn_as=learn_as,
            cached=cached,
        )

    async def _promoted_where(self, tenant_id: str, response_id: str,
                              partition_key: str | None) -> Answer | str | None:
        """The answer for a response promoted nowhere; else the partition its turn row
        was found in; else None (a full read decides).

        Promoted nowhere: its turn row is neither where its claim says nor in the
        partition the caller named (a response promoted before migration 007 has no
        claim; the full read finds it by the hint). The claim alone does not say: the
        processor claims every turn it starts on and keeps the claim when the turn is
        rejected (an outside review, session 38: a rejected response still waited for
        room and answered 503). Any error of these reads: the full read."""
        try:
            located = await self._store.locate_async(tenant_id, response_id)
            for where in dict.fromkeys(p for p in (located, partition_key) if p is not None):
                if await self._store.read_turn_async(tenant_id, where, response_id) is not None:
                    return where
            if located is not None and await self._store.turn_lost_async(
                tenant_id, response_id, located
            ):
                return None  # promoted, its row gone: the full read answers MISSING_HISTORY
        except Exception:  # noqa: BLE001 - the full read reads again and reports it
            return None
        return await self._absent(tenant_id, response_id, no_such_response())

    async def _read_response_now(
        self,
        tenant_id: str,
        response_id: str,
        fingerprint_hash: str,
        partition_key: str | None,
    ) -> Answer:
        """The full read, shared with the concurrent requests for the same response
        (``flights.py``: one read, begun after each of them arrived); each request
        answers from it with its own fingerprint."""
        loaded = await self._response_reads.run(
            # the hint too: a response with no claim (before migration 007) is found
            # only by a read that names its partition
            (tenant_id, response_id, partition_key),
            lambda: self._load_response(tenant_id, response_id, partition_key))
        return self._answer(loaded, fingerprint_hash, "response")

    async def _load_response(
        self, tenant_id: str, response_id: str, partition_key: str | None
    ) -> _Loaded:
        now = self._clock()
        history = await self._store.read_history_async(
            tenant_id, response_id=response_id, now=now, partition_key=partition_key
        )
        if isinstance(history, HistoryFailure) and history.reason is HistoryFailureReason.NOT_FOUND:
            rejected = await self._rejection(tenant_id, response_id)
            return _Loaded(history, None, now,
                           None if rejected is None else (response_id, rejected))
        return self._loaded(history, now)

    async def _absent(self, tenant_id: str, response_id: str, history: HistoryFailure) -> Answer:
        """A response promoted nowhere: NOT_PROMOTED if the ledger recorded its
        rejection, else the NOT_FOUND failure (pending, for a waiting request)."""
        rejected = await self._rejection(tenant_id, response_id)
        if rejected is not None:
            return not_promoted(response_id, rejected)
        return failure_answer(history, "response")

    async def _rejection(self, tenant_id: str, response_id: str) -> str | None:
        """The detail of the response's recorded rejection (``rejected: <reason>``), or
        None: not recorded (or no ledger)."""
        if self._ledger is None:
            return None
        recorded = await self._ledger.status_async(tenant_id, response_id)
        if recorded.status is ResponseState.REJECTED:
            return f"rejected: {recorded.reason}"
        return None

    def _loaded(self, history: VerifiedHistory | HistoryFailure, now: datetime) -> _Loaded:
        """A history read: rendered and cached once, whoever shares the read."""
        if isinstance(history, HistoryFailure):
            self._remember_expired(history)
            return _Loaded(history, None, now)
        rendered = render_history(history)
        if isinstance(rendered, RenderedHistory):
            rendered = self._shared(history.checkpoint, rendered)
            self._fill(history, rendered)
        return _Loaded(history, rendered, now)

    def _answer(self, loaded: _Loaded, fingerprint_hash: str, endpoint: str) -> Answer:
        """One request's answer from a history read (its own fingerprint)."""
        history, rendered = loaded.history, loaded.rendered
        if isinstance(history, HistoryFailure):
            if loaded.rejected is not None:
                return not_promoted(*loaded.rejected)
            return failure_answer(history, endpoint)
        if isinstance(rendered, HistoryBody):  # stored bytes that are not a UTF-8 JSON object
            return unrenderable_answer(rendered, endpoint)
        assert rendered is not None
        return verified_answer(
            self._cache,
            rendered,
            history.checkpoint,
            history.head_seq,
            fallback_reason(history.checkpoint, fingerprint_hash, loaded.now),
            endpoint,
        )

    def _remember_expired(self, failure: HistoryFailure) -> None:
        """A read found a response past its logical expiry: later requests for it are
        answered ``EXPIRED`` with no read (``_expired_answer``)."""
        if self._cache is not None and failure.expired is not None:
            self._cache.remember_expired(failure.expired.tenant_id, failure.expired)

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

    def _shared(self, checkpoint: CheckpointRecord, rendered: RenderedHistory) -> RenderedHistory:
        """The cached rendering of this response if it is the same bytes, else
        ``rendered``. A verified history never changes, so a full read of a cached one
        (a ``no-cache`` request) renders the same JSON: its answer then holds the
        cache's bytes, not a copy of its own while its client reads it (40 ``no-cache``
        clients that did not read an 8 MB answer held +337 MiB; an outside review,
        docs/decisions.md, "Clients that do not read")."""
        if self._cache is None:
            return rendered
        entry = self._cache.get(checkpoint.tenant_id, checkpoint.response_id)
        if entry is not None and entry.rendered == rendered:
            return entry.rendered
        return rendered

    def _fill(self, history: VerifiedHistory, rendered: RenderedHistory) -> None:
        """Cache a history just loaded from storage and verified."""
        if self._cache is None:
            return
        checkpoint = history.checkpoint
        tenant_id = checkpoint.tenant_id
        self._cache.remember_locations(
            tenant_id, [turn.response_id for turn in history.lineage], checkpoint.partition_key
        )
        self._cache.put(
            checkpoint.response_id,
            CachedHistory(
                tenant_id, checkpoint.partition_key, checkpoint, history.linked, rendered
            ),
        )
        if history.head is not None:  # kept while an entry of the partition is cached
            self._cache.remember_backed_head(tenant_id, checkpoint.partition_key, history.head)
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


@dataclass(frozen=True)
class _Loaded:
    """A full read's result, which the requests sharing it each answer from."""

    history: VerifiedHistory | HistoryFailure
    # A verified history's rendering (cached), or its CORRUPT_HISTORY body.
    rendered: RenderedHistory | HistoryBody | None
    now: datetime  # when the read began: its expiry and fallback are judged then
    # Not found, and the ledger recorded its rejection: (response id, detail).
    rejected: tuple[str, str] | None = None


@dataclass(frozen=True)
class _Lookup:
    """One response-history request, as the lookup steps pass it on."""

    tenant_id: str
    response_id: str
    fingerprint_hash: str
    use_cache: bool
    partition_key: str | None  # the caller's hint, unverified


def _with_record_hint(lookup: _Lookup, found_in: tuple[str, str] | None) -> _Lookup:
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
