"""A response's or a Conversation's verified history, read from its partition: the
location (the caller's hint, this store's, else the response id's claim), the
partition's load (``_load_lineage`` / ``_load_conversation``), the domain's
verification, a failure confirmed by a second read, and a claimed response whose row is
not there told apart as lost or never promoted. The blocking and the awaited read take
the same steps; only the loads differ."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

from ratchet.domain.history import (
    HistoryFailure,
    HistoryFailureReason,
    PartitionSnapshot,
    VerifiedHistory,
    verify_conversation_history,
    verify_history,
)
from services.store.backend import StoreBackend
from services.store.checkpoint_reader import CheckpointReader
from services.store.hints import StoreHints
from services.store.history_answers import (
    _confirmed,
    _exactly_one,
    _missing_turn,
    _needs_confirming,
    no_such_response,
)


class HistoryReader:
    """``CheckpointStore.read_history`` and ``read_history_async`` (their promises are
    on the facade). ``turn_lost_async`` is the store's own (a backend without I/O to
    wait for answers it in place), passed in so that this reader needs no facade."""

    def __init__(self, backend: StoreBackend, hints: StoreHints, checkpoints: CheckpointReader,
                 turn_lost_async: Callable[[str, str, str | None], Awaitable[bool]]) -> None:
        self._backend = backend
        self._hints = hints
        self._checkpoints = checkpoints
        self._turn_lost_async = turn_lost_async

    def read(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime | None,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        _exactly_one(response_id, conversation_id)
        now = now or self._backend.options.clock()
        first = self._read_once(tenant_id, response_id, conversation_id, now, partition_key)
        if not _needs_confirming(first):
            return first
        again = self._read_once(tenant_id, response_id, conversation_id, now, partition_key)
        return _confirmed(tenant_id, response_id or conversation_id, first, again)

    def _read_once(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        backend = self._backend
        if conversation_id is not None:
            snapshot = backend._load_conversation(tenant_id, conversation_id)
            return self._conversation_result(tenant_id, conversation_id, snapshot, now)
        assert response_id is not None
        hinted = self._hints.partition(tenant_id, response_id, partition_key)
        if hinted is not None:
            snapshot = backend._load_lineage(tenant_id, hinted, response_id)
            result = self._response_result(tenant_id, hinted, response_id, snapshot, now)
            if result is not None:
                return result
        located = backend._locate(tenant_id, response_id)
        if located is None:
            return no_such_response()
        if located != hinted:
            snapshot = backend._load_lineage(tenant_id, located, response_id)
            result = self._response_result(tenant_id, located, response_id, snapshot, now)
            if result is not None:
                return result
        # Claimed there, its row not there: promoted (a lost row) or never (``turn_lost``).
        if self._checkpoints.turn_lost(tenant_id, response_id, located):
            return _missing_turn(tenant_id, located, response_id)
        return no_such_response()

    async def read_async(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime | None,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        _exactly_one(response_id, conversation_id)
        now = now or self._backend.options.clock()
        first = await self._read_once_async(tenant_id, response_id, conversation_id,
                                            now, partition_key)
        if not _needs_confirming(first):
            return first
        again = await self._read_once_async(tenant_id, response_id, conversation_id,
                                            now, partition_key)
        return _confirmed(tenant_id, response_id or conversation_id, first, again)

    async def _read_once_async(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        backend = self._backend
        if conversation_id is not None:
            snapshot = await backend._load_conversation_async(tenant_id, conversation_id)
            return self._conversation_result(tenant_id, conversation_id, snapshot, now)
        assert response_id is not None
        hinted = self._hints.partition(tenant_id, response_id, partition_key)
        if hinted is not None:
            snapshot = await backend._load_lineage_async(tenant_id, hinted, response_id)
            result = self._response_result(tenant_id, hinted, response_id, snapshot, now)
            if result is not None:
                return result
        located = await backend._locate_async(tenant_id, response_id)
        if located is None:
            return no_such_response()
        if located != hinted:
            snapshot = await backend._load_lineage_async(tenant_id, located, response_id)
            result = self._response_result(tenant_id, located, response_id, snapshot, now)
            if result is not None:
                return result
        if await self._turn_lost_async(tenant_id, response_id, located):
            return _missing_turn(tenant_id, located, response_id)
        return no_such_response()

    def _conversation_result(
        self,
        tenant_id: str,
        conversation_id: str,
        snapshot: PartitionSnapshot | None,
        now: datetime,
    ) -> VerifiedHistory | HistoryFailure:
        if snapshot is None:
            return HistoryFailure(HistoryFailureReason.NOT_FOUND, "no such conversation")
        result = verify_conversation_history(snapshot, now)
        self._hints.learn_history(tenant_id, conversation_id, result)
        return result

    def _response_result(
        self,
        tenant_id: str,
        partition_key: str,
        response_id: str,
        snapshot: PartitionSnapshot | None,
        now: datetime,
    ) -> VerifiedHistory | HistoryFailure | None:
        """The verified history of ``response_id`` in that partition; None if not there."""
        if snapshot is None:
            return None
        result = verify_history(snapshot, response_id, now)
        if isinstance(result, HistoryFailure) and result.reason is HistoryFailureReason.NOT_FOUND:
            return None
        self._hints.learn_history(tenant_id, partition_key, result, response_id)
        return result
