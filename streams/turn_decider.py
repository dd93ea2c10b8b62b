"""The thread path's decision of one ``TurnCompleted`` with given facts: validate it
against the lineage it extends (the tail cache's or a read), decide with the pure rules
(``ratchet.domain.promotion``), and promote it if they allow (``CheckpointStore.promote``,
the hints from the lineage, the request's facts mark asserted). Decided again from fresh
reads when a rejection rested on cached facts or the lineage moved under the write;
what the store would answer a turn it never writes is ``StoreAnswers``'. A rejection is
returned, not recorded (``VerdictRecorder``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from ratchet.domain import promotion
from ratchet.domain.plan import (
    FactsChanged,
    LineageChanged,
    ParentMissing,
    Plan,
    RequestHeld,
    ResponseClaim,
)
from ratchet.domain.promotion import Accepted, Facts, JudgeOnly, Promote, Reject, Verdict
from schemas.models import RejectionReason, TurnCompleted
from services.ledger.base import Ledger, TurnFacts
from services.store.base import (
    CheckpointStore,
    CorruptPartition,
    InvalidPromotion,
    StoreUnavailable,
)
from streams import metrics
from streams.lineage import Lineage, LineageReader
from streams.promotion_hints import _Hints
from streams.store_answers import StoreAnswers
from streams.tail_cache import TailCache
from streams.verdict_recorder import VerdictRecorder

# The processor's logger: its log lines kept their name when this part left it.
log = logging.getLogger("streams.processor")

# How often a turn is decided again because the lineage it extends moved meanwhile
# (another promoter on the same partition) before the attempt is retried as a whole.
MAX_LINEAGE_ROUNDS = 4
# How many fresh lineage reads in a row may disagree with the store's view (at SERIAL)
# about the response it just said the turn extends, before the turn is ``CORRUPT``
# (``StoreAnswers.lineage_never_read``): reads that miss that response, or that extend
# it with a copy the write finds changed (``_parent_changed``, session 50). Neither
# happens in a healthy store (the view's SERIAL read completes a promotion in flight,
# and a verified read learns the row as the view decodes it); a lineage that keeps
# moving names another response each time and is not counted. Less than
# ``MAX_LINEAGE_ROUNDS``, so that it is reached within one attempt even after a round
# spent on cached facts: until session 49 (misses) and 50 (copies) such a turn was
# retried without end.
MAX_LINEAGE_MISSES = 3


class TurnDecider:
    """``decide_and_write``: a verdict (a promotion written, or a rejection not yet
    durable), ``FactsChanged`` (the facts the write asserted moved), after at most
    ``MAX_LINEAGE_ROUNDS`` lineage reads (``CORRUPT`` once ``MAX_LINEAGE_MISSES`` of
    them in a row missed the response the store's view names). Counts the decisions made again because they
    rested on cached facts (``cache_rechecks``)."""

    def __init__(self, store: CheckpointStore, ledger: Ledger, tails: TailCache,
                 lineages: LineageReader, answers: StoreAnswers, verdicts: VerdictRecorder,
                 clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.ledger = ledger
        self.tails = tails
        self.lineages = lineages
        self.answers = answers
        self.verdicts = verdicts
        self.clock_ms = clock_ms
        self.cache_rechecks = 0

    def decide_and_write(self, turn: TurnCompleted, facts: TurnFacts, mark: str | None, *,
                         fresh: bool = False, recheck: bool = True, owner_cached: bool = False,
                         claiming: Callable[[], ResponseClaim] | None = None
                         ) -> Verdict | FactsChanged:
        """Decide with ``facts`` (those of facts mark ``mark``) and promote if the rules
        allow; not yet durable for a rejection (the caller records it). ``fresh``: no
        cached lineage; ``recheck=False``: return a rejection decided from cached facts
        as it is (the caller decides it again from fresh reads anyway)."""
        lineage = None if fresh else self.lineages.cached(turn)
        from_cache = (lineage is not None and lineage.cached) or owner_cached
        lineage = lineage or self.lineages.read(turn)
        verdict = self._decide(turn, facts, mark, lineage, claiming, facts_read=recheck)
        rounds = misses = 0
        while (verdict is None or isinstance(verdict, LineageChanged)
               or (recheck and from_cache and isinstance(verdict, Reject))):
            # Decide again from fresh reads when (a) a rejection was decided with cached
            # facts: a stale or wrong entry may cost reads, never a wrong rejection (a
            # promotion needs no second look: the store only writes it on top of the
            # very response its pairing was checked against, see ``extends``); or (b)
            # the lineage the turn was checked against is no longer what it extends.
            if rounds == MAX_LINEAGE_ROUNDS:
                raise StoreUnavailable(
                    f"lineage of {turn.response_id} changed {rounds} times while deciding",
                    retryable=True, operation="promote")
            rounds += 1
            if from_cache:
                self.cache_rechecks += 1
                if owner_cached and turn.conversation_id is not None:
                    facts = replace(facts, conversation_owner=self.ledger.conversation_owner(
                        turn.conversation_id))
                from_cache = False
            # After None or ``LineageChanged`` (the lineage, or the head the turn
            # expects, is not what it was looked up as), the lineage is read whole: a
            # head read could lag again.
            named = verdict
            lineage = self.lineages.read(turn, head_first=isinstance(verdict, Reject))
            verdict = self._decide(turn, facts, mark, lineage, claiming, facts_read=recheck)
            misses = misses + 1 if _named_again(named, lineage, verdict) else 0
            if misses == MAX_LINEAGE_MISSES:
                assert isinstance(verdict, LineageChanged)
                read = None if lineage.tail is None else lineage.tail.response_id
                # Told (counted, logged) only by a decision made with the request's
                # facts, after the redelivery check: one made without them is decided
                # again from fresh reads before anything is recorded (their reads may
                # find the parent), so telling it counted a turn twice, or a turn
                # that was then promoted (session 49's review).
                return (self.verdicts.already_promoted(turn) if recheck else None) or \
                    self.answers.lineage_never_read(
                        turn, verdict.parent_response_id, misses, told=recheck,
                        differs=read == verdict.parent_response_id)
        return verdict

    def _decide(self, turn: TurnCompleted, facts: TurnFacts, mark: str | None,
                lineage: Lineage, claiming: Callable[[], ResponseClaim] | None = None,
                facts_read: bool = True) -> Verdict | FactsChanged | LineageChanged | None:
        """Validate against ``lineage``, decide, and promote if the rules allow it.

        ``LineageChanged``: the store would put the turn on another lineage than
        ``lineage``, the one it names (nothing written); None: the head the turn
        expects is the head after all (``_decide_off_head``). Either way the caller
        reads the lineage again."""
        known = Facts(
            cancelled=facts.cancellation is not None,
            cancellation_unsettled=facts.cancellation_unsettled,
            effects={e.effect_id: e for e in facts.effects},
            conversation_owner=facts.conversation_owner,
            # claims hook (issue 17): read with the request's facts, no extra query
            claims={c.effect_id: c for c in facts.claims},
        )
        if lineage.off_head is not None:
            return self._decide_off_head(turn, lineage, known, claiming, facts_read)
        with metrics.VALIDATION_SECONDS.time():
            validation = promotion.validate_after(turn, self.clock_ms(), lineage.pairing)
        decided = promotion.decide_turn(turn, validation, known)
        if lineage.unreadable is not None and (
                isinstance(decided, Promote)
                or decided.reason is RejectionReason.UNPAIRED_TOOL_CALL):
            decided = self.answers.on_unreadable_lineage(
                turn, lineage.unreadable, known,
                decided.request if isinstance(decided, Promote) else None)
        elif isinstance(decided, Reject) and decided.reason is RejectionReason.UNPAIRED_TOOL_CALL:
            answered = (self.answers.retry_unpaired_by_its_original(turn, known)
                        or self.answers.out_of_lineage(turn, lineage, known) or decided)
            if isinstance(answered, LineageChanged):
                return answered  # the write's view is another lineage (a parent promoted since)
            decided = answered
        if not isinstance(decided, Promote):
            # A retry of a request that stands promoted gets the promotion; but only
            # once the facts are read: a recorded rejection of this very event holds
            # (the caller reads them before making any rejection durable).
            return (self.verdicts.already_promoted(turn) if facts_read else None) or decided
        verdict = self._promote(turn, decided, lineage, mark, claiming)
        if isinstance(verdict, Accepted) and not verdict.replayed:
            self.lineages.learn(lineage, validation.pairing, verdict.checkpoint)
        return verdict

    def _decide_off_head(self, turn: TurnCompleted, lineage: Lineage, known: Facts,
                         claiming: Callable[[], ResponseClaim] | None,
                         facts_read: bool) -> Verdict | None:
        """A Conversation turn whose expected head was not the head when its lineage was
        looked up (nothing of it read): every rule but pairing, then the store's
        answer at SERIAL, never a write. Every answer rests on a SERIAL read that the
        head is not the expected one: the one-row read may lag a promotion in flight
        (another worker's, across a rebalance), and a turn at the head is decided by
        all its rules, pairing included, in their order. None: the head is the one it
        expects after all; the caller reads the lineage whole and decides again."""
        decided = promotion.decide_off_lineage(turn, self.clock_ms(), known)
        if isinstance(decided, Reject):
            if self.lineages.readable_head_seq(turn) == turn.expected_head_seq:
                return None
            return (self.verdicts.already_promoted(turn) if facts_read else None) or decided
        assert isinstance(decided, JudgeOnly)
        if claiming is not None:
            claiming()  # the response id's binding, as a turn sent to the write takes it
        try:
            outcome = self.store.judge(decided.request, lineage.off_head_response)
        except (InvalidPromotion, CorruptPartition) as exc:  # as ``_promote`` answers them
            decided = self.answers.refused_by_store(turn, exc)
            return (self.verdicts.already_promoted(turn) if facts_read else None) or decided
        if isinstance(outcome, Plan):
            return None
        verdict = promotion.interpret(turn, outcome)
        if isinstance(verdict, Accepted):
            return verdict  # this very request, promoted: its outcome again
        return (self.verdicts.already_promoted(turn) if facts_read else None) or verdict

    def _promote(self, turn: TurnCompleted, decided: Promote, lineage: Lineage,
                 mark: str | None, claiming: Callable[[], ResponseClaim] | None = None
                 ) -> Verdict | FactsChanged | LineageChanged:
        hints = _Hints.of(decided, lineage)
        # The claim's holder (raises StoreUnavailable if its outcome stays unknown).
        holder = claiming() if claiming is not None else None
        # A chain turn's response id owner, beside the batch (``StoreAnswers.chain_owner``); a
        # Conversation's owner is written once its first turn is promoted
        # (``VerdictRecorder.make_durable``).
        owners = self.ledger.start_recording_owners(
            tenant_id=turn.tenant_id, conversation_id=None,
            response_id=turn.response_id if turn.conversation_id is None else None)
        try:
            with metrics.LWT_SECONDS.time():
                outcome = self.store.promote(decided.request, head_hint=hints.head,
                                             parent_hint=hints.parent, extends=hints.extends,
                                             claimed=holder, facts_mark=mark)
            owners()
        except (InvalidPromotion, CorruptPartition) as exc:
            return self.answers.refused_by_store(turn, exc)
        if isinstance(outcome, FactsChanged):
            return outcome  # nothing written: the caller reads the facts and decides again
        if isinstance(outcome, LineageChanged):
            log.info("%s would extend %s, not %s (validated on): deciding again",
                     turn.response_id, outcome.parent_response_id, hints.extends)
            if lineage.cached and turn.conversation_id is not None:
                self.tails.forget_head(turn.tenant_id, turn.conversation_id)
            return outcome
        if isinstance(outcome, RequestHeld):
            return self.answers.held_by_another_response(turn, outcome.holder)
        if isinstance(outcome, ParentMissing):
            return self.answers.parent_missing(turn, outcome)
        return promotion.interpret(turn, outcome)


def _named_again(named: object, lineage: Lineage, verdict: object) -> bool:
    """Whether the store names again the response it named right before (``named``, a
    ``LineageChanged``) after a fresh ``lineage`` read: the read and the view disagree
    about it (``MAX_LINEAGE_MISSES``). Either the read missed it, or it extended it
    and the write found its copy of the row changed (``_parent_changed``: the only
    ``LineageChanged`` naming the response the turn was validated on; counted since
    session 50, before which the rounds' bound retried it without end). A lineage that
    moved again names another response; "no parent" named again after a read that found
    none is no disagreement about a row (left to the rounds' bound)."""
    if not (isinstance(named, LineageChanged) and isinstance(verdict, LineageChanged)):
        return False
    parent = named.parent_response_id
    tail = None if lineage.tail is None else lineage.tail.response_id
    return verdict.parent_response_id == parent and (parent is not None or tail is not None)
