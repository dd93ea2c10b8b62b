"""The rejections of a ``TurnCompleted`` decided from the event alone, before any store
read or claim: ids or a key no row could be keyed by (``CORRUPT``, nothing recorded), an
event above a limit of the protocol (``UNSUPPORTED_FORMAT``), a continued chain turn
without its root (``PARENT_NOT_PROMOTED``), a request digest that is no digest
(``CORRUPT``). All but the first are recorded like any rejection, or the recorded
outcome replayed, so the status endpoint and a redelivery agree."""

from __future__ import annotations

from ratchet.domain.promotion import Accepted, Reject, Verdict
from schemas.keys import MissingChainRoot, partition_key
from schemas.models import RejectionReason, TurnCompleted
from streams.handled import NO_FACTS, Handled
from streams.outbound import OutboundBuilder
from streams.request_facts import UNKNOWN, RequestFacts
from streams.verdict_recorder import VerdictRecorder, replayed_rejection


class EarlyRejections:
    """A turn rejected before the store, made durable and built to publish."""

    def __init__(self, request_facts: RequestFacts, verdicts: VerdictRecorder,
                 outbound: OutboundBuilder) -> None:
        self.request_facts = request_facts
        self.verdicts = verdicts
        self.outbound = outbound

    def on_bad_identity(self, turn: TurnCompleted, problem: str) -> Handled:
        """A turn whose ids or key are wrong (``identity_problem``): an id outside the
        API's pattern (a history the API could never serve, or an id no row could be
        keyed by), a chain's first response naming another root, or a record keyed
        apart from its partition key. ``CORRUPT`` with no store or ledger access at all
        (not even the response id's claim; validation says the same of the first two).
        Nothing is recorded: the rejection follows from the record alone, so a
        redelivery gets it again."""
        try:
            key = partition_key(turn)
        except MissingChainRoot:
            key = turn.response_id
        return self.outbound.publishable(turn, key, Reject(RejectionReason.CORRUPT, problem),
                                        NO_FACTS)

    def on_turn_beyond_limits(self, turn: TurnCompleted, beyond: str) -> Handled:
        """A turn whose event is above a limit of the protocol (its size, or its array
        items and map entries: a gateway that did not check): ``UNSUPPORTED_FORMAT``,
        decided without store reads, recorded like any rejection so the status endpoint
        and a redelivery agree. One beyond the element bound was read without its
        arrays: the effect ids it lists are not known, so only its own attempt's
        effects are orphaned (``orphaned_effects``)."""
        try:
            key = partition_key(turn)
        except MissingChainRoot:
            key = turn.response_id
        return self.reject_before_the_store(
            turn, key, Reject(RejectionReason.UNSUPPORTED_FORMAT, beyond))

    def on_unkeyed_turn(self, turn: TurnCompleted, missing: MissingChainRoot) -> Handled:
        """A continued chain turn without ``chain_root_id``: the partition its parent is
        in cannot be known, so it is ``PARENT_NOT_PROMOTED`` (what the store's chain
        rule answers for a parent it cannot find), decided without store reads and
        published under the turn's own response id, the only key it carries."""
        return self.reject_before_the_store(
            turn, turn.response_id, Reject(RejectionReason.PARENT_NOT_PROMOTED, str(missing)))

    def reject_before_the_store(self, turn: TurnCompleted, key: str,
                                reject: Reject) -> Handled:
        """A rejection decided from the event alone: recorded like any other (so the
        status endpoint and a redelivery agree), or the recorded one replayed."""
        facts = self.request_facts.effects_of(turn)
        verdict: Verdict | None
        if facts.decision is not None and facts.decision.reason is not None:
            # Never flip an outcome, also when a later retry was promoted since:
            # settled again like any replayed rejection.
            verdict = self.verdicts.settle_rejection(turn, key, replayed_rejection(facts.decision))
        elif isinstance(verdict := self.verdicts.already_promoted(turn), Accepted):
            # A retry of a request that stands promoted under this response id gets the
            # promotion, whatever this event looks like (CONTRACT 4: the original outcome),
            # unless this very event was rejected first (by another worker meanwhile).
            if self.verdicts.of_another_attempt(turn, verdict):
                verdict, facts = self.verdicts.rejected_first(turn, key, verdict)
            if isinstance(verdict, Accepted):
                verdict = self.verdicts.owned(turn, verdict, UNKNOWN)
        else:
            # Not promoted, or its row is damaged (``CORRUPT``, the write's answer).
            verdict = self.verdicts.make_durable(turn, key, verdict or reject, facts)
        return self.outbound.publishable(turn, key, verdict, facts)
