"""What a mutation review of the processor's parts (session 47: ``streams/handled.py``,
``outbound.py``, ``early_rejections.py``, ``verdict_recorder.py``, ``loop_promotion.py``,
``turn_promotion.py``, ``turn_decider.py``, ``store_answers.py``) found no test holding.
Each test here failed with its mutant applied (docs/decisions.md, "The processor's parts
under mutation")."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.domain.plan import FactsChanged, LineageChanged
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
from services.ledger.base import LedgerUnavailable, ResponseState
from services.store.base import StoreUnavailable
from streams import loop_promotion
from streams.handled import lane_name
from streams.records import DecodeFailed, RawRecord
from streams.turn_decider import MAX_LINEAGE_ROUNDS
from streams.turn_promotion import MAX_FACTS_ROUNDS
from tests.unit.test_processor_off_head import TURNS, _damage_head, promoted
from tests.unit.test_processor_on_loop import LoopHarness
from tests.unit.test_processor_rules import TOPICS, Harness, chain_turn, conv_id, raw_record, turn


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
