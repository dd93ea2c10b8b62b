"""Effects a turn carries without listing them (found by an outside review of effect
claims, session 25).

docs/gateway-protocol.md section 6, ``tool_effect_ids``: "An output answering the
``call_id`` of an effect recorded for the request that the turn does not list MUST have
that effect's digest too ... (``DUPLICATE_TOOL_EFFECT``: the tool ran again)"; section 7:
"an effect in a promoted history must not be undone".

1. A completed claim's call answered with ANOTHER output by a turn that does not list
   the claim was promoted: only ToolEffect-recorded effects were compared when unlisted.
2. A turn that carries an effect's recorded output without listing it was promoted, and
   the effect was published ``ATTEMPT_SUPERSEDED`` (final: compensate) although the
   promoted history shows its output. Such an effect is now used like a listed one: the
   checkpoint keeps it among the effects it uses, so a late redelivery of its
   ``ToolEffect`` is not orphaned either.
"""

from __future__ import annotations

import uuid

from ratchet.domain.claims import (
    ClaimRequest,
    ClaimState,
    CompletionState,
    EffectPolicy,
    effect_id_for_claim,
)
from ratchet.samples import NOW_MS, TENANT, make_tool_effect, make_turn, new_id
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.models import OrphanReason, RejectionReason
from tests.unit.test_processor_rules import TOPICS, Harness, conv_id, turn


def _claim_and_complete(h, key, conv, call_id, output, *, tool="send_email", attempt=1):
    effect_id = effect_id_for_claim(key, 0, tool, 0)
    req = ClaimRequest(TENANT, key, effect_id, attempt, 0, call_id, tool,
                       arguments_digest({"to": "bob"}), uuid.uuid4().hex, 30_000,
                       EffectPolicy.AT_MOST_ONCE)
    h.store.mark_request_facts(TENANT, conv, key)
    assert h.ledger.claim_effect(req, NOW_MS).state is ClaimState.CLAIMED
    h.store.mark_request_facts(TENANT, conv, key)
    state, _ = h.ledger.complete_claim(TENANT, key, effect_id, req.token, "succeeded",
                                       output, NOW_MS + 10)
    h.store.mark_request_facts(TENANT, conv, key)
    assert state is CompletionState.COMPLETED
    return effect_id


def test_unlisted_completed_claim_answered_with_another_output_is_refused():
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    recorded = function_call_output("c1", '{"sent": "message-id-1"}', item_id="fco_1")
    _claim_and_complete(h, key, conv, "c1", recorded)
    # the turn answers the claimed call c1 with another result (the tool ran again)
    items = [function_call("c1", "send_email", {"to": "bob"}, item_id="fc_1"),
             function_call_output("c1", '{"sent": "message-id-2"}', item_id="fco_1"),
             message("sent", role="assistant", item_id=new_id("msg"))]
    t = turn(conv, 0, items=items, idempotency_key=key, attempt=1, tool_effect_ids=())
    handled = h.processor.handle(h.record(t))
    first = handled.outbound[0]
    assert first.topic == TOPICS.rejections, (
        f"promoted (seq {getattr(first.model, 'seq', None)}) a turn whose output for "
        "claimed call c1 differs from the claim's recorded outcome")
    assert first.model.reason is RejectionReason.DUPLICATE_TOOL_EFFECT


def test_unlisted_completed_claim_carried_in_history_is_not_orphaned_final():
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    recorded = function_call_output("c1", '{"sent": "message-id-1"}', item_id="fco_1")
    effect_id = _claim_and_complete(h, key, conv, "c1", recorded)
    items = [function_call("c1", "send_email", {"to": "bob"}, item_id="fc_1"), recorded,
             message("sent", role="assistant", item_id=new_id("msg"))]
    t = turn(conv, 0, items=items, idempotency_key=key, attempt=1, tool_effect_ids=())
    handled = h.processor.handle(h.record(t))
    promoted = [o for o in handled.outbound if o.topic == TOPICS.checkpoints]
    orphans = [o.model for o in handled.outbound if o.topic == TOPICS.orphaned_effects]
    # Either refuse the turn (it carries the output of an effect it does not list) or,
    # having promoted it, never tell compensators to undo the effect in its history.
    assert not (promoted and any(o.effect_id == effect_id
                                 and o.reason is OrphanReason.ATTEMPT_SUPERSEDED
                                 for o in orphans)), (
        "promoted a history carrying the claimed effect's output AND published that "
        "effect EffectOrphaned ATTEMPT_SUPERSEDED (final: compensate)")


def _booking_carried_unlisted(h):
    """A recorded ToolEffect, and a turn carrying its exact output without listing it."""
    from ratchet.samples import make_tool_effect, make_turn

    key, rid, conv = new_id("idem"), new_id("resp"), new_id("conv")
    out = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
    effect = make_tool_effect("call_a", out, idempotency_key=key, response_id=rid,
                              conversation_id=conv)
    h.feed(effect)
    items = [function_call("call_a", "book", {"flight": "AF1"}, item_id="fc_a"), out,
             message("booked", role="assistant", item_id=new_id("msg"))]
    return effect, make_turn(items, idempotency_key=key, response_id=rid,
                             conversation_id=conv, tool_effect_ids=())


def test_unlisted_tool_effect_carried_in_history_is_not_orphaned_final():
    """The same with a ToolEffect-recorded effect (no claim): the turn carries exactly
    the recorded output for its call, is promoted, and the effect is published
    ATTEMPT_SUPERSEDED (final: compensate) -- compensation would undo an effect whose
    output the promoted history shows the model."""
    h = Harness()
    effect, t = _booking_carried_unlisted(h)
    handled = h.processor.handle(h.record(t))
    promoted = [o for o in handled.outbound if o.topic == TOPICS.checkpoints]
    orphans = [o.model for o in handled.outbound if o.topic == TOPICS.orphaned_effects]
    assert not (promoted and any(o.effect_id == effect.effect_id
                                 and o.reason is OrphanReason.ATTEMPT_SUPERSEDED
                                 for o in orphans)), (
        "promoted a history carrying the effect's output AND published it "
        "ATTEMPT_SUPERSEDED (final: compensate)")


def test_a_carried_effect_redelivered_after_the_promotion_is_not_orphaned():
    """The checkpoint keeps the carried effect among those its turn uses: the late
    path (a ``ToolEffect`` redelivered after the promotion) reads that list."""
    h = Harness()
    effect, t = _booking_carried_unlisted(h)
    handled = h.processor.handle(h.record(t))
    assert [o.topic for o in handled.outbound] == [TOPICS.checkpoints]
    assert h.orphans(effect) == []


def test_a_holders_tool_effect_with_another_output_than_its_completion_is_a_conflict():
    """gateway-protocol.md section 8, rule 3: a ToolEffect of a claimed effect with
    another digest than its completion marks the effect conflicted; a conflicted effect
    fails every turn listing it, and its orphan is final (``EFFECT_CONFLICT``). The
    turn was refused, but the effect was orphaned ``TURN_REJECTED`` (wait, do not
    compensate) under the ToolEffect's digest, not the claim's recorded result (found
    by a gateway built from the docs, session 25)."""
    from ratchet.samples import make_tool_effect

    h = Harness()
    conv, key = conv_id(), new_id("idem")
    recorded = function_call_output("c1", '{"sent": "message-id-1"}', item_id="fco_1")
    effect_id = _claim_and_complete(h, key, conv, "c1", recorded)
    other = function_call_output("c1", '{"sent": "message-id-2"}', item_id="fco_1")
    h.feed(make_tool_effect("c1", other, idempotency_key=key, conversation_id=conv,
                            effect_id=effect_id, tool_name="send_email"))
    items = [function_call("c1", "send_email", {"to": "bob"}, item_id="fc_1"), recorded,
             message("sent", role="assistant", item_id=new_id("msg"))]
    t = turn(conv, 0, items=items, idempotency_key=key, tool_effect_ids=(effect_id,))
    handled = h.processor.handle(h.record(t))
    assert handled.outbound[0].model.reason is RejectionReason.DUPLICATE_TOOL_EFFECT
    orphans = [o.model for o in handled.outbound if o.topic == TOPICS.orphaned_effects]
    # the claim's result, and (since session 31) the other run again: every verdict
    # names it (compensators dedupe EFFECT_CONFLICT by effect id and output digest)
    assert sorted((o.effect_id, o.reason, o.output_digest) for o in orphans) == sorted([
        (effect_id, OrphanReason.EFFECT_CONFLICT, recorded.content_digest),
        (effect_id, OrphanReason.EFFECT_CONFLICT, other.content_digest)])


# Another attempt's re-run of a listed call (an outside red team of session 26's own
# fixes; failed before its fix): the late-effect fix (an effect its promoted turn
# carries is used) also took another attempt's re-run of the same call, with the
# same output, as carried: a second execution of the tool was never compensated. A
# call the turn answers with a listed effect carries no other effect.
def _orphans(handled):
    return [(o.model.effect_id, o.model.reason) for o in handled.outbound
            if o.topic == TOPICS.orphaned_effects]


def test_another_attempts_rerun_of_a_listed_call_is_superseded():
    h = Harness()
    key, conv = new_id("idem"), new_id("conv")
    out = function_call_output("call_a", '{"sent": true}', item_id="fco_a")
    r1 = new_id("resp")
    e1 = make_tool_effect("call_a", out, idempotency_key=key, response_id=r1,
                          conversation_id=conv, tool_name="send_mail", subturn_index=0)
    h.feed(e1)
    t1 = make_turn([function_call("call_a", "send_mail", {"to": "x"}, item_id="fc_a"), out,
                    message("sent", role="assistant", item_id=new_id("msg"))],
                   idempotency_key=key, response_id=r1, conversation_id=conv,
                   tool_effect_ids=[e1.effect_id], attempt=1)
    assert h.processor.handle(h.record(t1)).outbound[0].model.seq == 1
    # attempt 2, which never saw the promotion, ran call_a again one round later
    r2 = new_id("resp")
    e2 = make_tool_effect("call_a", out, idempotency_key=key, response_id=r2,
                          conversation_id=conv, tool_name="send_mail", subturn_index=1,
                          attempt=2)
    assert e2.effect_id != e1.effect_id
    late = h.processor.handle(h.record(e2))
    t2 = t1.model_copy(update={"event_id": new_id("evt"), "response_id": r2, "attempt": 2,
                               "tool_effect_ids": [e2.effect_id]})
    dup = h.processor.handle(h.record(t2))
    assert dup.outbound[0].model.reason is RejectionReason.DUPLICATE
    assert (e2.effect_id, OrphanReason.ATTEMPT_SUPERSEDED) in _orphans(late) + _orphans(dup)


def test_another_attempts_claimed_rerun_of_a_listed_call_is_superseded():
    h = Harness()
    key, conv = new_id("idem"), new_id("conv")

    def claim(subturn, attempt, output):
        effect_id = effect_id_for_claim(key, subturn, "send_email", 0)
        req = ClaimRequest(TENANT, key, effect_id, attempt, subturn, "ca", "send_email",
                           arguments_digest({"to": "ca"}), uuid.uuid4().hex, 30_000,
                           EffectPolicy.AT_MOST_ONCE)
        h.ledger.claim_effect(req, NOW_MS)
        h.ledger.complete_claim(TENANT, key, effect_id, req.token, "succeeded", output,
                                NOW_MS)
        h.store.mark_request_facts(TENANT, conv, key)
        return effect_id

    out1 = function_call_output("ca", '{"sent": true}', item_id="fco_a")
    c1 = claim(0, 1, out1)
    t1 = make_turn([function_call("ca", "send_email", {"to": "ca"}, item_id="fc_a"), out1,
                    message("sent", role="assistant", item_id=new_id("msg"))],
                   idempotency_key=key, conversation_id=conv, tool_effect_ids=[c1])
    assert h.outcome(t1).seq == 1
    c2 = claim(1, 2, function_call_output("ca", '{"sent": true}', item_id="fco_a2"))
    t2 = t1.model_copy(update={"event_id": new_id("evt"), "response_id": new_id("resp"),
                               "attempt": 2, "tool_effect_ids": [c2]})
    dup = h.processor.handle(h.record(t2))
    assert dup.outbound[0].model.reason is RejectionReason.DUPLICATE
    assert (c2, OrphanReason.ATTEMPT_SUPERSEDED) in _orphans(dup)
