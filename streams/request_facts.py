"""What is recorded about a request beside its turn, for the processor.

A request's facts are its tool effects, its cancellation, its earlier decisions and
the response it stands promoted with, kept in the ledger and the history's partition
(``services/ledger``, ``services/store``). The facts mark (a row of the history's
partition, rewritten after each fact is durable) is what a promotion batch asserts
instead of reading them: a batch decided without a fact is refused (``FactsChanged``).

``RequestFacts`` records ``ToolEffect`` and ``TurnCancelled`` events (with the mark),
reads a turn's facts when its decision needs them, and says which promotion a
request stands with, for orphans (``EffectOrphaned``).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from ratchet.domain import promotion
from ratchet.domain.bounds import container_problem, effect_field_problem
from ratchet.domain.catalogue import EFFECT_OUTPUT_TYPES, effect_key
from ratchet.domain.history import (
    NO_ITEMS,
    CheckpointRecord,
    PromotionMode,
    verify_turn_items,
)
from ratchet.domain.promotion import RecordedEffect, Reject
from schemas.keys import MissingChainRoot, partition_key, request_scope
from schemas.models import (
    DeadLetterReason,
    Item,
    OrphanReason,
    RejectionReason,
    ToolEffect,
    TurnCancelled,
    TurnCompleted,
)
from services.ledger.base import (
    Cancellation,
    EffectWrite,
    Ledger,
    ResponseState,
    TurnFacts,
)
from services.store.base import CheckpointStore, CorruptPartition
from streams import metrics
from streams.outcomes import late_orphan_event, orphaned_event, recorded_effect
from streams.records import DecodeFailed, Outbound
from streams.tail_cache import TailCache
from streams.topics import Topics

log = logging.getLogger(__name__)

# The facts mark is not known yet: read it before the facts.
UNKNOWN = object()


class RequestFacts:
    """A request's facts: recorded (with the facts mark after each), read, and the
    promotion the request stands with. Thread-safe (no state of its own but the
    tail cache's facts marks)."""

    def __init__(self, store: CheckpointStore, ledger: Ledger, tails: TailCache,
                 topics: Topics) -> None:
        self.store = store
        self.ledger = ledger
        self.tails = tails
        self.topics = topics

    def record_effect(self, effect: ToolEffect) -> tuple[Outbound, ...]:
        """Record the effect, then the request's facts mark; then, if the request
        already stands promoted without it (an effect of another attempt arriving late,
        e.g. one that ran past its turn's promotion), publish it orphaned: the
        promotion's own orphans could not include it. Read at SERIAL after the mark: a
        promotion batch that landed before the mark is seen here, one sent after it is
        refused and reads the effect with the request's facts."""
        unbounded = effect_field_problem(effect)
        if unbounded is not None:
            raise DecodeFailed(DeadLetterReason.INVALID_EVENT,
                               f"effect {effect.effect_id}: {unbounded}")
        beyond = container_problem((effect.output,))
        if beyond is not None:
            # No turn could carry this output (UNSUPPORTED_FORMAT), and the claims API
            # refuses it: recorded, it would be an effect no promotion can use.
            raise DecodeFailed(DeadLetterReason.INVALID_EVENT,
                               f"effect {effect.effect_id}: output {beyond}")
        if not effect.output.digest_ok():
            # The digest is what a turn's output is checked against: one that is not its
            # content's would let a turn carry another output than the tool's.
            raise DecodeFailed(DeadLetterReason.INVALID_EVENT, (
                f"effect {effect.effect_id}: output {effect.output.item_id}'s content_digest "
                "is not the sha256 of its content"))
        recorded = recorded_effect(effect)
        result = self.ledger.record_effect(recorded)
        if result is EffectWrite.FOREIGN:
            # Its id was recorded by the request of its key in another Conversation or
            # chain (a key reused across them): that record stands, this one is parked.
            # A turn that lists the effect finds none of its own: MISSING_TOOL_EFFECT.
            raise DecodeFailed(DeadLetterReason.INVALID_EVENT, (
                f"effect id {effect.effect_id} is recorded for request "
                f"{effect.idempotency_key} in another Conversation (or in chain mode)"))
        # The effect's reference output: its claim's completion if it has one (the
        # holder's execution, whatever was recorded before it), else the first record.
        try:
            claimed = self._claimed_output(effect)
        except CorruptPartition as exc:
            # Its reference output (the claim's completion, or this first record) cannot
            # be told: a run published on it may be the claim's own, ordered undone.
            self.mark(effect.tenant_id, effect.partition_key, effect.idempotency_key)
            withheld("late_effect", "tool effect %s recorded; its claim is damaged: %s; not "
                     "published: this execution (output digest %s)", effect.effect_id, exc,
                     recorded.output_digest)
            return ()
        if claimed is None:
            conflicting = result is EffectWrite.CONFLICT
        else:
            conflicting = effect.output.content_digest != claimed
        if conflicting:
            log.warning("tool effect %s recorded with another output than its reference "
                        "(its claim's completion, else the first record): conflicted, this "
                        "execution is published EFFECT_CONFLICT", effect.effect_id)
        # This record is the claim's execution and another was recorded before it (by a
        # holder whose lease had run out, while the claim was not yet completed): that
        # one is the other execution, and nothing else would ever publish it.
        earlier = (self._recorded_first(effect)
                   if claimed is not None and not conflicting
                   and result is EffectWrite.CONFLICT else None)
        self.mark(effect.tenant_id, effect.partition_key, effect.idempotency_key)
        try:
            promoted = self.store.promoted_key(effect.tenant_id, effect.partition_key,
                                               effect.idempotency_key, effect.response_id,
                                               first_of_chain=_first_of_chain(effect))
            out = self._late_orphans(effect, recorded, result, conflicting, earlier,
                                     promoted)
        except CorruptPartition as exc:
            # Recorded; whether it is orphaned cannot be read (it may be used): nothing
            # published, the partition needs an operator. Met by the lookup above, or by
            # the second one of a cancelled chain's first request (``_settle_request``
            # reads the holder's partition again: damage, or a claim by a damaged
            # attempt, landing between the two; a dead letter until session 51). The
            # earlier execution's conflict orphan is withheld too, even when the first
            # lookup found the request promoted nowhere: the damaged read is the one
            # that says whether a promotion (another attempt's) carries its output, and
            # an orphan published wrongly orders a used side effect undone (session 52).
            # The line names each execution withheld, by output digest.
            earlier_digest = "" if earlier is None else (
                f" and an earlier execution (output digest {earlier.output_digest})")
            withheld("late_effect",
                     "tool effect %s recorded; whether request %s stands promoted cannot "
                     "be read: %s; not published: this execution (output digest %s)%s",
                     effect.effect_id, effect.idempotency_key, exc,
                     recorded.output_digest, earlier_digest)
            return ()
        if not out:
            return ()
        # Something to publish (rare): not while another claim of the request is
        # damaged, as a turn, a redelivered promotion or a cancellation of the request
        # publishes none then (an outside review of session 53: by arrival order, the
        # same run was withheld or ordered undone). One read, only here.
        damaged = promotion.damaged_claim(self.ledger.claims_for(effect.tenant_id,
                                                                 effect.idempotency_key))
        if damaged is not None:
            withheld("late_effect", "tool effect %s recorded; a claim of request %s is "
                     "damaged: %s; not published: %s", effect.effect_id,
                     effect.idempotency_key, damaged,
                     ", ".join(f"{o.model.effect_id} (output digest {o.model.output_digest})"
                               for o in out))
            return ()
        return out

    def _late_orphans(self, effect: ToolEffect, recorded: RecordedEffect, result: EffectWrite,
                      conflicting: bool, earlier: RecordedEffect | None,
                      promoted: CheckpointRecord | None) -> tuple[Outbound, ...]:
        """``record_effect``'s publications once the request's standing is read: the
        earlier execution's conflict orphan, then this record's own orphan (each if
        any). Raises ``CorruptPartition`` when settling the request meets damage."""
        out = []
        if earlier is not None:
            first = self._conflict_orphan(effect, earlier, promoted)
            if first is not None:  # its own outcome id: this record's may be published too
                out.append(Outbound(self.topics.orphaned_effects, effect.partition_key.encode(),
                                    late_orphan_event(effect, replace(first, displaced=True))))
        orphan = self._own_orphan(effect, recorded, result, conflicting, promoted)
        if orphan is not None:
            out.append(Outbound(self.topics.orphaned_effects, effect.partition_key.encode(),
                                late_orphan_event(effect, orphan)))
        return tuple(out)

    def _own_orphan(self, effect: ToolEffect, recorded: RecordedEffect, result: EffectWrite,
                    conflicting: bool,
                    promoted: CheckpointRecord | None) -> promotion.Orphan | None:
        """The orphan of the execution this ``ToolEffect`` records, if it is to be
        published now (None: used, decided by its turn later, or not knowable)."""
        if conflicting:
            return self._conflict_orphan(effect, recorded, promoted)
        if promoted is None:
            return self._cancelled_request_orphan(effect, recorded)
        if not promotion.needs_promoted_items(promoted, (effect.effect_id,)):
            return None  # used by the promoted turn, or unknown (promoted before 012)
        # Recorded after the promotion, which could not list it: used all the same if the
        # promoted turn carries its output under its call (the gateway produced the turn
        # first; gateway-protocol.md section 6).
        known, items = self.promoted_items(promoted)
        if not known:
            return None
        mine = replace(recorded, conflicted=result is EffectWrite.CONFLICT)
        if effect.effect_id in promotion.carried_by_items(
                items, promoted.accepted_effect_ids or (), (mine,), (), stored=True):
            return None
        return promotion.Orphan(recorded, OrphanReason.ATTEMPT_SUPERSEDED, detail=(
            f"recorded after request {effect.idempotency_key} was promoted as "
            f"{promoted.response_id}, which neither lists it nor carries its output"))

    def _claimed_output(self, effect: ToolEffect) -> str | None:
        """The output digest its claim was completed with (gateway-protocol.md section 8,
        rule 3), or None (no claim, or not completed with an output). Raises
        ``CorruptPartition`` for a damaged claim (``claims.claim_damage``)."""
        claim = self.ledger.claim(effect.tenant_id, effect.idempotency_key, effect.effect_id)
        damaged = None if claim is None else promotion.damaged_claim((claim,))
        if damaged is not None:
            raise CorruptPartition(damaged)
        if claim is None or not claim.completed or claim.output is None:
            return None
        return claim.output.content_digest

    def _recorded_first(self, effect: ToolEffect) -> RecordedEffect | None:
        """The record of the effect id kept in its request's facts (the first one)."""
        return next((e for e in self.ledger.effects_for(effect.tenant_id, effect.idempotency_key)
                     if e.effect_id == effect.effect_id), None)

    def _conflict_orphan(self, effect: ToolEffect, recorded: RecordedEffect,
                         promoted: CheckpointRecord | None) -> promotion.Orphan | None:
        """The orphan of a ToolEffect whose output is not the one recorded first for
        its effect id (by a ToolEffect or its claim's completion): a second execution of
        the tool (a retry ran it again under the same call). No turn can use it: every
        turn listing a conflicted effect is ``DUPLICATE_TOOL_EFFECT``, and one carrying
        another output than the recorded one too. So it is published at once, with its
        own output digest, ``EFFECT_CONFLICT`` (final). Only when the request already
        stands promoted with a turn that carries this very output (under the effect's
        call) is it in a history, and then nothing is published. The first execution is
        decided as before: used by the promotion that listed it, or orphaned by its
        turn's outcome (found by a gateway built from the docs: a re-run after the
        promotion was published nowhere)."""
        if promoted is not None:
            known, items = self.promoted_items(promoted)
            if not known:
                return None  # logged: the partition needs an operator
            if any(item.type in EFFECT_OUTPUT_TYPES
                   and effect_key(item) == recorded.call_id
                   and item.content_digest == recorded.output_digest for item in items):
                return None
        where = ("" if promoted is None else
                 f", after request {effect.idempotency_key} was promoted as "
                 f"{promoted.response_id}")
        return promotion.Orphan(
            replace(recorded, conflicted=True), OrphanReason.EFFECT_CONFLICT, detail=(
                f"effect {effect.effect_id} recorded with output digest "
                f"{recorded.output_digest}, not its reference output{where}: "
                "another execution of the tool, used by no turn"))

    def _cancelled_request_orphan(self, effect: ToolEffect,
                                  recorded: RecordedEffect) -> promotion.Orphan | None:
        """The orphan of an effect of a request that is not promoted but cancelled, or
        None. In one partition a cancelled request never promotes (every attempt
        decided after the cancellation is ``CANCELLED``; a batch decided before it is
        refused by its facts mark), so an effect recorded late (a tool that ran past the
        cancellation, after its turn's rejection) would never be orphaned otherwise.
        Its turn, if still to come, orphans it again (compensations are deduped by
        effect id)."""
        cancellation = self.ledger.cancellation(effect.tenant_id, effect.idempotency_key,
                                                request_scope(effect))
        if cancellation is None:
            return None
        if _first_of_chain(effect) and not self._no_other_attempt(effect):
            return None
        return promotion.Orphan(recorded, OrphanReason.TURN_CANCELLED, detail=(
            f"recorded after request {effect.idempotency_key} was cancelled"),
            rejection_reason=RejectionReason.CANCELLED)

    def record_cancel(self, cancel: TurnCancelled) -> tuple[Outbound, ...]:
        """Record the cancellation, then the request's facts mark; then, if the request
        stands promoted nowhere, publish every effect and claim of it ``TURN_CANCELLED``
        (``promotion.cancellation_orphans``). Read at SERIAL after the mark: a promotion
        batch that landed before it is seen (the cancellation came too late and is
        dropped: that promotion decided the effects), one sent after it is refused and
        decided again with the cancellation (``CANCELLED``), so the request never
        promotes and the orphans are final. Why here and not only by a turn: a turn
        rejected before the cancellation orphaned its own attempt's effects only, and a
        claim whose holder vanished was published nowhere (an outside review, session
        38). A chain's first response publishes nothing here: another attempt of its
        request, in another partition, may be promoting with an effect it replays
        (its turn's ``CANCELLED`` orphans what is its own)."""
        self.ledger.record_cancellation(Cancellation(
            cancel.tenant_id, cancel.idempotency_key, cancel.response_id, cancel.cancelled_at,
            request_scope(cancel)))
        self.mark(cancel.tenant_id, cancel.partition_key, cancel.idempotency_key)
        if _first_of_chain(cancel):
            return ()
        facts = self.effects_of(cancel)
        if not facts.effects and not facts.claims:
            return ()  # the common cancellation: nothing ran
        damaged = promotion.damaged_claim(facts.claims)
        if damaged is not None:
            withheld("cancellation", "request %s cancelled; its claims cannot be read: %s",
                     cancel.idempotency_key, damaged)
            return ()
        try:
            promoted = self.store.promoted_key(cancel.tenant_id, cancel.partition_key,
                                               cancel.idempotency_key, cancel.response_id,
                                               first_of_chain=False)
        except CorruptPartition as exc:
            withheld("cancellation", "request %s cancelled; whether it stands promoted "
                     "cannot be read: %s", cancel.idempotency_key, exc)
            return ()
        if promoted is not None:
            return ()
        key = cancel.partition_key.encode()
        return tuple(Outbound(self.topics.orphaned_effects, key,
                              orphaned_event(cancel, cancel.partition_key, orphan))
                     for orphan in promotion.cancellation_orphans(facts.effects, facts.claims))

    def _no_other_attempt(self, effect: ToolEffect) -> bool:
        """For an effect of a chain's first response: no other attempt of its request
        (another first response, another partition, whose batch asserts none of this
        partition's facts) can be promoted, now or later (``_settle_request``). False:
        another attempt stands promoted (its outcome decided the effect's fate: used,
        or orphaned by it)."""
        held, promoted = self._settle_request(effect.tenant_id, effect.idempotency_key,
                                              effect.response_id)
        if not held:
            return promoted is None
        # Held by this response: its own turn, in this partition, is decided already
        # (not promoted: rejected) or comes later and is CANCELLED. Its status says so
        # now, so that another attempt finding the request held by it is CONFLICT
        # instead of waiting for a turn that may never be sent.
        if self.ledger.status(effect.tenant_id, effect.response_id).status is not (
                ResponseState.REJECTED):
            self.ledger.mark_rejected(
                effect.tenant_id, effect.response_id, RejectionReason.CANCELLED.value,
                f"request {effect.idempotency_key} was cancelled")
        return True

    def _settle_request(self, tenant_id: str, idempotency_key: str,
                        response_id: str) -> tuple[bool, CheckpointRecord | None]:
        """Before orphaning the effects of a cancelled chain's first response: settle
        whether another attempt of its request can still be promoted. The request's
        claim is taken for ``response_id`` if free: (True, None), held by it, no other
        attempt ever promotes (every other is ``CONFLICT``). Held by another first
        response, which may promote (a batch in flight asserts its own partition's
        facts mark only): the request's facts are marked there too, so that batch is
        refused and decided again with the cancellation, and every later one reads it;
        only a promotion that landed before the mark can stand: (False, it or None).
        Raises ``CorruptPartition`` when the holder's partition is damaged (also if the
        damage, or the holder's claim, came after the caller's first lookup): both
        callers then publish nothing."""
        holder = self.store.hold_request(tenant_id, idempotency_key, response_id)
        if holder.response_id == response_id:
            return True, None
        self.mark(tenant_id, holder.partition_key, idempotency_key)
        return False, self.store.promoted_key(tenant_id, holder.partition_key,
                                              idempotency_key, holder.response_id,
                                              first_of_chain=True)

    def mark(self, tenant_id: str, key: str, idempotency_key: str) -> None:
        """After a fact of the request is durable (also when it was already there: a
        redelivery after a crash between the fact and its mark): a promotion of the
        request decided without it is refused (``FactsChanged``)."""
        mark = self.store.mark_request_facts(tenant_id, key, idempotency_key)
        self.tails.learn_facts_mark(tenant_id, key, idempotency_key, mark)

    def effects_of(self, turn: TurnCompleted | TurnCancelled) -> TurnFacts:
        """The request's facts as far as its orphans need them (effects and claims)."""
        return self.ledger.turn_facts(
            event_id=turn.event_id, tenant_id=turn.tenant_id,
            idempotency_key=turn.idempotency_key, conversation_id=None,
            scope=request_scope(turn))

    def read(self, turn: TurnCompleted, key: str, owner: str | None,
                    mark: str | None | object = UNKNOWN) -> tuple[TurnFacts, str | None]:
        """The request's facts and the facts mark they go with. An unknown mark is read
        first: a fact recorded after that read changes the mark, so the batch that
        asserts it is refused instead of missing the fact."""
        if mark is UNKNOWN:
            mark = self.store.request_facts_mark(turn.tenant_id, key, turn.idempotency_key)
        assert mark is None or isinstance(mark, str)
        conversation = turn.conversation_id
        facts = self.ledger.turn_facts(
            event_id=turn.event_id, tenant_id=turn.tenant_id,
            idempotency_key=turn.idempotency_key,
            conversation_id=conversation if owner is None else None, scope=request_scope(turn))
        if owner is not None:
            facts = replace(facts, conversation_owner=owner)
        if facts.cancellation is not None:
            try:
                if self._cancelled_after_promotion(turn, facts.cancellation):
                    facts = replace(facts, cancellation=None)
            except CorruptPartition as exc:
                log.error("whether the cancellation of request %s came after its promotion "
                          "cannot be read: %s", turn.idempotency_key, exc)
                facts = replace(facts, cancellation_unsettled=str(exc))
        return facts, mark

    def _cancelled_after_promotion(self, turn: TurnCompleted, cancel: Cancellation) -> bool:
        """A cancellation of a request that stands promoted came after its promotion,
        since one that came before would have prevented it (CONTRACT 4): it changes
        nothing, whichever attempt's response id it names, so later retries of the
        request still get DUPLICATE / IDEMPOTENCY_KEY_REUSED naming the promoted
        response. Asked only when a cancellation exists (rare). A damaged row of the
        response id it names tells nothing of the request (that id may be another
        request's): the request's own key is asked. Raises ``CorruptPartition`` when
        that lookup meets damage: the order cannot be told, and the turn is ``CORRUPT``
        (``cancellation_unsettled``), never promoted. Session 49 answered a retry under
        another response id ``CANCELLED`` when the promotion's own row was damaged, a
        request that stands promoted (found by an outside review)."""
        try:
            promoted = self.store.get_checkpoint(cancel.tenant_id, cancel.response_id)
        except CorruptPartition:
            promoted = None
        if promoted is not None and _of_request(turn, promoted):
            return True
        return self.promoted_request(turn) is not None

    def promoted_request(self, turn: TurnCompleted) -> CheckpointRecord | None:
        """The checkpoint the turn's request stands promoted with (by any attempt, under
        any response id: ``CheckpointStore.promoted_key``), or None. From the request's
        key alone, so that a turn the store could never take (a damaged item, a
        timestamp out of range) still learns it: its rejection must not orphan what the
        promotion used. None for a continued chain turn without a root (no partition
        to look in: its effects are keyed to one it does not name)."""
        try:
            key = partition_key(turn)
        except MissingChainRoot:
            return None
        return self.store.promoted_key(turn.tenant_id, key, turn.idempotency_key,
                                       turn.response_id, first_of_chain=_first_of_chain(turn))

    def promoted_items(self, promoted: CheckpointRecord) -> tuple[bool, tuple[Item, ...]]:
        """The stored items of ``promoted``, verified against its checkpoint: (known,
        items). Not known (logged: the partition needs an operator) when the row is
        gone, damaged, or does not match the checkpoint: then an effect it does not list
        may still be in its history, and none is orphaned."""
        try:
            snapshot = self.store.read_turn(promoted.tenant_id, promoted.partition_key,
                                            promoted.response_id)
            stored = None if snapshot is None else snapshot.checkpoints.get(
                promoted.response_id)
            if stored is None or stored.items_digest != promoted.items_digest:
                raise CorruptPartition(f"turn row of {promoted.response_id} is missing or "
                                       "differs from the request's promotion")
            items = snapshot.items.get(promoted.response_id, NO_ITEMS)
            failure = verify_turn_items(stored, items)
            if failure is not None:
                raise CorruptPartition(f"{failure.reason.value}: {failure.detail}")
        except CorruptPartition as exc:
            withheld("promoted_items", "orphans of request %s not published: the items of "
                     "its promotion %s cannot be read: %s", promoted.idempotency_key,
                     promoted.response_id, exc)
            return False, ()
        return True, items.items()

    def orphans_known(self, turn: TurnCompleted,
                      verdict: Reject) -> tuple[bool, CheckpointRecord | None]:
        """``promoted_request`` for a rejection's orphans: (known, promoted). Not known
        when the rows that say it are damaged (``CorruptPartition``): then any effect
        could be one the promotion used, and none is orphaned (logged: the partition
        needs an operator; the rejection itself is still published), nor for a continued
        chain turn without a root: the request's effects are the chains' (request scope)
        but the partition its promotion would be in is not named."""
        try:
            partition_key(turn)
        except MissingChainRoot:
            log.warning("orphans of %s not published: a continued chain turn without a "
                        "chain_root_id names no partition to find request %s's promotion in",
                        turn.response_id, turn.idempotency_key)
            return False, None
        try:
            promoted = self.promoted_request(turn)
            if (promoted is None and verdict.reason is RejectionReason.CANCELLED
                    and _first_of_chain(turn)):
                # Another attempt (another partition) may be promoting with the effects
                # this rejection would orphan: settle it first, as for a late effect.
                promoted = self._settle_request(turn.tenant_id, turn.idempotency_key,
                                                turn.response_id)[1]
            return True, promoted
        except CorruptPartition as exc:
            withheld("rejection", "orphans of %s not published: whether request %s stands "
                     "promoted cannot be read: %s", turn.response_id, turn.idempotency_key,
                     exc)
            return False, None


def withheld(where: str, message: str, *args: object) -> None:
    """Tell the operator that orphans were withheld on damage: one error line
    ``orphans withheld (<where>): ...`` and ``ratchet_worker_orphans_withheld_total{where}``
    (docs/operations.md, "Troubleshooting"). Nothing is published for such a request
    until an operator has decided: publishing an orphan wrongly orders a used side
    effect undone, which is worse than publishing none."""
    metrics.orphans_withheld(where).inc()
    log.error("orphans withheld (%s): " + message, where, *args)


def _first_of_chain(event: TurnCompleted | ToolEffect) -> bool:
    """A chain's first response: its partition is its own response id (a turn: no
    ``previous_response_id``; a tool effect names its own attempt's response)."""
    if event.conversation_id is not None or getattr(event, "previous_response_id", None):
        return False
    return partition_key(event) == event.response_id


def _of_request(turn: TurnCompleted, promoted: CheckpointRecord) -> bool:
    """``promoted`` is a promotion of the turn's own request: its key in the turn's
    partition (the store's idempotency record is per partition), or, for a chain's first
    response, another first response of the request (its attempts are partitions of
    their own)."""
    if promoted.idempotency_key != turn.idempotency_key:
        return False
    try:
        if promoted.partition_key == partition_key(turn):
            return True
    except MissingChainRoot:
        return False
    return (_first_of_chain(turn) and promoted.mode is PromotionMode.CHAIN
            and promoted.parent_response_id is None)


