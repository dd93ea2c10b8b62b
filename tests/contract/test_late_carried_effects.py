"""An effect first recorded after its request's promotion, whose output the promoted
turn carries, on both backends and both entry points.

docs/gateway-protocol.md section 7: an effect in a promoted history must not be undone;
``EffectOrphaned`` with ``ATTEMPT_SUPERSEDED`` tells compensators to undo it. A turn
may carry a tool's output before the tool's ``ToolEffect`` is recorded (the gateway
produced the turn first, or the effect's first delivery was lost and it came again).
Until session 26 such an effect was judged by the promoted turn's list alone and
published ``ATTEMPT_SUPERSEDED``: the compensator undid an effect whose output the
history shows the model (listed under "Left" since session 25). The promotion's own
items now decide it, as they do for an effect recorded before the turn, on every path
that orphans against a promotion: the late ``ToolEffect`` itself, a redelivery of the
promoted turn, and a retry of its request.
"""

from __future__ import annotations

import pytest

from ratchet.samples import make_tool_effect, make_turn, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import CheckpointPromoted, OrphanReason, PromotionRejected, RejectionReason
from tests.contract.test_processor_handover import ENTRIES, _orphaned

R = OrphanReason


def _carried_turn(*, output, tool_effect_ids=(), attempt=1, response_id=None, key=None,
                  conv=None):
    """A Conversation's first turn carrying ``output`` for call_a."""
    return make_turn(
        [function_call("call_a", "book", {"flight": "AF1"}, item_id="fc_a"), output,
         message("booked", role="assistant", item_id=new_id("msg"))],
        idempotency_key=key or new_id("idem"), response_id=response_id or new_id("resp"),
        conversation_id=conv or new_id("conv"), tool_effect_ids=tool_effect_ids,
        attempt=attempt)


def _late_effect(t, output, call_id="call_a"):
    return make_tool_effect(call_id, output, idempotency_key=t.idempotency_key,
                            response_id=t.response_id, conversation_id=t.conversation_id,
                            tool_name="book")


def _promoted(worker, t):
    handled = worker.handle(t)
    assert isinstance(handled.outbound[0].model, CheckpointPromoted), handled.outbound[0].model
    assert _orphaned(handled) == []
    return handled


@ENTRIES
def test_a_late_effect_the_promoted_turn_carries_is_not_orphaned(data, entry):
    worker = data.worker(entry)
    out = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
    t = _carried_turn(output=out)
    _promoted(worker, t)
    late = _late_effect(t, out)
    assert _orphaned(worker.handle(late)) == [], (
        "the promoted history carries the effect's output; ATTEMPT_SUPERSEDED would "
        "have it undone")
    # Its redelivery, a redelivery of the promoted turn and a retry of the request by
    # another attempt are answered alike: the effect is used, never orphaned.
    assert _orphaned(worker.handle(late)) == []
    assert _orphaned(worker.handle(t)) == []
    retry = t.model_copy(update={"event_id": new_id("evt"), "attempt": 2})
    replayed = worker.handle(retry)
    assert isinstance(replayed.outbound[0].model, CheckpointPromoted)
    assert _orphaned(replayed) == []


@ENTRIES
def test_a_retry_under_another_response_id_does_not_orphan_a_late_carried_effect(
        data, entry):
    """``DUPLICATE`` orphans every effect of the request the promotion did not use; one
    its history carries is used."""
    worker = data.worker(entry)
    out = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
    t = _carried_turn(output=out)
    _promoted(worker, t)
    late = _late_effect(t, out)
    worker.handle(late)
    retry = _carried_turn(output=out, key=t.idempotency_key, conv=t.conversation_id,
                          attempt=2)
    answer = worker.handle(retry)
    rejected = answer.outbound[0].model
    assert isinstance(rejected, PromotionRejected)
    assert rejected.reason is RejectionReason.DUPLICATE, rejected
    assert _orphaned(answer) == []


@ENTRIES
def test_a_late_effect_with_another_output_is_still_superseded(data, entry):
    """What the promoted turn does not carry stays orphaned: the same call answered with
    another output (the tool ran again), and a call the turn never made."""
    worker = data.worker(entry)
    out = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
    t = _carried_turn(output=out)
    _promoted(worker, t)
    again = _late_effect(t, function_call_output("call_a", '{"booked": "PNR999"}',
                                                 item_id="fco_b"))
    assert _orphaned(worker.handle(again)) == [(again.effect_id, R.ATTEMPT_SUPERSEDED)]
    other = _late_effect(t, function_call_output("call_b", '{"booked": "PNR555"}',
                                                 item_id="fco_c"), call_id="call_b")
    assert _orphaned(worker.handle(other)) == [(other.effect_id, R.ATTEMPT_SUPERSEDED)]
    # and a redelivery of the promoted turn orphans them again, the carried one not
    carried = _late_effect(t, out)
    worker.handle(carried)
    assert sorted(_orphaned(worker.handle(t))) == sorted(
        [(again.effect_id, R.ATTEMPT_SUPERSEDED), (other.effect_id, R.ATTEMPT_SUPERSEDED)])


def test_orphans_are_not_published_when_the_promoted_items_cannot_be_verified(
        data):
    """Fail closed: whether a late effect is carried is read from the promoted turn's
    items; when they do not match their checkpoint, nothing is shown unused and no
    orphan is published (logged for an operator), as for any unreadable promotion."""
    worker = data.worker("handle")
    out = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
    t = _carried_turn(output=out)
    _promoted(worker, t)
    store = worker.store
    real = store.read_turn

    def damaged(tenant_id, partition_key, response_id):
        snapshot = real(tenant_id, partition_key, response_id)
        items = snapshot.items[response_id]
        bad = items.__class__(items.seqs, items.ids, items.types, items.roles,
                              items.call_ids, (b'{"booked": "PNR000"}', *items.contents[1:]),
                              items.digests, items.formats)
        return snapshot.__class__(snapshot.tenant_id, snapshot.partition_key, snapshot.head,
                                  snapshot.checkpoints, {response_id: bad}, snapshot.damaged)

    store.read_turn = damaged
    try:
        assert _orphaned(worker.handle(_late_effect(t, function_call_output(
            "call_a", '{"booked": "PNR999"}', item_id="fco_b")))) == []
    finally:
        del store.read_turn


@pytest.mark.parametrize("listed", [True, False])
def test_a_listed_or_earlier_recorded_effect_is_unchanged(data, listed):
    """The effects recorded before the turn keep their rules: listed or carried, used;
    the checkpoint keeps them among the effects its turn uses, nothing is orphaned."""
    worker = data.worker("handle")
    out = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
    t = _carried_turn(output=out)
    effect = _late_effect(t, out)
    worker.handle(effect)
    if listed:
        t = t.model_copy(update={"tool_effect_ids": [effect.effect_id]})
    _promoted(worker, t)
    assert _orphaned(worker.handle(effect)) == []
    assert _orphaned(worker.handle(t)) == []
    stored = data.store().read_checkpoint(t.tenant_id, t.response_id)
    assert stored.accepted_effect_ids == (effect.effect_id,)
