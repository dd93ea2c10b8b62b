"""The API process's verified-history cache, and the stamp that revalidates it per hit.

Why a cache is sound at all: a promoted turn row is written once (``INSERT ... IF NOT
EXISTS``) and never changes, so the verified history ending at response R is
immutable. What a request adds to it (logical expiry, artifact expiry, the caller's
fingerprint, the Conversation's current head) is decided per request from cached
fields and a fresh stamp.

Why every hit is revalidated: tests (and operators' worst days) change stored rows
after they were verified. A hit must answer exactly what a full read would answer now,
or fall through to one. The stamp is one small query on the history's partition
(``STAMP_CQL``): the static head, and per turn row its ``seq`` and ``mode`` values and
the WRITE TIMESTAMP of every other cell verification depends on - but not the cells
themselves (the items blob is ~600 bytes per item; its write timestamp is 8). Any CQL
write to a verified row (a rewritten items cell, a changed expiry, a deleted cell or
row, even one that writes the same bytes) gives it a new write timestamp, so the
stamp differs and the hit becomes a miss: the full read and verification decide.

What a hit therefore guarantees: the answer a full read would give at the time of the
stamp query, unless a write forged an old write timestamp (``USING TIMESTAMP``) or
the bytes changed below CQL (disk damage; Cassandra's own chunk checksums are the
defence there). The response -> partition mapping (``response_locations``) is written
once and kept in memory, as the store's own location hints already do.

Only fully verified, fully renderable histories are cached; never a failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode, VerifiedHistory
from services.api.render import RenderedHistory
from services.store.base import StoreUnavailable

# The cells of a turn row that a VerifiedHistory is decoded from and verified against
# (services/store/cassandra.py ``_DECODED_CHECKPOINT_NAMES`` + ``items``). ``seq`` and
# ``mode`` are read as values instead: the chain-mode promotion batch legitimately
# rewrites a parent's ``seq`` with the same value (a condition, ``SET seq = seq``), and
# the Conversation seq check needs both anyway.
STAMPED_CELLS = (
    "response_id",
    "parent_response_id",
    "previous_response_id",
    "idempotency_key",
    "request_digest",
    "certification",
    "fingerprint_hash",
    "token_artifact",
    "router_receipt",
    "boundary_proof",
    "logical_expires_at",
    "promoted_at",
    "first_item_seq",
    "last_item_seq",
    "items_digest",
    "items",
)
STAMP_CQL = (
    "SELECT head_seq, head_response_id, head_item_count, kind, ref, seq, mode, "
    + ", ".join(f"writetime({cell})" for cell in STAMPED_CELLS)
    + " FROM turns WHERE tenant_id = ? AND partition_key = ? AND kind IN ('checkpoint', 'head')"
)
LOCATION_CQL = (
    "SELECT partition_key FROM response_locations WHERE tenant_id = ? AND response_id = ?"
)

_HEAD_SEQ, _HEAD_RESPONSE, _HEAD_ITEMS, _KIND, _REF, _SEQ, _MODE = range(7)


@dataclass(frozen=True)
class PartitionStamp:
    """What the stamp query saw: the head and, per turn row, ``(seq, mode, *writetimes)``."""

    partition_key: str
    head: Head | None
    rows: Mapping[str, tuple[Any, ...]]

    @classmethod
    def from_rows(cls, partition_key: str, rows: Sequence[Sequence[Any]]) -> PartitionStamp | None:
        if not rows:
            return None
        first = rows[0]
        head = (
            None
            if first[_HEAD_SEQ] is None
            else Head(first[_HEAD_SEQ], first[_HEAD_RESPONSE] or "", first[_HEAD_ITEMS] or 0)
        )
        return cls(
            partition_key=partition_key,
            head=head,
            rows={row[_REF]: tuple(row[_SEQ:]) for row in rows if row[_KIND] == "checkpoint"},
        )

    def conversation_seqs_unique(self) -> bool:
        """No two Conversation-mode rows share a seq (and none lacks one).

        Stricter than verification (which ignores rows it cannot decode): a stricter
        check only turns a hit into a miss, and the full read then decides."""
        seqs = Counter(
            row[0] for row in self.rows.values() if row[1] == PromotionMode.CONVERSATION.value
        )
        return None not in seqs and all(n == 1 for n in seqs.values())


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
        self._entries: OrderedDict[tuple[str, str], CachedHistory] = OrderedDict()
        self._locations: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._max_locations = max_locations
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant_id: str, response_id: str) -> CachedHistory | None:
        key = (tenant_id, response_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, response_id: str, entry: CachedHistory) -> None:
        if entry.nbytes > self.max_bytes:
            return  # larger than the whole cache: serving it from the store is the bound
        key = (entry.tenant_id, response_id)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = entry
            self._bytes += entry.nbytes
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def discard(self, tenant_id: str, response_id: str) -> None:
        with self._lock:
            old = self._entries.pop((tenant_id, response_id), None)
            if old is not None:
                self._bytes -= old.nbytes

    def location(self, tenant_id: str, response_id: str) -> str | None:
        with self._lock:
            return self._locations.get((tenant_id, response_id))

    def remember_location(self, tenant_id: str, response_id: str, partition_key: str) -> None:
        key = (tenant_id, response_id)
        with self._lock:
            self._locations[key] = partition_key
            self._locations.move_to_end(key)
            while len(self._locations) > self._max_locations:
                self._locations.popitem(last=False)


class CassandraStamps:
    """The stamp and location queries, prepared once, run with the driver's own async
    I/O: a cache hit never takes the thread-pool hop."""

    def __init__(self, session: Any, read_consistency: int, timeout_s: float = 5.0) -> None:
        from cassandra.cluster import EXEC_PROFILE_DEFAULT
        from cassandra.query import tuple_factory

        self._session = session
        self._timeout = timeout_s
        self._stamp = session.prepare(STAMP_CQL)
        self._stamp.consistency_level = read_consistency
        self._stamp.fetch_size = 5000  # one page for any history the store serves
        self._location = session.prepare(LOCATION_CQL)
        self._location.consistency_level = read_consistency
        # Plain tuples: no named-tuple class built per result.
        self._profile = session.execution_profile_clone_update(
            EXEC_PROFILE_DEFAULT, row_factory=tuple_factory
        )

    async def stamp(self, tenant_id: str, partition_key: str) -> PartitionStamp | None:
        rows = await self._rows(self._stamp, (tenant_id, partition_key), "stamp")
        return PartitionStamp.from_rows(partition_key, rows)

    async def locate(self, tenant_id: str, response_id: str) -> str | None:
        rows = await self._rows(self._location, (tenant_id, response_id), "locate")
        return rows[0][0] if rows else None

    async def _rows(self, statement: Any, params: tuple[Any, ...], operation: str) -> list:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list] = loop.create_future()
        rows: list = []

        def settle(result: Any = None, error: BaseException | None = None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(
                    StoreUnavailable(
                        f"store {operation}: {type(error).__name__}: {error}",
                        retryable=True,
                        operation=operation,
                    )
                )
            else:
                done.set_result(result)

        try:
            future = self._session.execute_async(
                statement, params, timeout=self._timeout, execution_profile=self._profile
            )
        except Exception as exc:  # noqa: BLE001 - a down cluster refuses at submit time
            raise StoreUnavailable(
                f"store {operation}: {type(exc).__name__}: {exc}",
                retryable=True,
                operation=operation,
            ) from exc

        def on_page(page: list) -> None:
            # Runs on the driver's I/O thread; results cross to the loop thread-safely.
            rows.extend(page)
            if future.has_more_pages:
                future.start_fetching_next_page()
            else:
                loop.call_soon_threadsafe(settle, rows)

        def on_error(exc: BaseException) -> None:
            loop.call_soon_threadsafe(settle, None, exc)

        future.add_callbacks(on_page, on_error)
        return await done


__all__ = [
    "CachedHistory",
    "CassandraStamps",
    "HistoryCache",
    "LOCATION_CQL",
    "PartitionStamp",
    "STAMP_CQL",
    "STAMPED_CELLS",
    "lineage_stamps",
]
