"""``GET .../responses/{id}/history``: one lookup of a response's history, from the
cache when it can answer (cached_histories.py), else the full read (full_reads.py).

A hit: a chain-mode history answers with no storage read, a Conversation-mode one with
its head read. A miss: find the partition (where this API verified the response
before, else the caller's hint, else the response's claim), then extend a cached
prefix (only the new rows) or read the partition in full. Not in the store:
``NOT_PROMOTED`` if the ledger recorded a rejection, else ``NOT_FOUND``. The wait for
a decision (``wait_ms``, decision_wait.py) calls ``read`` once or more per request."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from starlette.concurrency import run_in_threadpool

from ratchet.domain.history import (
    HistoryFailure,
    HistoryFailureReason,
    PartitionSnapshot,
    PromotionMode,
    backs,
)
from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import Answer, failure_answer, not_promoted
from services.api.answer_budget import AnswerBudget
from services.api.cache import CachedHistory, HistoryCache
from services.api.cached_histories import MAX_EXTENSION_ROWS, CachedHistories
from services.api.flights import SingleFlight
from services.api.full_reads import FullReads, Loaded, Recheck
from services.ledger.base import Ledger, ResponseState
from services.store.base import CheckpointStore, CorruptPartition
from services.store.history_answers import no_such_response


@dataclass(frozen=True)
class ClaimedRow:
    """The response's turn row, read where the response's claim says it lives (a
    response id is claimed in one partition per tenant before its batch is sent)."""

    partition_key: str
    row: PartitionSnapshot


@dataclass(frozen=True)
class ResponseLookup:
    """One response-history request, as the lookup steps pass it on."""

    tenant_id: str
    response_id: str
    fingerprint_hash: str
    use_cache: bool
    partition_key: str | None  # the caller's hint, unverified
    # The turn row a wait's first look found (decision_wait.py), read during this
    # request: the miss path extends by it instead of reading it again.
    claimed_row: ClaimedRow | None = None


class ResponseReader:
    """A response's history lookup (on the event loop, awaiting the driver's async
    reads; only an extension that must read several rows one by one runs in the
    thread pool)."""

    def __init__(
        self,
        store: CheckpointStore,
        ledger: Ledger | None,
        cache: HistoryCache | None,
        histories: CachedHistories,
        full_reads: FullReads,
        answers: AnswerBudget | None,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._ledger = ledger
        self._cache = cache
        self._histories = histories
        self._full_reads = full_reads
        self._answers = answers
        self._clock = clock
        self._response_reads: SingleFlight[Loaded] = SingleFlight("response")

    async def read(self, lookup: ResponseLookup) -> Answer:
        """The answer, its lookup time observed in ``ratchet_api_lookup_seconds``."""
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

    async def _cached_response(self, lookup: ResponseLookup) -> Answer:
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
                expired = self._histories.expired_hit(entry, "response")
                if expired is not None:
                    return expired
                if entry.checkpoint.mode is PromotionMode.CONVERSATION:
                    answer = await self._conversation_response_hit(entry, fingerprint_hash)
                else:
                    answer = self._histories.hit(
                        entry, entry.checkpoint.seq, fingerprint_hash, "response")
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
                expired = self._histories.expired_answer(known.expires_at, "response")
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
        if head is None or head.seq < entry.checkpoint.seq or self._histories.head_went_back(
                tenant_id, partition_key, head):
            return None
        if self._histories.head_entry(tenant_id, partition_key, head) is None and not (
                self._cache.head_backed(tenant_id, partition_key, head)):
            backed = await run_in_threadpool(
                self._histories.back_head, tenant_id, partition_key, head)
            if not backed:
                return None
        return self._histories.hit(entry, head.seq, fingerprint_hash, "response")

    async def _response_miss(self, lookup: ResponseLookup) -> Answer:
        """Find the response's partition and its turn row, then extend a cached prefix
        by that row (and, in the thread pool, any rows between) or read it in full.

        The partition: where this API verified the response before, else the caller's
        hint, else the response's claim (``locate``). A hint is never trusted: the turn
        row must be found there (a response id lives in one partition per tenant, bound
        by its claim), else the claim decides, as without a hint. With a right hint
        the extension reads ONE row; with the row a wait's first look found
        (``claimed_row``), none: it is the row this lookup would read, where the claim
        says, by the same read, made during this request (docs/decisions.md, "A wait
        that finds its turn promoted reads it once")."""
        assert self._cache is not None
        tenant_id, response_id = lookup.tenant_id, lookup.response_id
        verified = self._cache.location(tenant_id, response_id)
        claimed = lookup.claimed_row
        if claimed is not None and verified not in (None, claimed.partition_key):
            claimed = None  # where this API verified it decides (never seen: one claim)
        partition_key = verified or (
            lookup.partition_key if claimed is None else claimed.partition_key)
        if not lookup.use_cache:
            child(metrics.HISTORY_CACHE, "response", "bypass").inc()
            return await self._read_response(
                tenant_id, response_id, lookup.fingerprint_hash, partition_key
            )
        row = None
        try:
            if claimed is not None:
                if self._cache.extendable(tenant_id, claimed.partition_key):
                    row = claimed.row
            elif partition_key is not None and self._cache.extendable(tenant_id, partition_key):
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
        except CorruptPartition:
            # The response's claim names no partition (storage damage): the full read
            # asks it again and answers the typed CORRUPT_HISTORY failure. Raised from
            # here, it was the status endpoint's error shape (session 51).
            row = None
        if row is not None and partition_key is not None:
            answer = await self._extend_from(lookup, partition_key, row)
            if answer is not None:
                return answer
        recheck = Recheck(lambda: self._response_hit(lookup))
        try:
            return await self._read_response(
                tenant_id, response_id, lookup.fingerprint_hash, partition_key,
                cached=recheck,
            )
        finally:
            recheck.count_miss("response")

    async def _response_hit(self, lookup: ResponseLookup) -> Answer | None:
        """The cached history's answer for ``lookup`` (what ``_cached_response``
        answers from the cache, a Conversation response's head read now), else None.
        A response's verified history never changes: a cached one is what a full read
        would answer, whenever the request arrived."""
        assert self._cache is not None
        entry = self._cache.get(lookup.tenant_id, lookup.response_id)
        if entry is None:
            return None
        expired = self._histories.expired_hit(entry, "response")
        if expired is not None:
            return expired
        if entry.checkpoint.mode is PromotionMode.CONVERSATION:
            return await self._conversation_response_hit(entry, lookup.fingerprint_hash)
        return self._histories.hit(entry, entry.checkpoint.seq, lookup.fingerprint_hash, "response")

    async def _read_turn_if_extendable(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        assert self._cache is not None
        if not self._cache.extendable(tenant_id, partition_key):
            return None
        return await self._store.read_turn_async(tenant_id, partition_key, response_id)

    async def _extend_from(
        self, lookup: ResponseLookup, partition_key: str, row: PartitionSnapshot
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
        if row.head is not None and self._histories.head_went_back(lookup.tenant_id, partition_key,
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
            return self._histories.extend(*args[:6], max_rows=1, first=row)
        return await run_in_threadpool(self._histories.extend, *args)

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

        return await self._full_reads.budgeted(
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
        return self._full_reads.answer(loaded, fingerprint_hash, "response")

    async def _load_response(
        self, tenant_id: str, response_id: str, partition_key: str | None
    ) -> Loaded:
        now = self._clock()
        history = await self._store.read_history_async(
            tenant_id, response_id=response_id, now=now, partition_key=partition_key
        )
        if isinstance(history, HistoryFailure) and history.reason is HistoryFailureReason.NOT_FOUND:
            rejected = await self._rejection(tenant_id, response_id)
            return Loaded(history, None, now,
                           None if rejected is None else (response_id, rejected))
        return self._full_reads.loaded(history, now)

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
