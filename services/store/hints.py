"""The store's hints: facts it saw (heads, checkpoints, response locations), kept
bounded to plan a promotion without reading first (the fast path of
``CheckpointStore.promote``) and to read a response's history without the location
lookup. Never truth: every write re-checks them as conditions and every read verifies
the partition (``StoreOptions.hint_capacity``).

``StoreHints`` is what one store saw, shared by its parts: the promotion writer learns
from its writes and views, the history reader from its verified reads, and both look
their hints up here."""

from __future__ import annotations

import threading
from collections.abc import Hashable

from ratchet.domain.history import (
    CheckpointRecord,
    Head,
    HistoryFailure,
    PromotionMode,
    VerifiedHistory,
    backs,
)
from ratchet.domain.plan import Plan, PromotionRequest, PromotionView
from ratchet.lru import Lru


class _Hints:
    """A bounded, thread-safe LRU map of facts this store saw: hints, never truth."""

    def __init__(self, capacity: int) -> None:
        self._lru = Lru(capacity)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> object | None:
        with self._lock:
            return self._lru.get(key)

    def put(self, key: Hashable, value: object) -> None:
        with self._lock:
            self._lru.put(key, value)

    def put_head(self, key: Hashable, head: Head) -> None:
        """Heads only move forward: never replace a newer head by an older one."""
        with self._lock:
            known = self._lru.get(key)
            if isinstance(known, Head) and known.seq > head.seq:
                return
            self._lru.put(key, head)


class StoreHints:
    """The heads, checkpoints and response locations one store saw (each map bounded by
    ``capacity``), learnt only from what is durable: its own applied writes, views
    read at linearizable consistency, verified histories."""

    def __init__(self, capacity: int) -> None:
        # (tenant, partition_key) -> Head; (tenant, partition_key, response_id) ->
        # CheckpointRecord; (tenant, response_id) -> partition_key.
        self.heads = _Hints(capacity)
        self.checkpoints = _Hints(capacity)
        self.locations = _Hints(capacity)

    def head(self, request: PromotionRequest) -> Head | None:
        head = self.heads.get((request.tenant_id, request.partition_key))
        return head if isinstance(head, Head) else None

    def parent(self, request: PromotionRequest) -> CheckpointRecord | None:
        if request.previous_response_id is None:
            return None
        parent = self.checkpoints.get(
            (request.tenant_id, request.partition_key, request.previous_response_id)
        )
        return parent if isinstance(parent, CheckpointRecord) else None

    def partition(
        self, tenant_id: str, response_id: str, partition_key: str | None
    ) -> str | None:
        """The caller's partition hint, else where this store saw the response."""
        hinted = partition_key or self.locations.get((tenant_id, response_id))
        return hinted if isinstance(hinted, str) else None

    def learn_promotion(self, request: PromotionRequest, plan: Plan,
                        checkpoint: CheckpointRecord) -> None:
        """The write of ``plan`` applied: remember what it makes true."""
        key = (request.tenant_id, request.partition_key)
        if plan.new_head is not None:
            self.heads.put_head(key, plan.new_head)
        self.checkpoints.put((*key, request.response_id), checkpoint)
        self.locations.put((request.tenant_id, request.response_id), request.partition_key)

    def learn_view(self, request: PromotionRequest, view: PromotionView) -> None:
        key = (request.tenant_id, request.partition_key)
        # Only a head its own row backs: the fast path's conditions are the hint's
        # cells, so damaged cells kept as a hint would let the next turn be built on them.
        if view.head is not None and backs(view.head, view.head_backing):
            self.heads.put_head(key, view.head)
        if view.parent is not None:
            self.checkpoints.put((*key, view.parent.response_id), view.parent)

    def learn_history(
        self, tenant_id: str, partition_key: str, result: VerifiedHistory | HistoryFailure,
        response_id: str | None = None,
    ) -> None:
        """What a read of the partition answered; ``response_id``: the response read,
        found there (its location is learnt whatever the answer), None for a
        Conversation's read."""
        if response_id is not None:
            self.locations.put((tenant_id, response_id), partition_key)
        if not isinstance(result, VerifiedHistory):
            return
        checkpoint = result.checkpoint
        self.checkpoints.put((tenant_id, partition_key, checkpoint.response_id), checkpoint)
        if checkpoint.mode is PromotionMode.CONVERSATION and checkpoint.seq == result.head_seq:
            self.heads.put_head((tenant_id, partition_key), Head.of(checkpoint))
