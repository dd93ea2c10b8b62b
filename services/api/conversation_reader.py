"""``GET .../conversations/{id}/history``: the Conversation's head read (one row), then
the head's cached history if there is one (cached_histories.py), else an extension
from a cached prefix, else the full read (full_reads.py). Without a cache every lookup is
the full read (``read_in_full``); service.py chooses and times the lookup."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from starlette.concurrency import run_in_threadpool

from ratchet.domain.history import Head
from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import Answer
from services.api.cache import HistoryCache
from services.api.cached_histories import CachedHistories
from services.api.flights import SingleFlight
from services.api.full_reads import FullReads, Loaded, Recheck
from services.store.base import CheckpointStore


class ConversationReader:
    """A Conversation's history lookup (on the event loop; an extension that may read
    rows one by one runs in the thread pool)."""

    def __init__(
        self,
        store: CheckpointStore,
        cache: HistoryCache | None,
        histories: CachedHistories,
        full_reads: FullReads,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._cache = cache
        self._histories = histories
        self._full_reads = full_reads
        self._clock = clock
        self._conversation_reads: SingleFlight[Loaded] = SingleFlight("conversation")

    async def read(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str, use_cache: bool
    ) -> Answer:
        """One head read (one row); the head's cached lineage if there is one, else an
        extension from a cached prefix, else the full read."""
        assert self._cache is not None
        if not use_cache:
            child(metrics.HISTORY_CACHE, "conversation", "bypass").inc()
            return await self.read_in_full(
                tenant_id, conversation_id, fingerprint_hash
            )
        head = await self._store.read_head_async(tenant_id, conversation_id)
        if head is not None and self._histories.head_went_back(tenant_id, conversation_id, head):
            child(metrics.HISTORY_CACHE, "conversation", "miss").inc()
            return await self.read_in_full(
                tenant_id, conversation_id, fingerprint_hash
            )
        if head is not None:
            entry = self._histories.head_entry(tenant_id, conversation_id, head)
            if entry is not None:
                answer = self._histories.hit(entry, head.seq, fingerprint_hash, "conversation")
                if answer is not None:
                    return answer
            known = self._cache.expired(tenant_id, head.response_id)
            if (known is not None and known.partition_key == conversation_id
                    and known.head == head):  # the head names exactly that turn
                expired = self._histories.expired_answer(known.expires_at, "conversation")
                if expired is not None:
                    return expired
        return await self._conversation_miss(tenant_id, conversation_id, fingerprint_hash, head)

    async def _conversation_miss(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str, head: Head | None
    ) -> Answer:
        """An extension of a cached prefix (in the thread pool: it may read rows one by
        one), else the full read, which alone waits in the answer budget."""
        assert self._cache is not None
        if head is not None and head.response_id:
            answer = await run_in_threadpool(
                self._histories.extend,
                tenant_id, conversation_id, head.response_id, fingerprint_hash, "conversation", head
            )
            if answer is not None:
                return answer
        recheck = Recheck(lambda: self._conversation_hit(tenant_id, conversation_id,
                                                          fingerprint_hash, head))
        try:
            return await self.read_in_full(
                tenant_id, conversation_id, fingerprint_hash, cached=recheck)
        finally:
            recheck.count_miss("conversation")

    async def _conversation_hit(self, tenant_id: str, conversation_id: str,
                                fingerprint_hash: str, head: Head | None) -> Answer | None:
        """The cached history of ``head``, the Conversation's head read after the
        request arrived (so after any promotion it was told of: never an older turn's
        history), if a read cached it since; else None. No read."""
        assert self._cache is not None
        if head is None or self._histories.head_went_back(tenant_id, conversation_id, head):
            return None
        entry = self._histories.head_entry(tenant_id, conversation_id, head)
        return None if entry is None else self._histories.hit(entry, head.seq, fingerprint_hash,
                                                    "conversation")

    async def read_in_full(
        self, tenant_id: str, conversation_id: str, fingerprint_hash: str,
        cached: Callable[[], Awaitable[Answer | None]] | None = None,
    ) -> Answer:
        # Its cost is learned under its partition, as a response's read with the
        # partition known (``_read_response``): both read that partition's rows up to
        # a turn, so the last answer of either endpoint is the next one's best guess.
        # Before session 44 it had a key of its own: a Conversation read after response
        # reads started at the default estimate (an eighth of the budget).
        return await self._full_reads.budgeted(("partition", tenant_id, conversation_id), lambda: (
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
        return self._full_reads.answer(loaded, fingerprint_hash, "conversation")

    async def _load_conversation(self, tenant_id: str, conversation_id: str) -> Loaded:
        now = self._clock()
        history = await self._store.read_history_async(
            tenant_id, conversation_id=conversation_id, now=now
        )
        return self._full_reads.loaded(history, now)
