"""Cassandra ledger (tables in ``infra/migrations/002_ledger.cql``, ``003``, ``006``, ``008``, ``010``).

A logical request's tool effects, cancellation and event decisions share one partition
of ``request_facts`` (006), so ``turn_facts`` reads them with one query. Every write
is idempotent, so a redelivered event can simply do it again. Writes of effects,
cancellations and decisions are LWTs (first write wins); an LWT whose outcome is
unknown (timeout) is resolved by re-reading at ``SERIAL`` consistency, never guessed.
Driver errors become ``LedgerUnavailable``, which the processor retries with backoff.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Session
from cassandra.policies import FallthroughRetryPolicy
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    PreparedStatement,
    dict_factory,
    tuple_factory,
)

from ratchet.domain import claims
from ratchet.domain.claims import (
    Answer,
    ClaimRecord,
    ClaimRequest,
    CompletionState,
    Insert,
    TakeOver,
)
from ratchet.domain.promotion import RecordedEffect
from schemas.models import Item
from services.cassandra_cluster import DRIVER_OUTAGES, completed, keyspace_of
from services.cassandra_loop import LoopRequestFailed, LoopResult, LoopSession
from services.ledger.base import (
    Cancellation,
    Decision,
    EffectWrite,
    Ledger,
    LedgerUnavailable,
    ResponseStatus,
    TurnFacts,
    in_scope,
    nothing_to_wait,
    response_status,
)

T = TypeVar("T")

_FACT_COLUMNS = (
    "kind, ref, attempt, subturn_index, call_id, tool_name, arguments_digest, status, "
    "output_item_id, output_digest, executed_at, conflicted, response_id, cancelled_at, "
    "outcome, reason, detail, seq, decided_at, existing_response_id, "
    "claim_token, lease_until, claimed_at, claim_completed, completed_at, output_item, takeovers, "
    "scope, taken_over_call_ids, previous_attempt"
)
# A claim read with the request's cancellation flag (static: one cell per partition).
_CLAIM_COLUMNS = (
    "kind, ref, attempt, subturn_index, call_id, tool_name, arguments_digest, status, "
    "claim_token, lease_until, claimed_at, claim_completed, completed_at, output_item, "
    "takeovers, request_cancelled, taken_over_call_ids, previous_attempt"
)
# Re-deciding after a lost race is bounded: each round means another claimant won a
# conditional write in between, which a lease makes rare.
_CLAIM_ROUNDS = 5


def _guard(call: Callable[[], T]) -> T:
    """Run one driver call, turning infrastructure failures (``DRIVER_OUTAGES``) into
    ``LedgerUnavailable``: the record is retried, never dead-lettered as a bug."""
    try:
        return call()
    except DRIVER_OUTAGES as exc:
        raise LedgerUnavailable(f"ledger: {type(exc).__name__}: {exc}") from exc


async def _on_loop(request: Awaitable[LoopResult]) -> LoopResult:
    """A request of the C++ driver; its failure as ``LedgerUnavailable``."""
    try:
        return await request
    except LoopRequestFailed as exc:
        raise LedgerUnavailable(f"ledger: {exc}") from exc


class CassandraLedger(Ledger):
    """Ledger on an existing driver ``Session``. ``keyspace`` qualifies the tables
    (default: the session's keyspace; neither is ``NoKeyspace``)."""

    def __init__(self, session: Session, *, timeout_s: float = 5.0,
                 loop_session: LoopSession | None = None, keyspace: str | None = None) -> None:
        ks = keyspace_of(session, keyspace)  # never left to the session's USE
        facts_table = f"{ks}.request_facts"
        self._session = session
        self._timeout = timeout_s
        # The requests awaited on an event loop go through the C++ driver when the process
        # gives a session of it (services/cassandra_loop.py); else cassandra-driver's
        # callbacks. Only the loop that session connected on may use it.
        self.loop_session = loop_session
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
        facts = f"{facts_table} WHERE tenant_id = ? AND idempotency_key = ?"
        self._insert_effect = self._lwt(
            f"INSERT INTO {facts_table} (tenant_id, idempotency_key, kind, ref, attempt, "
            "subturn_index, call_id, tool_name, arguments_digest, status, output_item_id, "
            "output_digest, executed_at, conflicted, scope) "
            "VALUES (?, ?, 'effect', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false, ?) IF NOT EXISTS"
        )
        self._mark_conflicted = self._lwt(
            f"UPDATE {facts_table} SET conflicted = true WHERE tenant_id = ? AND "
            "idempotency_key = ? AND kind = 'effect' AND ref = ? IF EXISTS"
        )
        self._select_effect_serial = self._prepare(
            f"SELECT {_FACT_COLUMNS} FROM {facts} AND kind = 'effect' AND ref = ?",
            ConsistencyLevel.SERIAL,
        )
        self._select_facts = self._prepare(
            f"SELECT {_FACT_COLUMNS} FROM {facts}", ConsistencyLevel.QUORUM)
        # One row per scope (its ref; '' also for every row written before scopes).
        self._insert_cancel = self._lwt(
            f"INSERT INTO {facts_table} (tenant_id, idempotency_key, kind, ref, response_id, "
            "cancelled_at, scope) VALUES (?, ?, 'cancel', ?, ?, ?, ?) IF NOT EXISTS"
        )
        cancel_cql = f"SELECT {_FACT_COLUMNS} FROM {facts} AND kind = 'cancel'"
        self._select_cancel = self._prepare(cancel_cql, ConsistencyLevel.QUORUM)
        # An unknown outcome's read: SERIAL completes (or supersedes) a round in flight,
        # which a QUORUM read would miss, and which could then land after it.
        self._select_cancel_serial = self._prepare(cancel_cql, ConsistencyLevel.SERIAL)
        # -- claims (migration 010; rules in ratchet/domain/claims.py) ------------------
        self._insert_claim = self._lwt(
            f"INSERT INTO {facts_table} (tenant_id, idempotency_key, kind, ref, attempt, "
            "subturn_index, call_id, tool_name, arguments_digest, claim_token, lease_until, "
            "claimed_at, claim_completed, takeovers) "
            "VALUES (?, ?, 'claim', ?, ?, ?, ?, ?, ?, ?, ?, ?, false, 0) IF NOT EXISTS")
        # Carries the cancellation condition into the claim's batch (a batch statement
        # must write something: when the request last claimed, kept for operators).
        self._claim_not_cancelled = self._lwt(
            f"UPDATE {facts_table} SET last_claim_at = ? WHERE tenant_id = ? AND "
            "idempotency_key = ? IF request_cancelled = null")
        self._take_over_claim = self._lwt(
            f"UPDATE {facts_table} SET attempt = ?, call_id = ?, claim_token = ?, "
            "lease_until = ?, claimed_at = ?, takeovers = ?, taken_over_call_ids = ?, "
            "previous_attempt = ? WHERE tenant_id = ? AND "
            "idempotency_key = ? AND kind = 'claim' AND ref = ? IF claim_token = ? AND "
            "lease_until = ? AND claim_completed = false AND request_cancelled = null")
        self._complete_claim = self._lwt(
            f"UPDATE {facts_table} SET claim_completed = true, status = ?, output_item = ?, "
            "output_item_id = ?, output_digest = ?, completed_at = ? WHERE tenant_id = ? AND "
            "idempotency_key = ? AND kind = 'claim' AND ref = ? IF claim_token = ? AND "
            "claim_completed = false")
        self._select_claim_serial = self._prepare(
            f"SELECT {_CLAIM_COLUMNS} FROM {facts} AND kind = 'claim' AND ref = ?",
            ConsistencyLevel.SERIAL)
        # The partition's static cells with any row (or none): the cancellation flag.
        self._select_cancelled_serial = self._prepare(
            f"SELECT request_cancelled FROM {facts} LIMIT 1", ConsistencyLevel.SERIAL)
        self._cancel_flag = self._lwt(
            f"UPDATE {facts_table} SET request_cancelled = true WHERE tenant_id = ? AND "
            "idempotency_key = ?")
        self._dict_profile: Any = EXEC_PROFILE_DEFAULT
        with contextlib.suppress(Exception):
            self._dict_profile = session.execution_profile_clone_update(
                EXEC_PROFILE_DEFAULT, row_factory=dict_factory)
        self._insert_decision = self._lwt(
            f"INSERT INTO {facts_table} (tenant_id, idempotency_key, kind, ref, response_id, "
            "outcome, reason, detail, seq, decided_at, existing_response_id) "
            "VALUES (?, ?, 'decision', ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        decision_cql = f"SELECT {_FACT_COLUMNS} FROM {facts} AND kind = 'decision' AND ref = ?"
        self._select_decision = self._prepare(decision_cql, ConsistencyLevel.QUORUM)
        self._select_decision_serial = self._prepare(decision_cql, ConsistencyLevel.SERIAL)
        self._insert_conversation_owner = self._prepare(
            f"INSERT INTO {ks}.conversation_owners (conversation_id, tenant_id) VALUES (?, ?)",
            ConsistencyLevel.QUORUM,
        )
        self._select_conversation_owner = self._prepare(
            f"SELECT tenant_id FROM {ks}.conversation_owners WHERE conversation_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._insert_response_owner = self._prepare(
            f"INSERT INTO {ks}.response_owners (response_id, tenant_id) VALUES (?, ?)",
            ConsistencyLevel.QUORUM,
        )
        self._select_response_owner = self._prepare(
            f"SELECT tenant_id FROM {ks}.response_owners WHERE response_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._set_rejected = self._prepare(
            f"UPDATE {ks}.response_status SET rejected_reason = ?, rejected_detail = ?, "
            "rejected_existing_response_id = ? WHERE tenant_id = ? AND response_id = ?",
            ConsistencyLevel.QUORUM,
        )
        self._select_status = self._prepare(
            "SELECT promoted, promoted_seq, rejected_reason, rejected_detail, "
            f"rejected_existing_response_id FROM {ks}.response_status WHERE tenant_id = ? "
            "AND response_id = ?",
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
            effect.output_digest, effect.executed_at, effect.scope,
        )
        try:
            result = self._run(self._insert_effect, params)
            applied = result.was_applied
        except LedgerUnavailable:
            # The outcome may be unknown: resolve it by a SERIAL read. If the read also
            # fails, the caller retries the whole (idempotent) write later.
            applied = None
        if applied:
            # The row was not there and now holds this record: nothing to read (a SERIAL
            # read here cost a Paxos round per recorded effect).
            return EffectWrite.RECORDED
        existing = self._effect_serial(*key)
        if existing is None:
            raise LedgerUnavailable(f"effect {effect.effect_id}: write outcome unknown")
        if None not in (existing.scope, effect.scope) and existing.scope != effect.scope:
            return EffectWrite.FOREIGN
        if existing.output_digest == effect.output_digest:
            return EffectWrite.ALREADY_RECORDED  # unapplied, or an unknown outcome
        self._run(self._mark_conflicted, key)
        return EffectWrite.CONFLICT

    def _effect_serial(self, tenant_id: str, key: str, effect_id: str) -> RecordedEffect | None:
        row = self._run(self._select_effect_serial, (tenant_id, key, effect_id)).one()
        return None if row is None else _effect_from_row(tenant_id, key, row)

    def effects_for(self, tenant_id: str, idempotency_key: str) -> Sequence[RecordedEffect]:
        rows = self._run(self._select_facts, (tenant_id, idempotency_key))
        return _RequestFacts(tenant_id, idempotency_key, rows).effects

    # -- effect claims --------------------------------------------------------------------
    def claim_effect(self, request: ClaimRequest, now_ms: int) -> Answer:
        """1. ONE conditional batch: insert the claim if absent AND the request is not
        cancelled (static cell, same partition); applied -> CLAIMED.
        2. Not applied: the LWT returned the claim and flag that won; decide from them
        (``claims.decide_claim``): an answer, or a takeover (ONE conditional update on
        the expired holder's token and lease); a lost takeover re-decides.
        3. Unknown outcome (timeout): a SERIAL read of the claim decides; a claim that
        carries this request's token is ours (tokens are unique per claimant)."""
        r = request
        key = (r.tenant_id, r.idempotency_key)
        action: claims.Action = Insert(claims.new_claim(r, now_ms))
        for _ in range(_CLAIM_ROUNDS):
            if isinstance(action, Answer):
                return action
            stmt, params = (self._claim_batch(action.claim, now_ms), None) \
                if isinstance(action, Insert) else self._takeover(action)
            try:
                result = _guard(lambda s=stmt, p=params: self._session.execute(
                    s, p, timeout=self._timeout, execution_profile=self._dict_profile))
                if result.was_applied:
                    return claims.answer_for(action)
                existing, cancelled = self._claim_from_lwt(r, list(result))
            except LedgerUnavailable:
                existing, cancelled = self._claim_serial(*key, r.effect_id)
                if existing is not None and existing.token == r.token \
                        and existing.claimed_at == action.claim.claimed_at:
                    return claims.answer_for(action)  # our write landed
            action = claims.decide_claim(existing, r, now_ms, cancelled)
        raise LedgerUnavailable(f"claim {r.effect_id}: still contended after "
                                f"{_CLAIM_ROUNDS} conditional writes")

    def _claim_batch(self, c: ClaimRecord, now_ms: int) -> BatchStatement:
        batch = BatchStatement(BatchType.LOGGED, consistency_level=ConsistencyLevel.QUORUM,
                               serial_consistency_level=ConsistencyLevel.SERIAL,
                               retry_policy=FallthroughRetryPolicy())
        batch.add(self._insert_claim, (
            c.tenant_id, c.idempotency_key, c.effect_id, c.attempt, c.subturn_index,
            c.call_id, c.tool_name, c.arguments_digest, c.token, c.lease_until, c.claimed_at))
        batch.add(self._claim_not_cancelled, (now_ms, c.tenant_id, c.idempotency_key))
        return batch

    def _takeover(self, action: TakeOver) -> tuple[PreparedStatement, tuple[Any, ...]]:
        c, old = action.claim, action.previous
        return self._take_over_claim, (
            c.attempt, c.call_id, c.token, c.lease_until, c.claimed_at, c.takeovers,
            list(c.taken_over_call_ids), c.previous_attempt, c.tenant_id, c.idempotency_key, c.effect_id, old.token, old.lease_until)

    def _claim_from_lwt(self, r: ClaimRequest,
                        rows: list[dict[str, Any]]) -> tuple[ClaimRecord | None, bool]:
        """The current claim and cancellation flag an unapplied LWT returned. A row with
        no ``claim_token`` is the partition's static row only (no such claim); an
        answer without the claim's columns (takeover: only the checked cells) is
        completed by a SERIAL read."""
        cancelled = any(row.get("request_cancelled") for row in rows)
        for row in rows:
            if row.get("kind") == "claim" and row.get("ref") == r.effect_id:
                return _claim_from_row(r.tenant_id, r.idempotency_key, row), cancelled
        if any("kind" in row for row in rows):
            return None, cancelled
        return self._claim_serial(r.tenant_id, r.idempotency_key, r.effect_id)

    def _claim_serial(self, tenant_id: str, key: str,
                      effect_id: str) -> tuple[ClaimRecord | None, bool]:
        rows = self._fan_out_dicts([(self._select_claim_serial, (tenant_id, key, effect_id)),
                                    (self._select_cancelled_serial, (tenant_id, key))])
        claim_row, flag_row = rows[0].one(), rows[1].one()
        cancelled = bool(flag_row and flag_row.get("request_cancelled"))
        claim = None if claim_row is None else _claim_from_row(tenant_id, key, claim_row)
        return claim, cancelled

    def _claim_only_serial(self, tenant_id: str, key: str, effect_id: str) -> ClaimRecord | None:
        """``_claim_serial`` without the cancellation flag, for callers that do not use
        it: one SERIAL read (a Paxos round), not two."""
        row = _guard(lambda: self._session.execute(
            self._select_claim_serial, (tenant_id, key, effect_id), timeout=self._timeout,
            execution_profile=self._dict_profile)).one()
        return None if row is None else _claim_from_row(tenant_id, key, row)

    def _fan_out_dicts(self, calls: list[tuple[PreparedStatement, Sequence[Any]]]) -> list[Any]:
        def run() -> list[Any]:
            futures = [self._session.execute_async(stmt, params, timeout=self._timeout,
                                                   execution_profile=self._dict_profile)
                       for stmt, params in calls]
            return [f.result() for f in futures]
        return _guard(run)

    def complete_claim(self, tenant_id: str, idempotency_key: str, effect_id: str, token: str,
                       status: str, output: Item,
                       now_ms: int) -> tuple[CompletionState, ClaimRecord | None]:
        """ONE conditional update on the holder's token; not applied or unknown: a
        SERIAL read of the claim says what holds (``claims.decide_completion``)."""
        params = (status, claims.output_to_json(output), output.item_id,
                  output.content_digest, now_ms, tenant_id, idempotency_key, effect_id, token)
        try:
            applied = self._run(self._complete_claim, params).was_applied
        except LedgerUnavailable:
            applied = None
        existing = self._claim_only_serial(tenant_id, idempotency_key, effect_id)
        if applied:
            return CompletionState.COMPLETED, existing
        refused = claims.decide_completion(existing, token, status, output)
        if refused is None:
            # The update did not apply yet the claim is ours and open: only an unknown
            # outcome leaves that (a timeout that did not land). Say so; never guess.
            raise LedgerUnavailable(f"claim {effect_id}: completion outcome unknown")
        if refused is CompletionState.ALREADY_COMPLETED and applied is None \
                and existing is not None and existing.completed_at == now_ms:
            # Our timed-out write landed (it wrote completed_at = now_ms); an earlier
            # completion of the same outcome, whose answer was lost, stays ALREADY.
            return CompletionState.COMPLETED, existing
        return refused, existing

    def claim(self, tenant_id: str, idempotency_key: str, effect_id: str) -> ClaimRecord | None:
        return self._claim_only_serial(tenant_id, idempotency_key, effect_id)

    def claims_for(self, tenant_id: str, idempotency_key: str) -> Sequence[ClaimRecord]:
        rows = self._run(self._select_facts, (tenant_id, idempotency_key))
        return _RequestFacts(tenant_id, idempotency_key, rows).claims

    # -- cancellations ------------------------------------------------------------------
    def record_cancellation(self, cancellation: Cancellation) -> None:
        # The 'cancel' row and the static flag that claims are conditioned on, in one
        # conditional batch (one partition): a claim sees both or neither.
        c = cancellation
        batch = BatchStatement(BatchType.LOGGED, consistency_level=ConsistencyLevel.QUORUM,
                               serial_consistency_level=ConsistencyLevel.SERIAL,
                               retry_policy=FallthroughRetryPolicy())
        batch.add(self._insert_cancel, (c.tenant_id, c.idempotency_key, c.scope or "",
                                         c.response_id, c.cancelled_at, c.scope))
        batch.add(self._cancel_flag, (c.tenant_id, c.idempotency_key))
        try:
            _guard(lambda: self._session.execute(batch, timeout=self._timeout))
        except LedgerUnavailable:
            # The outcome may be unknown: a SERIAL read settles it. A cancellation of
            # this scope there (ours or a first one) stands; none: it did not land, and
            # the caller retries the (idempotent) write.
            rows = self._run(self._select_cancel_serial, (c.tenant_id, c.idempotency_key))
            if not any((found.scope or "") == (c.scope or "") for found in (
                    _cancellation_from_row(c.tenant_id, c.idempotency_key, row)
                    for row in rows)):
                raise

    def cancellations(self, tenant_id: str, idempotency_key: str) -> Sequence[Cancellation]:
        rows = self._run(self._select_cancel, (tenant_id, idempotency_key))
        return [_cancellation_from_row(tenant_id, idempotency_key, row) for row in rows]

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
                   conversation_id: str | None, scope: str | None = None) -> TurnFacts:
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
            effects=tuple(e for e in facts.effects if in_scope(e.scope, scope)),
            cancellation=next((c for c in facts.cancellations if in_scope(c.scope, scope)),
                              None),
            conversation_owner=None if owner_row is None else owner_row[0],
            claims=facts.claims,
        )

    async def conversation_owner_async(self, conversation_id: str) -> str | None:
        if self.loop_session is not None:
            row = (await _on_loop(self.loop_session.execute(
                self._select_conversation_owner, (conversation_id,)))).one()
            return None if row is None else row[0]
        future = _guard(lambda: self._session.execute_async(
            self._select_conversation_owner, (conversation_id,), timeout=self._timeout,
            execution_profile=self._rows_profile))
        await completed(future)
        row = _guard(future.result).one()  # answered already: does not block
        return None if row is None else row[0]

    async def record_owners_async(self, *, tenant_id: str, response_id: str | None,
                                  conversation_id: str | None) -> None:
        if self.loop_session is not None:
            writes = self._owner_writes(tenant_id, response_id, conversation_id)
            if len(writes) == 1:
                await _on_loop(self.loop_session.execute(*writes[0]))
            elif writes:
                await _on_loop(self.loop_session.execute_batch(
                    writes, consistency=ConsistencyLevel.QUORUM, logged=False))
            return
        future = self._send_owners(tenant_id, response_id, conversation_id)
        if future is not None:
            await completed(future)
            _guard(future.result)  # answered already: does not block

    def start_recording_owners(self, *, tenant_id: str, response_id: str | None,
                               conversation_id: str | None) -> Callable[[], None]:
        future = self._send_owners(tenant_id, response_id, conversation_id)
        if future is None:
            return nothing_to_wait

        def wait() -> None:
            _guard(future.result)

        return wait

    def _owner_writes(self, tenant_id: str, response_id: str | None,
                      conversation_id: str | None) -> list[tuple[PreparedStatement, tuple]]:
        writes = []
        if response_id is not None:
            writes.append((self._insert_response_owner, (response_id, tenant_id)))
        if conversation_id is not None:
            writes.append((self._insert_conversation_owner, (conversation_id, tenant_id)))
        return writes

    def _send_owners(self, tenant_id: str, response_id: str | None,
                     conversation_id: str | None) -> Any:
        """The owners' write sent (its driver future), or None: nothing to write."""
        writes = self._owner_writes(tenant_id, response_id, conversation_id)
        if not writes:
            return None
        if len(writes) == 1:
            statement, params = writes[0]
        else:
            # Idempotent plain writes to two partitions in one client request: an
            # UNLOGGED batch costs the driver (our CPU bottleneck) one round trip.
            statement, params = BatchStatement(
                BatchType.UNLOGGED, consistency_level=ConsistencyLevel.QUORUM), None
            for write in writes:
                statement.add(*write)
        # Sent now, waited for by the caller once its promotion batch is back.
        return _guard(lambda: self._session.execute_async(statement, params,
                                                          timeout=self._timeout))

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

    def mark_rejected(self, tenant_id: str, response_id: str, reason: str, detail: str,
                      existing_response_id: str | None = None) -> None:
        self._run(self._set_rejected,
                  (reason, detail, existing_response_id, tenant_id, response_id))

    def status(self, tenant_id: str, response_id: str) -> ResponseStatus:
        row = self._run(self._select_status, (tenant_id, response_id)).one()
        return _status_of(row, response_id)

    async def status_async(self, tenant_id: str, response_id: str) -> ResponseStatus:
        """``status`` on the event loop (the API's wait_ms path): through the C++ driver
        if the ledger has a ``loop_session``, else on cassandra-driver's callbacks."""
        if self.loop_session is not None:
            answer = await _on_loop(self.loop_session.execute(self._select_status,
                                                              (tenant_id, response_id)))
            return _status_of(answer.one(), response_id)
        future = _guard(lambda: self._session.execute_async(
            self._select_status, (tenant_id, response_id), timeout=self._timeout,
            execution_profile=self._rows_profile))
        await completed(future)
        return _status_of(_guard(future.result).one(), response_id)  # answered: no block


def _status_of(row: Any, response_id: str) -> ResponseStatus:
    if row is None:
        return response_status(None, False, None, "", response_id)
    promoted, promoted_seq, rejected_reason, rejected_detail, existing = row
    return response_status(promoted_seq, bool(promoted), rejected_reason,
                           rejected_detail or "", response_id, existing)


# Rows of ``request_facts`` are read by position (see ``_rows_profile``), in the order of
# ``_FACT_COLUMNS``: kind, ref, the nine effect fields, conflicted, response_id,
# cancelled_at, then the six decision fields.
_KIND, _REF, _EFFECT, _CONFLICTED, _RESPONSE, _CANCELLED_AT, _DECISION = 0, 1, 2, 11, 12, 13, 14
_SCOPE = 27
_TAKEN_OVER = 28  # taken_over_call_ids, previous_attempt
_CLAIM = 20  # claim_token ... takeovers
_CLAIM_FIELDS = ("claim_token", "lease_until", "claimed_at", "claim_completed",
                 "completed_at", "output_item", "takeovers")


def _unset_nulls(values: Sequence[Any]) -> tuple[Any, ...]:
    """Absent values left unset, not written as null (a null cell is a tombstone)."""
    return tuple(UNSET_VALUE if v is None else v for v in values)


def _effect_from_row(tenant_id: str, key: str, row: Any) -> RecordedEffect:
    return RecordedEffect(tenant_id, key, row[_REF], *row[_EFFECT:_CONFLICTED],
                          conflicted=bool(row[_CONFLICTED]), scope=row[_SCOPE])


def _cancellation_from_row(tenant_id: str, key: str, row: Any) -> Cancellation:
    return Cancellation(tenant_id, key, row[_RESPONSE], row[_CANCELLED_AT], row[_SCOPE])


def _decision_from_row(tenant_id: str, key: str, row: Any) -> Decision:
    outcome, reason, detail, seq, decided_at, existing = row[_DECISION:_DECISION + 6]
    return Decision(row[_REF], tenant_id, row[_RESPONSE], outcome, reason, detail or "", seq,
                    decided_at, existing, idempotency_key=key)


def _flag(value: Any) -> bool | None:
    """A boolean cell, null kept (a claim's null completion flag is damage:
    ``claims.claim_damage``), never read as false."""
    return None if value is None else bool(value)


def _claim_from_row(tenant_id: str, key: str, row: Any) -> ClaimRecord:
    """A claim from a dict row (LWT answers, SERIAL reads) or a positional fact row."""
    if not isinstance(row, dict):
        names = ("ref", "attempt", "subturn_index", "call_id", "tool_name",
                 "arguments_digest", "status")
        row = {**dict(zip(names, (row[_REF], *row[_EFFECT:_EFFECT + 5], row[_EFFECT + 5]),
                          strict=True)),
               **dict(zip(_CLAIM_FIELDS, row[_CLAIM:_CLAIM + 7], strict=True)),
               "taken_over_call_ids": row[_TAKEN_OVER],
               "previous_attempt": row[_TAKEN_OVER + 1]}
    output = row["output_item"]
    return ClaimRecord(
        tenant_id, key, row["ref"], row["attempt"], row["subturn_index"], row["call_id"],
        row["tool_name"], row["arguments_digest"], row["claim_token"], row["lease_until"],
        row["claimed_at"], completed=_flag(row["claim_completed"]), status=row["status"],
        output=None if output is None else claims.output_from_json(output),
        completed_at=row["completed_at"], takeovers=row["takeovers"] or 0,
        taken_over_call_ids=tuple(row.get("taken_over_call_ids") or ()),
        previous_attempt=row.get("previous_attempt"))


class _RequestFacts:
    """The rows of one ``request_facts`` partition, by kind (clustering order: effects
    come sorted by effect_id)."""

    def __init__(self, tenant_id: str, key: str, rows: Any) -> None:
        effects: list[RecordedEffect] = []
        found_claims: list[ClaimRecord] = []
        self.cancellations: list[Cancellation] = []
        self.decisions: dict[str, Decision] = {}
        for row in rows:
            kind = row[_KIND]
            if kind == "effect":
                effects.append(_effect_from_row(tenant_id, key, row))
            elif kind == "cancel":
                self.cancellations.append(_cancellation_from_row(tenant_id, key, row))
            elif kind == "decision":
                self.decisions[row[_REF]] = _decision_from_row(tenant_id, key, row)
            elif kind == "claim":
                found_claims.append(_claim_from_row(tenant_id, key, row))
        self.effects = tuple(effects)
        self.claims = tuple(found_claims)
