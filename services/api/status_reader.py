"""``GET .../status``: promoted (the store is the truth), else what the ledger recorded,
else unknown, with the integrity checks a promoted Conversation response shares with
both history endpoints."""

from __future__ import annotations

from collections.abc import Callable

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode, backs
from ratchet.metric_children import child
from services.api import metrics
from services.api.models import StatusBody
from services.ledger.base import Ledger
from services.store.base import CheckpointStore, CorruptPartition


class StatusReader:
    """A response's state from the store and the ledger (blocking reads: the route runs
    it in the thread pool)."""

    def __init__(self, store: CheckpointStore, ledger: Ledger | None) -> None:
        self._store = store
        self._ledger = ledger

    def status(self, tenant_id: str, response_id: str) -> StatusBody:
        """Promoted (the store is the truth), else what the ledger recorded, else unknown.
        A checkpoint row that cannot be decoded raises ``CorruptPartition`` (answered 500
        ``CORRUPT_HISTORY``, as its history is): never "unknown", which would tell the
        gateway to wait for a decision that was made. A Conversation response whose
        partition head no checkpoint backs raises it too (CONTRACT 5: "an integrity
        failure on every endpoint", as both history endpoints answer it). A promoted
        response whose turn row is gone raises ``TurnLost`` (500 ``MISSING_HISTORY``, as
        its history is; ``CheckpointStore.turn_lost``)."""
        checkpoint = self._store.read_promoted(tenant_id, response_id)
        if checkpoint is not None:
            self._check_head_backed(tenant_id, checkpoint)
            body = StatusBody(response_id=response_id, state="promoted", seq=checkpoint.seq)
        elif self._ledger is not None:
            recorded = self._ledger.status(tenant_id, response_id)
            body = StatusBody(
                response_id=response_id,
                state=recorded.status.value,
                reason=recorded.reason,
                seq=recorded.seq,
                existing_response_id=recorded.existing_response_id,
            )
        else:
            body = StatusBody(response_id=response_id, state="unknown")
        child(metrics.STATUS_ANSWERS, body.state, body.reason or "").inc()
        return body

    def _check_head_backed(self, tenant_id: str, checkpoint: CheckpointRecord) -> None:
        """``CorruptPartition`` unless the head of ``checkpoint``'s Conversation is a
        checkpoint's own cells, at or beyond it (a head lost, rolled back below it, or
        rewritten). Chain responses have no head. Found by an outside review: the status
        said ``promoted`` where both history endpoints said ``CORRUPT_HISTORY``."""
        if checkpoint.mode is not PromotionMode.CONVERSATION:
            return
        problem = self._head_problem(tenant_id, checkpoint, self._store.read_head)
        if problem is not None:
            # Looked at again at SERIAL before it is an integrity failure: reads at read
            # consistency may straddle a promotion still committing (the head behind
            # the response just promoted, or seen before its row); SERIAL completes it.
            problem = self._head_problem(tenant_id, checkpoint, self._store.head)
        if problem is not None:
            raise CorruptPartition(
                f"partition {checkpoint.partition_key} of tenant {tenant_id}: {problem}")

    def _head_problem(self, tenant_id: str, checkpoint: CheckpointRecord,
                      read_head: Callable[[str, str], Head | None]) -> str | None:
        head = read_head(tenant_id, checkpoint.partition_key)
        if head is None or head.seq < checkpoint.seq:
            return (f"the head {head} is behind response {checkpoint.response_id} at seq "
                    f"{checkpoint.seq}")
        row = (checkpoint if head.response_id == checkpoint.response_id
               else self._store.read_checkpoint(tenant_id, head.response_id))
        if row is None or row.partition_key != checkpoint.partition_key or not backs(head, row):
            return f"the head {head} is not backed by its checkpoint"
        return None
