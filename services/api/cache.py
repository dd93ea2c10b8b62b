"""The API process's verified-history cache, and the stamp that revalidates it per hit.

Why a cache is sound at all: a promoted turn row is written once (``INSERT ... IF NOT
EXISTS``) and never changes, so the verified history ending at response R is
immutable. What a request adds to it (logical expiry, artifact expiry, the caller's
fingerprint, the Conversation's current head) is decided per request from cached
fields and a fresh stamp.

Why every hit is revalidated: tests (and operators' worst days) change stored rows
after they were verified. A hit must answer exactly what a full read would answer now,
or fall through to one. The stamp is one small query on the history's partition
(``services/store/stamps.py``): the static head, and per turn row its ``seq`` and
``mode`` values and the WRITE TIMESTAMP of every other cell verification depends on - but not the cells
themselves (the items blob is ~600 bytes per item; its write timestamp is 8). Any CQL
write to a verified row (a rewritten items cell, a changed expiry, a deleted cell or
row, even one that writes the same bytes) gives it a new write timestamp, so the
stamp differs and the hit becomes a miss: the full read and verification decide.

What a hit therefore guarantees: the answer a full read would give at the time of the
stamp query, unless a write forged an old write timestamp (``USING TIMESTAMP``) or
the bytes changed below CQL (disk damage; Cassandra's own chunk checksums are the
defence there). The response -> partition mapping (``response_claims``) is written
once and kept in memory, as the store's own location hints already do.

Only fully verified, fully renderable histories are cached; never a failure.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ratchet.domain.history import CheckpointRecord, PromotionMode, VerifiedHistory
from ratchet.lru import Lru
from services.api.render import RenderedHistory
from services.store.stamps import PartitionStamp


@dataclass(frozen=True)
class CachedHistory:
    """A verified history, its lineage's stamps at verification, and its rendered JSON."""

    tenant_id: str
    partition_key: str
    checkpoint: CheckpointRecord
    lineage_stamps: tuple[tuple[str, tuple[Any, ...]], ...]
    rendered: RenderedHistory  # items and checkpoint JSON, rendered once
    nbytes: int

    def head_seq(self, stamp: PartitionStamp) -> int | None:
        """The head_seq a full read reports now, or None if a full read must decide.

        Mirrors ``verify_history``: a Conversation turn must not be beyond the head and
        its Conversation must have one turn per seq; a chain turn's head is itself."""
        for ref, cells in self.lineage_stamps:
            if stamp.rows.get(ref) != cells:
                return None
        if self.checkpoint.mode is not PromotionMode.CONVERSATION:
            return self.checkpoint.seq
        head = stamp.head
        if head is None or head.seq < self.checkpoint.seq:
            return None
        backing = stamp.rows.get(head.response_id)  # (seq, mode, ...): the head's own turn
        if backing is None or backing[:2] != (head.seq, PromotionMode.CONVERSATION.value):
            return None
        if not stamp.conversation_seqs_unique():
            return None
        return head.seq


def lineage_stamps(
    history: VerifiedHistory, stamp: PartitionStamp
) -> tuple[tuple[str, tuple[Any, ...]], ...] | None:
    """The stamp's cells of every turn of ``history``; None if the stamp lacks one
    (it was taken before the read, so a turn it does not know is not cacheable) or is
    of another partition (the store found the response elsewhere than hinted)."""
    if history.checkpoint.partition_key != stamp.partition_key:
        return None
    out = []
    for checkpoint in history.lineage:
        cells = stamp.rows.get(checkpoint.response_id)
        if cells is None or cells[0] != checkpoint.seq:
            return None
        out.append((checkpoint.response_id, cells))
    return tuple(out)


class HistoryCache:
    """LRU of ``CachedHistory`` by (tenant_id, response_id), bounded by bytes.

    Also remembers (tenant_id, response_id) -> partition_key for every verified
    history, bounded by ``max_locations`` (locations are immutable). Thread-safe:
    misses fill from the thread pool, hits read on the event loop."""

    def __init__(self, max_bytes: int, max_locations: int = 100_000) -> None:
        self.max_bytes = max_bytes
        self._entries = Lru(max_bytes, weigh=_nbytes)
        self._locations = Lru(max_locations)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return self._entries.weight

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant_id: str, response_id: str) -> CachedHistory | None:
        with self._lock:
            entry = self._entries.get((tenant_id, response_id))
            return entry if isinstance(entry, CachedHistory) else None

    def put(self, response_id: str, entry: CachedHistory) -> None:
        if entry.nbytes > self.max_bytes:
            return  # larger than the whole cache: serving it from the store is the bound
        with self._lock:
            self._entries.put((entry.tenant_id, response_id), entry)

    def discard(self, tenant_id: str, response_id: str) -> None:
        with self._lock:
            self._entries.pop((tenant_id, response_id))

    def location(self, tenant_id: str, response_id: str) -> str | None:
        with self._lock:
            location = self._locations.get((tenant_id, response_id))
            return location if isinstance(location, str) else None

    def remember_location(self, tenant_id: str, response_id: str, partition_key: str) -> None:
        with self._lock:
            self._locations.put((tenant_id, response_id), partition_key)


def _nbytes(entry: object) -> int:
    assert isinstance(entry, CachedHistory)
    return entry.nbytes


__all__ = [
    "CachedHistory",
    "HistoryCache",
    "lineage_stamps",
]
