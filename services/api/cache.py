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

Extension (``services/api/service.py``): a history whose lineage digests were all
checked (``linked``) may be extended by the rows promoted after it, read and verified
alone (``ratchet.domain.history.verify_extension``); the new entry's items JSON is the
prefix's plus the new turns' pre-rendered fragments.

Locations: (tenant_id, response_id) -> partition_key of every verified turn, kept here
(immutable: a response id is bound once per tenant, ``response_claims``); a response
not seen yet is looked for under the caller's ``partition_key`` hint, else located by
its claim (``CheckpointStore.locate``).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode
from ratchet.lru import Lru
from services.api.render import RenderedHistory

# Bytes counted per entry on top of its JSON: the checkpoint record (~1.4 KB decoded),
# the entry, its rendered parts and the LRU's bookkeeping. Measured in RSS: 1 KiB
# counted ~half of it (an outside review, session 36: a full 64 MiB cache of ~3 KB
# histories grew the API by 124 MiB).
ENTRY_OVERHEAD_BYTES = 3 * 1024
# The cache's side maps (locations, linked partitions, highest seqs, backed heads) are
# bounded by bytes too, each at this share of the cache's: an entry counts its key's
# and value's text plus this overhead (the tuple key, the LRU's node, the value).
SIDE_MAP_SHARE = 16
SIDE_ENTRY_OVERHEAD_BYTES = 480


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

    Also remembers, each side map bounded by ``max_bytes / SIDE_MAP_SHARE`` (their
    text and a fixed overhead per entry, ``_SideMap``): (tenant_id, response_id) ->
    partition_key for every verified turn (locations are immutable), and which
    (tenant_id, partition_key) had a linked history cached (so a miss elsewhere does
    not try an extension that cannot succeed). Thread-safe: lookups use it on the
    event loop, multi-row extensions and conversation misses from the thread pool,
    the pre-warmer from its own thread."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries = _FairShares(max_bytes)
        side = max_bytes // SIDE_MAP_SHARE
        self._locations = _SideMap(side)
        self._partitions = _SideMap(side)
        # (tenant_id, partition_key) -> the highest Conversation seq verified here: a
        # head never moves back, so one below it is damage (``head_went_back``).
        self._highest = _SideMap(side)
        # (tenant_id, partition_key) -> the Conversation head a full read found backed:
        # the same head cells need no cached history of the head's own turn to be
        # trusted by a hit of an earlier turn (its row is immutable).
        self._backed_heads = _SideMap(side)
        self._lock = threading.Lock()

    @property
    def side_nbytes(self) -> int:
        """The side maps' bytes, as counted."""
        with self._lock:
            return sum(m.nbytes for m in (self._locations, self._partitions, self._highest,
                                          self._backed_heads))

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
        with self._lock:
            self._entries.put(response_id, entry)
            key = (entry.tenant_id, entry.partition_key)
            if entry.linked:
                self._partitions.put(key, True)
            checkpoint = entry.checkpoint
            if checkpoint is not None and checkpoint.mode is PromotionMode.CONVERSATION:
                highest = self._highest.get(key)
                if not isinstance(highest, int) or highest < checkpoint.seq:
                    self._highest.put(key, checkpoint.seq)

    def head_went_back(self, tenant_id: str, partition_key: str, head_seq: int) -> bool:
        """Whether a Conversation turn beyond ``head_seq`` was verified here: the head
        read now is behind a turn that stood (rolled back: damage). Only a full read
        may answer then; it sees the rows beyond the head."""
        with self._lock:
            highest = self._highest.get((tenant_id, partition_key))
            return isinstance(highest, int) and head_seq < highest

    def remember_backed_head(self, tenant_id: str, partition_key: str, head: Head) -> None:
        with self._lock:
            self._backed_heads.put((tenant_id, partition_key), head)

    def head_backed(self, tenant_id: str, partition_key: str, head: Head) -> bool:
        """A full read here found these very head cells backed by their checkpoint."""
        with self._lock:
            return self._backed_heads.get((tenant_id, partition_key)) == head

    def discard(self, tenant_id: str, response_id: str) -> None:
        with self._lock:
            self._entries.pop(tenant_id, response_id)

    def extendable(self, tenant_id: str, partition_key: str) -> bool:
        """A linked history of this partition was cached (it may have been evicted
        since: a hint that costs at most one row read, never an answer)."""
        with self._lock:
            return self._partitions.get((tenant_id, partition_key)) is not None

    def location(self, tenant_id: str, response_id: str) -> str | None:
        with self._lock:
            location = self._locations.get((tenant_id, response_id))
            return location if isinstance(location, str) else None

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
                if locations.get(key) != partition_key:
                    locations.put(key, partition_key)


class _SideMap:
    """An LRU of small facts keyed by (tenant_id, id), bounded by the bytes counted
    for it: its key's and value's text plus ``SIDE_ENTRY_OVERHEAD_BYTES`` an entry
    (an outside review, session 36: bounded by count only, 100 000 entries each, three
    of them held 89 MiB with 20-character ids, 174 MiB with 200). Not thread-safe."""

    def __init__(self, capacity: int) -> None:
        self._lru = Lru(capacity, weigh=_side_weight)

    @property
    def nbytes(self) -> int:
        return self._lru.weight

    def get(self, key: tuple[str, str]) -> object | None:
        held = self._lru.get(key)
        return None if held is None else held[1]  # type: ignore[index]

    def put(self, key: tuple[str, str], value: object) -> None:
        text = len(value.response_id) + len(value.lineage_digest or "") if isinstance(
            value, Head) else len(value) if isinstance(value, str) else 0
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

    def put(self, response_id: str, entry: CachedHistory) -> None:
        if self.capacity <= 0:
            return
        tenant_id = entry.tenant_id
        lru = self._tenants.setdefault(tenant_id, Lru(self.capacity, weigh=_nbytes))
        self._changing(tenant_id, lru, lambda: lru.put(response_id, entry))
        while self.weight > self.capacity:
            heaviest = self._heaviest_tenant()
            largest = self._tenants[heaviest]
            self._changing(heaviest, largest, largest.pop_oldest)

    def pop(self, tenant_id: str, response_id: str) -> None:
        lru = self._tenants.get(tenant_id)
        if lru is not None:
            self._changing(tenant_id, lru, lambda: lru.pop(response_id))

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


__all__ = ["CachedHistory", "ENTRY_OVERHEAD_BYTES", "HistoryCache"]
