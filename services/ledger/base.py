"""The processor's own durable ledger: tool effects, cancellations and decisions.

The checkpoint store (``services/store``) owns promotions. Everything else the
promotion processor must remember across restarts lives here:

* **tool effects** by ``(tenant_id, idempotency_key, effect_id)``: deduplicated on
  first write (Cassandra ``IF NOT EXISTS``); a second record of the same effect with
  a different output digest marks the effect *conflicted* for good;
* **cancellations** by ``(tenant_id, idempotency_key, scope)``: a ``TurnCancelled``
  seen before the completion makes that completion ``CANCELLED``. The scope
  (``schemas.keys.request_scope``: the Conversation, or the tenant's chains together)
  tells apart requests that use one key in several Conversations;
  effects carry theirs too, and a turn's facts are those of its scope (``in_scope``);
* **decisions** by ``event_id`` (stored with the event's request, below): the first
  decision taken for a gateway event.
  A redelivered event re-publishes exactly that decision instead of deciding again
  (the head may have moved meanwhile, and an outcome must never flip);
* **owners**: which tenant promoted a conversation's first turn and which tenant
  promoted a response id, so another tenant's ids give ``TENANT_MISMATCH``;
* **effect claims** by ``(tenant_id, idempotency_key, effect_id)``: claim before
  execute (``ratchet/domain/claims.py`` holds the rules). One conditional write per
  claim, with a lease; an expired lease is taken over only by a condition on the
  previous holder's token and lease; a cancelled request refuses new claims in the
  same conditional write; only the holder's token records the outcome;
* **response status** by ``(tenant_id, response_id)``: the latest rejection of a
  response id, what ``GET /v1/responses/{id}/status`` answers when the store holds
  no checkpoint of it (a promotion is the store's: it always wins over a rejection,
  e.g. of a redelivery rejected as DUPLICATE). Rows written before issue 15 may
  also say ``promoted``; they are read as such.

Effects, claims, the cancellation and the decisions of one logical request (tenant,
idempotency key) live together (Cassandra: one partition of ``request_facts``), so
``turn_facts`` reads them in one query. Both backends (``memory.py``,
``cassandra.py``) have the same semantics and pass the same tests
(``tests/contract/test_ledger_contract.py``). Methods are synchronous: the processor calls them from a worker thread.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from ratchet.domain.claims import Answer, ClaimRecord, ClaimRequest, CompletionState
from ratchet.domain.promotion import RecordedEffect
from schemas.errors import Unavailable
from schemas.models import Item

__all__ = [
    "Cancellation",
    "in_scope",
    "Decision",
    "EffectWrite",
    "Ledger",
    "LedgerUnavailable",
    "ResponseState",
    "ResponseStatus",
    "TurnFacts",
    "response_status",
]


class LedgerUnavailable(Unavailable):
    """The ledger's database could not be reached or timed out; retrying may help."""

    dependency = "the effect ledger (Cassandra)"


class EffectWrite(StrEnum):
    """What recording one tool effect did."""

    RECORDED = "recorded"  # first time this effect_id was seen
    ALREADY_RECORDED = "already_recorded"  # same effect_id, same output digest: a redelivery
    CONFLICT = "conflict"  # same effect_id, different output digest
    # same effect_id recorded by the request of its key in another scope (another
    # Conversation, or in chain mode): nothing written, the first record stands unchanged
    FOREIGN = "foreign"


@dataclass(frozen=True)
class Cancellation:
    tenant_id: str
    idempotency_key: str
    response_id: str
    cancelled_at: int
    # The request scope it cancels (``schemas.keys.request_scope``); None: recorded
    # before scopes, it cancels every request of its key.
    scope: str | None = None


def in_scope(fact_scope: str | None, scope: str | None) -> bool:
    """A fact recorded in ``fact_scope`` is a fact of the request in ``scope``: the same
    scope, or either unknown (a fact recorded before scopes; a caller that asks for
    every fact of the key, e.g. a continued chain turn without its root)."""
    return scope is None or fact_scope is None or fact_scope == scope


@dataclass(frozen=True)
class Decision:
    """The first decision taken for one gateway event (replayed on redelivery).

    ``outcome`` is ``promoted`` or ``rejected``; for ``promoted`` the store holds the
    details, so only rejections are normally recorded here.
    """

    event_id: str
    tenant_id: str
    response_id: str
    outcome: str
    reason: str | None
    detail: str
    seq: int | None  # head seq the rejection refers to (CONFLICT, OUT_OF_ORDER, DUPLICATE)
    decided_at: int
    existing_response_id: str | None = None
    # The event's logical request: decisions are stored with the request's other facts
    # (its effects and cancellation), so all of them are read together.
    idempotency_key: str | None = None


@dataclass(frozen=True)
class TurnFacts:
    """What the ledger knows about one ``TurnCompleted`` before it is decided."""

    decision: Decision | None
    effects: tuple[RecordedEffect, ...]
    cancellation: Cancellation | None
    conversation_owner: str | None
    claims: tuple[ClaimRecord, ...] = ()
    # Set by the processor (``RequestFacts.read``), never by the ledger: the damage that
    # hides whether ``cancellation`` came after the request's promotion (then it would
    # change nothing); the turn is ``CORRUPT``, neither promoted nor ``CANCELLED``.
    cancellation_unsettled: str | None = None


class ResponseState(StrEnum):
    PROMOTED = "promoted"
    REJECTED = "rejected"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class ResponseStatus:
    """Answer of ``GET /v1/responses/{id}/status``."""

    response_id: str
    status: ResponseState
    reason: str | None = None
    seq: int | None = None
    detail: str = ""
    # DUPLICATE: the response the request was promoted as.
    existing_response_id: str | None = None


class Ledger(abc.ABC):
    """Storage interface; see the module docstring for the semantics."""

    # -- tool effects -------------------------------------------------------------
    @abc.abstractmethod
    def record_effect(self, effect: RecordedEffect) -> EffectWrite:
        """Record ``effect`` once; a different output digest later marks it conflicted
        (the same scope: a record of another scope is ``FOREIGN`` and changes nothing)."""

    @abc.abstractmethod
    def effects_for(self, tenant_id: str, idempotency_key: str) -> Sequence[RecordedEffect]:
        """Every effect recorded under one key (every scope), ordered by effect_id."""

    # -- effect claims (claim before execute) -----------------------------------------
    @abc.abstractmethod
    def claim_effect(self, request: ClaimRequest, now_ms: int) -> Answer:
        """Claim one effect (``claims.decide_claim``) with ONE conditional write; a lost
        race re-decides from the state that won; an unknown outcome is resolved by a
        linearizable read, never guessed."""

    @abc.abstractmethod
    def complete_claim(self, tenant_id: str, idempotency_key: str, effect_id: str, token: str,
                       status: str, output: Item,
                       now_ms: int) -> tuple[CompletionState, ClaimRecord | None]:
        """Record the holder's outcome (``claims.decide_completion``); the claim after."""

    def claim(self, tenant_id: str, idempotency_key: str, effect_id: str) -> ClaimRecord | None:
        """One claim of one request (None: no such claim, also for another tenant)."""
        return next((c for c in self.claims_for(tenant_id, idempotency_key)
                     if c.effect_id == effect_id), None)

    @abc.abstractmethod
    def claims_for(self, tenant_id: str, idempotency_key: str) -> Sequence[ClaimRecord]:
        """Every claim of one logical request, ordered by effect_id."""

    # -- cancellations ------------------------------------------------------------
    @abc.abstractmethod
    def record_cancellation(self, cancellation: Cancellation) -> None:
        """Remember that a request was cancelled (idempotent: the first record of its
        scope wins). Effect claims of the key are refused from then on, in every scope
        (the claims API knows a request by its key)."""

    @abc.abstractmethod
    def cancellations(self, tenant_id: str, idempotency_key: str) -> Sequence[Cancellation]:
        """Every scope's cancellation recorded under one key."""

    def cancellation(self, tenant_id: str, idempotency_key: str,
                     scope: str | None = None) -> Cancellation | None:
        """The cancellation of the request of ``scope`` (``in_scope``; None: of any)."""
        return next((c for c in self.cancellations(tenant_id, idempotency_key)
                     if in_scope(c.scope, scope)), None)

    # -- ownership (tenant checks) ---------------------------------------------------
    @abc.abstractmethod
    def record_conversation_owner(self, conversation_id: str, tenant_id: str) -> None:
        """Remember the tenant that promoted a conversation's first turn (idempotent;
        a plain write: the last tenant written stands, on every backend).

        A plain write is enough: every event of a conversation id is on one Kafka
        partition and handled by one lane at a time, so two tenants never race here.
        """

    @abc.abstractmethod
    def conversation_owner(self, conversation_id: str) -> str | None: ...

    @abc.abstractmethod
    def record_response_owner(self, response_id: str, tenant_id: str) -> None:
        """Remember which tenant promoted a chain's response id (idempotent; the last
        tenant written stands: response ids are per tenant, so a reader checks the
        checkpoints, ``StoreAnswers.chain_owner`` in streams/store_answers.py). Asked only
        when a chain turn's parent is missing (``TENANT_MISMATCH`` for another tenant's
        parent); a Conversation's responses are never a chain's parent (they live in
        the Conversation's partition), so they are not recorded."""

    @abc.abstractmethod
    def response_owner(self, response_id: str) -> str | None: ...

    # -- round-trip savers used by the processor ---------------------------------------
    def turn_facts(self, *, event_id: str, tenant_id: str, idempotency_key: str,
                   conversation_id: str | None, scope: str | None = None) -> TurnFacts:
        """Everything the processor reads before deciding on a turn (backends may fan
        the reads out in parallel: one round trip instead of four): the facts of the
        request of ``scope`` (``in_scope``; None: every fact of the key)."""
        return TurnFacts(
            decision=self.decision(event_id, tenant_id=tenant_id,
                                   idempotency_key=idempotency_key),
            effects=tuple(e for e in self.effects_for(tenant_id, idempotency_key)
                          if in_scope(e.scope, scope)),
            cancellation=self.cancellation(tenant_id, idempotency_key, scope),
            conversation_owner=None if conversation_id is None
            else self.conversation_owner(conversation_id),
            claims=tuple(self.claims_for(tenant_id, idempotency_key)),
        )

    def start_recording_owners(self, *, tenant_id: str, response_id: str | None,
                               conversation_id: str | None) -> Callable[[], None]:
        """Start writing the owner of a response id (a chain's turn: only a chain names
        a parent, see ``response_owner``) and of a Conversation; the returned waiter
        returns once they are durable (``LedgerUnavailable`` otherwise). Nothing to
        write (both None): no request. The processor writes a chain turn's response
        owner beside its promotion batch (it may stay though the batch is refused: a
        reader of it checks the checkpoint, ``StoreAnswers.chain_owner``) and a
        Conversation's owner only after its first turn's batch applied."""
        if response_id is not None:
            self.record_response_owner(response_id, tenant_id)
        if conversation_id is not None:
            self.record_conversation_owner(conversation_id, tenant_id)
        return nothing_to_wait

    async def conversation_owner_async(self, conversation_id: str) -> str | None:
        """``conversation_owner`` awaited; a backend with async I/O overrides it."""
        return await asyncio.to_thread(self.conversation_owner, conversation_id)

    async def record_owners_async(self, *, tenant_id: str, response_id: str | None,
                                  conversation_id: str | None) -> None:
        """``start_recording_owners`` and its waiter, awaited."""
        await asyncio.to_thread(lambda: self.start_recording_owners(
            tenant_id=tenant_id, response_id=response_id, conversation_id=conversation_id)())

    # -- decisions and status -------------------------------------------------------
    @abc.abstractmethod
    def record_decision(self, decision: Decision) -> Decision:
        """Store the decision for its event unless one exists; return the one that holds."""

    @abc.abstractmethod
    def decision(self, event_id: str, *, tenant_id: str,
                 idempotency_key: str) -> Decision | None:
        """The decision held for the event (of that tenant's logical request)."""

    @abc.abstractmethod
    def mark_rejected(self, tenant_id: str, response_id: str, reason: str, detail: str,
                      existing_response_id: str | None = None) -> None:
        """Record the latest rejection of ``response_id`` (never hides a promotion);
        ``existing_response_id``: the original response a DUPLICATE names."""

    @abc.abstractmethod
    def status(self, tenant_id: str, response_id: str) -> ResponseStatus:
        """Promoted, rejected or unknown; another tenant's response id is unknown."""

    async def status_async(self, tenant_id: str, response_id: str) -> ResponseStatus:
        """``status`` awaited; a backend with async I/O overrides it."""
        return await asyncio.to_thread(self.status, tenant_id, response_id)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections (backends that hold none need not override)."""


def nothing_to_wait() -> None:
    """The waiter of a write that sent nothing."""
    return None


def response_status(row_promoted_seq: int | None, row_promoted: bool, reason: str | None,
                    detail: str, response_id: str,
                    existing_response_id: str | None = None) -> ResponseStatus:
    """Fold the stored columns into one answer: a promotion hides any rejection."""
    if row_promoted:
        return ResponseStatus(response_id, ResponseState.PROMOTED, None, row_promoted_seq)
    if reason is not None:
        return ResponseStatus(response_id, ResponseState.REJECTED, reason, None, detail,
                              existing_response_id)
    return ResponseStatus(response_id, ResponseState.UNKNOWN)
