"""The store's answers the thread path gives itself, for a turn that never reaches the
store's write or that the write refused: a retry of a request that stands promoted
(``DUPLICATE`` / ``IDEMPOTENCY_KEY_REUSED``), ordering against a head the turn does not
extend (``CONFLICT`` / ``OUT_OF_ORDER``), a chain parent not there or another tenant's,
a lineage that cannot be read, damaged rows, a request held by another chain's first
response. Each in the order the write would answer (docs/gateway-protocol.md,
section 7); rare paths, each a read or two."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ratchet.domain import promotion
from ratchet.domain.history import (
    IGNORING_EXPIRY,
    CheckpointRecord,
    HistoryFailure,
    HistoryFailureReason,
)
from ratchet.domain.plan import (
    AheadOfHead,
    Conflict,
    Duplicate,
    KeyReused,
    LineageChanged,
    ParentMissing,
    Plan,
    PromotionRequest,
    ResponseClaim,
    TooLarge,
)
from ratchet.domain.promotion import Facts, JudgeOnly, Reject, Verdict
from ratchet.domain.validation import EMPTY_PAIRING, PairingState, pairing_state_of
from schemas.models import RejectionReason, TurnCompleted
from services.ledger.base import Ledger, ResponseState
from services.store.base import (
    CheckpointStore,
    CorruptPartition,
    HeadDamaged,
    InvalidPromotion,
    StoreUnavailable,
    turn_size,
)
from streams import metrics
from streams.lineage import Lineage, LineageReader
from streams.request_facts import RequestFacts

# The processor's logger: its log lines kept their name when this part left it.
log = logging.getLogger("streams.processor")


class StoreAnswers:
    """What the store would answer a turn, decided from reads (never a write)."""

    def __init__(self, store: CheckpointStore, ledger: Ledger, request_facts: RequestFacts,
                 lineages: LineageReader, clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.ledger = ledger
        self.request_facts = request_facts
        self.lineages = lineages
        self.clock_ms = clock_ms

    def out_of_lineage(self, turn: TurnCompleted, lineage: Lineage,
                       known: Facts) -> Verdict | LineageChanged | None:
        """The write's answer to a turn whose pairing failed against a lineage it does
        not extend (a Conversation head it does not expect, a chain parent that is not
        there), or None when it does extend it (its own pairing failed: that stands).
        Such a turn is not judged by a pairing against a history that is not its own:
        its other checks stand, in their order (its boundary proof, its effects), then
        the store's judgement (``CheckpointStore.judge``: one view read at SERIAL,
        never a write), which answers in the write's own order (docs/gateway-protocol.md,
        section 7): the size rule (``UNSUPPORTED_FORMAT``), the request standing promoted
        (``DUPLICATE`` / ``IDEMPOTENCY_KEY_REUSED``, or its promotion again under its
        own response id), a response id another request promoted in the partition
        (``CONFLICT`` naming it), damaged rows (``CORRUPT``), then ordering
        (``CONFLICT`` / ``OUT_OF_ORDER``, ``PARENT_NOT_PROMOTED`` / ``TENANT_MISMATCH``).
        ``LineageChanged``: the write would put the turn on another lineage than the one
        read for it (a parent promoted, a head moved since): decided again from a fresh
        read. Until session 48 this answer was assembled from reads of its own, which
        skipped the size rule, read damaged request rows as "not promoted" and answered
        a parent promoted since that read ``PARENT_NOT_PROMOTED``."""
        if not _off_its_lineage(turn, lineage):
            return None
        off = promotion.decide_off_lineage(turn, self.clock_ms(), known)
        if isinstance(off, Reject):
            return off
        assert isinstance(off, JudgeOnly)
        extends = None if lineage.tail is None else lineage.tail.response_id
        try:
            outcome = self.store.judge(off.request, extends)
        except (InvalidPromotion, CorruptPartition) as exc:  # as the write's are answered
            return self.refused_by_store(turn, exc)
        if isinstance(outcome, Plan):
            if outcome.parent_response_id == extends:
                return None  # it extends the lineage it was paired against after all
            return LineageChanged(outcome.parent_response_id)
        if isinstance(outcome, ParentMissing):
            return self.parent_missing(turn, outcome)
        return promotion.interpret(turn, outcome)

    def refused_by_store(self, turn: TurnCompleted,
                          exc: InvalidPromotion | CorruptPartition) -> Reject:
        """The answer when the store refuses a request (validation let through what it
        refuses) or meets damaged rows, in a write or a judgement alike: ``CORRUPT``,
        recorded and published like any rejection (not a dead letter: the event itself
        is fine, and a redelivery must get the same answer). The head's own damage
        (``HeadDamaged``, ordering's input) is answered as a lineage that cannot be
        read: ordering against the head cells first; other damage (the request's
        idempotency record, an undecodable row) is an answer that comes before
        ordering and cannot be decided."""
        if isinstance(exc, InvalidPromotion):
            return Reject(RejectionReason.CORRUPT, f"store refused the turn: {exc}")
        if isinstance(exc, HeadDamaged):
            log.error("promotion of %s met a corrupt partition: %s", turn.response_id, exc)
            return self._against_damaged_head(turn, HistoryFailure(
                HistoryFailureReason.CORRUPT_HISTORY, f"stored partition is corrupt: {exc}"))
        return damaged_rows(turn, exc)

    def retry_unpaired_by_its_original(self, turn: TurnCompleted,
                                        known: Facts) -> Reject | None:
        """A retry of a request that stands promoted, whose pairing failed only because
        of its original: sent on a history that holds the original (a gateway that lost
        the answer rehydrates the head, which is the original), its calls are "not
        unique" because the original put them there. It is answered as the retry it is
        (CONTRACT 4: ``DUPLICATE`` naming the original, ``IDEMPOTENCY_KEY_REUSED``), as
        one with message items only is. Told from a retry whose own items break the
        rules (an output answering no call: ``UNPAIRED_TOOL_CALL`` stands, the event's
        own reason comes first) by its pairing against the history the original
        extended. None otherwise, or when that history cannot be read (the pairing
        rejection stands: fail closed). Only on an ``UNPAIRED_TOOL_CALL`` (rare). A retry
        under the original's own response id with its digest is no retry of it here (it
        is replayed, ``VerdictRecorder.already_promoted``); with another digest it is a key reuse like
        any other (an outside review, session 36: it was answered UNPAIRED_TOOL_CALL)."""
        original = self._promoted_original(turn)
        if original is None or (original.response_id == turn.response_id
                                and original.request_digest == turn.request_digest):
            return None
        before = EMPTY_PAIRING
        if original.parent_response_id is not None:
            # A claim naming no partition, where that history must be located, is the
            # read's typed failure (``CORRUPT_HISTORY``, session 51), not a raise.
            found = self.store.read_history(
                turn.tenant_id, response_id=original.parent_response_id,
                partition_key=original.partition_key, now=IGNORING_EXPIRY)
            if isinstance(found, HistoryFailure):
                return None
            state = pairing_state_of(found.items)
            if not isinstance(state, PairingState):
                return None
            before = state
        again = promotion.validate_after(turn, self.clock_ms(), before)
        if again.reason is RejectionReason.UNPAIRED_TOOL_CALL:
            return None  # its own items break the rules wherever it is sent
        # Its checks after pairing stand (its boundary proof, its effects), before the
        # write's answer (section 7's order).
        rejected = promotion.decide_turn(turn, again, known)
        if isinstance(rejected, Reject):
            return rejected
        # The write's first answer is its size rule, before the request's promotion
        # (until session 48's second outside review, DUPLICATE for an oversized retry).
        size, limit = turn_size(rejected.request), self.store.options.max_turn_bytes
        if size > limit:
            return promotion.interpret(turn, TooLarge(size, limit))
        return self._retry_verdict(turn, original)

    def _promoted_original(self, turn: TurnCompleted) -> CheckpointRecord | None:
        """``promoted_request``, None when the rows that say it are damaged (logged)."""
        try:
            return self.request_facts.promoted_request(turn)
        except CorruptPartition as exc:  # damaged rows: the caller's rule decides
            log.error("%s: whether request %s stands promoted cannot be read: %s",
                      turn.response_id, turn.idempotency_key, exc)
            return None

    @staticmethod
    def _retry_verdict(turn: TurnCompleted, original: CheckpointRecord) -> Reject | None:
        """The store's answer to ``turn`` given the promotion its request stands with."""
        if original.request_digest == turn.request_digest:
            if original.response_id == turn.response_id:
                return None
            outcome: Duplicate | KeyReused = Duplicate(original)
        else:
            outcome = KeyReused(original.request_digest, original.response_id)
        verdict = promotion.interpret(turn, outcome)
        return verdict if isinstance(verdict, Reject) else None

    def on_unreadable_lineage(self, turn: TurnCompleted, failure: HistoryFailure,
                              known: Facts, request: PromotionRequest | None) -> Verdict:
        """The answer to a turn (valid on its own) whose lineage is stored but cannot be
        read: its pairing cannot be checked, and the history it would end could never
        be served. ``request``: the turn as it would be written (None when its pairing
        failed against the empty state read for it: every other rule is applied here
        first, in its order, as off the lineage). Then the store's judgement
        (``CheckpointStore.judge``, one view read at SERIAL), the write's answers in the
        write's order: the size rule (``UNSUPPORTED_FORMAT``), the request standing
        promoted (``DUPLICATE`` / ``IDEMPOTENCY_KEY_REUSED``, or its promotion again
        under its own id), the response id bound in the partition (``CONFLICT`` naming
        it), damaged request rows (``CORRUPT``), ordering against the head (``CONFLICT``
        / ``OUT_OF_ORDER``). Else the read's reason: an item type or format this version
        does not know (e.g. written by a newer one) is ``UNKNOWN_ITEM_TYPE`` /
        ``UNSUPPORTED_FORMAT``, damaged or missing rows ``CORRUPT``; so is a view that
        would plan the turn and a chain parent the view does not find (the read found
        something there). A head the store finds damaged: ordering against its cells
        (``_against_damaged_head``), as after the write. Until
        session 48's second outside review this was assembled from reads of its own
        (``_before_ordering``), which answered a retry before the size rule and read a
        damaged idempotency record as "not promoted". The read's detail goes to the log
        only (it may quote stored data)."""
        if request is None:
            off = promotion.decide_off_lineage(turn, self.clock_ms(), known)
            if isinstance(off, Reject):
                return off
            assert isinstance(off, JudgeOnly)
            request = off.request
        try:
            outcome = self.store.judge(request)
        except (InvalidPromotion, CorruptPartition) as exc:  # HeadDamaged: the cells' order
            return self.refused_by_store(turn, exc)
        if not isinstance(outcome, Plan | ParentMissing):
            return promotion.interpret(turn, outcome)
        return _unreadable(turn, failure)

    def lineage_never_read(self, turn: TurnCompleted, named: str | None,
                           misses: int, *, told: bool = True, differs: bool = False) -> Reject:
        """The answer to a turn whose lineage the store's view names (``named``: the
        response it would extend, at SERIAL) while ``misses`` fresh history reads in a
        row after it did not extend that response (``TurnDecider``,
        ``MAX_LINEAGE_MISSES``). A healthy store never gets here: the view's SERIAL read
        completes a promotion in flight, so the next read sees it. Left are rows the
        read skips and the view takes (a row filed under another tenant) or a store
        whose two reads disagree: the history the turn would extend cannot be read,
        so its pairing cannot be checked and the history it would end could never be
        served: ``CORRUPT``, like any lineage that cannot be read (never a promotion,
        never a retry without end). Counted, and logged by ``_unreadable``, unless not
        ``told`` (a decision the caller makes again before recording anything).
        ``differs``: the reads did extend ``named``, but with a copy of its row the
        write found changed (``_parent_changed``): the stored row is not the one a
        verified read gives, damage as far as the turn can tell (``CORRUPT_HISTORY``;
        session 50)."""
        failure = (HistoryFailure(
            HistoryFailureReason.CORRUPT_HISTORY,
            f"the store's view of {named} differs from the copy {misses} verified history "
            f"reads in a row gave") if differs else HistoryFailure(
            HistoryFailureReason.MISSING_HISTORY,
            f"the store's view names {named}, {misses} history reads in a row missed it"))
        if not told:
            return _rejection_of(failure)
        metrics.LINEAGE_READ_MISSES.inc()
        return _unreadable(turn, failure)

    def _against_damaged_head(self, turn: TurnCompleted, failure: HistoryFailure) -> Reject:
        """A Conversation turn whose head the store finds damaged (``HeadDamaged``: cells
        no row backs, a head lost while turns stand), raised after the answers that come
        before ordering found none, or before them when the head went back: ordered
        against the head cells as they read (``CONFLICT`` / ``OUT_OF_ORDER``), else the
        read's reason (``CORRUPT``)."""
        expected = turn.expected_head_seq
        seq = self.lineages.readable_head_seq(turn)
        if expected is not None and seq is not None and expected != seq:
            verdict = promotion.interpret(
                turn, Conflict(seq) if expected < seq else AheadOfHead(seq))
            assert isinstance(verdict, Reject)
            return verdict
        return _unreadable(turn, failure)

    def parent_missing(self, turn: TurnCompleted, outcome: ParentMissing) -> Verdict:
        """The write's ``ParentMissing`` answered: ``TENANT_MISMATCH`` when another
        tenant promoted the parent id (``chain_owner``), else ``PARENT_NOT_PROMOTED``;
        ``CORRUPT`` when a checkpoint row that lookup reads is damaged (which tenant's
        the parent is cannot be told: never a dead letter, session 49)."""
        try:
            owner = self.chain_owner(turn, outcome.previous_response_id)
        except CorruptPartition as exc:
            return damaged_rows(turn, exc)
        return promotion.interpret(turn, outcome, owner)

    def chain_owner(self, turn: TurnCompleted, response_id: str) -> str | None:
        """The tenant that promoted chain response ``response_id`` (another tenant's
        parent is ``TENANT_MISMATCH``), or None. The owner row is written beside the
        promotion batch, so it may name a tenant whose batch was then refused: another
        tenant counts only if its checkpoint is there (asked on this rare path only).
        Response ids are per tenant and the row holds the last tenant written: when it
        names another, this tenant may have promoted the id too (in another chain than
        the turn names), and then the parent is its own, not another tenant's."""
        found = self.ledger.response_owner(response_id)
        if found is None or found == turn.tenant_id:
            return found
        if self.store.get_checkpoint(turn.tenant_id, response_id) is not None:
            return turn.tenant_id
        return found if self.store.get_checkpoint(found, response_id) is not None else None

    def held_by_another_response(self, turn: TurnCompleted, holder: ResponseClaim) -> Reject:
        """A chain's first response whose request another first response holds, not
        promoted: if that response was rejected, the request is bound to it and this
        one is ``CONFLICT`` (a retry keeps its response id); undecided (its event still
        in flight in its own partition), wait for it: retried, like a store outage."""
        state = self.ledger.status(turn.tenant_id, holder.response_id).status
        if state is ResponseState.REJECTED:
            return Reject(RejectionReason.CONFLICT, f"request {turn.idempotency_key} is bound "
                          f"to response {holder.response_id}, which was not promoted")
        raise StoreUnavailable(
            f"request {turn.idempotency_key} is held by response {holder.response_id} "
            "(the first response of another chain), not decided yet", retryable=True,
            operation="promote/request-claim")


def damaged_rows(turn: TurnCompleted, exc: CorruptPartition) -> Reject:
    """The answer to a turn that met damaged rows other than the head's (an
    undecodable row, a damaged idempotency record), in the write, a judgement or a
    lookup of a promotion (``get_checkpoint``): what they hold cannot be known, so
    neither can an answer that depends on it: ``CORRUPT``, recorded like any rejection.
    Logged: the partition needs an operator."""
    log.error("promotion of %s met a corrupt partition: %s", turn.response_id, exc)
    return Reject(RejectionReason.CORRUPT, f"stored partition is corrupt: {exc}")


def _off_its_lineage(turn: TurnCompleted, lineage: Lineage) -> bool:
    """Whether ``turn`` does not extend ``lineage`` as read (a cached lineage is the one
    the turn expects): a Conversation turn expecting another head than the one read
    (or expecting none, taken for a new Conversation from the turn alone, which only
    the store's view can confirm), a chain turn whose parent was not there."""
    if lineage.cached:
        return False
    if turn.conversation_id is not None:
        expected = turn.expected_head_seq
        if lineage.tail is None and not lineage.unread:
            return expected == 0  # ``starts_lineage``: whether one exists decides
        head = 0 if lineage.absent else None if lineage.tail is None else lineage.tail.seq
        return head is not None and expected is not None and expected != head
    return turn.previous_response_id is not None and lineage.absent


def _unreadable(turn: TurnCompleted, failure: HistoryFailure) -> Reject:
    """The rejection of a turn extending a lineage a read could not verify, by the
    read's reason; its detail (it may quote stored data) to the log only."""
    log.error("%s extends a lineage that cannot be read: %s: %s", turn.response_id,
              failure.reason.value, failure.detail)
    return _rejection_of(failure)


def _rejection_of(failure: HistoryFailure) -> Reject:
    """``_unreadable``'s rejection, not logged."""
    reason = _UNREADABLE.get(failure.reason, RejectionReason.CORRUPT)
    return Reject(reason, f"the history this turn extends cannot be read "
                  f"({failure.reason.value}): it cannot be continued")


# The rejection of a turn extending a lineage a read could not verify, by the read's
# reason (any other: CORRUPT).
_UNREADABLE = {
    HistoryFailureReason.UNKNOWN_ITEM_TYPE: RejectionReason.UNKNOWN_ITEM_TYPE,
    HistoryFailureReason.UNSUPPORTED_FORMAT: RejectionReason.UNSUPPORTED_FORMAT,
}
