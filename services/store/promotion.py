"""The promotion protocol of ``base.py``'s docstring, done: the size rule, the fast path
from hints, the read-plan-write rounds, the claims taken before the first write. The
plan itself is the domain's (``ratchet.domain.plan``); the checks around it are
``promotion_checks.py``'s; the I/O is the backend's hooks (``backend.py``)."""

from __future__ import annotations

import functools

from ratchet.domain.history import CheckpointRecord, Head
from ratchet.domain.plan import (
    FactsChanged,
    LineageChanged,
    Plan,
    Promoted,
    PromotionOutcome,
    PromotionRequest,
    ResponseClaim,
    ResponseClaimed,
    TooLarge,
    build_checkpoint,
    check_claim,
    check_view_filing,
    plan_from_hints,
    plan_promotion,
    starts_chain,
)
from services.store.backend import StoreBackend
from services.store.errors import StoreUnavailable
from services.store.hints import StoreHints
from services.store.hook_calls import stray_stop
from services.store.promotion_checks import (
    ANY_LINEAGE,
    _check_not_behind,
    _extends,
    _parent_changed,
)
from services.store.request_checks import turn_size, validate_request
from services.store.request_facts import RequestFacts

# How many read-decide-write rounds a promotion may lose before giving up; each lost
# round means another promoter moved the partition, so the next decision is final.
MAX_PROMOTION_ROUNDS = 4


class PromotionWriter:
    """``CheckpointStore.promote``, ``judge`` and ``promote_from_hints_async`` (their
    promises are on the facade). Learns what its writes and views make true into the
    store's hints; asks ``RequestFacts`` whether a chain's first request is held."""

    def __init__(self, backend: StoreBackend, hints: StoreHints,
                 requests: RequestFacts) -> None:
        self._backend = backend
        self._hints = hints
        self._requests = requests

    def promote(
        self,
        request: PromotionRequest,
        head_hint: Head | None,
        parent_hint: CheckpointRecord | None,
        extends: str | None | object,
        claimed: ResponseClaim | None,
        facts_mark: str | None,
    ) -> PromotionOutcome:
        backend = self._backend
        validate_request(request)
        size = turn_size(request)
        if size > backend.options.max_turn_bytes:
            return TooLarge(size, backend.options.max_turn_bytes)
        mine = ResponseClaim.of(request)
        holder = claimed

        def claim_is_mine() -> bool:
            nonlocal holder
            if holder is None:
                holder = backend._claim(mine)
            return holder == mine

        request_held = functools.cache(lambda: self._requests.request_held(request))
        plan = self._plan_from_hints(request, head_hint, parent_hint)
        if plan is not None and _extends(plan, extends) and claim_is_mine():
            held = request_held()
            if held is not None:
                return held
            promoted = self._attempt(request, plan, facts_mark)
            if promoted is not None:
                return promoted
        known_parent = parent_hint if parent_hint is not None else self._hints.parent(request)
        known_head = self._hints.head(request)  # durable: learned, never a caller's guess
        guess = head_hint if head_hint is not None else known_head
        for _ in range(MAX_PROMOTION_ROUNDS):
            view = backend._read_view(request, None if guess is None else guess.response_id)
            check_view_filing(request, view)  # before a row of it is learnt or answered
            _check_not_behind(request, known_head, view.head)
            guess = known_head = view.head
            if extends is not ANY_LINEAGE and _parent_changed(request, known_parent, view):
                assert view.parent is not None
                return LineageChanged(view.parent.response_id)
            self._hints.learn_view(request, view)
            decision = plan_promotion(request, view)
            if not isinstance(decision, Plan):
                return decision
            if view.facts_mark != facts_mark:
                return FactsChanged(view.facts_mark)
            if not _extends(decision, extends):
                return LineageChanged(decision.parent_response_id)
            if not claim_is_mine():
                assert holder is not None
                check_claim(holder, mine)  # a damaged claim that may be the turn's own
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
              head_guess: str | None) -> PromotionOutcome | Plan:
        validate_request(request)
        size = turn_size(request)
        if size > self._backend.options.max_turn_bytes:
            return TooLarge(size, self._backend.options.max_turn_bytes)
        view = self._backend._read_view(request, head_guess)
        check_view_filing(request, view)
        _check_not_behind(request, self._hints.head(request), view.head)
        return plan_promotion(request, view)

    async def promote_from_hints_async(
        self,
        request: PromotionRequest,
        head_hint: Head | None,
        parent_hint: CheckpointRecord | None,
        extends: str | None | object,
        facts_mark: str | None,
    ) -> Promoted | None:
        validate_request(request)
        if (turn_size(request) > self._backend.options.max_turn_bytes
                or starts_chain(request)):
            return None  # a chain's first response also claims its request: ``promote``
        plan = self._plan_from_hints(request, head_hint, parent_hint)
        if plan is None or not _extends(plan, extends):
            return None
        checkpoint = self._checkpoint_of(request, plan)
        if not await self._backend._write_async(request, plan, checkpoint, facts_mark):
            return None
        self._hints.learn_promotion(request, plan, checkpoint)
        return Promoted(checkpoint)

    def _attempt(self, request: PromotionRequest, plan: Plan,
                 facts_mark: str | None) -> Promoted | None:
        """One conditional write of ``plan``; ``Promoted`` if it applied."""
        checkpoint = self._checkpoint_of(request, plan)
        if not self._backend._write(request, plan, checkpoint, facts_mark):
            return None
        self._hints.learn_promotion(request, plan, checkpoint)
        return Promoted(checkpoint)

    def _checkpoint_of(self, request: PromotionRequest, plan: Plan) -> CheckpointRecord:
        options = self._backend.options
        # The clock is a hook: awaited (``promote_from_hints_async``) a bare StopIteration
        # out of it would be a coroutine's bare RuntimeError, not the store's failure.
        # Caught here, not through ``call_hook``: no call more per promoted turn.
        try:
            now = options.clock()
        except StopIteration as stop:
            raise stray_stop(options.clock, stop) from stop
        return build_checkpoint(request, plan, now, options.logical_retention_s)

    def _plan_from_hints(self, request: PromotionRequest, head_hint: Head | None,
                         parent_hint: CheckpointRecord | None) -> Plan | None:
        """The plan the caller's hints give, or this store's own where it gave none."""
        return plan_from_hints(
            request,
            head_hint if head_hint is not None else self._hints.head(request),
            parent_hint if parent_hint is not None else self._hints.parent(request),
        )
