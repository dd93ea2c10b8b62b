"""The cache's side of a lookup: an answer from a cached history (a hit, or EXPIRED
known without a read), whether a Conversation's head is backed by a verified turn, an
extension of a cached prefix by the rows after it, and the cache filled by a full read.

Both readers (response_reader.py, conversation_reader.py) and the pre-warmer
(prewarm.py) use it; the rules of a verified history stay in the domain
(``verify_extension``, ``fallback_reason``) and the cache's bookkeeping in cache.py.
Without a cache (``cache`` None) only the full read's calls come here (``shared``,
``fill``, ``remember_expired``), and do nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

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
from services.api.answer import Answer, failure_answer, unrenderable_answer, verified_answer
from services.api.cache import CachedHistory, HistoryCache
from services.api.models import HistoryBody
from services.api.render import RenderedHistory, render_extension
from services.store.base import CheckpointStore

# Rows a lookup reads one by one back to a cached prefix before it reads the partition
# in full instead (a gateway's continuation is usually one turn past its last lookup).
MAX_EXTENSION_ROWS = 4


class CachedHistories:
    """Answers and extensions from the ``HistoryCache`` (None: no cache)."""

    def __init__(
        self,
        store: CheckpointStore,
        cache: HistoryCache | None,
        clock: Callable[[], datetime],
    ) -> None:
        self._store = store
        self._cache = cache
        self._clock = clock

    def hit(
        self, entry: CachedHistory, current_head_seq: int, fingerprint_hash: str, endpoint: str
    ) -> Answer | None:
        """The answer from a cached history, or None if only a full read may answer.
        ``current_head_seq``: the Conversation's backed head (chain mode: ignored)."""
        expired = self.expired_hit(entry, endpoint)
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

    def expired_hit(self, entry: CachedHistory, endpoint: str) -> Answer | None:
        """``EXPIRED`` from a cached history past its logical expiry, or None. What the
        full read answers first for it, before the lineage and the head (rule 2,
        ``verify_history``): its stored expiry never changes, so the answer needs no
        read (an outside review, session 36: every request for an expired response or
        Conversation was a full partition read, 36 ms beside a 4 MB history)."""
        return self.expired_answer(entry.checkpoint.logical_expires_at, endpoint)

    def expired_answer(self, expires: datetime | None, endpoint: str) -> Answer | None:
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

    def head_went_back(self, tenant_id: str, partition_key: str, head: Head) -> bool:
        """The head read is behind a Conversation turn verified here (rolled back onto
        an earlier turn: damage its own cells cannot show, docs/store.md): the full read
        decides, which sees the turns beyond it."""
        assert self._cache is not None
        return self._cache.head_went_back(tenant_id, partition_key, head.seq)

    def head_entry(self, tenant_id: str, partition_key: str, head: Head) -> CachedHistory | None:
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
        return self.head_entry(tenant_id, partition_key, head) is not None or (
            self._cache.head_backed(tenant_id, partition_key, head))

    def back_head(self, tenant_id: str, partition_key: str, head: Head) -> bool:
        """Load and verify the head's turn by extension (blocking): True if its history
        is cached now. False: no cached prefix within reach, or rows the extension cannot
        decide; the caller's full read decides."""
        extended = self._extended(
            tenant_id, partition_key, head.response_id, head, MAX_EXTENSION_ROWS, self._clock()
        )
        return isinstance(extended, tuple)

    def extend(
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
            self.remember_expired(extended)
            return failure_answer(extended, endpoint)
        if isinstance(extended, HistoryBody):
            child(metrics.HISTORY_CACHE, endpoint, "extended").inc()
            return unrenderable_answer(extended, endpoint)
        entry, current = extended
        target = entry.checkpoint
        if target.mode is PromotionMode.CONVERSATION:
            # The head read with the rows must be backed, as on a hit.
            assert current is not None  # _extended refuses a Conversation turn without one
            if self.head_entry(tenant_id, partition_key, current) is None and not (
                self.back_head(tenant_id, partition_key, current)
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

    def remember_expired(self, failure: HistoryFailure) -> None:
        """A read found a response past its logical expiry: later requests for it are
        answered ``EXPIRED`` with no read (``_expired_answer``)."""
        if self._cache is not None and failure.expired is not None:
            self._cache.remember_expired(failure.expired.tenant_id, failure.expired)

    def shared(self, checkpoint: CheckpointRecord, rendered: RenderedHistory) -> RenderedHistory:
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

    def fill(self, history: VerifiedHistory, rendered: RenderedHistory) -> None:
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
