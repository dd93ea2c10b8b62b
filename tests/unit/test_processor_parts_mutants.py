"""What a mutation review of the processor's parts (session 47: ``streams/handled.py``,
``outbound.py``, ``early_rejections.py``, ``verdict_recorder.py``, ``loop_promotion.py``,
``turn_promotion.py``, ``turn_decider.py``, ``store_answers.py``) found no test holding.
Each test here failed with its mutant applied (docs/decisions.md, "The processor's parts
under mutation")."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.domain.history import HistoryFailure, HistoryFailureReason
from ratchet.domain.plan import FactsChanged, LineageChanged
from ratchet.domain.validation import EMPTY_PAIRING
from ratchet.samples import (
    NOW_MS,
    TENANT,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
    new_id,
)
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.keys import partition_key
from schemas.limits import MAX_EVENT_BYTES
from schemas.models import CheckpointPromoted, DeadLetter, DeadLetterReason, RejectionReason
from services.ledger.base import Decision, LedgerUnavailable, ResponseState
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions, StoreUnavailable
from services.store.memory import MemoryCheckpointStore
from streams import loop_promotion
from streams.handled import NO_FACTS, lane_name
from streams.lineage import Lineage
from streams.processor import PromotionProcessor
from streams.records import DecodeFailed, RawRecord
from streams.tail_cache import TailCache
from streams.turn_decider import MAX_LINEAGE_ROUNDS
from streams.turn_promotion import MAX_FACTS_ROUNDS
from tests.unit.test_processor_off_head import TURNS, _damage_head, promoted
from tests.unit.test_processor_on_loop import LoopHarness
from tests.unit.test_processor_order_before_pairing import self_unpaired
from tests.unit.test_processor_retry_at_head import tool_items
from tests.unit.test_processor_rules import (
    TOPICS,
    Harness,
    PickleCodec,
    chain_turn,
    conv_id,
    raw_record,
    turn,
)


def test_a_records_log_name_is_its_topic_partition_and_offset():
    """``lane_name``: the name every log line of the processor gives a record."""
    record = RawRecord(TOPICS.gateway_events, 3, 17, b"k", b"v")
    assert lane_name(record) == f"{TOPICS.gateway_events}[3]@17"


def test_the_metrics_label_says_promoted_or_rejected():
    """``Handled.kind`` labels the worker's outcome counters: a promotion is
    ``promoted``, a rejection ``rejected``, on the thread path both."""
    h = Harness()
    conv = conv_id()
    promoted = h.processor.handle(h.record(turn(conv, 0)))
    rejected = h.processor.handle(h.record(turn(conv, 0)))  # its head moved: CONFLICT
    assert (promoted.kind, rejected.kind) == ("promoted", "rejected")


class FailingCodec:
    """Every record fails to decode with a long error (a writer's schema quoted)."""

    def __init__(self, error: str) -> None:
        self.error = error

    def decode(self, record):
        raise DecodeFailed(DeadLetterReason.CORRUPT_PAYLOAD, self.error, schema_id=7)

    def decodes_offline(self, record):
        return True


def test_a_dead_letter_keeps_the_start_of_a_long_error_and_is_stamped_by_the_clock():
    """The dead letter's ``error`` is bounded (4 000 characters) but keeps that much of
    the error's start, and ``dead_lettered_at`` is the processor's clock."""
    h = Harness()
    error = "".join(f"{i:05d} " for i in range(2000))  # 12 000 characters, none alike
    h.rewire(codec=FailingCodec(error))
    [letter] = h.processor.handle(RawRecord(TOPICS.gateway_events, 0, 1, b"k", b"v")).outbound
    assert isinstance(letter.model, DeadLetter)
    assert letter.model.error == error[:4000]
    assert letter.model.dead_lettered_at == NOW_MS


def test_a_record_of_exactly_the_loops_bound_is_promoted_on_the_loop(monkeypatch):
    """``LoopPromotion.promote`` takes a record of at most ``LOOP_MAX_RECORD_BYTES``;
    one byte more goes to the thread path."""
    t = turn(conv_id(), 0)
    size = len(raw_record(t).value)
    monkeypatch.setattr(loop_promotion, "LOOP_MAX_RECORD_BYTES", size)
    h = LoopHarness()
    assert h.outcome(t).seq == 1
    assert (h.processor.loop_promotions, h.handed_over) == (1, 0)
    monkeypatch.setattr(loop_promotion, "LOOP_MAX_RECORD_BYTES", size - 1)
    h = LoopHarness()
    assert h.outcome(t).seq == 1
    assert (h.processor.loop_promotions, h.handed_over) == (0, 1)


def test_a_chain_turns_owner_write_that_fails_on_the_loop_publishes_nothing_there():
    """The loop path writes a chain turn's response owner beside its batch and awaits it
    before anything is published: when that write fails, the record goes to the thread
    path (which writes the owner), never out with the owner unwritten."""
    h = LoopHarness()
    root = chain_turn(None, None)
    child = chain_turn(root.response_id, root.response_id)
    assert h.outcome(root).seq == 1

    async def owners_down(**kw):
        raise LedgerUnavailable("injected")

    h.ledger.record_owners_async = owners_down
    h.handed_over = 0
    assert h.outcome(child).seq == 2
    assert (h.processor.loop_promotions, h.handed_over) == (0, 1)
    assert h.ledger.response_owner(child.response_id) == TENANT


def _promote_answering(h: Harness, answer) -> list:
    """The store's promotion write answering ``answer`` every time; its calls listed."""
    calls = []

    def promote(request, **kw):
        calls.append(kw)
        return answer

    h.store.promote = promote
    return calls


def test_a_lineage_that_keeps_moving_is_decided_at_most_max_lineage_rounds_again():
    """``TurnDecider``: a write that finds another lineage every time is decided again
    ``MAX_LINEAGE_ROUNDS`` times, then the attempt is retried whole (a retryable
    ``StoreUnavailable``), never sooner and never endlessly."""
    h = Harness()
    calls = _promote_answering(h, LineageChanged(None))
    with pytest.raises(StoreUnavailable) as raised:
        h.processor.handle(h.record(turn(conv_id(), 0)))
    assert raised.value.retryable
    assert len(calls) == 1 + MAX_LINEAGE_ROUNDS


def test_facts_that_keep_changing_are_read_at_most_max_facts_rounds_times():
    """``TurnPromotion``: a write that finds the request's facts changed every time is
    tried ``MAX_FACTS_ROUNDS`` times, then the attempt is retried whole."""
    h = Harness()
    calls = _promote_answering(h, FactsChanged("a-mark"))
    with pytest.raises(StoreUnavailable) as raised:
        h.processor.handle(h.record(turn(conv_id(), 0)))
    assert raised.value.retryable
    assert len(calls) == MAX_FACTS_ROUNDS


def test_orphans_are_keyed_like_their_outcome_by_the_partition_key():
    """An ``EffectOrphaned`` is published under the turn's partition key, as its outcome
    is (one Kafka partition: a compensator reads them in order with the outcome)."""
    h = Harness()
    t, effects = make_tool_loop_turn(rounds=2, conversation_id=conv_id())
    h.feed(*effects, make_turn_cancelled(t))
    out = h.processor.handle(h.record(t)).outbound
    orphans = [o for o in out if o.topic == TOPICS.orphaned_effects]
    assert len(orphans) == 2
    assert {o.key for o in out} == {partition_key(t).encode()}


def test_on_the_loop_a_record_keyed_apart_or_with_no_digest_is_rejected_corrupt():
    """``LoopPromotion.promote`` gives the thread path a record keyed apart from its
    partition key and a turn whose request digest is no digest: both are ``CORRUPT``
    there, decided before any claim, never promoted on the loop."""
    h = LoopHarness()
    t = turn(conv_id(), 0)
    record = RawRecord(TOPICS.gateway_events, 0, 1, b"someone-else", raw_record(t).value)

    async def in_thread(handle):
        h.handed_over += 1
        return handle()

    handled = asyncio.run(h.processor.handle_async(record, in_thread))
    assert handled.outbound[0].model.reason is RejectionReason.CORRUPT
    bad = turn(conv_id(), 0, request_digest="A" * 64)
    assert h.outcome(bad).reason is RejectionReason.CORRUPT
    assert (h.processor.loop_promotions, h.handed_over) == (0, 2)
    assert h.outcome(turn(conv_id(), 0, response_id=bad.response_id)).seq == 1  # unbound


def test_another_request_under_a_promoted_response_id_never_gets_its_promotion():
    """``VerdictRecorder.already_promoted``: a turn gets the stored promotion of its
    response id only as a retry of the very request (its idempotency key and digest):
    another request with the same body and response id is rejected, never answered
    with the first request's promotion."""
    h = Harness()
    first = turn(conv_id(), 0)
    assert h.outcome(first).seq == 1
    other = first.model_copy(update={"idempotency_key": new_id("idem"),
                                     "event_id": new_id("evt")})
    answer = h.outcome(other)
    assert not isinstance(answer, CheckpointPromoted), answer


def test_a_late_claim_the_promoted_turn_carries_is_not_orphaned_on_redelivery():
    """``OutboundBuilder.publishable``: a claim the stored promotion does not list may
    be one recorded after it whose output its turn carries; the promotion's items
    decide it (read for claims as for effects), so a redelivery of the promoted turn
    does not publish it ``ATTEMPT_SUPERSEDED``."""
    h = Harness()
    key, conv = new_id("idem"), new_id("conv")
    out = function_call_output("ca", '{"sent": true}', item_id="fco_a")
    t1 = make_turn([function_call("ca", "send_email", {"to": "ca"}, item_id="fc_a"), out,
                    message("sent", role="assistant", item_id=new_id("msg"))],
                   idempotency_key=key, conversation_id=conv)
    assert h.outcome(t1).seq == 1
    effect_id = effect_id_for_claim(key, 0, "send_email", 0)
    req = ClaimRequest(TENANT, key, effect_id, 1, 0, "ca", "send_email",
                       arguments_digest({"to": "ca"}), uuid.uuid4().hex, 30_000,
                       EffectPolicy.AT_MOST_ONCE)
    h.ledger.claim_effect(req, NOW_MS)
    h.ledger.complete_claim(TENANT, key, effect_id, req.token, "succeeded", out, NOW_MS)
    again = h.processor.handle(h.record(t1))
    assert isinstance(again.outbound[0].model, CheckpointPromoted)
    assert [o.model for o in again.outbound if o.topic == TOPICS.orphaned_effects] == []


def test_a_continued_chain_turn_without_its_root_is_parent_not_promoted_and_recorded():
    """``EarlyRejections.on_unkeyed_turn``: ``PARENT_NOT_PROMOTED`` (what the chain rule
    answers for a parent it cannot find), published under the turn's response id and
    recorded, so the status endpoint says it too."""
    h = Harness()
    t = make_turn(conversation_id=None, chain_root_id=None, expected_head_seq=None,
                  previous_response_id=new_id("resp"), response_id=new_id("resp"))
    [rejected] = h.processor.handle(h.record(t)).outbound
    assert rejected.model.reason is RejectionReason.PARENT_NOT_PROMOTED
    assert rejected.key == t.response_id.encode()
    assert h.ledger.status(TENANT, t.response_id).status is ResponseState.REJECTED


def test_a_promoted_turn_redelivered_beyond_a_limit_writes_the_owner_its_worker_did_not():
    """``EarlyRejections.reject_before_the_store``: a redelivery answered with its
    stored promotion makes the Conversation's owner durable, as any replay does (the
    worker that promoted it may have stopped before writing it)."""
    h = Harness()
    conv, resp, key = conv_id(), new_id("resp"), new_id("idem")
    small = turn(conv, 0, response_id=resp, idempotency_key=key)
    assert h.outcome(small).seq == 1
    h.ledger._conversation_owners.pop(conv)  # its worker stopped before the owner
    big = message("x" * (MAX_EVENT_BYTES + 10), role="assistant", item_id=new_id("msg"))
    redelivered = make_turn((big,), conversation_id=conv, expected_head_seq=0,
                            response_id=resp, idempotency_key=key)
    assert redelivered.request_digest == small.request_digest
    h.rewire()  # another worker: nothing cached
    assert isinstance(h.outcome(redelivered), CheckpointPromoted)
    assert h.ledger.conversation_owner(conv) == TENANT


def test_an_unpaired_turn_at_a_damaged_head_gets_the_lineages_answer_not_pairings():
    """``TurnDecider._decide``: a turn at the head whose pairing fails against a lineage
    that cannot be read is answered as that lineage (``CORRUPT``): its pairing was
    checked against nothing it can trust (docs/gateway-protocol.md section 7)."""
    h = Harness()
    conv, _ = promoted(h)
    _damage_head(h, conv)
    unpaired = [function_call_output("call_nowhere", "{}", item_id=new_id("fco"))]
    out = h.outcome(turn(conv, TURNS, items=unpaired))
    assert out.reason is RejectionReason.CORRUPT, out.detail


def test_a_wrong_cached_owner_costs_a_read_never_a_rejection():
    """``TurnDecider.decide_and_write``: a rejection decided with the tail cache's owner
    of a Conversation (a turn that reads its facts) is decided again with the ledger's:
    a wrong cache entry never rejects a turn ``TENANT_MISMATCH``."""
    h = Harness()
    conv = conv_id()
    final, effects = make_tool_loop_turn(rounds=1, conversation_id=conv)
    h.feed(*effects)
    h.processor.tails.learn_owner(conv, "tenant-other")
    assert h.outcome(final).seq == 1


# --- the survivors left by the first run, and the mutants it did not run -----------------


class DecidedMeanwhile(MemoryLedger):
    """A ledger on which another worker's decision of the event (``first``) is recorded
    just before this worker's own: between its read of the facts and its record."""

    first: Decision | None = None

    def record_decision(self, decision: Decision) -> Decision:
        if self.first is not None:
            first, self.first = self.first, None
            super().record_decision(first)
        return super().record_decision(decision)


def test_a_decision_another_worker_recorded_first_is_the_one_published():
    """``VerdictRecorder.make_durable``: when the ledger holds another decision of the
    event (a zombie's, recorded between this worker's facts read and its record), that
    one is settled and published, never this worker's own (an outcome never flips)."""
    h = Harness()
    h.ledger = DecidedMeanwhile()
    h.rewire(ledger=h.ledger)
    conv = conv_id()
    assert [h.outcome(turn(conv, head)).seq for head in (0, 1)] == [1, 2]
    late = turn(conv, 1)  # this worker: CONFLICT at head 2
    h.ledger.first = Decision(  # the zombie's, when the Conversation had no turn yet
        event_id=late.event_id, tenant_id=TENANT, response_id=late.response_id,
        outcome="rejected", reason="OUT_OF_ORDER", detail="expected head 1 is ahead of head 0",
        seq=0, decided_at=NOW_MS - 1, idempotency_key=late.idempotency_key)
    out = h.outcome(late)
    assert (out.reason, out.head_seq) == (RejectionReason.OUT_OF_ORDER, 0)
    assert h.ledger.status(TENANT, late.response_id).reason == "OUT_OF_ORDER"


class _Delegating:
    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)


class PausedBatch(_Delegating):
    """A worker's store whose promotion batch waits until ``go`` (a slow old owner)."""

    def __init__(self, store) -> None:
        super().__init__(store)
        self.go, self.at_batch = threading.Event(), threading.Event()

    def promote(self, request, **kw):
        self.at_batch.set()
        assert self.go.wait(30)
        return self._store.promote(request, **kw)


class StopsBeforeTheMark(_Delegating):
    """A worker that stops between a fact it recorded and the facts mark."""

    def mark_request_facts(self, *args, **kw):
        raise StoreUnavailable("injected: stopped before the mark", retryable=True,
                               operation="mark")


class BeforeTheMark(_Delegating):
    """Runs ``before_mark`` once, just before this worker writes a facts mark."""

    before_mark = None

    def mark_request_facts(self, *args, **kw):
        if self.before_mark is not None:
            act, self.before_mark = self.before_mark, None
            act()
        return self._store.mark_request_facts(*args, **kw)


def test_a_batch_landing_before_a_rejections_mark_is_published_not_the_rejection():
    """``VerdictRecorder.settle_rejection`` writes the facts mark, then reads whether the
    attempt stands promoted: a promotion decided without the rejection (its facts read
    before it) whose batch lands before the mark is what both workers publish. Read
    first, such a batch landing between the read and the mark was published beside the
    rejection. (A chain's first response: both workers read its facts always.)"""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    paused, marking = PausedBatch(store), BeforeTheMark(store)
    old, stopping, new = (PromotionProcessor(s, ledger, PickleCodec(), TOPICS,
                                             clock_ms=lambda: NOW_MS)
                          for s in (paused, StopsBeforeTheMark(store), marking))
    t = chain_turn(None, None)
    by_old = []
    old_worker = threading.Thread(target=lambda: by_old.append(old.handle(raw_record(t, 1))))
    old_worker.start()  # read the facts (none), decided Promote, its batch pending
    assert paused.at_batch.wait(30)
    with pytest.raises(StoreUnavailable):  # the cancellation recorded, not its mark
        stopping.handle(raw_record(make_turn_cancelled(t), 2))

    def old_batch_lands():
        paused.go.set()
        old_worker.join(30)

    marking.before_mark = old_batch_lands
    by_new = new.handle(raw_record(t, 1)).outbound[0].model  # decided CANCELLED
    assert marking.before_mark is None and len(by_old) == 1
    published = by_old[0].outbound[0].model
    assert isinstance(published, CheckpointPromoted)
    assert by_new == published


def test_a_fact_recorded_after_a_fresh_recheck_is_read_with_the_ledgers_owner():
    """``TurnPromotion``: a rejection decided with a wrong cached Conversation owner is
    decided again from fresh reads (the ledger's owner); when a fact of the request
    lands before that decision's batch (``FactsChanged``), the facts are read again with
    the ledger's owner too, never the cached one: no ``TENANT_MISMATCH``."""
    h = Harness()
    conv = conv_id()
    assert h.outcome(turn(conv, 0)).seq == 1
    h.processor.tails.learn_owner(conv, "tenant-other")
    t = turn(conv, 1)
    _, [effect] = make_tool_loop_turn(rounds=1, conversation_id=conv,
                                      idempotency_key=t.idempotency_key,
                                      response_id=t.response_id)
    other = PromotionProcessor(h.store, h.ledger, PickleCodec(), TOPICS,
                               clock_ms=lambda: NOW_MS)
    promote = h.store.promote

    def effect_lands_first(request, **kw):
        h.store.promote = promote
        assert other.handle(raw_record(effect, 99)).outbound == ()
        return promote(request, **kw)

    h.store.promote = effect_lands_first
    assert h.outcome(t).seq == 2
    assert h.store.promote is promote  # the batch did meet the new fact


def test_a_turn_the_loop_cannot_promote_for_its_status_binds_no_response_id():
    """``LoopPromotion.promote`` takes no claim for a turn whose status is not promotable
    (docs/gateway-protocol.md: a ``failed`` or ``in_progress`` turn binds nothing), as
    the thread path takes none: its response id stays free for another request."""
    h = LoopHarness()
    conv = conv_id()
    started = turn(conv, 0, status="in_progress")
    assert h.outcome(started).reason is RejectionReason.NOT_PROMOTABLE_STATUS
    assert h.outcome(turn(conv, 0, response_id=started.response_id)).seq == 1


class ClaimUnknown(_Delegating):
    """The response id's claim is sent but its outcome stays unknown (a timeout)."""

    def start_claiming(self, claim):
        def waiter():
            raise StoreUnavailable("injected: the claim's outcome is unknown", retryable=True,
                                   operation="promote/claim")
        return waiter


def test_an_off_head_turn_is_answered_only_once_its_response_ids_claim_is_known():
    """``TurnDecider._decide_off_head`` waits for the response id's claim before the
    store's judgement, as a turn sent to the write does: while its outcome is unknown
    the attempt is retried whole, nothing recorded or published."""
    h = Harness()
    conv = conv_id()
    assert [h.outcome(turn(conv, head)).seq for head in (0, 1)] == [1, 2]
    h.rewire(store=ClaimUnknown(h.store), tails=TailCache(capacity=0))
    stale = turn(conv, 1)  # off its head: judged by the store, never written
    with pytest.raises(StoreUnavailable) as raised:
        h.processor.handle(h.record(stale))
    assert raised.value.retryable
    assert h.ledger.status(TENANT, stale.response_id).status is not ResponseState.REJECTED


def test_a_conversation_lineage_found_absent_is_at_head_zero():
    """``StoreAnswers`` (via ``TurnDecider._decide``): a Conversation whose lineage read
    found nothing stored has no head: a turn expecting head 2 whose pairing failed
    against nothing is ``OUT_OF_ORDER`` at head 0 (ordering before pairing), not
    ``UNPAIRED_TOOL_CALL``. (Through the processor a read finds a Conversation absent
    only after its head was found at the expected seq; answered directly here.)"""
    h = Harness()
    t = turn(conv_id(), 2, items=[function_call_output("call_open", "{}",
                                                       item_id=new_id("fco"))])
    absent = Lineage(EMPTY_PAIRING, None, unread=True, absent=True)
    out = h.processor._decider._decide(t, NO_FACTS, None, absent, facts_read=True)
    assert (out.reason, out.head_seq) == (RejectionReason.OUT_OF_ORDER, 0)


@pytest.mark.parametrize("reason", [HistoryFailureReason.UNKNOWN_ITEM_TYPE,
                                    HistoryFailureReason.UNSUPPORTED_FORMAT])
def test_a_lineage_this_version_cannot_read_is_answered_with_the_reads_reason(reason):
    """``StoreAnswers.on_unreadable_lineage``: a turn at the head of a history written
    with an item type or a format this version does not know is rejected with that
    reason (docs/gateway-protocol.md section 7), not ``CORRUPT``."""
    h = Harness()
    conv = conv_id()
    assert h.outcome(turn(conv, 0)).seq == 1
    h.rewire(tails=TailCache(capacity=0))
    h.store.read_history = lambda *a, **kw: HistoryFailure(reason, "written by a newer build")
    assert h.outcome(turn(conv, 1)).reason is RejectionReason(reason.value)


def test_a_parent_whose_owner_row_names_a_tenant_without_it_is_not_promoted():
    """``StoreAnswers.chain_owner``: the response owner row is written beside a batch
    that may then be refused: another tenant named there without the checkpoint is no
    owner, and the continuation is ``PARENT_NOT_PROMOTED``, not ``TENANT_MISMATCH``."""
    h = Harness()
    root = chain_turn(None, None)
    assert h.outcome(root).seq == 1
    refused = new_id("resp")
    h.ledger.record_response_owner(refused, "tenant-other")  # its batch then refused
    out = h.outcome(chain_turn(root.response_id, refused))
    assert out.reason is RejectionReason.PARENT_NOT_PROMOTED


def test_a_resent_first_turn_with_unpaired_items_is_answered_as_a_retry():
    """``StoreAnswers.out_of_lineage``: a retry of a promoted first turn sent again at
    head 0 of the Conversation its original began does not extend the head and is not
    judged by pairing: the write's first answer, ``DUPLICATE`` naming the original,
    with unpaired items of its own too (not ``CONFLICT``)."""
    h = Harness()
    conv = conv_id()
    original = turn(conv, 0)
    assert h.outcome(original).seq == 1
    retry = turn(conv, 0, items=self_unpaired(), idempotency_key=original.idempotency_key,
                 attempt=2)
    out = h.outcome(retry)
    assert (out.reason, out.existing_response_id) == (RejectionReason.DUPLICATE,
                                                      original.response_id)


def test_a_retry_whose_originals_history_cannot_be_read_stays_unpaired():
    """``StoreAnswers.retry_unpaired_by_its_original``: a retry whose pairing failed at
    its original's head is judged on the history its original extended; when that
    cannot be read, the pairing rejection stands (fail closed), never a pairing
    against nothing. (A store whose two reads disagree: a double.)"""
    h = Harness()
    conv, items = conv_id(), tool_items("call_twice")
    first = turn(conv, 0)
    assert h.outcome(first).seq == 1
    original = turn(conv, 1, items=items)
    assert h.outcome(original).seq == 2
    h.rewire(tails=TailCache(capacity=0))
    read_history = h.store.read_history

    def parent_unreadable(tenant_id, **kw):
        if kw.get("response_id") == first.response_id:
            return HistoryFailure(HistoryFailureReason.CORRUPT_HISTORY, "injected")
        return read_history(tenant_id, **kw)

    h.store.read_history = parent_unreadable
    retry = turn(conv, 2, items=items, idempotency_key=original.idempotency_key, attempt=2)
    assert h.outcome(retry).reason is RejectionReason.UNPAIRED_TOOL_CALL


def test_a_chain_retry_with_no_parent_gets_the_writes_answer_whatever_its_pairing():
    """``StoreAnswers.out_of_lineage``: a chain turn whose parent is not
    there extends no lineage and is not judged by pairing: a retry of a promoted request
    gets the write's first answer (``DUPLICATE``) with its own unpaired items as with
    paired ones (it was ``PARENT_NOT_PROMOTED`` then, the answer resting on pairing)."""
    h = Harness()
    original = chain_turn(None, None)
    assert h.outcome(original).seq == 1
    answers = []
    for items in (tool_items("call_c"), self_unpaired()):
        retry = chain_turn(original.response_id, new_id("resp"), items=items,
                           idempotency_key=original.idempotency_key, attempt=2)
        out = h.outcome(retry)
        answers.append((out.reason, out.existing_response_id))
    assert answers == [(RejectionReason.DUPLICATE, original.response_id)] * 2
