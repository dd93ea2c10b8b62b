"""A response's or a Conversation's verified history, read from its partition: the
location (the caller's hint, this store's, else the response id's claim), the
partition's load (``_load_lineage`` / ``_load_conversation``), the domain's
verification, a failure confirmed by a second read, and a claimed response whose row is
not there told apart as lost or never promoted (``turn_lost``).

The blocking and the awaited read are one: the read's steps are a generator
(``_read_steps``) that yields each I/O it needs as a hook's name and its arguments and
is sent the answer; ``read`` calls the hook, ``read_async`` awaits its ``_async`` twin
(every hook a read takes has one: ``backend.py``, and the store's ``turn_lost_async``).
A hook that raises ``StopIteration`` fails both alike (``StrayStopIteration``,
``hook_calls.py``): neither the generator nor a coroutine can pass one on.
Everything between two I/Os (the hints, verification, the confirmation) is written once."""

from __future__ import annotations

from collections.abc import Generator
from datetime import datetime
from typing import Any

from ratchet.domain.history import (
    HistoryFailure,
    HistoryFailureReason,
    PartitionSnapshot,
    VerifiedHistory,
    verify_conversation_history,
    verify_history,
)
from ratchet.domain.plan import CorruptPartition
from services.store.backend import StoreBackend
from services.store.hints import StoreHints
from services.store.history_answers import (
    _confirmed,
    _exactly_one,
    _missing_turn,
    _needs_confirming,
    no_such_response,
)
from services.store.hook_calls import await_hook, call_hook

# One I/O of a read: the name of the store's method and its arguments.
Step = tuple[str, tuple[Any, ...]]
Steps = Generator[Step, Any, VerifiedHistory | HistoryFailure]


def _resumed(steps: Steps, answer: Any, damage: CorruptPartition | None) -> Step:
    """The generator's next step: sent the hook's answer, or thrown the hook's
    ``CorruptPartition`` (a step that does not catch it lets it out of the read)."""
    if damage is not None:
        return steps.throw(damage)
    return steps.send(answer)


def _damaged_claim(what: str, exc: CorruptPartition) -> HistoryFailure:
    """A read that had to ask a response's claim, which is damaged: ``CORRUPT_HISTORY``
    (confirmed by a second read, as every one)."""
    return HistoryFailure(HistoryFailureReason.CORRUPT_HISTORY, f"{what}: {exc}")


class HistoryReader:
    """``CheckpointStore.read_history`` and ``read_history_async`` (their promises are
    on the facade). ``store`` is the store object itself (a ``CheckpointStore``, typed
    by the hooks it implements so that this module needs no facade): each step's method
    is looked up on it at the call, so a backend's hook, and a subclass's or a test's
    replacement of a hook or of ``turn_lost`` / ``turn_lost_async``, is the one called."""

    def __init__(self, store: StoreBackend, hints: StoreHints) -> None:
        self._store = store
        self._hints = hints

    def read(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime | None,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        steps = self._read_steps(tenant_id, response_id, conversation_id, now, partition_key)
        store, answer, damage = self._store, None, None
        while True:
            # Only the generator's own end is caught, never a hook's exception (a
            # ``StopIteration`` out of a hook returned None as the history, session 47);
            # a hook's own ``StopIteration`` is ``StrayStopIteration`` (``hook_calls``).
            # A hook's ``CorruptPartition`` goes into the generator, whose step decides.
            try:
                name, args = _resumed(steps, answer, damage)
            except StopIteration as done:
                return done.value
            try:
                answer, damage = call_hook(getattr(store, name), *args), None
            except CorruptPartition as exc:
                answer, damage = None, exc

    async def read_async(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime | None,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        steps = self._read_steps(tenant_id, response_id, conversation_id, now, partition_key)
        store, answer, damage = self._store, None, None
        while True:
            try:  # the generator's end alone, as in ``read``
                name, args = _resumed(steps, answer, damage)
            except StopIteration as done:
                return done.value
            try:
                answer, damage = await await_hook(getattr(store, f"{name}_async"), *args), None
            except CorruptPartition as exc:
                answer, damage = None, exc

    def _read_steps(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime | None,
        partition_key: str | None,
    ) -> Steps:
        _exactly_one(response_id, conversation_id)
        now = now or call_hook(self._store.options.clock)  # a hook: asked in a generator
        first = yield from self._read_once(tenant_id, response_id, conversation_id, now,
                                           partition_key)
        if not _needs_confirming(first):
            return first
        again = yield from self._read_once(tenant_id, response_id, conversation_id, now,
                                           partition_key)
        return _confirmed(tenant_id, response_id or conversation_id, first, again)

    def _read_once(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime,
        partition_key: str | None,
    ) -> Steps:
        if conversation_id is not None:
            snapshot = yield "_load_conversation", (tenant_id, conversation_id)
            return self._conversation_result(tenant_id, conversation_id, snapshot, now)
        assert response_id is not None
        hinted = self._hints.partition(tenant_id, response_id, partition_key)
        if hinted is not None:
            snapshot = yield "_load_lineage", (tenant_id, hinted, response_id)
            result = self._response_result(tenant_id, hinted, response_id, snapshot, now)
            if result is not None:
                return result
        try:
            located = yield "_locate", (tenant_id, response_id)
        except CorruptPartition as exc:
            # A claim naming no partition (Cassandra's ``_claimed_partition``): where the
            # response lives cannot be told, so its history cannot be read. A typed
            # answer, as for damaged rows: raised, the API answered the status
            # endpoint's error shape on the history endpoints (session 51).
            return _damaged_claim("the response cannot be located", exc)
        if located is None:
            return no_such_response()
        if located != hinted:
            snapshot = yield "_load_lineage", (tenant_id, located, response_id)
            result = self._response_result(tenant_id, located, response_id, snapshot, now)
            if result is not None:
                return result
        # Claimed there, its row not there: promoted (a lost row) or never (``turn_lost``).
        try:
            lost = yield "turn_lost", (tenant_id, response_id, located)
        except CorruptPartition as exc:
            # A claim naming no request (``CheckpointReader.turn_lost``): whether the
            # response was promoted cannot be told (session 51: memory read it as
            # never promoted, Cassandra refused the null key as an outage).
            return _damaged_claim("whether the response was promoted cannot be told", exc)
        if lost:
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
