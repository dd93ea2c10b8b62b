"""The checkpoint store interface: frozen records in, typed outcomes out.

Expected results (a lost race, a duplicate, a missing parent, a turn too large) are
*outcomes*, returned. Broken infrastructure is an *exception*: ``StoreUnavailable``,
which says whether retrying the same call can help. A malformed request (a bug in the
caller) is ``InvalidPromotion``.

Promotion protocol, shared by every backend (``CheckpointStore.promote``):

1. refuse a turn above ``max_turn_bytes`` (``TooLarge``) before any I/O;
2. fast path: if the plan can be computed without reading (a new Conversation, a
   chain root, or a hint: the head / parent checkpoint the caller or this store last
   saw), write it at once (step 5). The write's conditions are exactly the facts the
   plan rests on (head cells, no idempotency record, no checkpoint of the response
   id, the parent's checkpoint as hinted), so it applies only where ``plan_promotion``
   on a fresh view would have returned that same plan: a wrong hint can only make it
   refused, never wrong;
3. read the partition's view at linearizable consistency: head, the idempotency
   record of the key, an existing checkpoint of the response id, the parent;
4. plan with the pure ``ratchet.domain.plan.plan_promotion``: an outcome (``Duplicate``, ``KeyReused``,
   ``Conflict`` ...) ends the call; otherwise a ``Plan`` (seq, parent, item seqs);
5. write items + checkpoint + idempotency record + head advance in ONE atomic,
   conditional write that only applies if the plan's facts are still true;
6. applied: ``Promoted``. Not applied: a stale hint or someone else moved first, go
   back to 3 (after a lost race the next decision is an outcome, since every state
   change is monotonic).

Before its first write (step 2 or 5) a promotion holds the response id's claim
(``ResponseClaim``): one linearizable insert per (tenant, response id), first request
wins, never released. A claim held by another request ends the call with
``ResponseClaimed`` once the view shows no ``Duplicate`` / ``KeyReused`` / ``Conflict``
outcome (those are answered first); this is what binds a response id once per tenant
across partitions. A claim whose batch is then refused stays with its request: a later
turn of the same request (same key, digest, partition) finds it and goes on.

A request's facts (kept by the ledger) are asserted, not read: every fact writer
sets the request's facts mark (``mark_request_facts``) and the write of step 5 also
requires the mark the caller decided with; a different mark ends the call with
``FactsChanged`` before any write.

A chain's first response also claims its request, (tenant, idempotency key), the same
way (``_request_held``): its retries under other response ids are other partitions.

A response located by its claim whose turn row is not there was either never promoted
(refused, in flight) or promoted and its row lost to storage damage (rows never expire):
``turn_lost`` tells them apart by the claim's request's idempotency record, and a lost
one reads ``MISSING_HISTORY`` (``TurnLost`` from ``read_promoted``), never ``NOT_FOUND``.

Backends implement ``_claim``, ``_claim_request``, ``_request_holder``, ``_read_view``,
``_write``, ``_load_partition``, ``_locate``, ``_located_checkpoint``, the lost-row reads
``_claim_of`` / ``_promoted_response`` / ``_turn_row_serial``, and the facts mark's
``_set_facts_mark`` / ``request_facts_mark``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ratchet.domain.history import (
    CheckpointRecord,
    Head,
    HistoryFailure,
    HistoryFailureReason,
    PartitionSnapshot,
    PromotionMode,
    VerifiedHistory,
    backs,
    verify_conversation_history,
    verify_history,
)
from ratchet.domain.plan import (
    CorruptPartition,
    Duplicate,
    FactsChanged,
    HeadDamaged,
    IdempotencyRecord,
    KeyReused,
    LineageChanged,
    Plan,
    Promoted,
    PromotionOutcome,
    PromotionRequest,
    PromotionView,
    RequestHeld,
    ResponseClaim,
    ResponseClaimed,
    TooLarge,
    build_checkpoint,
    plan_from_hints,
    plan_promotion,
    starts_chain,
)
from schemas.models import Certification
from services.store.errors import InvalidPromotion, StoreError, StoreUnavailable, TurnLost
from services.store.hints import _Hints
from services.store.history_answers import (
    _confirmed,
    _exactly_one,
    _missing_turn,
    _needs_confirming,
    lost_turn,
    no_such_response,
)
from services.store.promotion_checks import (
    ANY_LINEAGE,
    _check_not_behind,
    _extends,
    _parent_changed,
)
from services.store.request_checks import DEFAULT_MAX_TURN_BYTES, turn_size, validate_request

__all__ = [
    "ANY_LINEAGE",
    "CheckpointStore",
    "CorruptPartition",  # raised by backends too; defined with the plan it breaks
    "HeadDamaged",
    "DEFAULT_MAX_TURN_BYTES",
    "InvalidPromotion",
    "StoreError",
    "StoreOptions",
    "StoreUnavailable",
    "TurnLost",
    "turn_size",
    "validate_request",
]

# How many read-decide-write rounds a promotion may lose before giving up; each lost
# round means another promoter moved the partition, so the next decision is final.
MAX_PROMOTION_ROUNDS = 4


def _utc_now() -> datetime:
    return datetime.now(UTC)


# --- the interface --------------------------------------------------------------------


@dataclass
class StoreOptions:
    """Knobs shared by every backend.

    ``hint_capacity``: how many heads, checkpoints and response locations the store
    remembers (each, LRU) to plan a promotion without reading first and to read a
    response's history without the location lookup. Hints are never trusted: every
    write re-checks them as conditions and every read verifies the partition. 0
    turns them off (every promotion with a head or a parent then reads first).
    """

    logical_retention_s: int = 0
    max_turn_bytes: int = DEFAULT_MAX_TURN_BYTES
    clock: Callable[[], datetime] = field(default=_utc_now)
    hint_capacity: int = 4096


class CheckpointStore(ABC):
    """Atomic promotion of turns and verified reads of histories.

    Thread-safe. Every method either returns a typed result or raises
    ``StoreUnavailable`` / ``InvalidPromotion``.
    """

    def __init__(self, options: StoreOptions | None = None) -> None:
        self.options = options or StoreOptions()
        capacity = self.options.hint_capacity
        # (tenant, partition_key) -> Head; (tenant, partition_key, response_id) ->
        # CheckpointRecord; (tenant, response_id) -> partition_key.
        self._head_hints = _Hints(capacity)
        self._checkpoint_hints = _Hints(capacity)
        self._location_hints = _Hints(capacity)

    # -- public API ---------------------------------------------------------------------

    def promote(
        self,
        request: PromotionRequest,
        *,
        head_hint: Head | None = None,
        parent_hint: CheckpointRecord | None = None,
        extends: str | None | object = ANY_LINEAGE,
        claimed: ResponseClaim | None = None,
        facts_mark: str | None = None,
    ) -> PromotionOutcome:
        """Persist the turn atomically, or say why not (see the module docstring).

        ``head_hint`` (Conversation mode: the head the caller last saw) and
        ``parent_hint`` (chain mode: the parent's checkpoint the caller read) let the
        store write without reading first. They are optional and never trusted: a
        wrong hint costs one refused write, never a wrong outcome. Without them the
        store uses what it saw itself (its own promotions and verified reads).

        ``extends``: the response id whose lineage the caller validated the turn
        against (None: the turn starts a lineage). A plan that would extend any other
        response is not written; ``LineageChanged`` says what it would have extended.
        Because a plan's parent is also a condition of its write, a promotion
        returned with ``extends`` given really extends that response.

        ``claimed``: the holder of the response id's claim, as the waiter of
        ``start_claiming`` returned it (the caller overlapped the claim with its own
        reads); without it the store takes the claim itself before its first write.

        ``facts_mark``: the request's facts mark the caller decided with (None: no
        fact of the request recorded, what a caller that read no facts asserts). The
        write applies only if the mark is still that; otherwise ``FactsChanged`` with
        the mark found, and nothing is written (see ``mark_request_facts``).
        """
        validate_request(request)
        size = turn_size(request)
        if size > self.options.max_turn_bytes:
            return TooLarge(size, self.options.max_turn_bytes)
        mine = ResponseClaim.of(request)
        holder = claimed

        def claim_is_mine() -> bool:
            nonlocal holder
            if holder is None:
                holder = self._claim(mine)
            return holder == mine

        request_held = functools.cache(lambda: self._request_held(request))
        plan = self._plan_from_hints(request, head_hint, parent_hint)
        if plan is not None and _extends(plan, extends) and claim_is_mine():
            held = request_held()
            if held is not None:
                return held
            promoted = self._attempt(request, plan, facts_mark)
            if promoted is not None:
                return promoted
        known_parent = parent_hint if parent_hint is not None else self._hinted_parent(request)
        known_head = self._hinted_head(request)  # durable: learned, never a caller's guess
        guess = head_hint if head_hint is not None else known_head
        for _ in range(MAX_PROMOTION_ROUNDS):
            view = self._read_view(request, None if guess is None else guess.response_id)
            _check_not_behind(request, known_head, view.head)
            guess = known_head = view.head
            if extends is not ANY_LINEAGE and _parent_changed(request, known_parent, view):
                assert view.parent is not None
                return LineageChanged(view.parent.response_id)
            self._learn_view(request, view)
            decision = plan_promotion(request, view)
            if not isinstance(decision, Plan):
                return decision
            if view.facts_mark != facts_mark:
                return FactsChanged(view.facts_mark)
            if not _extends(decision, extends):
                return LineageChanged(decision.parent_response_id)
            if not claim_is_mine():
                assert holder is not None
                return ResponseClaimed(holder)
            held = request_held()
            if held is not None:
                return held
            promoted = self._attempt(request, decision, facts_mark)
            if promoted is not None:
                return promoted
        raise StoreUnavailable(
            f"promotion of {request.response_id} lost {MAX_PROMOTION_ROUNDS} rounds in a row",
            retryable=True,
            operation="promote",
        )

    def judge(self, request: PromotionRequest,
              head_guess: str | None = None) -> PromotionOutcome | Plan:
        """What ``promote`` would answer ``request`` now, in its order, with nothing
        written: the size rule, then the view read at SERIAL (one round trip) and the
        promotion rules (the request standing promoted, the response id in this
        partition, the head's damage, ordering). A ``Plan`` when the request could be
        written after all (the caller validates the turn against its lineage first).
        For a turn whose lineage was not read because it cannot be written where it was
        sent (a Conversation turn that expects another head than the head).
        ``head_guess``: the response id of the head the caller read, so that its row
        comes with the view (one round trip); any guess is checked, none trusted."""
        validate_request(request)
        size = turn_size(request)
        if size > self.options.max_turn_bytes:
            return TooLarge(size, self.options.max_turn_bytes)
        view = self._read_view(request, head_guess)
        _check_not_behind(request, self._hinted_head(request), view.head)
        return plan_promotion(request, view)

    async def promote_from_hints_async(
        self,
        request: PromotionRequest,
        *,
        head_hint: Head | None = None,
        parent_hint: CheckpointRecord | None = None,
        extends: str | None | object = ANY_LINEAGE,
        facts_mark: str | None = None,
    ) -> Promoted | None:
        """``promote``'s first step, awaited: the one conditional write of the plan the
        hints give, for a caller that holds the response id's claim already (it must:
        this does not take it). ``Promoted``, or None when that step did not promote (no
        plan from the hints, a plan that does not extend ``extends``, a turn above the
        size limit, a refused write or one whose outcome is unknown): the caller then
        calls ``promote``, which reads and decides (a write that did land is found
        there as this request's own promotion)."""
        validate_request(request)
        if turn_size(request) > self.options.max_turn_bytes or starts_chain(request):
            return None  # a chain's first response also claims its request: ``promote``
        plan = self._plan_from_hints(request, head_hint, parent_hint)
        if plan is None or not _extends(plan, extends):
            return None
        checkpoint = self._checkpoint_of(request, plan)
        if not await self._write_async(request, plan, checkpoint, facts_mark):
            return None
        return self._promoted(request, plan, checkpoint)

    def read_history(
        self,
        tenant_id: str,
        *,
        response_id: str | None = None,
        conversation_id: str | None = None,
        now: datetime | None = None,
        partition_key: str | None = None,
    ) -> VerifiedHistory | HistoryFailure:
        """The complete verified history of a response or a Conversation, or why not.

        Give exactly one of ``response_id`` / ``conversation_id``. Another tenant's
        id is ``NOT_FOUND``, exactly like an unknown id. With ``response_id``, an
        optional ``partition_key`` (the Conversation id or chain root the caller
        knows) saves the location lookup; it is a hint: if the response is not in
        that partition, the location index is asked as without it.

        A failure that says the stored rows are wrong (``CONFIRMED_FAILURES``) is
        decided from two reads: the read is made once more, and its answer stands
        (``_confirmed``).
        """
        _exactly_one(response_id, conversation_id)
        now = now or self.options.clock()
        first = self._read_history_once(tenant_id, response_id, conversation_id, now,
                                        partition_key)
        if not _needs_confirming(first):
            return first
        again = self._read_history_once(tenant_id, response_id, conversation_id, now,
                                        partition_key)
        return _confirmed(tenant_id, response_id or conversation_id, first, again)

    def _read_history_once(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        if conversation_id is not None:
            snapshot = self._load_conversation(tenant_id, conversation_id)
            return self._conversation_result(tenant_id, conversation_id, snapshot, now)
        assert response_id is not None
        hinted = self._hinted_partition(tenant_id, response_id, partition_key)
        if hinted is not None:
            snapshot = self._load_lineage(tenant_id, hinted, response_id)
            result = self._response_result(tenant_id, hinted, response_id, snapshot, now)
            if result is not None:
                return result
        located = self._locate(tenant_id, response_id)
        if located is None:
            return no_such_response()
        if located != hinted:
            snapshot = self._load_lineage(tenant_id, located, response_id)
            result = self._response_result(tenant_id, located, response_id, snapshot, now)
            if result is not None:
                return result
        # Claimed there, its row not there: promoted (a lost row) or never (``turn_lost``).
        if self.turn_lost(tenant_id, response_id, located):
            return _missing_turn(tenant_id, located, response_id)
        return no_such_response()

    async def read_history_async(
        self,
        tenant_id: str,
        *,
        response_id: str | None = None,
        conversation_id: str | None = None,
        now: datetime | None = None,
        partition_key: str | None = None,
    ) -> VerifiedHistory | HistoryFailure:
        """``read_history`` for an event loop: the same reads, awaited
        (``_load_partition_async``, ``_locate_async``), then the same verification and
        the same confirmation of a failure."""
        _exactly_one(response_id, conversation_id)
        now = now or self.options.clock()
        first = await self._read_history_once_async(tenant_id, response_id, conversation_id,
                                                    now, partition_key)
        if not _needs_confirming(first):
            return first
        again = await self._read_history_once_async(tenant_id, response_id, conversation_id,
                                                    now, partition_key)
        return _confirmed(tenant_id, response_id or conversation_id, first, again)

    async def _read_history_once_async(
        self,
        tenant_id: str,
        response_id: str | None,
        conversation_id: str | None,
        now: datetime,
        partition_key: str | None,
    ) -> VerifiedHistory | HistoryFailure:
        if conversation_id is not None:
            snapshot = await self._load_conversation_async(tenant_id, conversation_id)
            return self._conversation_result(tenant_id, conversation_id, snapshot, now)
        assert response_id is not None
        hinted = self._hinted_partition(tenant_id, response_id, partition_key)
        if hinted is not None:
            snapshot = await self._load_lineage_async(tenant_id, hinted, response_id)
            result = self._response_result(tenant_id, hinted, response_id, snapshot, now)
            if result is not None:
                return result
        located = await self._locate_async(tenant_id, response_id)
        if located is None:
            return no_such_response()
        if located != hinted:
            snapshot = await self._load_lineage_async(tenant_id, located, response_id)
            result = self._response_result(tenant_id, located, response_id, snapshot, now)
            if result is not None:
                return result
        if await self.turn_lost_async(tenant_id, response_id, located):
            return _missing_turn(tenant_id, located, response_id)
        return no_such_response()

    def _hinted_partition(
        self, tenant_id: str, response_id: str, partition_key: str | None
    ) -> str | None:
        hinted = partition_key or self._location_hints.get((tenant_id, response_id))
        return hinted if isinstance(hinted, str) else None

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
        self._learn_history(tenant_id, conversation_id, result)
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
        self._location_hints.put((tenant_id, response_id), partition_key)
        self._learn_history(tenant_id, partition_key, result)
        return result

    @abstractmethod
    def head(self, tenant_id: str, partition_key: str) -> Head | None:
        """The Conversation's head, or None if nothing was promoted (or chain mode)."""

    @abstractmethod
    def read_head(self, tenant_id: str, partition_key: str) -> Head | None:
        """``head`` at read consistency (not linearizable): what a history reader
        needs, one row, never a Paxos round."""

    async def read_head_async(self, tenant_id: str, partition_key: str) -> Head | None:
        """``read_head`` for an event loop; a backend with async I/O overrides it so a
        Conversation cache hit never takes the thread-pool hop."""
        return await asyncio.to_thread(self.read_head, tenant_id, partition_key)

    def read_turn(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """ONE turn row (its checkpoint and items, UNverified, with the partition's
        head): what extending an already verified history reads. None if absent.
        The caller verifies it (``ratchet.domain.history.verify_extension``)."""
        return self._load_turn(tenant_id, partition_key, response_id)

    def locate(self, tenant_id: str, response_id: str) -> str | None:
        """The partition a response id was promoted under (a hint, verified by reads)."""
        return self._locate(tenant_id, response_id)

    def turn_lost(self, tenant_id: str, response_id: str,
                  partition_key: str | None = None) -> bool:
        """True when the response was promoted and its turn row is gone (storage
        damage: rows never expire, docs/store.md). Only for a response whose row a read
        did not find where its claim says (``partition_key``, when the caller located
        it): never on the common read path.

        Promoted: the idempotency record of the request holding the response id's claim,
        in the claimed partition, names this response id (the promotion batch writes
        the record with the turn row, atomically). A claim whose batch was refused or is
        in flight, or whose request promoted another response id, was not promoted:
        False, as for an id claimed nowhere. The row is then looked for once more at
        linearizable consistency (``_turn_row_serial``), which completes a promotion
        still committing: a row that is only late is not lost."""
        claim = self._claim_of(tenant_id, response_id)
        if claim is None or (partition_key is not None and claim.partition_key != partition_key):
            return False
        promoted = self._promoted_response(tenant_id, claim.partition_key,
                                           claim.idempotency_key)
        if promoted != response_id:
            return False
        return not self._turn_row_serial(tenant_id, claim.partition_key, response_id)

    async def turn_lost_async(self, tenant_id: str, response_id: str,
                              partition_key: str | None = None) -> bool:
        """``turn_lost`` for an event loop (a rare path: the thread pool's hop is fine)."""
        return await asyncio.to_thread(self.turn_lost, tenant_id, response_id, partition_key)

    def read_promoted(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        """``read_checkpoint`` for an answer that must tell a promoted response from an
        unknown one (the status endpoint): raises ``TurnLost`` where ``read_checkpoint``
        finds no row but the response was promoted (``turn_lost``), else its answer."""
        located, checkpoint = self._located_checkpoint(tenant_id, response_id)
        if checkpoint is None and located is not None and self.turn_lost(
            tenant_id, response_id, located
        ):
            raise TurnLost(lost_turn(tenant_id, located, response_id))
        return checkpoint

    def read_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        """The promoted checkpoint of a response, or None (also for another tenant);
        raises ``CorruptPartition`` for a row that cannot be decoded or is filed under
        another response id (the status endpoint answers it, never as "unknown")."""
        return self._located_checkpoint(tenant_id, response_id)[1]

    async def read_turn_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """``read_turn`` for an event loop (a backend with async I/O overrides it)."""
        return await asyncio.to_thread(self.read_turn, tenant_id, partition_key, response_id)

    async def locate_async(self, tenant_id: str, response_id: str) -> str | None:
        """``locate`` for an event loop."""
        return await self._locate_async(tenant_id, response_id)

    def get_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        """The promoted checkpoint of a response, or None (also for another tenant, and
        for a row that cannot be decoded: the processor's lookups, which only ask
        whether a usable promotion is there, treat a damaged one as absent)."""
        try:
            return self.read_checkpoint(tenant_id, response_id)
        except CorruptPartition:
            return None

    @abstractmethod
    def _located_checkpoint(
        self, tenant_id: str, response_id: str
    ) -> tuple[str | None, CheckpointRecord | None]:
        """The partition the response id's claim names (None: claimed nowhere) and the
        checkpoint row there (``read_checkpoint``'s answer, its errors included)."""

    def _request_held(
        self, request: PromotionRequest
    ) -> Duplicate | KeyReused | RequestHeld | None:
        """None when the request may be written. A chain's first response claims its
        request (tenant, idempotency key) before its first write, as it claims its
        response id: a retry under another response id would land in another partition,
        where no idempotency record can see the first attempt. Held by another response
        id: that response's own partition says whether it stands promoted (``Duplicate``
        or ``KeyReused``, as a partition's own record would), else ``RequestHeld``."""
        if not starts_chain(request):
            return None
        mine = ResponseClaim.of(request)
        holder = self._claim_request(mine)
        if holder.response_id == request.response_id:
            return None
        original = self._promoted_at(request, holder)
        if original is None:
            return RequestHeld(holder)
        if original.request_digest == request.request_digest:
            return Duplicate(original)
        return KeyReused(original.request_digest, original.response_id)

    def hold_request(self, tenant_id: str, idempotency_key: str,
                     response_id: str) -> ResponseClaim:
        """Claim the request of a chain's first response ``response_id`` (its partition
        key) for it unless another first response holds it; returns the holder. Asked
        for a fact of the request, not a turn (the processor, before orphaning a late
        effect of a cancelled request): the claim's ``request_digest`` is empty, and
        only its ``response_id`` is ever compared (``_request_held``). Held by
        ``response_id``, no other attempt of the request can ever be promoted."""
        return self._claim_request(ResponseClaim(tenant_id, response_id, response_id,
                                                 idempotency_key, ""))

    @abstractmethod
    def _request_holder(self, tenant_id: str, idempotency_key: str) -> ResponseClaim | None:
        """The holder of the request's claim (linearizable read), None if unclaimed."""

    @abstractmethod
    def _claim_request(self, claim: ResponseClaim) -> ResponseClaim:
        """Insert ``claim`` as the holder of its (tenant, idempotency key) unless the
        key is held already (linearizable, first request wins, never released);
        returns the holder (``claim`` itself when it is ours)."""

    def promoted_request(self, request: PromotionRequest) -> CheckpointRecord | None:
        """The checkpoint the request (its idempotency key) stands promoted with, by
        whichever attempt or response id, or None: its partition's idempotency record,
        and for a chain's first response the partition of the response holding its
        request claim (a retry under another response id is another partition). Read at
        linearizable consistency, like a promotion's view. Asked on the rare paths that
        must know whether the request stands promoted (a cancellation that came after
        its promotion; effects a rejected attempt must not orphan)."""
        validate_request(request)
        original = self._read_view(request).original
        if original is None and starts_chain(request):
            holder = self._request_holder(request.tenant_id, request.idempotency_key)
            if holder is not None and holder.partition_key != request.partition_key:
                original = self._promoted_at(request, holder)
        return original

    def promoted_key(self, tenant_id: str, partition_key: str, idempotency_key: str,
                     response_id: str, *, first_of_chain: bool) -> CheckpointRecord | None:
        """``promoted_request`` for a fact of a request that knows only the request's
        key and one attempt's partition and response id (a tool effect): the view's
        idempotency record there, and, for an attempt that is a chain's first response
        (``first_of_chain``: its partition is its own response id, in chain mode), the
        request claim's holder's: its request may stand promoted in another attempt's
        partition."""
        request = PromotionRequest(
            tenant_id=tenant_id, partition_key=partition_key, mode=PromotionMode.CHAIN,
            response_id=response_id, idempotency_key=idempotency_key, request_digest="",
            items=(), certification=Certification.LOGICAL_ONLY)
        validate_request(request)
        original = self._read_view(request).original
        if original is None and first_of_chain:
            holder = self._request_holder(tenant_id, idempotency_key)
            if holder is not None and holder.partition_key != partition_key:
                original = self._promoted_at(request, holder)
        return original

    def _promoted_at(self, request: PromotionRequest,
                     holder: ResponseClaim) -> CheckpointRecord | None:
        """What the partition of ``holder`` (another first response of a chain) says
        ``request``'s key promoted: its view's idempotency record, at SERIAL."""
        return self._read_view(dataclasses.replace(
            request, partition_key=holder.partition_key, response_id=holder.response_id
        )).original

    # -- request facts marks ------------------------------------------------------------

    def mark_request_facts(self, tenant_id: str, partition_key: str, idempotency_key: str) -> str:
        """Say that a fact of this request (a tool effect, an effect claim or its
        outcome, a cancellation, a rejection decision) was recorded, AFTER recording
        it; returns the new mark. A plain write in the history partition: a promotion
        decided without that fact asserts the old mark and is refused
        (``FactsChanged``), so a promotion never misses a fact recorded before it.
        One recorded after the promotion's write is ordered after the promotion."""
        mark = uuid.uuid4().hex
        self._set_facts_mark(tenant_id, partition_key, idempotency_key, mark)
        return mark

    def mark_claim(self, tenant_id: str, partition_key: str, idempotency_key: str, *,
                   first_of_chain: bool = False) -> IdempotencyRecord | None:
        """``mark_request_facts`` around an effect claim, which must not let its holder
        run the tool once the request stands promoted: nothing would ever use the run,
        and a holder that vanished would leave it published nowhere. Returns the record
        of the promotion the request stands with (the claims API then answers
        ``PROMOTED``), else None once the mark is written.

        The mark is conditional (no response bound to the key in that partition), so it
        and a promotion batch, which asserts the mark its decision saw, are ordered by
        one Paxos round: a batch before it promoted (we learn it here), one after it is
        refused and decided again with the claim among the facts.

        ``first_of_chain``: the claim is an attempt of a chain's first response (its
        partition is its own response id). Its request may stand promoted under another
        response id, in the partition of the response holding the request
        (``hold_request``): that partition is marked the same way. Only then: the same
        key in another chain or a Conversation is another request, whose holder this is
        not. A claim made before the holder held the request is seen by the holder's
        own read of the request's facts after its batch (the processor's
        ``_on_turn``)."""
        promoted = self._mark_unless_promoted(tenant_id, partition_key, idempotency_key,
                                              uuid.uuid4().hex)
        if promoted is not None or not first_of_chain:
            return promoted
        holder = self._request_holder(tenant_id, idempotency_key)
        if holder is None or holder.partition_key == partition_key:
            return None
        return self._mark_unless_promoted(tenant_id, holder.partition_key, idempotency_key,
                                          uuid.uuid4().hex)

    @abstractmethod
    def _mark_unless_promoted(self, tenant_id: str, partition_key: str, idempotency_key: str,
                              mark: str) -> IdempotencyRecord | None:
        """Write the mark unless a response is bound to the key in the partition
        (linearizable with the promotion batch); returns that binding, or None when the
        mark was written. An unknown outcome raises ``StoreUnavailable``."""

    @abstractmethod
    def request_facts_mark(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        """The request's facts mark (None: no fact recorded). Read it BEFORE reading
        the facts: a fact recorded after this read changes the mark."""

    @abstractmethod
    def _set_facts_mark(self, tenant_id: str, partition_key: str, idempotency_key: str,
                        mark: str) -> None:
        """Write the mark (plain write, durable at write consistency)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the in-memory backend has nothing to release."""

    # -- hints ----------------------------------------------------------------------------

    def _attempt(self, request: PromotionRequest, plan: Plan,
                 facts_mark: str | None) -> Promoted | None:
        """One conditional write of ``plan``; ``Promoted`` if it applied."""
        checkpoint = self._checkpoint_of(request, plan)
        if not self._write(request, plan, checkpoint, facts_mark):
            return None
        return self._promoted(request, plan, checkpoint)

    def _checkpoint_of(self, request: PromotionRequest, plan: Plan) -> CheckpointRecord:
        return build_checkpoint(
            request, plan, self.options.clock(), self.options.logical_retention_s
        )

    def _promoted(self, request: PromotionRequest, plan: Plan,
                  checkpoint: CheckpointRecord) -> Promoted:
        """The write of ``plan`` applied: remember what it makes true (hints)."""
        key = (request.tenant_id, request.partition_key)
        if plan.new_head is not None:
            self._head_hints.put_head(key, plan.new_head)
        self._checkpoint_hints.put((*key, request.response_id), checkpoint)
        self._location_hints.put((request.tenant_id, request.response_id), request.partition_key)
        return Promoted(checkpoint)

    def _plan_from_hints(self, request: PromotionRequest, head_hint: Head | None,
                         parent_hint: CheckpointRecord | None) -> Plan | None:
        """The plan the caller's hints give, or this store's own where it gave none."""
        return plan_from_hints(
            request,
            head_hint if head_hint is not None else self._hinted_head(request),
            parent_hint if parent_hint is not None else self._hinted_parent(request),
        )

    def _hinted_head(self, request: PromotionRequest) -> Head | None:
        head = self._head_hints.get((request.tenant_id, request.partition_key))
        return head if isinstance(head, Head) else None

    def _hinted_parent(self, request: PromotionRequest) -> CheckpointRecord | None:
        if request.previous_response_id is None:
            return None
        parent = self._checkpoint_hints.get(
            (request.tenant_id, request.partition_key, request.previous_response_id)
        )
        return parent if isinstance(parent, CheckpointRecord) else None

    def _learn_view(self, request: PromotionRequest, view: PromotionView) -> None:
        key = (request.tenant_id, request.partition_key)
        # Only a head its own row backs: the fast path's conditions are the hint's
        # cells, so damaged cells kept as a hint would let the next turn be built on them.
        if view.head is not None and backs(view.head, view.head_backing):
            self._head_hints.put_head(key, view.head)
        if view.parent is not None:
            self._checkpoint_hints.put((*key, view.parent.response_id), view.parent)

    def _learn_history(
        self, tenant_id: str, partition_key: str, result: VerifiedHistory | HistoryFailure
    ) -> None:
        if not isinstance(result, VerifiedHistory):
            return
        checkpoint = result.checkpoint
        self._checkpoint_hints.put((tenant_id, partition_key, checkpoint.response_id), checkpoint)
        if checkpoint.mode is PromotionMode.CONVERSATION and checkpoint.seq == result.head_seq:
            self._head_hints.put_head((tenant_id, partition_key), Head.of(checkpoint))

    # -- backend hooks ------------------------------------------------------------------

    def start_claiming(self, claim: ResponseClaim) -> Callable[[], ResponseClaim]:
        """Start taking the response id's claim ahead of ``promote``; returns the waiter
        that gives the claim's holder (``claim`` itself when it is ours), to pass as
        ``promote(..., claimed=...)``. Lets a caller overlap the claim with its own
        reads. The waiter raises ``StoreUnavailable`` if the outcome stays unknown.
        Taken now, as a backend with async I/O sends it now: a turn that ends up
        rejected binds its response id whether or not the waiter is called (the memory
        store took it only when waited for, so its rejected turns bound nothing: an
        outside review, session 32)."""
        holder = self._claim(claim)
        return lambda: holder

    async def claim_async(self, claim: ResponseClaim) -> ResponseClaim:
        """``start_claiming``'s waiter, awaited: the claim's holder (``claim`` itself
        when it is ours). ``StoreUnavailable`` when the outcome is not known at once (a
        backend with async I/O leaves the settling SERIAL read to ``promote``)."""
        return await asyncio.to_thread(self.start_claiming(claim))

    @abstractmethod
    def _claim(self, claim: ResponseClaim) -> ResponseClaim:
        """Insert ``claim`` unless the response id is claimed already (linearizable,
        first writer wins); return the holder. An unknown outcome is resolved by a
        linearizable read, never guessed (``StoreUnavailable`` if that fails too)."""

    @abstractmethod
    def _read_view(self, request: PromotionRequest,
                   head_guess: str | None = None) -> PromotionView:
        """Read head / idempotency record / existing / parent, linearizably, and for a
        Conversation request the turn row the head names (``head_backing``; a backend
        may read ``head_guess``'s row with the rest, to spare a second read when the
        head names it)."""

    @abstractmethod
    def _write(self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord,
               facts_mark: str | None) -> bool:
        """Atomically write the turn if the plan's facts still hold; True if applied.

        The conditions: no idempotency record for the key, no checkpoint for the
        response id, and (Conversation) the head is exactly ``plan.expected_head``
        (absent if None) or (chain) the checkpoint ``plan.parent`` is still there with
        the same seq, item range and mode; the request's facts mark is ``facts_mark``
        (absent if None). Nothing is written unless all hold. An
        unknown outcome must be resolved before returning (never guessed).
        """

    async def _write_async(self, request: PromotionRequest, plan: Plan,
                           checkpoint: CheckpointRecord, facts_mark: str | None) -> bool:
        """``_write`` awaited; True if applied, False if refused or (a backend with async
        I/O) if the outcome is unknown: the caller then reads (``promote``)."""
        return await asyncio.to_thread(self._write, request, plan, checkpoint, facts_mark)

    @abstractmethod
    def _locate(self, tenant_id: str, response_id: str) -> str | None:
        """The partition key of the response id's claim (verified against it later)."""

    @abstractmethod
    def _claim_of(self, tenant_id: str, response_id: str) -> ResponseClaim | None:
        """The response id's claim (read consistency), or None: claimed nowhere."""

    @abstractmethod
    def _promoted_response(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        """The response id the request's idempotency record in that partition names (read
        consistency); None without a record (none, or only the request's facts mark)."""

    @abstractmethod
    def _turn_row_serial(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        """Whether the response's turn row is in that partition, read linearizably (a
        promotion in flight is completed first); a row that cannot be decoded is there."""

    @abstractmethod
    def _load_turn(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """One turn row of a partition (see ``read_turn``), or None if absent."""

    @abstractmethod
    def _load_partition(self, tenant_id: str, partition_key: str) -> PartitionSnapshot | None:
        """Every checkpoint and item of one partition, or None if it holds nothing."""

    def _load_conversation(self, tenant_id: str, conversation_id: str) -> PartitionSnapshot | None:
        """What the read of a Conversation needs of its partition: all of it (its head's
        lineage is every turn). A backend whose reads cost per byte may answer a
        partition that holds no Conversation from its structure alone."""
        return self._load_partition(tenant_id, conversation_id)

    async def _load_conversation_async(
        self, tenant_id: str, conversation_id: str
    ) -> PartitionSnapshot | None:
        """``_load_conversation`` awaited."""
        return await self._load_partition_async(tenant_id, conversation_id)

    def _load_lineage(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """What the read of one response needs of its partition: every checkpoint and
        the head (the rules check the whole partition's structure) and the items of the
        response's lineage; other turns' items may be left out (``verify_history``
        reads the lineage's only). By default the whole partition; a backend whose
        reads cost per byte overrides it."""
        return self._load_partition(tenant_id, partition_key)

    async def _load_lineage_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """``_load_lineage`` awaited."""
        return await self._load_partition_async(tenant_id, partition_key)

    async def _locate_async(self, tenant_id: str, response_id: str) -> str | None:
        """``_locate`` awaited; a backend with async I/O overrides it."""
        return await asyncio.to_thread(self._locate, tenant_id, response_id)

    async def _load_partition_async(
        self, tenant_id: str, partition_key: str
    ) -> PartitionSnapshot | None:
        """``_load_partition`` awaited; a backend with async I/O overrides it."""
        return await asyncio.to_thread(self._load_partition, tenant_id, partition_key)
