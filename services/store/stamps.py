"""Partition stamps: what the API's history cache revalidates every hit with.

A stamp is one small query on a history's partition: the static head, and per turn
row its ``seq`` and ``mode`` values and the WRITE TIMESTAMP of every other cell
verification depends on (not the cells themselves). Any CQL write to a verified row
gives it a new write timestamp, so a changed stamp turns a cache hit into a miss
(``services/api/cache.py`` says why that makes the cache sound). The statements run
on the driver's own async I/O: a cache hit never takes the thread-pool hop. Get one
from ``CassandraCheckpointStore.stamps()``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ratchet.domain.history import Head, PromotionMode
from services.store.base import StoreUnavailable
from services.store.rows import DECODED_CHECKPOINT_NAMES

# The cells of a turn row that a VerifiedHistory is decoded from and verified against
# (the codec's ``DECODED_CHECKPOINT_NAMES`` + ``items``). ``seq`` and ``mode`` are read
# as values instead: the chain-mode promotion batch legitimately rewrites a parent's
# ``seq`` with the same value (a condition, ``SET seq = seq``), and the Conversation
# seq check needs both anyway.
STAMPED_CELLS = (
    *(name for name in DECODED_CHECKPOINT_NAMES if name not in ("seq", "mode")),
    "items",
)
STAMP_CQL = (
    "SELECT head_seq, head_response_id, head_item_count, kind, ref, seq, mode, "
    + ", ".join(f"writetime({cell})" for cell in STAMPED_CELLS)
    + " FROM turns WHERE tenant_id = ? AND partition_key = ? AND kind IN ('checkpoint', 'head')"
)
LOCATION_CQL = (
    "SELECT partition_key FROM response_claims WHERE tenant_id = ? AND response_id = ?"
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
