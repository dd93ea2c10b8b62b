"""The API process's cache of verified histories, served without reading them again.

Why serving from memory is sound (CONTRACT section 5): a promoted turn row is written
once (``INSERT ... IF NOT EXISTS``) and never changes, so the verified history ending
at response R is immutable. Verification happens when rows are LOADED from storage
(a miss, an extension, a ``Cache-Control: no-cache`` read); a history verified once is
the promoted history and is served byte-identical from here while it is unexpired.
What a request adds to it (logical expiry, artifact expiry, the caller's fingerprint,
a Conversation's current head) is decided per request from the cached checkpoint (and,
on the Conversation endpoint, one head read).

Keys are (tenant_id, response_id): another tenant's lookup can never find an entry,
whatever the id. Only fully verified, fully renderable histories are cached; never a
failure. Memory is bounded (``max_bytes``, ``RATCHET_API_HISTORY_CACHE_BYTES``) by each
entry's rendered JSON and the certification payloads its checkpoint holds, and shared
fairly between tenants (CONTRACT section 5: "bounded, per tenant"): over the bound, the
tenant holding the most bytes gives up its least recently used entry, so one tenant's
traffic cannot push out the others' histories while it holds more than they do.

Extension (``services/api/cached_histories.py``): a history whose lineage digests were all
checked (``linked``) may be extended by the rows promoted after it, read and verified
alone (``ratchet.domain.history.verify_extension``); the new entry's items JSON is the
prefix's plus the new turns' pre-rendered fragments.

Locations: (tenant_id, response_id) -> partition_key of every verified turn, kept here
(immutable: a response id is bound once per tenant, ``response_claims``); a response
not seen yet is looked for under the caller's ``partition_key`` hint, else located by
its claim (``CheckpointStore.locate``). A response a read found past its logical expiry
keeps its expiry beside its location (``ExpiredTurn``): never a history, but the read's
first answer for it, which never changes, so it is answered ``EXPIRED`` with no read
(session 42; before, only a history cached before it expired was).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode
from ratchet.lru import Lru
from services.api.render import RenderedHistory

# Bytes counted per entry on top of its JSON: the checkpoint record (~1.4 KB decoded),
# the entry, its rendered parts and the LRU's bookkeeping. Measured in RSS: 1 KiB
# counted ~half of it (an outside review, session 36: a full 64 MiB cache of ~3 KB
# histories grew the API by 124 MiB).
ENTRY_OVERHEAD_BYTES = 3 * 1024
# The cache's locations are bounded by bytes too, at this share of the cache's: an
# entry counts its key's and value's text plus this overhead (the tuple key, the LRU's
# node, the value).
SIDE_MAP_SHARE = 16
SIDE_ENTRY_OVERHEAD_BYTES = 480
_UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class ExpiredTurn:
    """A response a read found past its logical expiry: its partition, its expiry (a
    stored expiry never changes) and, for a Conversation's turn, the head it is (the
    Conversation endpoint answers ``EXPIRED`` for a head naming exactly it)."""

    partition_key: str
    expires_at: datetime
    head: Head | None

    @property
    def text_len(self) -> int:
        """The text it holds, as the side map counts it (a Head's two ids, its digest)."""
        head = self.head
        held = len(self.partition_key) + 64  # the datetime and the record
        if head is not None:
            held += len(head.response_id) + len(head.lineage_digest or "") + 64
        return held


def expired_turn(checkpoint: CheckpointRecord) -> ExpiredTurn | None:
    """What is remembered of a checkpoint a read found expired (None: no expiry)."""
    if checkpoint.logical_expires_at is None:
        return None
    head = Head.of(checkpoint) if checkpoint.mode is PromotionMode.CONVERSATION else None
    return ExpiredTurn(checkpoint.partition_key, checkpoint.logical_expires_at, head)


@dataclass(frozen=True)
class CachedHistory:
    """A verified history: its last checkpoint and its JSON, rendered once."""

    tenant_id: str
    partition_key: str
    checkpoint: CheckpointRecord  # the response the history ends with
    linked: bool  # every lineage digest checked: later rows may extend it alone
    rendered: RenderedHistory

    @property
    def nbytes(self) -> int:
        rendered, checkpoint = self.rendered, self.checkpoint
        held = len(rendered.items_json) + len(rendered.checkpoint_json) + ENTRY_OVERHEAD_BYTES
        if checkpoint is not None:  # its receipt, proof and effect ids are held as text
            held += len(checkpoint.router_receipt or "") + len(checkpoint.boundary_proof or "")
            held += sum(len(e) for e in checkpoint.accepted_effect_ids or ())
        return held


class HistoryCache:
    """LRU of ``CachedHistory`` by (tenant_id, response_id), bounded by bytes.

    Also remembers, per (tenant_id, partition_key) with an entry cached (``_Facts``,
    dropped with the partition's last entry, so they protect every hit as long as one
    can be served): whether a linked history was cached (a miss elsewhere there may
    extend it), the highest Conversation seq verified (a head below it is damage), the
    head a full read found backed. And (tenant_id, response_id) -> partition_key for
    every verified turn (locations are immutable), bounded by ``max_bytes /
    SIDE_MAP_SHARE`` (``_SideMap``). Thread-safe: lookups use it on the event loop,
    multi-row extensions and conversation misses from the thread pool, the pre-warmer
    from its own thread."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # Told of the items bytes of every entry the cache lets go (evicted, discarded,
        # replaced by an entry of other bytes), from the thread that let it go, under
        # the cache's lock: answers still being written may hold them
        # (``AnswerBudget.evicted``).
        self.on_evict: Callable[[bytes], None] | None = None
        self._entries = _FairShares(max_bytes)
        self._locations = _SideMap(max_bytes // SIDE_MAP_SHARE)
        self._facts: dict[tuple[str, str], _Facts] = {}
        self._lock = threading.Lock()

    @property
    def side_nbytes(self) -> int:
        """The locations' bytes, as counted."""
        with self._lock:
            return self._locations.nbytes

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return self._entries.weight

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, tenant_id: str, response_id: str) -> CachedHistory | None:
        with self._lock:
            return self._entries.get(tenant_id, response_id)

    def put(self, response_id: str, entry: CachedHistory) -> None:
        if entry.nbytes > self.max_bytes:
            return  # larger than the whole cache: serving it from the store is the bound
        key = (entry.tenant_id, entry.partition_key)
        with self._lock:
            known = self._entries.get(entry.tenant_id, response_id)
            facts = self._facts.setdefault(key, _Facts())
            facts.entries += 0 if known is not None else 1
            facts.linked = facts.linked or entry.linked
            checkpoint = entry.checkpoint
            if checkpoint is not None and checkpoint.mode is PromotionMode.CONVERSATION:
                facts.highest = max(facts.highest or 0, checkpoint.seq)
            if (known is not None and self.on_evict is not None
                    and known.rendered.items_json is not entry.rendered.items_json):
                # Replaced by other bytes. A full read of a cached history (``no-cache``)
                # renders the cache's own bytes again (cached_histories.py, ``shared``): the
                # cache still holds those, nothing is let go.
                self.on_evict(known.rendered.items_json)
            for evicted in self._entries.put(response_id, entry):
                self._forget(evicted)

    def holds(self, entry: CachedHistory, items_json: bytes) -> bool:
        """Whether ``entry``'s response is cached now with these very items bytes (not
        made recently used)."""
        with self._lock:
            cached = self._entries.peek(entry.tenant_id, entry.checkpoint.response_id)
            return cached is not None and cached.rendered.items_json is items_json

    def _forget(self, entry: CachedHistory) -> None:
        if self.on_evict is not None:
            self.on_evict(entry.rendered.items_json)
        key = (entry.tenant_id, entry.partition_key)
        facts = self._facts.get(key)
        if facts is not None:
            facts.entries -= 1
            if facts.entries <= 0:
                del self._facts[key]

    def head_went_back(self, tenant_id: str, partition_key: str, head_seq: int) -> bool:
        """Whether a Conversation turn beyond ``head_seq`` was verified here: the head
        read now is behind a turn that stood (rolled back: damage). Only a full read
        may answer then; it sees the rows beyond the head."""
        with self._lock:
            facts = self._facts.get((tenant_id, partition_key))
            return facts is not None and facts.highest is not None and head_seq < facts.highest

    def remember_backed_head(self, tenant_id: str, partition_key: str, head: Head) -> None:
        """Remembered while an entry of the partition is cached (call after ``put``)."""
        with self._lock:
            facts = self._facts.get((tenant_id, partition_key))
            if facts is not None:
                facts.backed_head = head

    def head_backed(self, tenant_id: str, partition_key: str, head: Head) -> bool:
        """A full read here found these very head cells backed by their checkpoint."""
        with self._lock:
            facts = self._facts.get((tenant_id, partition_key))
            return facts is not None and facts.backed_head == head

    def discard(self, tenant_id: str, response_id: str) -> None:
        with self._lock:
            dropped = self._entries.pop(tenant_id, response_id)
            if dropped is not None:
                self._forget(dropped)

    def extendable(self, tenant_id: str, partition_key: str) -> bool:
        """A linked history of this partition was cached, and an entry of it still is (a
        hint that costs at most one row read, never an answer)."""
        with self._lock:
            facts = self._facts.get((tenant_id, partition_key))
            return facts is not None and facts.linked

    def location(self, tenant_id: str, response_id: str) -> str | None:
        with self._lock:
            return _location_of(self._locations.get((tenant_id, response_id)))

    def expired(self, tenant_id: str, response_id: str) -> ExpiredTurn | None:
        """The response's expiry, if a read here found it past it."""
        with self._lock:
            known = self._locations.get((tenant_id, response_id))
            return known if isinstance(known, ExpiredTurn) else None

    def remember_expired(self, tenant_id: str, checkpoint: CheckpointRecord) -> None:
        """A read found ``checkpoint`` past its logical expiry (``HistoryFailure.expired``):
        kept with its location, in the locations' bound."""
        known = expired_turn(checkpoint)
        if known is None:
            return
        with self._lock:
            self._locations.put((tenant_id, checkpoint.response_id), known)

    def remember_location(self, tenant_id: str, response_id: str, partition_key: str) -> None:
        self.remember_locations(tenant_id, (response_id,), partition_key)

    def remember_locations(
        self, tenant_id: str, response_ids: Iterable[str], partition_key: str
    ) -> None:
        """Every turn of a verified lineage lives in its one partition (under one lock).
        A location already known is only refreshed (``get``): a cold read of a long
        history remembers the same 50 locations again, and a ``put`` costs ~3x more."""
        locations = self._locations
        with self._lock:
            for response_id in response_ids:
                key = (tenant_id, response_id)
                if _location_of(locations.get(key)) != partition_key:
                    locations.put(key, partition_key)


@dataclass
class _Facts:
    """What the cache knows of one partition while it holds an entry of it."""

    entries: int = 0  # entries of the partition cached
    linked: bool = False  # a linked history of it was cached
    highest: int | None = None  # the highest Conversation seq verified
    backed_head: Head | None = None  # the head a full read found backed


def _location_of(known: object) -> str | None:
    """The partition a locations entry names (a text, or an ``ExpiredTurn``'s)."""
    if isinstance(known, ExpiredTurn):
        return known.partition_key
    return known if isinstance(known, str) else None


class _SideMap:
    """An LRU of texts (or ``ExpiredTurn``s, counted by ``text_len``) keyed by
    (tenant_id, id), bounded by the bytes counted for it:
    its key's and value's text plus ``SIDE_ENTRY_OVERHEAD_BYTES`` an entry (an outside
    review, session 36: the cache's maps were bounded by count only, 100 000 entries
    each; three of them held 89 MiB with 20-character ids, 174 MiB with 200). Not
    thread-safe."""

    def __init__(self, capacity: int) -> None:
        self._lru = Lru(capacity, weigh=_side_weight)

    @property
    def nbytes(self) -> int:
        return self._lru.weight

    def get(self, key: tuple[str, str]) -> object | None:
        held = self._lru.get(key)
        return None if held is None else held[1]  # type: ignore[index]

    def put(self, key: tuple[str, str], value: str | ExpiredTurn) -> None:
        text = len(value) if isinstance(value, str) else value.text_len
        self._lru.put(key, (len(key[0]) + len(key[1]) + text + SIDE_ENTRY_OVERHEAD_BYTES,
                            value))


def _side_weight(held: object) -> int:
    return held[0]  # type: ignore[index]


class _FairShares:
    """Cached histories by tenant, each tenant's in least-recently-used order, bounded
    in total by ``capacity`` bytes. Over it, the tenant holding the most bytes gives up
    its least recently used entry, until the total fits: a tenant keeps its entries
    while it holds no more than any other. Not thread-safe (``HistoryCache`` locks).

    Every operation costs O(log tenants), not O(tenants): the entry count is kept as
    it changes, and the heaviest tenant is found in a heap of (weight, tenant) pushed
    at each change of a tenant's weight, whose stale pairs are dropped as they reach
    its top (an outside review, session 36: with 21 916 tenants cached, summing their
    counts and scanning for the heaviest on every fill cost 14-19 ms per cold read,
    against 1.2-1.6 ms with few tenants). Of equally heavy tenants, the one that
    reached that weight first gives up an entry."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.weight = 0
        self._count = 0
        self._tenants: dict[str, Lru] = {}
        self._heaviest: list[tuple[int, int, str]] = []  # (-weight, order, tenant)
        self._order = itertools.count()

    def __len__(self) -> int:
        return self._count

    def get(self, tenant_id: str, response_id: str) -> CachedHistory | None:
        lru = self._tenants.get(tenant_id)
        entry = None if lru is None else lru.get(response_id)
        return entry if isinstance(entry, CachedHistory) else None

    def peek(self, tenant_id: str, response_id: str) -> CachedHistory | None:
        lru = self._tenants.get(tenant_id)
        entry = None if lru is None else lru.peek(response_id)
        return entry if isinstance(entry, CachedHistory) else None

    def put(self, response_id: str, entry: CachedHistory) -> list[CachedHistory]:
        """Cache ``entry``; the entries evicted to make room (possibly itself)."""
        if self.capacity <= 0:
            return [entry]
        tenant_id = entry.tenant_id
        # Each tenant's LRU is unbounded: only this loop evicts (and says what).
        lru = self._tenants.setdefault(tenant_id, Lru(_UNBOUNDED, weigh=_nbytes))
        self._changing(tenant_id, lru, lambda: lru.put(response_id, entry))
        evicted: list[CachedHistory] = []
        while self.weight > self.capacity:
            heaviest = self._heaviest_tenant()
            largest = self._tenants[heaviest]
            self._changing(heaviest, largest,
                           lambda lru=largest: evicted.append(lru.pop_oldest()))
        return evicted

    def pop(self, tenant_id: str, response_id: str) -> CachedHistory | None:
        """Drop one entry; the entry dropped, if there was one."""
        lru = self._tenants.get(tenant_id)
        entry = None if lru is None else lru.get(response_id)
        if lru is not None and entry is not None:
            self._changing(tenant_id, lru, lambda: lru.pop(response_id))
        return entry if isinstance(entry, CachedHistory) else None

    def _changing(self, tenant_id: str, lru: Lru, change: Callable[[], object]) -> None:
        """Run ``change`` on one tenant's entries and keep the totals and heap true."""
        weight, count = lru.weight, len(lru)
        change()
        self.weight += lru.weight - weight
        self._count += len(lru) - count
        if not len(lru):
            del self._tenants[tenant_id]
        elif lru.weight != weight:
            heapq.heappush(self._heaviest, (-lru.weight, next(self._order), tenant_id))
            if len(self._heaviest) > 2 * len(self._tenants) + 64:
                self._heaviest = [(-w.weight, next(self._order), t)
                                  for t, w in self._tenants.items()]
                heapq.heapify(self._heaviest)

    def _heaviest_tenant(self) -> str:
        """The tenant holding the most bytes (called only while some tenant holds any:
        the total is above the capacity)."""
        while True:
            negative, _, tenant_id = self._heaviest[0]
            lru = self._tenants.get(tenant_id)
            if lru is not None and lru.weight == -negative:
                return tenant_id
            heapq.heappop(self._heaviest)  # stale: that tenant's weight changed since


def _nbytes(entry: object) -> int:
    assert isinstance(entry, CachedHistory)
    return entry.nbytes


__all__ = ["CachedHistory", "ENTRY_OVERHEAD_BYTES", "ExpiredTurn", "HistoryCache"]
