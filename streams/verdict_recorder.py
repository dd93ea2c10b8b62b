"""A verdict made durable before anything is published (the commit order's step 1):
a rejection recorded and settled (its facts mark, a promotion of this attempt that
landed first, its status row), a promotion's owners written, a retry answered with a
promotion checked against a rejection of this very event recorded first. An outcome
never flips: every answer here is the first one recorded."""

from __future__ import annotations

from collections.abc import Callable

from ratchet.domain.promotion import Accepted, Reject, Verdict
from schemas.keys import MissingChainRoot, partition_key
from schemas.models import RejectionReason, TurnCompleted
from services.ledger.base import Decision, Ledger, TurnFacts
from services.store.base import CheckpointStore, CorruptPartition
from streams.request_facts import UNKNOWN, RequestFacts
from streams.store_answers import damaged_rows
from streams.tail_cache import TailCache


class VerdictRecorder:
    """Records verdicts in the ledger (and owners), reads whether a turn stands
    promoted. Each step idempotent: a redelivery, or a worker that finds another's
    half-done work, finishes it."""

    def __init__(self, store: CheckpointStore, ledger: Ledger, request_facts: RequestFacts,
                 tails: TailCache, clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.ledger = ledger
        self.request_facts = request_facts
        self.tails = tails
        self.clock_ms = clock_ms

    @staticmethod
    def of_another_attempt(turn: TurnCompleted, verdict: Accepted) -> bool:
        return verdict.replayed and verdict.checkpoint.accepted_attempt != turn.attempt

    def rejected_first(self, turn: TurnCompleted, key: str,
                       verdict: Accepted) -> tuple[Verdict, TurnFacts]:
        """A turn answered with another attempt's promotion (the store's idempotency
        record, or the "already promoted" check): a retry of a promoted request gets
        it, but a rejection of this very event recorded first holds (an outcome never
        flips): a redelivery of an attempt rejected before that promotion, or the same
        event decided meanwhile by another worker (the new owner after a rebalance).
        Read after the promotion was seen: a rejection decided before the later attempt
        was processed is durable by now. Returns the verdict and the request's facts."""
        facts = self.request_facts.effects_of(turn)
        if facts.decision is not None and facts.decision.reason is not None:
            return self.settle_rejection(turn, key, replayed_rejection(facts.decision)), facts
        return verdict, facts

    def already_promoted(self, turn: TurnCompleted) -> Accepted | Reject | None:
        """A redelivered turn that was promoted before must be re-published as promoted,
        even if a rule would now reject it (a later cancellation, an expired proof).
        Only asked on the way to a rejection, so the common path saves a read. A
        damaged checkpoint row of its response id cannot tell whether it was: the
        write's answer, ``CORRUPT`` (a ``Reject``; before session 49 the row read as
        absent, and a ``failed`` retry of the promoted request was
        ``NOT_PROMOTABLE_STATUS``)."""
        try:
            existing = self.store.get_checkpoint(turn.tenant_id, turn.response_id)
        except CorruptPartition as exc:
            return damaged_rows(turn, exc)
        if existing is None or existing.idempotency_key != turn.idempotency_key:
            return None
        if existing.request_digest != turn.request_digest:
            return None
        try:
            if existing.partition_key != partition_key(turn):
                return None  # the same request sent to another history: CONFLICT stands
        except MissingChainRoot:
            pass  # no partition of its own to compare (a continued chain without root)
        return Accepted(existing, replayed=True)

    def make_durable(self, turn: TurnCompleted, key: str, verdict: Verdict,
                     facts: TurnFacts) -> Verdict:
        """Record the verdict before anything is published (commit order, step 1)."""
        if isinstance(verdict, Accepted):
            # Durable already: the turn (the store) and a chain turn's response owner
            # (written beside its batch; again for a replay, whose worker may have
            # stopped before it was durable). A Conversation's owner is written only now that its
            # first turn is promoted (a refused batch must not hand the Conversation to
            # its tenant), also by a redelivery (its writer may have stopped before).
            return self.owned(turn, verdict, facts.conversation_owner,
                              response_owner=verdict.replayed)
        held = self.ledger.record_decision(Decision(
            event_id=turn.event_id, tenant_id=turn.tenant_id, response_id=turn.response_id,
            outcome="rejected", reason=verdict.reason.value, detail=verdict.detail,
            seq=verdict.head_seq, decided_at=self.clock_ms(),
            existing_response_id=verdict.existing_response_id,
            idempotency_key=turn.idempotency_key,
        ))
        # Another worker may have decided this event first (zombie after a rebalance):
        # the first decision holds.
        return self.settle_rejection(turn, key, replayed_rejection(held))

    def settle_rejection(self, turn: TurnCompleted, key: str, verdict: Reject) -> Verdict:
        """Make a recorded rejection final, in this order (also when it is replayed: the
        worker that recorded it may have stopped at any step; each is idempotent):

        1. the request's facts mark: from now on a promotion batch of this request
           decided without the decision is refused, and whoever decides it again reads
           the decision (it was durable before the mark);
        2. a promotion of this attempt that landed before the mark (another worker that
           decided it on the fast path, e.g. the old owner after a rebalance) stands:
           the rejection was never published, and never will be. Only this attempt's:
           a later retry's promotion (another attempt) does not make a rejection
           already published, or about to be, a promotion when it is redelivered; the
           rejection was decided first and the retry went on after it (CONTRACT 4);
        3. the status row (a DUPLICATE's names the original response)."""
        self.request_facts.mark(turn.tenant_id, key, turn.idempotency_key)
        promoted = self.already_promoted(turn)
        # A damaged row (``Reject``) shows no promotion: the recorded rejection holds.
        if isinstance(promoted, Accepted) and promoted.checkpoint.accepted_attempt == turn.attempt:
            return self.owned(turn, promoted, UNKNOWN)
        self.ledger.mark_rejected(turn.tenant_id, turn.response_id, verdict.reason.value,
                                  verdict.detail, verdict.existing_response_id)
        return verdict

    def owned(self, turn: TurnCompleted, verdict: Accepted,
              known_owner: str | None | object, *, response_owner: bool = True) -> Accepted:
        """A promotion answered, with its owner durable: the worker that promoted it may
        have stopped before writing it. A chain turn's response id owner (a plain,
        idempotent write: the checkpoint is this tenant's), unless ``response_owner``
        is False (written beside this very batch); a Conversation's owner, where there
        is none: ``known_owner`` is the owner read with the turn's facts, or
        ``UNKNOWN`` (read here unless cached; never written over another tenant)."""
        conversation = turn.conversation_id
        if conversation is None:
            if response_owner:
                self.ledger.start_recording_owners(
                    tenant_id=turn.tenant_id, response_id=turn.response_id,
                    conversation_id=None)()
            return verdict
        if known_owner is UNKNOWN:
            known_owner = (self.tails.owner(conversation)
                           or self.ledger.conversation_owner(conversation))
        if known_owner is None:
            self.ledger.start_recording_owners(
                tenant_id=turn.tenant_id, response_id=None, conversation_id=conversation)()
        if known_owner in (None, turn.tenant_id):
            self.tails.learn_owner(conversation, turn.tenant_id)
        return verdict


def replayed_rejection(decision: Decision) -> Reject:
    return Reject(RejectionReason(decision.reason), decision.detail, decision.seq,
                  decision.existing_response_id)
