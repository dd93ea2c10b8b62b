"""The promotion processor core: one consumed record in, the records to publish out.

This is the Faust-free part of the agent. ``handle_async`` runs the common promotion
on the event loop (below) and hands everything else to ``handle``, the synchronous
path, in a worker thread (the store and ledger drivers block there). ``handle`` does,
for one record:

* decode it; an undecodable record becomes a ``DeadLetter`` (never an exception);
* ``ToolEffect``: record it in the ledger (dedupe by effect_id), then the request's
  facts mark; publishes it ``EffectOrphaned`` only if its request already stands
  promoted without it (an effect arriving after the promotion) or cancelled
  (``streams/request_facts.py``);
* ``TurnCancelled``: record the cancellation, then the facts mark; publishes the
  request's effects and claims ``TURN_CANCELLED`` when it stands promoted nowhere;
* ``TurnCompleted``: decide it as if the request had no facts (the promotion batch
  asserts that: no facts mark) unless they are needed or known to exist, then read
  them; replay an earlier rejection of this very event if there is one, else take the
  pairing state of the lineage the turn extends from the tail cache
  (``streams/tail_cache.py``) or a history read (``streams/lineage.py``), call the pure domain
  (``ratchet.domain.promotion``), make the outcome durable, and return
  ``CheckpointPromoted`` / ``PromotionRejected`` plus any ``EffectOrphaned``. The store
  writes the turn only on top of the lineage it was checked against (``extends``) and
  the facts it was decided with (``facts_mark``); a rejection decided without the facts
  or with cached facts is decided again from fresh reads.

Every write is idempotent, so handling the same record again (redelivery after a
crash, or a retry after an ``Unavailable``) returns the same outcome and
never promotes twice. Publishing and acking are the caller's job (``streams/app.py``)
and happen strictly after this returns.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

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
    FactsChanged,
    KeyReused,
    LineageChanged,
    ParentMissing,
    Plan,
    RequestHeld,
    ResponseClaim,
)
from ratchet.domain.promotion import (
    Accepted,
    Facts,
    JudgeOnly,
    Promote,
    Reject,
    Verdict,
)
from ratchet.domain.validation import (
    EMPTY_PAIRING,
    PROMOTABLE_STATUSES,
    PairingState,
    pairing_state_of,
    request_digest_problem,
)
from schemas.avro import header_schema_id
from schemas.errors import Unavailable
from schemas.keys import MissingChainRoot, partition_key
from schemas.limits import MAX_EVENT_BYTES
from schemas.models import (
    DeadLetter,
    DeadLetterReason,
    GatewayEvent,
    RejectionReason,
    ToolEffect,
    TurnCancelled,
    TurnCompleted,
)
from services.ledger.base import (
    Decision,
    Ledger,
    ResponseState,
    TurnFacts,
)
from services.store.base import (
    CheckpointStore,
    CorruptPartition,
    HeadDamaged,
    InvalidPromotion,
    StoreUnavailable,
)
from streams import metrics
from streams.identity_checks import _first_of_chain, identity_problem, unquotable_field
from streams.lineage import Lineage, LineageReader
from streams.outcomes import (
    orphaned_event,
    promoted_event,
    rejected_event,
)
from streams.promotion_hints import _Hints
from streams.records import DecodeFailed, EventCodec, Outbound, RawRecord, TurnBeyondLimits
from streams.request_facts import UNKNOWN, RequestFacts
from streams.tail_cache import TailCache
from streams.topics import Topics

log = logging.getLogger(__name__)

# How often a turn is decided again because the lineage it extends moved meanwhile
# (another promoter on the same partition) before the attempt is retried as a whole.
MAX_LINEAGE_ROUNDS = 4
# How often the request's facts may change under one decision before the attempt is
# retried as a whole (each change is a fact recorded meanwhile: rare).
MAX_FACTS_ROUNDS = 4
# The largest record promoted on the event loop: decoding, validating and binding a
# turn is CPU work that holds up every other lane meanwhile (~0.5 ms for a few KiB; a
# turn near the 10 MiB limit would take the loop for a long while). Larger ones go
# to a thread.
LOOP_MAX_RECORD_BYTES = 256 * 1024
# No fact of the request read (the fast path): what the batch asserts with no mark.
_NO_FACTS = TurnFacts(decision=None, effects=(), cancellation=None, conversation_owner=None)
# Not known yet (a facts mark, an owner): read it.
_UNKNOWN = UNKNOWN


def lane_name(record: RawRecord) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


@dataclass(frozen=True)
class Handled:
    """What handling one record produced: records to publish and a label for metrics."""

    outbound: tuple[Outbound, ...]
    kind: str  # promoted | rejected | dead_lettered | effect | cancel


class PromotionProcessor:
    """Decode -> decide -> write durably; returns what to publish. Thread-safe.

    Cassandra is the source of truth. The only state kept between records is the
    bounded tail cache (``streams/tail_cache.py``): facts about promoted lineages that
    save reads, never decide a rejection alone, and never grow past a fixed size.
    """

    def __init__(self, store: CheckpointStore, ledger: Ledger, codec: EventCodec,
                 topics: Topics, clock_ms: Callable[[], int] | None = None,
                 tails: TailCache | None = None) -> None:
        self.store = store
        self.ledger = ledger
        self.codec = codec
        self.topics = topics
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        # Bounded memory of promoted lineages (pairing state, heads, owners); see
        # streams/tail_cache.py. ``TailCache(capacity=0)`` turns it off.
        self.tails = tails if tails is not None else TailCache()
        self.lineages = LineageReader(store, self.tails, self.clock_ms)
        self.request_facts = RequestFacts(store, ledger, self.tails, topics)
        self.cache_rechecks = 0  # rejections decided from cached facts, decided again
        self.loop_promotions = 0  # turns promoted on the event loop (``handle_async``)

    @property
    def cache_hits(self) -> int:
        return self.lineages.cache_hits

    @property
    def cache_misses(self) -> int:
        return self.lineages.cache_misses

    # -- entry point -------------------------------------------------------------------
    def handle(self, record: RawRecord) -> Handled:
        """Handle one record; raises only ``Unavailable`` (store, ledger or registry
        down: retry later)."""
        try:
            size = len(record.value or b"")
            beyond = (f"event of {size} bytes exceeds the protocol maximum of "
                      f"{MAX_EVENT_BYTES} bytes" if size > MAX_EVENT_BYTES else None)
            try:
                event: GatewayEvent = self.codec.decode(record)
            except TurnBeyondLimits as exc:
                event, beyond = exc.turn, exc.detail
            if isinstance(event, ToolEffect | TurnCancelled):
                problem = identity_problem(event, record.key) or beyond
                if problem is not None:
                    # No outcome topic to reject it on, and no row may be keyed by such
                    # an id or hold such a record, or it is out of its request's order:
                    # the record is parked, bytes kept.
                    raise DecodeFailed(DeadLetterReason.INVALID_EVENT, problem)
                if isinstance(event, ToolEffect):
                    return Handled(self.request_facts.record_effect(event), "effect")
                return Handled(self.request_facts.record_cancel(event), "cancel")
            unquotable = unquotable_field(event)
            if unquotable is not None:
                raise DecodeFailed(DeadLetterReason.INVALID_EVENT, unquotable)
            problem = identity_problem(event, record.key)
            if problem is not None:
                return self._on_bad_identity(event, problem)
            if beyond is not None:
                return self._on_turn_beyond_limits(event, beyond)
            return self._on_turn(event)
        except DecodeFailed as exc:
            return Handled((self._dead_letter(record, exc),), "dead_lettered")
        except Unavailable:
            raise
        except Exception as exc:
            # A bug met by this one record: park the record (bytes kept) in the dead
            # letters instead of crashing or stalling the partition forever.
            log.exception("unexpected error on %s; dead-lettering the record",
                          lane_name(record))
            failed = DecodeFailed(DeadLetterReason.UNKNOWN,
                                  f"processing failed: {type(exc).__name__}: {exc}")
            return Handled((self._dead_letter(record, failed),), "dead_lettered")

    async def handle_async(self, record: RawRecord,
                           in_thread: Callable[[Callable[[], Handled]], Awaitable[Handled]]
                           ) -> Handled:
        """``handle`` with its common case on the event loop: a turn that promotes from
        the tail cache with no fact of its request recorded (``_promote_on_loop``).
        Everything else, and every turn that does not promote that way, is handled by
        ``handle`` through ``in_thread`` (the drivers block), from the start: each
        write of the attempt on the loop is idempotent, so ``handle`` finds what it
        left (the claim is the request's own, a landed batch is its own promotion)."""
        try:
            handled = await self._promote_on_loop(record)
        except Exception as exc:  # noqa: BLE001 - the thread path decides and retries
            log.debug("%s: promotion on the loop gave way to the thread path (%r)",
                      lane_name(record), exc)
            handled = None
        if handled is not None:
            self.loop_promotions += 1
            metrics.events_by_path("loop").inc()
            return handled
        metrics.events_by_path("thread").inc()
        return await in_thread(lambda: self.handle(record))

    async def _promote_on_loop(self, record: RawRecord) -> Handled | None:
        """The fast path of ``_on_turn`` without a thread, or None (nothing decided).

        Taken only when no read but the owner's is needed: the record decodes without
        the registry and is at most ``LOOP_MAX_RECORD_BYTES``; it is a promotable
        ``TurnCompleted`` that uses no tool effects, has only ids the API can serve and is
        not a chain's first response (which claims its request too,
        ``CheckpointStore.promote``); this worker wrote no facts mark for its request; the
        lineage it extends is in the tail cache (or it starts one). It
        awaits the claim, the promotion batch of the plan the hints give (asserting no
        facts mark) and the owners. Any other answer (a rejection, a refused or unknown
        write, a claim held by another request) returns None."""
        if not self.codec.decodes_offline(record):
            return None
        if len(record.value or b"") > LOOP_MAX_RECORD_BYTES:
            return None
        turn = self.codec.decode(record)
        if (not isinstance(turn, TurnCompleted) or turn.status not in PROMOTABLE_STATUSES
                or promotion.used_effect_ids(turn)):
            return None
        if _first_of_chain(turn):
            return None  # it claims its request and reads its facts: the thread path
        if (identity_problem(turn, record.key) is not None
                or request_digest_problem(turn.request_digest) is not None):
            return None  # rejected before any claim: the thread path
        key = partition_key(turn)
        if self.tails.facts_mark(turn.tenant_id, key, turn.idempotency_key) is not None:
            return None
        lineage = self.lineages.cached(turn)
        if lineage is None:
            return None
        claim = ResponseClaim(turn.tenant_id, turn.response_id, key, turn.idempotency_key,
                              turn.request_digest)
        claiming = asyncio.ensure_future(self.store.claim_async(claim))  # sent now
        try:
            conversation = turn.conversation_id
            owner = None if conversation is None else self.tails.owner(conversation)
            if conversation is not None and owner is None:
                owner = await self.ledger.conversation_owner_async(conversation)
            # Timed by hand, not by the histograms' ``time()`` (a context manager: six
            # calls more per use, twice per turn); observed whatever happens, like it.
            started = time.perf_counter()
            try:
                validation = promotion.validate_after(turn, self.clock_ms(), lineage.pairing)
            finally:
                metrics.VALIDATION_SECONDS.observe(time.perf_counter() - started)
            decided = promotion.decide_turn(turn, validation, Facts(
                cancelled=False, effects={}, conversation_owner=owner, claims={}))
            holder = await claiming
        finally:
            if not claiming.done():
                claiming.cancel()  # failed before the claim's answer: claimed again
        if not isinstance(decided, Promote) or holder != claim:
            return None
        hints = _Hints.of(decided, lineage)
        # A chain turn's response id owner, beside the batch (a Conversation's turns
        # own no response id: no task for an empty write).
        owners = (asyncio.ensure_future(self.ledger.record_owners_async(
            tenant_id=turn.tenant_id, response_id=turn.response_id, conversation_id=None))
            if conversation is None else None)
        started = time.perf_counter()
        try:
            promoted = await self.store.promote_from_hints_async(
                decided.request, head_hint=hints.head, parent_hint=hints.parent,
                extends=hints.extends, facts_mark=None)
        finally:
            metrics.LWT_SECONDS.observe(time.perf_counter() - started)
            if owners is not None:
                await owners  # durable before anything is published (raises if not)
        if promoted is None:
            return None
        if conversation is not None and owner is None:
            # The Conversation's owner only once its first turn is promoted (a refused
            # batch must not hand the Conversation to its tenant); durable before
            # anything is published (a crash before it: the redelivery writes it).
            await self.ledger.record_owners_async(
                tenant_id=turn.tenant_id, response_id=None, conversation_id=conversation)
        verdict = Accepted(promoted.checkpoint)
        self.lineages.learn(lineage, validation.pairing, promoted.checkpoint)
        if conversation is not None:
            self.tails.learn_owner(conversation, turn.tenant_id)
        return self._publishable(turn, key, verdict, _NO_FACTS)

    # -- TurnCompleted -------------------------------------------------------------------
    def _on_turn(self, turn: TurnCompleted) -> Handled:
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
            return self._on_unkeyed_turn(turn, exc)
        if turn.status in PROMOTABLE_STATUSES:
            problem = request_digest_problem(turn.request_digest)
            if problem is not None:
                # Before the response id's claim, which would bind the id to it; decided
                # from the event alone, recorded, and the attempt's effects orphaned.
                return self._reject_before_the_store(
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
            facts, mark = self.request_facts.read(turn, key, owner, known_mark or _UNKNOWN)
            read = True
        else:
            # A cached owner (immutable once claimed) saves the owner read.
            facts = _NO_FACTS if conversation is None else replace(
                _NO_FACTS, conversation_owner=owner or self.ledger.conversation_owner(
                    conversation))
            mark, read = None, False
        fresh = False  # decide from fresh reads only (no cached lineage or owner)
        for _ in range(MAX_FACTS_ROUNDS):
            if facts.decision is not None and facts.decision.reason is not None:
                # Never flip it: the recorded rejection, settled again (its writer may
                # have stopped before the mark or the status), unless the event stands
                # promoted (a batch that landed before the rejection's mark did).
                verdict: Verdict = self._settle_rejection(
                    turn, key, _replayed_rejection(facts.decision))
                break
            decided = self._decide_and_write(
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
            verdict = self._make_durable(turn, key, decided, facts)
            break
        else:
            raise StoreUnavailable(
                f"facts of request {turn.idempotency_key} changed {MAX_FACTS_ROUNDS} times "
                "while deciding", retryable=True, operation="promote")
        if isinstance(verdict, Accepted) and self._of_another_attempt(turn, verdict):
            verdict, facts = self._rejected_first(turn, key, verdict)
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
        return self._publishable(turn, key, verdict, facts)






    def _on_bad_identity(self, turn: TurnCompleted, problem: str) -> Handled:
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
        return self._publishable(turn, key, Reject(RejectionReason.CORRUPT, problem),
                                 _NO_FACTS)

    def _on_turn_beyond_limits(self, turn: TurnCompleted, beyond: str) -> Handled:
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
        return self._reject_before_the_store(
            turn, key, Reject(RejectionReason.UNSUPPORTED_FORMAT, beyond))

    def _on_unkeyed_turn(self, turn: TurnCompleted, missing: MissingChainRoot) -> Handled:
        """A continued chain turn without ``chain_root_id``: the partition its parent is
        in cannot be known, so it is ``PARENT_NOT_PROMOTED`` (what the store's chain
        rule answers for a parent it cannot find), decided without store reads and
        published under the turn's own response id, the only key it carries."""
        return self._reject_before_the_store(
            turn, turn.response_id, Reject(RejectionReason.PARENT_NOT_PROMOTED, str(missing)))

    def _reject_before_the_store(self, turn: TurnCompleted, key: str,
                                 reject: Reject) -> Handled:
        """A rejection decided from the event alone: recorded like any other (so the
        status endpoint and a redelivery agree), or the recorded one replayed."""
        facts = self.request_facts.effects_of(turn)
        verdict: Verdict | None
        if facts.decision is not None and facts.decision.reason is not None:
            # Never flip an outcome, also when a later retry was promoted since:
            # settled again like any replayed rejection.
            verdict = self._settle_rejection(turn, key, _replayed_rejection(facts.decision))
        elif (verdict := self._already_promoted(turn)) is not None:
            # A retry of a request that stands promoted under this response id gets the
            # promotion, whatever this event looks like (CONTRACT 4: the original outcome),
            # unless this very event was rejected first (by another worker meanwhile).
            if self._of_another_attempt(turn, verdict):
                verdict, facts = self._rejected_first(turn, key, verdict)
            if isinstance(verdict, Accepted):
                verdict = self._owned(turn, verdict, _UNKNOWN)
        else:
            verdict = self._make_durable(turn, key, reject, facts)
        return self._publishable(turn, key, verdict, facts)

    @staticmethod
    def _of_another_attempt(turn: TurnCompleted, verdict: Accepted) -> bool:
        return verdict.replayed and verdict.checkpoint.accepted_attempt != turn.attempt

    def _rejected_first(self, turn: TurnCompleted, key: str,
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
            return self._settle_rejection(turn, key, _replayed_rejection(facts.decision)), facts
        return verdict, facts

    def _decide_and_write(self, turn: TurnCompleted, facts: TurnFacts, mark: str | None, *,
                          fresh: bool = False, recheck: bool = True, owner_cached: bool = False,
                          claiming: Callable[[], ResponseClaim] | None = None
                          ) -> Verdict | FactsChanged:
        """Decide with ``facts`` (those of facts mark ``mark``) and promote if the rules
        allow; not yet durable for a rejection (the caller records it). ``fresh``: no
        cached lineage; ``recheck=False``: return a rejection decided from cached facts
        as it is (the caller decides it again from fresh reads anyway)."""
        lineage = None if fresh else self.lineages.cached(turn)
        from_cache = (lineage is not None and lineage.cached) or owner_cached
        verdict = self._decide(turn, facts, mark, lineage or self.lineages.read(turn), claiming,
                               facts_read=recheck)
        rounds = 0
        while verdict is None or (recheck and from_cache and isinstance(verdict, Reject)):
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
            # After None (the lineage, or the head the turn expects, is not what it was
            # looked up as), the lineage is read whole: a head read could lag again.
            verdict = self._decide(turn, facts, mark,
                                   self.lineages.read(turn, head_first=verdict is not None),
                                   claiming, facts_read=recheck)
        return verdict

    def _decide(self, turn: TurnCompleted, facts: TurnFacts, mark: str | None,
                lineage: Lineage, claiming: Callable[[], ResponseClaim] | None = None,
                facts_read: bool = True) -> Verdict | FactsChanged | None:
        """Validate against ``lineage``, decide, and promote if the rules allow it.

        None: the store would put the turn on another lineage than ``lineage``
        (nothing written); the caller reads the lineage again."""
        known = Facts(
            cancelled=facts.cancellation is not None,
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
            decided = self._on_unreadable_lineage(turn, lineage.unreadable)
        elif isinstance(decided, Reject) and decided.reason is RejectionReason.UNPAIRED_TOOL_CALL:
            decided = (self._retry_unpaired_by_its_original(turn, known)
                       or self._out_of_lineage(turn, lineage, known) or decided)
        if not isinstance(decided, Promote):
            # A retry of a request that stands promoted gets the promotion; but only
            # once the facts are read: a recorded rejection of this very event holds
            # (the caller reads them before making any rejection durable).
            return (self._already_promoted(turn) if facts_read else None) or decided
        verdict = self._promote(turn, decided, lineage, mark, claiming)
        if isinstance(verdict, Accepted) and not verdict.replayed:
            self.lineages.learn(lineage, validation.pairing, verdict.checkpoint)
        return verdict

    def _out_of_lineage(self, turn: TurnCompleted, lineage: Lineage,
                        known: Facts) -> Reject | None:
        """``_write_answer_out_of_lineage``, after every rule but pairing: a turn that
        does not extend the lineage it was paired against is not judged by that
        pairing, but its other checks stand, in their order (its boundary proof, its
        effects: docs/gateway-protocol.md, section 7), as off the head."""
        answer = self._write_answer_out_of_lineage(turn, lineage)
        if answer is None:
            return None
        off = promotion.decide_off_lineage(turn, self.clock_ms(), known)
        return off if isinstance(off, Reject) else answer

    def _write_answer_out_of_lineage(self, turn: TurnCompleted,
                                     lineage: Lineage) -> Reject | None:
        """Why a turn whose pairing failed does not extend ``lineage`` at all, or None.

        Pairing is checked against the lineage read for the turn: a Conversation's
        current head (which the turn may not extend: it expects an older or a newer
        one), or a chain parent that is not there. Such a turn is judged by ordering,
        as the store would judge it (CONTRACT 4: ``CONFLICT`` / ``OUT_OF_ORDER`` with the
        head; ``PARENT_NOT_PROMOTED`` / ``TENANT_MISMATCH``), not by a pairing against
        a history that is not its own. From a read only (a cached lineage is the one
        the turn expects)."""
        if lineage.cached:
            return None
        if turn.conversation_id is not None:
            expected = turn.expected_head_seq
            head = (0 if lineage.absent else None if lineage.tail is None
                    else lineage.tail.seq)
            if head is None and expected == 0 and not lineage.unread:
                # Taken for a new Conversation from the turn alone (``starts_lineage``):
                # whether one exists decides, as for any other expected head.
                stored = self.store.head(turn.tenant_id, turn.conversation_id)
                head = 0 if stored is None else stored.seq
            if head is None or expected is None or expected == head:
                return None  # the head it extends: its own pairing failed
            return self._off_head_answer(turn, head)
        parent = turn.previous_response_id
        if parent is None or not lineage.absent:
            return None
        verdict = promotion.interpret(turn, ParentMissing(parent),
                                      self._chain_owner(turn, parent))
        assert isinstance(verdict, Reject)
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
            return (self._already_promoted(turn) if facts_read else None) or decided
        assert isinstance(decided, JudgeOnly)
        if claiming is not None:
            claiming()  # the response id's binding, as a turn sent to the write takes it
        try:
            outcome = self.store.judge(decided.request, lineage.off_head_response)
        except (InvalidPromotion, CorruptPartition) as exc:  # as ``_promote`` answers them
            decided = self._refused_by_store(turn, exc)
            return (self._already_promoted(turn) if facts_read else None) or decided
        if isinstance(outcome, Plan):
            return None
        verdict = promotion.interpret(turn, outcome)
        if isinstance(verdict, Accepted):
            return verdict  # this very request, promoted: its outcome again
        return (self._already_promoted(turn) if facts_read else None) or verdict

    def _refused_by_store(self, turn: TurnCompleted,
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
        log.error("promotion of %s met a corrupt partition: %s", turn.response_id, exc)
        if isinstance(exc, HeadDamaged):
            return self._on_unreadable_lineage(turn, HistoryFailure(
                HistoryFailureReason.CORRUPT_HISTORY, f"stored partition is corrupt: {exc}"))
        return Reject(RejectionReason.CORRUPT, f"stored partition is corrupt: {exc}")

    def _off_head_answer(self, turn: TurnCompleted, head: int) -> Reject:
        """The write's answer to a Conversation turn that expects another head than
        ``head``. A retry of a promoted request first, e.g. of a turn that answered a call
        the retry now finds answered in the head (the original itself): the store's
        answer, which comes before ordering's. Then ``CONFLICT`` / ``OUT_OF_ORDER``."""
        retry = self._retry_of_promoted_request(turn)
        if retry is not None:
            return retry
        assert turn.expected_head_seq is not None and turn.expected_head_seq != head
        outcome = Conflict(head) if turn.expected_head_seq < head else AheadOfHead(head)
        verdict = promotion.interpret(turn, outcome)
        assert isinstance(verdict, Reject)
        return verdict

    def _retry_unpaired_by_its_original(self, turn: TurnCompleted,
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
        is replayed, ``_already_promoted``); with another digest it is a key reuse like
        any other (an outside review, session 36: it was answered UNPAIRED_TOOL_CALL)."""
        original = self._promoted_original(turn)
        if original is None or (original.response_id == turn.response_id
                                and original.request_digest == turn.request_digest):
            return None
        before = EMPTY_PAIRING
        if original.parent_response_id is not None:
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
        return self._retry_verdict(turn, original)

    def _promoted_original(self, turn: TurnCompleted) -> CheckpointRecord | None:
        """``promoted_request``, None when the rows that say it are damaged (logged)."""
        try:
            return self.request_facts.promoted_request(turn)
        except CorruptPartition as exc:  # damaged rows: the caller's rule decides
            log.error("%s: whether request %s stands promoted cannot be read: %s",
                      turn.response_id, turn.idempotency_key, exc)
            return None

    def _retry_of_promoted_request(self, turn: TurnCompleted) -> Reject | None:
        """The store's first answer to a turn whose request stands promoted, when the
        turn never reaches the store (its lineage is unreadable, or its pairing was
        checked against a head it does not extend): ``DUPLICATE`` under another response
        id with the same request digest, ``IDEMPOTENCY_KEY_REUSED`` with another digest
        (under any response id). None otherwise; under the same response id and digest,
        "already promoted" follows. It does not depend on the lineage."""
        original = self._promoted_original(turn)
        return None if original is None else self._retry_verdict(turn, original)

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

    def _on_unreadable_lineage(self, turn: TurnCompleted, failure: HistoryFailure) -> Reject:
        """The rejection of a turn (valid on its own) whose lineage is stored but cannot
        be read: its pairing cannot be checked, and the history it would end could never
        be served. As the store would answer, a retry of a request promoted under
        another response id first (``DUPLICATE`` / ``IDEMPOTENCY_KEY_REUSED``), then
        ordering: a Conversation turn that does not expect the current head is
        ``CONFLICT`` / ``OUT_OF_ORDER``. Then the read's
        reason: an item type or format this version does not know (e.g. written by a
        newer one) is ``UNKNOWN_ITEM_TYPE`` / ``UNSUPPORTED_FORMAT``, damaged or missing
        rows ``CORRUPT``. The read's detail goes to the log only (it may quote stored
        data)."""
        retry = self._retry_of_promoted_request(turn)
        if retry is not None:
            return retry
        expected = turn.expected_head_seq
        seq = self.lineages.readable_head_seq(turn)
        if expected is not None and seq is not None and expected != seq:
            verdict = promotion.interpret(
                turn, Conflict(seq) if expected < seq else AheadOfHead(seq))
            assert isinstance(verdict, Reject)
            return verdict
        log.error("%s extends a lineage that cannot be read: %s: %s", turn.response_id,
                  failure.reason.value, failure.detail)
        reason = _UNREADABLE.get(failure.reason, RejectionReason.CORRUPT)
        return Reject(reason, f"the history this turn extends cannot be read "
                      f"({failure.reason.value}): it cannot be continued")



    def _already_promoted(self, turn: TurnCompleted) -> Accepted | None:
        """A redelivered turn that was promoted before must be re-published as promoted,
        even if a rule would now reject it (a later cancellation, an expired proof).
        Only asked on the way to a rejection, so the common path saves a read."""
        existing = self.store.get_checkpoint(turn.tenant_id, turn.response_id)
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

    def _promote(self, turn: TurnCompleted, decided: Promote, lineage: Lineage,
                 mark: str | None, claiming: Callable[[], ResponseClaim] | None = None
                 ) -> Verdict | FactsChanged | None:
        hints = _Hints.of(decided, lineage)
        # The claim's holder (raises StoreUnavailable if its outcome stays unknown).
        holder = claiming() if claiming is not None else None
        # A chain turn's response id owner, beside the batch (``_chain_owner``); a
        # Conversation's owner is written once its first turn is promoted
        # (``_make_durable``).
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
            return self._refused_by_store(turn, exc)
        if isinstance(outcome, FactsChanged):
            return outcome  # nothing written: the caller reads the facts and decides again
        if isinstance(outcome, LineageChanged):
            log.info("%s would extend %s, not %s (validated on): deciding again",
                     turn.response_id, outcome.parent_response_id, hints.extends)
            if lineage.cached and turn.conversation_id is not None:
                self.tails.forget_head(turn.tenant_id, turn.conversation_id)
            return None
        if isinstance(outcome, RequestHeld):
            return self._held_by_another_response(turn, outcome.holder)
        parent_owner = None
        if isinstance(outcome, ParentMissing):
            parent_owner = self._chain_owner(turn, outcome.previous_response_id)
        return promotion.interpret(turn, outcome, parent_owner)

    def _chain_owner(self, turn: TurnCompleted, response_id: str) -> str | None:
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

    def _held_by_another_response(self, turn: TurnCompleted, holder: ResponseClaim) -> Reject:
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

    def _make_durable(self, turn: TurnCompleted, key: str, verdict: Verdict,
                      facts: TurnFacts) -> Verdict:
        """Record the verdict before anything is published (commit order, step 1)."""
        if isinstance(verdict, Accepted):
            # Durable already: the turn (the store) and a chain turn's response owner
            # (written beside its batch; again for a replay, whose worker may have
            # stopped before it was durable). A Conversation's owner is written only now that its
            # first turn is promoted (a refused batch must not hand the Conversation to
            # its tenant), also by a redelivery (its writer may have stopped before).
            return self._owned(turn, verdict, facts.conversation_owner,
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
        return self._settle_rejection(turn, key, _replayed_rejection(held))

    def _settle_rejection(self, turn: TurnCompleted, key: str, verdict: Reject) -> Verdict:
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
        promoted = self._already_promoted(turn)
        if promoted is not None and promoted.checkpoint.accepted_attempt == turn.attempt:
            return self._owned(turn, promoted, _UNKNOWN)
        self.ledger.mark_rejected(turn.tenant_id, turn.response_id, verdict.reason.value,
                                  verdict.detail, verdict.existing_response_id)
        return verdict

    def _owned(self, turn: TurnCompleted, verdict: Accepted,
               known_owner: str | None | object, *, response_owner: bool = True) -> Accepted:
        """A promotion answered, with its owner durable: the worker that promoted it may
        have stopped before writing it. A chain turn's response id owner (a plain,
        idempotent write: the checkpoint is this tenant's), unless ``response_owner``
        is False (written beside this very batch); a Conversation's owner, where there
        is none: ``known_owner`` is the owner read with the turn's facts, or
        ``_UNKNOWN`` (read here unless cached; never written over another tenant)."""
        conversation = turn.conversation_id
        if conversation is None:
            if response_owner:
                self.ledger.start_recording_owners(
                    tenant_id=turn.tenant_id, response_id=turn.response_id,
                    conversation_id=None)()
            return verdict
        if known_owner is _UNKNOWN:
            known_owner = (self.tails.owner(conversation)
                           or self.ledger.conversation_owner(conversation))
        if known_owner is None:
            self.ledger.start_recording_owners(
                tenant_id=turn.tenant_id, response_id=None, conversation_id=conversation)()
        if known_owner in (None, turn.tenant_id):
            self.tails.learn_owner(conversation, turn.tenant_id)
        return verdict

    # -- what to publish ------------------------------------------------------------------
    def _publishable(self, turn: TurnCompleted, partition: str, verdict: Verdict,
                     facts: TurnFacts) -> Handled:
        key = partition.encode()
        if isinstance(verdict, Accepted):
            out = [Outbound(self.topics.checkpoints, key,
                            promoted_event(turn, partition, verdict.checkpoint))]
            kind = "promoted"
        else:
            out = [Outbound(self.topics.rejections, key, rejected_event(turn, partition, verdict))]
            kind = "rejected"
        # A rejected attempt of a request that stands promoted must never orphan what
        # the promoted turn used: read the promotion, only when there is something to
        # orphan (rejections with effects or claims are rare).
        known, promoted = (self.request_facts.orphans_known(turn, verdict)
                           if isinstance(verdict, Reject) and (facts.effects or facts.claims)
                           else (True, None))
        # The stored promotion that stands (a replayed one, or the one a rejected
        # attempt's request has): its items, only when an effect it does not list as
        # used could be one recorded after it that its turn carries (rare: a read).
        stands = (verdict.checkpoint if isinstance(verdict, Accepted) and verdict.replayed
                  else promoted)
        items = None
        if known and stands is not None and promotion.needs_promoted_items(
                stands, [e.effect_id for e in facts.effects]
                + [c.effect_id for c in facts.claims]):
            known, items = self.request_facts.promoted_items(stands)
        # claims hook (issue 17): a claim of an attempt not accepted is orphaned too
        orphans = (promotion.orphaned_effects(turn, verdict, facts.effects, facts.claims,
                                              promoted, items) if known else ())
        for orphan in orphans:
            out.append(Outbound(self.topics.orphaned_effects, key,
                                orphaned_event(turn, partition, orphan)))
        return Handled(tuple(out), kind)

    def _dead_letter(self, record: RawRecord, exc: DecodeFailed) -> Outbound:
        log.warning("dead letter %s[%d]@%d: %s", record.topic, record.partition, record.offset,
                    exc.error)
        letter = DeadLetter(
            key=record.key, value=record.value, error=exc.error[:4000], reason=exc.reason,
            source_topic=record.topic, source_partition=record.partition,
            source_offset=record.offset,
            schema_id=header_schema_id(record.value) if exc.schema_id is None else exc.schema_id,
            dead_lettered_at=self.clock_ms(),
        )
        return Outbound(self.topics.dead_letters, record.key, letter)


# The rejection of a turn extending a lineage a read could not verify, by the read's
# reason (any other: CORRUPT).
_UNREADABLE = {
    HistoryFailureReason.UNKNOWN_ITEM_TYPE: RejectionReason.UNKNOWN_ITEM_TYPE,
    HistoryFailureReason.UNSUPPORTED_FORMAT: RejectionReason.UNSUPPORTED_FORMAT,
}


def _replayed_rejection(decision: Decision) -> Reject:
    return Reject(RejectionReason(decision.reason), decision.detail, decision.seq,
                  decision.existing_response_id)
