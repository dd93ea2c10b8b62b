"""Cassandra ledger (tables in ``infra/migrations/002_ledger.cql``, ``003``, ``006``, ``008``).

A logical request's tool effects, cancellation and event decisions share one partition
of ``request_facts`` (006), so ``turn_facts`` reads them with one query. Every write
is idempotent, so a redelivered event can simply do it again. Writes of effects,
cancellations and decisions are LWTs (first write wins); an LWT whose outcome is
unknown (timeout) is resolved by re-reading at ``SERIAL`` consistency, never guessed.
Driver errors become ``LedgerUnavailable``, which the processor retries with backoff.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cassandra import ConsistencyLevel, DriverException, RequestExecutionException
from cassandra.cluster import EXEC_PROFILE_DEFAULT, NoHostAvailable, Session
from cassandra.policies import FallthroughRetryPolicy
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    PreparedStatement,
    tuple_factory,
)

from ratchet.domain.promotion import RecordedEffect
from services.ledger.base import (
    Cancellation,
    Decision,
    EffectWrite,
    Ledger,
    LedgerUnavailable,
    ResponseStatus,
    TurnFacts,
    response_status,
)

T = TypeVar("T")

_FACT_COLUMNS = (
    "kind, ref, attempt, subturn_index, call_id, tool_name, arguments_digest, status, "
    "output_item_id, output_digest, executed_at, conflicted, response_id, cancelled_at, "
    "outcome, reason, detail, seq, decided_at, existing_response_id"
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
        # A request's effects, cancellation and decisions: one partition of
        # ``request_facts`` (migration 006), read whole by ``turn_facts``.
        facts = "request_facts WHERE tenant_id = ? AND idempotency_key = ?"
        self._insert_effect = self._lwt(
            "INSERT INTO request_facts (tenant_id, idempotency_key, kind, ref, attempt, "
            "subturn_index, call_id, tool_name, arguments_digest, status, output_item_id, "
            "output_digest, executed_at, conflicted) "
            "VALUES (?, ?, 'effect', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false) IF NOT EXISTS"
        )
        self._mark_conflicted = self._lwt(
            "UPDATE request_facts SET conflicted = true WHERE tenant_id = ? AND "
            "idempotency_key = ? AND kind = 'effect' AND ref = ? IF EXISTS"
        )
        self._select_effect_serial = self._prepare(
            f"SELECT {_FACT_COLUMNS} FROM {facts} AND kind = 'effect' AND ref = ?",
            ConsistencyLevel.SERIAL,
        )
        self._select_facts = self._prepare(
            f"SELECT {_FACT_COLUMNS} FROM {facts}", ConsistencyLevel.QUORUM)
        self._insert_cancel = self._lwt(
            "INSERT INTO request_facts (tenant_id, idempotency_key, kind, ref, response_id, "
            "cancelled_at) VALUES (?, ?, 'cancel', '', ?, ?) IF NOT EXISTS"
        )
        self._select_cancel = self._prepare(
            f"SELECT {_FACT_COLUMNS} FROM {facts} AND kind = 'cancel' AND ref = ''",
            ConsistencyLevel.QUORUM,
        )
        self._insert_decision = self._lwt(
            "INSERT INTO request_facts (tenant_id, idempotency_key, kind, ref, response_id, "
            "outcome, reason, detail, seq, decided_at, existing_response_id) "
            "VALUES (?, ?, 'decision', ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        decision_cql = f"SELECT {_FACT_COLUMNS} FROM {facts} AND kind = 'decision' AND ref = ?"
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
            "UPDATE response_status SET rejected_reason = ?, rejected_detail = ?, "
            "rejected_existing_response_id = ? WHERE tenant_id = ? AND response_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._select_status = self._prepare(
            "SELECT promoted, promoted_seq, rejected_reason, rejected_detail, "
            "rejected_existing_response_id FROM response_status WHERE tenant_id = ? AND response_id = ?",
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
        return None if row is None else _effect_from_row(tenant_id, key, row)

    def effects_for(self, tenant_id: str, idempotency_key: str) -> Sequence[RecordedEffect]:
        rows = self._run(self._select_facts, (tenant_id, idempotency_key))
        return _RequestFacts(tenant_id, idempotency_key, rows).effects

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
        return None if row is None else _cancellation_from_row(tenant_id, idempotency_key, row)

    # -- decisions and status -----------------------------------------------------------
    def record_decision(self, decision: Decision) -> Decision:
        d = decision
        if d.idempotency_key is None:
            raise ValueError("a decision is filed under its request: idempotency_key is needed")
        key = (d.tenant_id, d.idempotency_key)
        # On an unknown outcome (timeout) the SERIAL read below tells which decision holds.
        with contextlib.suppress(LedgerUnavailable):
            self._run(self._insert_decision, (*key, d.event_id, *_unset_nulls((
                d.response_id, d.outcome, d.reason, d.detail, d.seq, d.decided_at,
                d.existing_response_id))))
        row = self._run(self._select_decision_serial, (*key, d.event_id)).one()
        held = None if row is None else _decision_from_row(*key, row)
        if held is None:
            raise LedgerUnavailable(f"decision for event {d.event_id}: write outcome unknown")
        return held

    def decision(self, event_id: str, *, tenant_id: str,
                 idempotency_key: str) -> Decision | None:
        row = self._run(self._select_decision, (tenant_id, idempotency_key, event_id)).one()
        return None if row is None else _decision_from_row(tenant_id, idempotency_key, row)

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
        """ONE query for the request's effects, cancellation and decisions (and, in
        parallel, the conversation's owner when asked)."""
        key = (tenant_id, idempotency_key)
        if conversation_id is None:
            rows, owner_row = self._run(self._select_facts, key), None
        else:
            rows, owner = self._fan_out([(self._select_facts, key),
                                         (self._select_conversation_owner, (conversation_id,))])
            owner_row = owner.one()
        facts = _RequestFacts(tenant_id, idempotency_key, rows)
        return TurnFacts(
            decision=facts.decisions.get(event_id),
            effects=facts.effects,
            cancellation=facts.cancellation,
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

    def mark_rejected(self, tenant_id: str, response_id: str, reason: str, detail: str,
                      existing_response_id: str | None = None) -> None:
        self._run(self._set_rejected,
                  (reason, detail, existing_response_id, tenant_id, response_id))

    def status(self, tenant_id: str, response_id: str) -> ResponseStatus:
        row = self._run(self._select_status, (tenant_id, response_id)).one()
        if row is None:
            return response_status(None, False, None, "", response_id)
        promoted, promoted_seq, rejected_reason, rejected_detail, existing = row
        return response_status(promoted_seq, bool(promoted), rejected_reason,
                               rejected_detail or "", response_id, existing)


# Rows of ``request_facts`` are read by position (see ``_rows_profile``), in the order of
# ``_FACT_COLUMNS``: kind, ref, the nine effect fields, conflicted, response_id,
# cancelled_at, then the six decision fields.
_KIND, _REF, _EFFECT, _CONFLICTED, _RESPONSE, _CANCELLED_AT, _DECISION = 0, 1, 2, 11, 12, 13, 14


def _unset_nulls(values: Sequence[Any]) -> tuple[Any, ...]:
    """Absent values left unset, not written as null (a null cell is a tombstone)."""
    return tuple(UNSET_VALUE if v is None else v for v in values)


def _effect_from_row(tenant_id: str, key: str, row: Any) -> RecordedEffect:
    return RecordedEffect(tenant_id, key, row[_REF], *row[_EFFECT:_CONFLICTED],
                          conflicted=bool(row[_CONFLICTED]))


def _cancellation_from_row(tenant_id: str, key: str, row: Any) -> Cancellation:
    return Cancellation(tenant_id, key, row[_RESPONSE], row[_CANCELLED_AT])


def _decision_from_row(tenant_id: str, key: str, row: Any) -> Decision:
    outcome, reason, detail, seq, decided_at, existing = row[_DECISION:_DECISION + 6]
    return Decision(row[_REF], tenant_id, row[_RESPONSE], outcome, reason, detail or "", seq,
                    decided_at, existing, idempotency_key=key)


class _RequestFacts:
    """The rows of one ``request_facts`` partition, by kind (clustering order: effects
    come sorted by effect_id)."""

    def __init__(self, tenant_id: str, key: str, rows: Any) -> None:
        effects: list[RecordedEffect] = []
        self.cancellation: Cancellation | None = None
        self.decisions: dict[str, Decision] = {}
        for row in rows:
            kind = row[_KIND]
            if kind == "effect":
                effects.append(_effect_from_row(tenant_id, key, row))
            elif kind == "cancel":
                self.cancellation = _cancellation_from_row(tenant_id, key, row)
            elif kind == "decision":
                self.decisions[row[_REF]] = _decision_from_row(tenant_id, key, row)
        self.effects = tuple(effects)
