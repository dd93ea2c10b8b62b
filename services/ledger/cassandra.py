"""Cassandra ledger (tables in ``infra/migrations/002_ledger.cql``).

Every write is idempotent, so a redelivered event can simply do it again. Writes to
``tool_effects``, ``cancellations`` and ``event_decisions`` are LWTs (first write
wins); an LWT whose outcome is unknown (timeout) is resolved by re-reading at
``SERIAL`` consistency, never guessed. Driver errors become ``LedgerUnavailable``,
which the processor retries with backoff.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cassandra import ConsistencyLevel, DriverException, RequestExecutionException
from cassandra.cluster import EXEC_PROFILE_DEFAULT, NoHostAvailable, Session
from cassandra.policies import FallthroughRetryPolicy
from cassandra.query import BatchStatement, BatchType, PreparedStatement, tuple_factory

from services.ledger.base import (
    Cancellation,
    Decision,
    EffectWrite,
    Ledger,
    LedgerUnavailable,
    RecordedEffect,
    ResponseStatus,
    TurnFacts,
    response_status,
)

T = TypeVar("T")

_EFFECT_COLUMNS = (
    "tenant_id, idempotency_key, effect_id, attempt, subturn_index, call_id, tool_name, "
    "arguments_digest, status, output_item_id, output_digest, executed_at, conflicted"
)


def _guard(call: Callable[[], T]) -> T:
    """Run one driver call, turning infrastructure failures into ``LedgerUnavailable``."""
    try:
        return call()
    except (NoHostAvailable, RequestExecutionException, DriverException, OSError) as exc:
        raise LedgerUnavailable(f"ledger: {type(exc).__name__}: {exc}") from exc


class CassandraLedger(Ledger):
    """Ledger on an existing driver ``Session`` bound to the ratchet keyspace."""

    def __init__(self, session: Session, *, timeout_s: float = 5.0) -> None:
        self._session = session
        self._timeout = timeout_s
        # Rows come back as plain tuples and are read by position: the driver's default
        # named-tuple rows build a new class for every result (collections.namedtuple),
        # which was the largest single CPU cost of a ledger read in the worker's
        # profile. A profile passed per call leaves the shared session untouched;
        # sessions that refuse profiles (legacy configuration) keep named tuples, which
        # index the same.
        self._rows_profile: Any = EXEC_PROFILE_DEFAULT
        with contextlib.suppress(Exception):
            self._rows_profile = session.execution_profile_clone_update(
                EXEC_PROFILE_DEFAULT, row_factory=tuple_factory)
        self._insert_effect = self._lwt(
            f"INSERT INTO tool_effects ({_EFFECT_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false) IF NOT EXISTS"
        )
        self._mark_conflicted = self._lwt(
            "UPDATE tool_effects SET conflicted = true "
            "WHERE tenant_id = ? AND idempotency_key = ? AND effect_id = ? IF EXISTS"
        )
        self._select_effect_serial = self._prepare(
            f"SELECT {_EFFECT_COLUMNS} FROM tool_effects "
            "WHERE tenant_id = ? AND idempotency_key = ? AND effect_id = ?",
            ConsistencyLevel.SERIAL,
        )
        self._select_effects = self._prepare(
            f"SELECT {_EFFECT_COLUMNS} FROM tool_effects "
            "WHERE tenant_id = ? AND idempotency_key = ?",
            ConsistencyLevel.QUORUM,
        )
        self._insert_cancel = self._lwt(
            "INSERT INTO cancellations (tenant_id, idempotency_key, response_id, cancelled_at) "
            "VALUES (?, ?, ?, ?) IF NOT EXISTS"
        )
        self._select_cancel = self._prepare(
            "SELECT tenant_id, idempotency_key, response_id, cancelled_at FROM cancellations "
            "WHERE tenant_id = ? AND idempotency_key = ?",
            ConsistencyLevel.QUORUM,
        )
        self._insert_decision = self._lwt(
            "INSERT INTO event_decisions (event_id, tenant_id, response_id, outcome, reason, "
            "detail, seq, decided_at, existing_response_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        decision_cql = (
            "SELECT event_id, tenant_id, response_id, outcome, reason, detail, seq, decided_at, "
            "existing_response_id FROM event_decisions WHERE event_id = ?"
        )
        self._select_decision = self._prepare(decision_cql, ConsistencyLevel.QUORUM)
        self._select_decision_serial = self._prepare(decision_cql, ConsistencyLevel.SERIAL)
        self._insert_conversation_owner = self._prepare(
            "INSERT INTO conversation_owners (conversation_id, tenant_id) VALUES (?, ?)",
            ConsistencyLevel.QUORUM,
        )
        self._select_conversation_owner = self._prepare(
            "SELECT tenant_id FROM conversation_owners WHERE conversation_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._insert_response_owner = self._prepare(
            "INSERT INTO response_owners (response_id, tenant_id) VALUES (?, ?)",
            ConsistencyLevel.QUORUM,
        )
        self._select_response_owner = self._prepare(
            "SELECT tenant_id FROM response_owners WHERE response_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._set_promoted = self._prepare(
            "UPDATE response_status SET promoted = true, promoted_seq = ? "
            "WHERE tenant_id = ? AND response_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._set_rejected = self._prepare(
            "UPDATE response_status SET rejected_reason = ?, rejected_detail = ? "
            "WHERE tenant_id = ? AND response_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._select_status = self._prepare(
            "SELECT promoted, promoted_seq, rejected_reason, rejected_detail "
            "FROM response_status WHERE tenant_id = ? AND response_id = ?",
            ConsistencyLevel.QUORUM,
        )

    # -- statement helpers ------------------------------------------------------------
    def _prepare(self, cql: str, consistency: int) -> PreparedStatement:
        stmt = _guard(lambda: self._session.prepare(cql))
        stmt.consistency_level = consistency
        return stmt

    def _lwt(self, cql: str) -> PreparedStatement:
        """An LWT statement: never re-sent blindly by the driver (unknown outcomes)."""
        stmt = self._prepare(cql, ConsistencyLevel.QUORUM)
        stmt.serial_consistency_level = ConsistencyLevel.SERIAL
        stmt.retry_policy = FallthroughRetryPolicy()
        stmt.is_idempotent = False
        return stmt

    def _run(self, stmt: PreparedStatement, params: Sequence[Any]) -> Any:
        return _guard(lambda: self._session.execute(stmt, params, timeout=self._timeout,
                                                    execution_profile=self._rows_profile))

    # -- tool effects -------------------------------------------------------------------
    def record_effect(self, effect: RecordedEffect) -> EffectWrite:
        key = (effect.tenant_id, effect.idempotency_key, effect.effect_id)
        params = (
            *key, effect.attempt, effect.subturn_index, effect.call_id, effect.tool_name,
            effect.arguments_digest, effect.status, effect.output_item_id,
            effect.output_digest, effect.executed_at,
        )
        try:
            result = self._run(self._insert_effect, params)
            applied = result.was_applied
        except LedgerUnavailable:
            # The outcome may be unknown: resolve it by a SERIAL read. If the read also
            # fails, the caller retries the whole (idempotent) write later.
            applied = None
        existing = self._effect_serial(*key)
        if existing is None:
            raise LedgerUnavailable(f"effect {effect.effect_id}: write outcome unknown")
        if existing.output_digest == effect.output_digest:
            return EffectWrite.RECORDED if applied else EffectWrite.ALREADY_RECORDED
        self._run(self._mark_conflicted, key)
        return EffectWrite.CONFLICT

    def _effect_serial(self, tenant_id: str, key: str, effect_id: str) -> RecordedEffect | None:
        row = self._run(self._select_effect_serial, (tenant_id, key, effect_id)).one()
        return None if row is None else _effect_from_row(row)

    def effects_for(self, tenant_id: str, idempotency_key: str) -> Sequence[RecordedEffect]:
        rows = self._run(self._select_effects, (tenant_id, idempotency_key))
        return [_effect_from_row(r) for r in rows]

    # -- cancellations ------------------------------------------------------------------
    def record_cancellation(self, cancellation: Cancellation) -> None:
        c = cancellation
        try:
            self._run(self._insert_cancel,
                      (c.tenant_id, c.idempotency_key, c.response_id, c.cancelled_at))
        except LedgerUnavailable:
            if self.cancellation(c.tenant_id, c.idempotency_key) is None:
                raise

    def cancellation(self, tenant_id: str, idempotency_key: str) -> Cancellation | None:
        row = self._run(self._select_cancel, (tenant_id, idempotency_key)).one()
        if row is None:
            return None
        return Cancellation(*row)

    # -- decisions and status -----------------------------------------------------------
    def record_decision(self, decision: Decision) -> Decision:
        d = decision
        # On an unknown outcome (timeout) the SERIAL read below tells which decision holds.
        with contextlib.suppress(LedgerUnavailable):
            self._run(self._insert_decision, (d.event_id, d.tenant_id, d.response_id,
                                              d.outcome, d.reason, d.detail, d.seq,
                                              d.decided_at, d.existing_response_id))
        row = self._run(self._select_decision_serial, (d.event_id,)).one()
        held = None if row is None else _decision_from_row(row)
        if held is None:
            raise LedgerUnavailable(f"decision for event {d.event_id}: write outcome unknown")
        return held

    def decision(self, event_id: str) -> Decision | None:
        row = self._run(self._select_decision, (event_id,)).one()
        return None if row is None else _decision_from_row(row)

    # -- round-trip savers ------------------------------------------------------------------
    def _fan_out(self, calls: list[tuple[PreparedStatement, Sequence[Any]]]) -> list[Any]:
        """Run independent statements concurrently; one round trip for all of them."""
        def run() -> list[Any]:
            futures = [self._session.execute_async(stmt, params, timeout=self._timeout,
                                                   execution_profile=self._rows_profile)
                       for stmt, params in calls]
            return [f.result() for f in futures]
        return _guard(run)

    def turn_facts(self, *, event_id: str, tenant_id: str, idempotency_key: str,
                   conversation_id: str | None) -> TurnFacts:
        calls = [(self._select_decision, (event_id,)),
                 (self._select_effects, (tenant_id, idempotency_key)),
                 (self._select_cancel, (tenant_id, idempotency_key))]
        if conversation_id is not None:
            calls.append((self._select_conversation_owner, (conversation_id,)))
        results = self._fan_out(calls)
        decision_row, cancel_row = results[0].one(), results[2].one()
        owner_row = results[3].one() if conversation_id is not None else None
        return TurnFacts(
            decision=None if decision_row is None else _decision_from_row(decision_row),
            effects=tuple(_effect_from_row(r) for r in results[1]),
            cancellation=None if cancel_row is None else Cancellation(*cancel_row),
            conversation_owner=None if owner_row is None else owner_row[0],
        )

    def record_promotion(self, *, tenant_id: str, response_id: str, seq: int,
                         conversation_id: str | None) -> None:
        # One client request for idempotent plain writes to three partitions: an
        # UNLOGGED batch costs the driver (our CPU bottleneck) one round trip.
        batch = BatchStatement(BatchType.UNLOGGED, consistency_level=ConsistencyLevel.QUORUM)
        batch.add(self._set_promoted, (seq, tenant_id, response_id))
        batch.add(self._insert_response_owner, (response_id, tenant_id))
        if conversation_id is not None:
            batch.add(self._insert_conversation_owner, (conversation_id, tenant_id))
        _guard(lambda: self._session.execute(batch, timeout=self._timeout))

    # -- ownership ------------------------------------------------------------------------
    def record_conversation_owner(self, conversation_id: str, tenant_id: str) -> None:
        self._run(self._insert_conversation_owner, (conversation_id, tenant_id))

    def conversation_owner(self, conversation_id: str) -> str | None:
        row = self._run(self._select_conversation_owner, (conversation_id,)).one()
        return None if row is None else row[0]

    def record_response_owner(self, response_id: str, tenant_id: str) -> None:
        self._run(self._insert_response_owner, (response_id, tenant_id))

    def response_owner(self, response_id: str) -> str | None:
        row = self._run(self._select_response_owner, (response_id,)).one()
        return None if row is None else row[0]

    def mark_promoted(self, tenant_id: str, response_id: str, seq: int | None) -> None:
        self._run(self._set_promoted, (seq, tenant_id, response_id))

    def mark_rejected(self, tenant_id: str, response_id: str, reason: str, detail: str) -> None:
        self._run(self._set_rejected, (reason, detail, tenant_id, response_id))

    def status(self, tenant_id: str, response_id: str) -> ResponseStatus:
        row = self._run(self._select_status, (tenant_id, response_id)).one()
        if row is None:
            return response_status(None, False, None, "", response_id)
        promoted, promoted_seq, rejected_reason, rejected_detail = row
        return response_status(promoted_seq, bool(promoted), rejected_reason,
                               rejected_detail or "", response_id)


# Rows are read by position (see ``_rows_profile``): the SELECTs above list their
# columns in exactly these orders.


def _decision_from_row(row: Any) -> Decision:
    (event_id, tenant_id, response_id, outcome, reason, detail, seq, decided_at,
     existing_response_id) = row
    return Decision(event_id, tenant_id, response_id, outcome, reason, detail or "", seq,
                    decided_at, existing_response_id)


def _effect_from_row(row: Any) -> RecordedEffect:
    *fields, conflicted = row  # _EFFECT_COLUMNS order
    return RecordedEffect(*fields, conflicted=bool(conflicted))
