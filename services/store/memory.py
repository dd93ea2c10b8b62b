"""In-memory backend with the same semantics as Cassandra (for tests and demos).

One lock guards everything. ``_read_view`` and ``_write`` take it separately, exactly
like the Cassandra backend's read and conditional write are separate round trips, so
the optimistic-concurrency path (lose a race, re-read, decide again) is exercised here
too. ``_write`` re-checks the same conditions the Cassandra batch carries (idempotency
record and checkpoint absent, the whole head, the planned chain parent), so the fast
path (a write planned from hints, no read first) behaves here exactly as there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime

from ratchet.domain.history import (
    NO_ITEMS,
    CheckpointRecord,
    Head,
    HistoryFailure,
    PartitionSnapshot,
    PromotionMode,
    TurnItems,
    VerifiedHistory,
)
from ratchet.domain.plan import (
    CorruptPartition,
    IdempotencyRecord,
    Plan,
    PromotionRequest,
    PromotionView,
    ResponseClaim,
    claimed_partition,
)
from services.store.base import CheckpointStore, StoreOptions
from services.store.hook_calls import call_hook


@dataclass
class _Partition:
    head: Head | None = None
    checkpoints: dict[str, CheckpointRecord] = field(default_factory=dict)
    items: dict[str, TurnItems] = field(default_factory=dict)
    idempotency: dict[str, IdempotencyRecord] = field(default_factory=dict)
    # idempotency key -> the request's facts mark (``mark_request_facts``)
    facts_marks: dict[str, str] = field(default_factory=dict)
    # Cassandra's head marker row: set by a Conversation's first write (``IF NOT
    # EXISTS`` there), never by a chain's. Its own fact, not derived from the rows: on
    # Cassandra a damaged ``mode`` cell does not take the marker with it, and later
    # turns do not stand for a lost one (rrevn, session 50).
    marker: bool = False

    def conversation_begun(self) -> bool:
        """A Conversation turn was promoted here (Cassandra: the head marker row)."""
        return self.marker


def _same_parent(stored: CheckpointRecord | None, planned: CheckpointRecord) -> bool:
    """The chain condition of the Cassandra batch: the parent row still says the same
    (and is filed under its own response id: the row at its key names it)."""
    return (
        stored is not None
        and stored.response_id == planned.response_id
        and stored.seq == planned.seq
        and stored.last_item_seq == planned.last_item_seq
        and stored.mode is planned.mode
        and stored.lineage_digest == planned.lineage_digest
    )


class MemoryCheckpointStore(CheckpointStore):
    """A ``CheckpointStore`` held in a dict; thread-safe."""

    def __init__(self, options: StoreOptions | None = None) -> None:
        super().__init__(options)
        self._lock = threading.Lock()
        self._partitions: dict[tuple[str, str], _Partition] = {}
        # (tenant, response id) -> its claim (first writer wins, never changed).
        self._claims: dict[tuple[str, str], ResponseClaim] = {}
        # (tenant, idempotency key) -> the chain's first response holding the request
        self._request_claims: dict[tuple[str, str], ResponseClaim] = {}

    def head(self, tenant_id: str, partition_key: str) -> Head | None:
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            return None if partition is None else partition.head

    def read_head(self, tenant_id: str, partition_key: str) -> Head | None:
        return self.head(tenant_id, partition_key)

    async def read_head_async(self, tenant_id: str, partition_key: str) -> Head | None:
        return call_hook(self.read_head, tenant_id, partition_key)  # no I/O to wait for

    # No I/O to wait for: the async reads are the blocking ones, called in place
    # (through ``call_hook``: a ``StopIteration`` out of one fails as the base's thread
    # hop does, ``StrayStopIteration``, not as a coroutine's bare ``RuntimeError``).

    async def read_turn_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        return call_hook(self.read_turn, tenant_id, partition_key, response_id)

    async def locate_async(self, tenant_id: str, response_id: str) -> str | None:
        return call_hook(self.locate, tenant_id, response_id)

    async def read_history_async(
        self,
        tenant_id: str,
        *,
        response_id: str | None = None,
        conversation_id: str | None = None,
        now: datetime | None = None,
        partition_key: str | None = None,
    ) -> VerifiedHistory | HistoryFailure:
        return self.read_history(
            tenant_id,
            response_id=response_id,
            conversation_id=conversation_id,
            now=now,
            partition_key=partition_key,
        )

    def _load_turn(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            if partition is None or response_id not in partition.checkpoints:
                return None
            return PartitionSnapshot(
                tenant_id=tenant_id,
                partition_key=partition_key,
                head=partition.head,
                checkpoints={response_id: partition.checkpoints[response_id]},
                items={response_id: partition.items.get(response_id, NO_ITEMS)},
            )

    def _located_checkpoint(
        self, tenant_id: str, response_id: str
    ) -> tuple[str | None, CheckpointRecord | None]:
        with self._lock:
            claim = self._claims.get((tenant_id, response_id))
            if claim is None:
                return None, None
            located = claimed_partition(tenant_id, response_id, claim.partition_key)
            partition = self._partitions.get((tenant_id, located))
            checkpoint = None if partition is None else partition.checkpoints.get(response_id)
        # Cassandra's lookup refuses a row filed under another response id: so does this.
        if checkpoint is not None and checkpoint.response_id != response_id:
            raise CorruptPartition(f"checkpoint row of {response_id} in {located} "
                                   "is filed under another response id")
        return located, checkpoint

    async def turn_lost_async(self, tenant_id: str, response_id: str,
                              partition_key: str | None = None) -> bool:
        return call_hook(self.turn_lost, tenant_id, response_id, partition_key)

    def _claim_of(self, tenant_id: str, response_id: str) -> ResponseClaim | None:
        with self._lock:
            return self._claims.get((tenant_id, response_id))

    def _promoted_response(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            record = None if partition is None else partition.idempotency.get(idempotency_key)
            return None if record is None else record.response_id

    def _turn_row_serial(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            return partition is not None and response_id in partition.checkpoints

    def _claim(self, claim: ResponseClaim) -> ResponseClaim:
        with self._lock:
            return self._claims.setdefault((claim.tenant_id, claim.response_id), claim)

    def _request_holder(self, tenant_id: str, idempotency_key: str) -> ResponseClaim | None:
        with self._lock:
            return self._request_claims.get((tenant_id, idempotency_key))

    def _claim_request(self, claim: ResponseClaim) -> ResponseClaim:
        with self._lock:
            return self._request_claims.setdefault((claim.tenant_id, claim.idempotency_key),
                                                   claim)

    def _read_view(self, request: PromotionRequest,
                   head_guess: str | None = None) -> PromotionView:
        with self._lock:
            partition = self._partitions.get((request.tenant_id, request.partition_key))
            if partition is None:
                return PromotionView(head=None)
            record = partition.idempotency.get(request.idempotency_key)
            parent_id = request.previous_response_id
            head = partition.head
            return PromotionView(
                head=head,
                idempotency=record,
                original=None if record is None else partition.checkpoints.get(record.response_id),
                existing=partition.checkpoints.get(request.response_id),
                parent=None if parent_id is None else partition.checkpoints.get(parent_id),
                facts_mark=partition.facts_marks.get(request.idempotency_key),
                head_backing=None if head is None else partition.checkpoints.get(head.response_id),
                conversation_begun=partition.conversation_begun(),
            )

    def request_facts_mark(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            return None if partition is None else partition.facts_marks.get(idempotency_key)

    def _set_facts_mark(self, tenant_id: str, partition_key: str, idempotency_key: str,
                        mark: str) -> None:
        with self._lock:
            partition = self._partitions.setdefault((tenant_id, partition_key), _Partition())
            partition.facts_marks[idempotency_key] = mark

    def _mark_unless_promoted(self, tenant_id: str, partition_key: str, idempotency_key: str,
                              mark: str) -> IdempotencyRecord | None:
        with self._lock:
            partition = self._partitions.setdefault((tenant_id, partition_key), _Partition())
            record = partition.idempotency.get(idempotency_key)
            if record is not None:
                return record
            partition.facts_marks[idempotency_key] = mark
            return None

    def _write(self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord,
               facts_mark: str | None) -> bool:
        key = (request.tenant_id, request.partition_key)
        with self._lock:
            partition = self._partitions.get(key) or _Partition()
            if (
                request.idempotency_key in partition.idempotency
                or request.response_id in partition.checkpoints
                or partition.facts_marks.get(request.idempotency_key) != facts_mark
            ):
                return False
            if request.mode is PromotionMode.CONVERSATION and partition.head != plan.expected_head:
                return False
            if plan.new_head is not None and plan.expected_head is None and (
                partition.conversation_begun()
            ):
                return False  # Cassandra: the head marker row's ``IF NOT EXISTS``
            if plan.parent is not None and not _same_parent(
                partition.checkpoints.get(plan.parent.response_id), plan.parent
            ):
                return False
            self._partitions[key] = partition
            partition.idempotency[request.idempotency_key] = IdempotencyRecord(
                request.idempotency_key, request.request_digest, request.response_id
            )
            partition.checkpoints[request.response_id] = checkpoint
            partition.items[request.response_id] = TurnItems.of(
                request.items, checkpoint.first_item_seq
            )
            if plan.new_head is not None:
                partition.head = plan.new_head
                if plan.expected_head is None:  # Cassandra: the marker row's INSERT
                    partition.marker = True
            return True

    def _locate(self, tenant_id: str, response_id: str) -> str | None:
        with self._lock:
            claim = self._claims.get((tenant_id, response_id))
        # A claim naming no partition raises, as Cassandra's lookup (``claimed_partition``).
        return None if claim is None else claimed_partition(tenant_id, response_id,
                                                            claim.partition_key)

    def _load_partition(self, tenant_id: str, partition_key: str) -> PartitionSnapshot | None:
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            if partition is None or (partition.head is None and not partition.checkpoints
                                     and not partition.marker):
                return None  # nothing promoted (at most request facts marks)
            return PartitionSnapshot(
                tenant_id=tenant_id,
                partition_key=partition_key,
                head=partition.head,
                checkpoints=dict(partition.checkpoints),
                items=dict(partition.items),
                conversation_begun=partition.conversation_begun(),
            )
