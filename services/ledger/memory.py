"""In-memory ledger with the same semantics as the Cassandra one (tests, demos)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace

from ratchet.domain import claims
from ratchet.domain.claims import Answer, ClaimRecord, ClaimRequest, CompletionState
from ratchet.domain.promotion import RecordedEffect
from schemas.models import Item
from services.ledger.base import (
    Cancellation,
    Decision,
    EffectWrite,
    Ledger,
    ResponseStatus,
    response_status,
)


class MemoryLedger(Ledger):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._effects: dict[tuple[str, str], dict[str, RecordedEffect]] = {}
        # (tenant, key) -> scope ('' also for one recorded before scopes, as the
        # Cassandra row's ref) -> the first cancellation of that scope
        self._cancellations: dict[tuple[str, str], dict[str, Cancellation]] = {}
        self._claims: dict[tuple[str, str], dict[str, ClaimRecord]] = {}
        # (tenant, idempotency key, event id) -> the first decision: the Cassandra
        # ledger files a decision under its request the same way, so an event id reused
        # by another tenant or request never answers with this one's decision.
        self._decisions: dict[tuple[str, str, str], Decision] = {}
        # (tenant, response) -> [promoted, seq, reason, detail]
        self._status: dict[tuple[str, str], list] = {}
        self._conversation_owners: dict[str, str] = {}
        self._response_owners: dict[str, str] = {}

    def record_effect(self, effect: RecordedEffect) -> EffectWrite:
        with self._lock:
            by_id = self._effects.setdefault((effect.tenant_id, effect.idempotency_key), {})
            existing = by_id.get(effect.effect_id)
            if existing is None:
                by_id[effect.effect_id] = replace(effect, conflicted=False)
                return EffectWrite.RECORDED
            if None not in (existing.scope, effect.scope) and existing.scope != effect.scope:
                return EffectWrite.FOREIGN
            if existing.output_digest == effect.output_digest:
                return EffectWrite.ALREADY_RECORDED
            by_id[effect.effect_id] = replace(existing, conflicted=True)
            return EffectWrite.CONFLICT

    def effects_for(self, tenant_id: str, idempotency_key: str) -> Sequence[RecordedEffect]:
        with self._lock:
            by_id = self._effects.get((tenant_id, idempotency_key), {})
            return [by_id[k] for k in sorted(by_id)]

    def claim_effect(self, request: ClaimRequest, now_ms: int) -> Answer:
        # The lock plays the conditional write: decide and apply atomically.
        with self._lock:
            request_key = (request.tenant_id, request.idempotency_key)
            by_id = self._claims.setdefault(request_key, {})
            action = claims.decide_claim(by_id.get(request.effect_id), request, now_ms,
                                         cancelled=bool(self._cancellations.get(request_key)))
            if isinstance(action, Answer):
                return action
            by_id[request.effect_id] = action.claim
            return claims.answer_for(action)

    def complete_claim(self, tenant_id: str, idempotency_key: str, effect_id: str, token: str,
                       status: str, output: Item,
                       now_ms: int) -> tuple[CompletionState, ClaimRecord | None]:
        with self._lock:
            by_id = self._claims.get((tenant_id, idempotency_key), {})
            existing = by_id.get(effect_id)
            refused = claims.decide_completion(existing, token, status, output)
            if refused is not None:
                return refused, existing
            assert existing is not None
            by_id[effect_id] = claims.completed(existing, status, output, now_ms)
            return CompletionState.COMPLETED, by_id[effect_id]

    def claims_for(self, tenant_id: str, idempotency_key: str) -> Sequence[ClaimRecord]:
        with self._lock:
            by_id = self._claims.get((tenant_id, idempotency_key), {})
            return [by_id[k] for k in sorted(by_id)]

    def record_cancellation(self, cancellation: Cancellation) -> None:
        with self._lock:
            key = (cancellation.tenant_id, cancellation.idempotency_key)
            by_scope = self._cancellations.setdefault(key, {})
            by_scope.setdefault(cancellation.scope or "", cancellation)

    def cancellations(self, tenant_id: str, idempotency_key: str) -> Sequence[Cancellation]:
        with self._lock:
            by_scope = self._cancellations.get((tenant_id, idempotency_key), {})
            return [by_scope[s] for s in sorted(by_scope)]

    def record_conversation_owner(self, conversation_id: str, tenant_id: str) -> None:
        with self._lock:
            # The last write stands, as for Cassandra's plain INSERT (the contract).
            self._conversation_owners[conversation_id] = tenant_id

    def conversation_owner(self, conversation_id: str) -> str | None:
        with self._lock:
            return self._conversation_owners.get(conversation_id)

    def record_response_owner(self, response_id: str, tenant_id: str) -> None:
        with self._lock:
            self._response_owners[response_id] = tenant_id

    def response_owner(self, response_id: str) -> str | None:
        with self._lock:
            return self._response_owners.get(response_id)

    def record_decision(self, decision: Decision) -> Decision:
        if decision.idempotency_key is None:
            raise ValueError("a decision is filed under its request: idempotency_key is needed")
        key = (decision.tenant_id, decision.idempotency_key, decision.event_id)
        with self._lock:
            return self._decisions.setdefault(key, decision)

    def decision(self, event_id: str, *, tenant_id: str,
                 idempotency_key: str) -> Decision | None:
        with self._lock:
            return self._decisions.get((tenant_id, idempotency_key, event_id))

    def mark_rejected(self, tenant_id: str, response_id: str, reason: str, detail: str,
                      existing_response_id: str | None = None) -> None:
        with self._lock:
            row = self._status.setdefault((tenant_id, response_id),
                                          [False, None, None, "", None])
            row[2], row[3], row[4] = reason, detail, existing_response_id

    def status(self, tenant_id: str, response_id: str) -> ResponseStatus:
        with self._lock:
            promoted, seq, reason, detail, existing = self._status.get(
                (tenant_id, response_id), [False, None, None, "", None]
            )
        return response_status(seq, promoted, reason, detail, response_id, existing)
