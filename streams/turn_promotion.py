"""The thread path of one ``TurnCompleted``: decide it and make the outcome durable.

The fast path reads none of the request's facts; they are read when the turn needs
them or a write says they changed, and before any rejection is recorded (a rejection
decided without them, or from cached facts, is decided again from fresh reads). The
decision itself is ``TurnDecider``'s, making it durable ``VerdictRecorder``'s, the
rejections decided from the event alone ``EarlyRejections``'."""

from __future__ import annotations

import functools
from dataclasses import replace

from ratchet.domain import promotion
from ratchet.domain.plan import FactsChanged, ResponseClaim
from ratchet.domain.promotion import Accepted, Reject, Verdict
from ratchet.domain.validation import PROMOTABLE_STATUSES, request_digest_problem
from schemas.keys import MissingChainRoot, partition_key
from schemas.models import RejectionReason, TurnCompleted
from services.ledger.base import Ledger
from services.store.base import CheckpointStore, StoreUnavailable
from streams.early_rejections import EarlyRejections
from streams.handled import NO_FACTS, Handled
from streams.identity_checks import _first_of_chain
from streams.outbound import OutboundBuilder
from streams.request_facts import UNKNOWN, RequestFacts
from streams.tail_cache import TailCache
from streams.turn_decider import TurnDecider
from streams.verdict_recorder import VerdictRecorder, replayed_rejection

# How often the request's facts may change under one decision before the attempt is
# retried as a whole (each change is a fact recorded meanwhile: rare).
MAX_FACTS_ROUNDS = 4


class TurnPromotion:
    """``handle``: one decoded ``TurnCompleted`` whose identity checks passed, to the
    records to publish. Counts the rejections decided without the facts (or from
    cached ones) and decided again (``cache_rechecks``)."""

    def __init__(self, store: CheckpointStore, ledger: Ledger, tails: TailCache,
                 request_facts: RequestFacts, decider: TurnDecider,
                 verdicts: VerdictRecorder, early: EarlyRejections,
                 outbound: OutboundBuilder) -> None:
        self.store = store
        self.ledger = ledger
        self.tails = tails
        self.request_facts = request_facts
        self.decider = decider
        self.verdicts = verdicts
        self.early = early
        self.outbound = outbound
        self.cache_rechecks = 0

    def handle(self, turn: TurnCompleted) -> Handled:
        """Decide and make durable. The fast path reads none of the request's facts
        (effects, claims, cancellation, earlier decision): the promotion batch asserts
        that none were recorded (no facts mark). The facts are read when the turn uses
        tool effects (it needs them), when this worker recorded one of the request's
        facts itself, when the batch found a mark (``FactsChanged``), and before any
        rejection is made durable (a rejection needs them: replay, cancellation,
        orphans)."""
        try:
            key = partition_key(turn)
        except MissingChainRoot as exc:
            return self.early.on_unkeyed_turn(turn, exc)
        if turn.status in PROMOTABLE_STATUSES:
            problem = request_digest_problem(turn.request_digest)
            if problem is not None:
                # Before the response id's claim, which would bind the id to it; decided
                # from the event alone, recorded, and the attempt's effects orphaned.
                return self.early.reject_before_the_store(
                    turn, key, Reject(RejectionReason.CORRUPT, problem))
        conversation = turn.conversation_id
        owner = None if conversation is None else self.tails.owner(conversation)
        # The response id's claim must be held before the promotion batch is sent;
        # taking it now overlaps it with the reads (one round trip less per turn). A
        # turn that ends up rejected leaves a claim only its own request can use (a
        # retry of it goes on; another request could never bind the id anyway).
        claiming = (functools.cache(self.store.start_claiming(ResponseClaim(
            turn.tenant_id, turn.response_id, key, turn.idempotency_key, turn.request_digest)))
            if turn.status in PROMOTABLE_STATUSES else None)
        known_mark = self.tails.facts_mark(turn.tenant_id, key, turn.idempotency_key)
        # A chain's first response reads its request's facts always: its other
        # attempts are other partitions, whose facts marks its batch cannot assert (a
        # cancellation keyed to another attempt is still in the ledger, by request).
        if promotion.used_effect_ids(turn) or known_mark is not None or _first_of_chain(turn):
            facts, mark = self.request_facts.read(turn, key, owner, known_mark or UNKNOWN)
            read = True
        else:
            # A cached owner (immutable once claimed) saves the owner read.
            facts = NO_FACTS if conversation is None else replace(
                NO_FACTS, conversation_owner=owner or self.ledger.conversation_owner(
                    conversation))
            mark, read = None, False
        fresh = False  # decide from fresh reads only (no cached lineage or owner)
        for _ in range(MAX_FACTS_ROUNDS):
            if facts.decision is not None and facts.decision.reason is not None:
                # Never flip it: the recorded rejection, settled again (its writer may
                # have stopped before the mark or the status), unless the event stands
                # promoted (a batch that landed before the rejection's mark did).
                verdict: Verdict = self.verdicts.settle_rejection(
                    turn, key, replayed_rejection(facts.decision))
                break
            decided = self.decider.decide_and_write(
                turn, facts, mark, fresh=fresh, recheck=read, claiming=claiming,
                owner_cached=owner is not None and not fresh)
            if isinstance(decided, FactsChanged):
                facts, mark = self.request_facts.read(turn, key, None if fresh else owner, decided.mark)
                read = True
                continue
            if isinstance(decided, Reject) and not read:
                # A rejection decided without the facts (or from cached lineage/owner):
                # decided again from fresh reads of everything before it is recorded.
                self.cache_rechecks += 1
                facts, mark = self.request_facts.read(turn, key, None)
                read = fresh = True
                continue
            verdict = self.verdicts.make_durable(turn, key, decided, facts)
            break
        else:
            raise StoreUnavailable(
                f"facts of request {turn.idempotency_key} changed {MAX_FACTS_ROUNDS} times "
                "while deciding", retryable=True, operation="promote")
        if isinstance(verdict, Accepted) and self.verdicts.of_another_attempt(turn, verdict):
            verdict, facts = self.verdicts.rejected_first(turn, key, verdict)
            read = True
        if isinstance(verdict, Accepted) and (
                (verdict.replayed and not read)
                or (not verdict.replayed and _first_of_chain(turn))):
            # A redelivery (or a retry) found its promotion stored: its orphans are the
            # request's effects the promoted turn did not use, which the fast path did
            # not read. Read them, or a worker without this request's facts mark in its
            # cache would publish none (the one that promoted first did).
            # A chain's first response, just promoted: read them again after its batch.
            # An effect of another attempt is recorded in that attempt's partition,
            # whose facts mark this batch does not assert; its worker orphans it only
            # if its read (after the effect) sees this promotion. If it did not, the
            # effect was recorded before this batch, and this read sees it.
            facts = self.request_facts.effects_of(turn)
        return self.outbound.publishable(turn, key, verdict, facts)
