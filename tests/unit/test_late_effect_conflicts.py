"""A tool run again with another output is published for compensation, whenever its
``ToolEffect`` comes (found by a gateway built from the docs alone, session 30).

CONTRACT 4: a second record of an effect id with another output digest is an effect
conflict; docs/gateway-protocol.md section 7: ``EFFECT_CONFLICT`` is final (compensate).
Before, a conflicting ``ToolEffect`` that came after its request's promotion was
published nowhere when the promoted turn had listed the effect (a double charge never
compensated: only a log line), nowhere either when it disagreed with a listed claim's
completion, and as ``ATTEMPT_SUPERSEDED`` under the first run's ``effect_id`` when the
effect was unused (a compensator deduping by effect id dropped it). Now each such
execution is published ``EFFECT_CONFLICT`` at once with its own ``output_digest``,
unless the promoted turn carries that very output.
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
from ratchet.samples import NOW_MS, TENANT, make_tool_effect, new_id
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.models import CheckpointPromoted, OrphanReason, RejectionReason
from tests.unit.test_processor_carried_effects import _claim_and_complete
from tests.unit.test_processor_rules import Harness, conv_id, turn

R = OrphanReason


def _turn(conv, key, output, listed=(), call_id="c1", tool="send_email", args=None):
    items = [function_call(call_id, tool, args or {"to": "bob"}, item_id="fc_1"), output,
             message("sent", role="assistant", item_id=new_id("msg"))]
    return turn(conv, 0, items=items, idempotency_key=key, attempt=1,
                tool_effect_ids=tuple(listed))


def _effect(conv, key, output, effect_id=None, call_id="c1"):
    fields = {} if effect_id is None else {"effect_id": effect_id}
    return make_tool_effect(call_id, output, idempotency_key=key, conversation_id=conv,
                            tool_name="send_email", arguments={"to": "bob"}, **fields)


def _orphans(h, event):
    return [(o.effect_id, o.reason, o.output_digest) for o in h.orphans(event)]


def test_a_rerun_after_the_promotion_that_listed_the_effect_is_an_effect_conflict():
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    first = function_call_output("c1", '{"charged": 1}', item_id="fco_1")
    again = function_call_output("c1", '{"charged": 2}', item_id="fco_2")
    e1 = _effect(conv, key, first)
    assert _orphans(h, e1) == []
    promoted = h.outcome(_turn(conv, key, first, listed=(e1.effect_id,)))
    assert isinstance(promoted, CheckpointPromoted)
    e2 = _effect(conv, key, again, effect_id=e1.effect_id)
    assert _orphans(h, e2) == [(e1.effect_id, R.EFFECT_CONFLICT, again.content_digest)], (
        "the second execution is in no history: it must reach compensators")
    # A redelivery of either record: the first run is the promoted turn's (never
    # orphaned), the second is published again (compensators dedupe by effect id and
    # output digest for EFFECT_CONFLICT).
    assert _orphans(h, e1) == []
    assert _orphans(h, e2) == [(e1.effect_id, R.EFFECT_CONFLICT, again.content_digest)]


def test_a_rerun_of_an_unused_effect_is_an_effect_conflict_under_its_own_digest():
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    carried = function_call_output("c1", '{"charged": 0}', item_id="fco_0")
    assert isinstance(h.outcome(_turn(conv, key, carried)), CheckpointPromoted)
    run1 = function_call_output("c1", '{"charged": 1}', item_id="fco_1")
    run2 = function_call_output("c1", '{"charged": 2}', item_id="fco_2")
    e1 = _effect(conv, key, run1)
    assert _orphans(h, e1) == [(e1.effect_id, R.ATTEMPT_SUPERSEDED, run1.content_digest)]
    e2 = _effect(conv, key, run2, effect_id=e1.effect_id)
    assert _orphans(h, e2) == [(e1.effect_id, R.EFFECT_CONFLICT, run2.content_digest)]


def test_a_rerun_the_promoted_turn_carries_is_not_orphaned():
    """The promoted turn answered the call with the output a late record carries (that
    run is in the history): nothing to compensate for it."""
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    carried = function_call_output("c1", '{"charged": 2}', item_id="fco_2")
    assert isinstance(h.outcome(_turn(conv, key, carried)), CheckpointPromoted)
    other = function_call_output("c1", '{"charged": 1}', item_id="fco_1")
    e1 = _effect(conv, key, other)
    assert _orphans(h, e1) == [(e1.effect_id, R.ATTEMPT_SUPERSEDED, other.content_digest)]
    e2 = _effect(conv, key, carried, effect_id=e1.effect_id)
    assert _orphans(h, e2) == []


def test_a_holders_tool_effect_unlike_a_listed_claims_completion_after_the_promotion():
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    completed = function_call_output("c1", '{"sent": "message-id-1"}', item_id="fco_1")
    effect_id = _claim_and_complete(h, key, conv, "c1", completed)
    t = _turn(conv, key, completed, listed=(effect_id,))
    assert isinstance(h.outcome(t), CheckpointPromoted)
    other = function_call_output("c1", '{"sent": "message-id-2"}', item_id="fco_1")
    late = _effect(conv, key, other, effect_id=effect_id)
    assert _orphans(h, late) == [(effect_id, R.EFFECT_CONFLICT, other.content_digest)]
    same = _effect(conv, key, completed, effect_id=effect_id)  # the completion's own
    # never orphaned; the other run may be named again (compensators dedupe by effect
    # id and output digest): it was recorded before this one
    assert set(_orphans(h, same)) <= {(effect_id, R.EFFECT_CONFLICT, other.content_digest)}


def test_a_conflict_before_the_promotion_publishes_each_execution():
    """The second execution at once; the first with the turn that lists the conflicted
    effect, refused ``DUPLICATE_TOOL_EFFECT`` as before."""
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    run1 = function_call_output("c1", '{"charged": 1}', item_id="fco_1")
    run2 = function_call_output("c1", '{"charged": 2}', item_id="fco_2")
    e1 = _effect(conv, key, run1)
    assert _orphans(h, e1) == []
    e2 = _effect(conv, key, run2, effect_id=e1.effect_id)
    assert _orphans(h, e2) == [(e1.effect_id, R.EFFECT_CONFLICT, run2.content_digest)]
    handled = h.processor.handle(h.record(_turn(conv, key, run1, listed=(e1.effect_id,))))
    assert handled.outbound[0].model.reason is RejectionReason.DUPLICATE_TOOL_EFFECT
    orphans = [(o.model.effect_id, o.model.reason, o.model.output_digest)
               for o in handled.outbound[1:]]
    assert orphans == [(e1.effect_id, R.EFFECT_CONFLICT, run1.content_digest)]


# --- the claim's completion is the effect's reference output (a review, session 31) ------
# A holder whose lease ran out may still record its ToolEffect before the claim's taker
# completes the claim with another output. The completion is the effect's execution
# (gateway-protocol.md section 8, rule 3), whatever was recorded before it.


def _takeover(h, conv, key):
    """Attempt 1 claims the effect (call c1) and its lease runs out; attempt 2 takes
    the claim over (call c2). Returns (effect id, attempt 2's claim request)."""
    effect_id = effect_id_for_claim(key, 0, "send_email", 0)
    requests = []
    for attempt, now in ((1, NOW_MS), (2, NOW_MS + 5_000)):
        req = ClaimRequest(TENANT, key, effect_id, attempt, 0, f"c{attempt}", "send_email",
                           arguments_digest({"to": "bob"}), uuid.uuid4().hex, 1_000,
                           EffectPolicy.AT_LEAST_ONCE)
        h.store.mark_request_facts(TENANT, conv, key)
        assert h.ledger.claim_effect(req, now).state is ClaimState.CLAIMED
        h.store.mark_request_facts(TENANT, conv, key)
        requests.append(req)
    return effect_id, requests[1]


def _complete(h, conv, key, effect_id, req, output):
    state, _ = h.ledger.complete_claim(TENANT, key, effect_id, req.token, "succeeded",
                                       output, NOW_MS + 6_000)
    h.store.mark_request_facts(TENANT, conv, key)
    assert state is CompletionState.COMPLETED


def _attempt_effect(conv, key, output, effect_id, attempt):
    return make_tool_effect(f"c{attempt}", output, idempotency_key=key, conversation_id=conv,
                            tool_name="send_email", arguments={"to": "bob"},
                            attempt=attempt, effect_id=effect_id)


def _stale_run_then_completion(h):
    """The stale holder (attempt 1) records its run while the claim is open (nothing
    published: the first record); then the taker (attempt 2) completes the claim with
    another output. Returns (conv, key, effect id, the stale run, the completion)."""
    conv, key = conv_id(), new_id("idem")
    effect_id, taker = _takeover(h, conv, key)
    stale = function_call_output("c1", '{"sent": "m-1"}', item_id="fco_a1")
    done = function_call_output("c2", '{"sent": "m-2"}', item_id="fco_a2")
    assert _orphans(h, _attempt_effect(conv, key, stale, effect_id, 1)) == []
    _complete(h, conv, key, effect_id, taker, done)
    return conv, key, effect_id, stale, done


def _takers_turn(conv, key, done, effect_id):
    """The taker's turn: it lists the effect and carries the completion."""
    items = [function_call("c2", "send_email", {"to": "bob"}, item_id="fc_2"), done,
             message("sent", role="assistant", item_id=new_id("msg"))]
    return turn(conv, 0, items=items, idempotency_key=key, attempt=2,
                tool_effect_ids=(effect_id,))


def test_a_stale_holders_run_recorded_before_the_completion_is_published():
    """Before: the stale holder's output (recorded first, the claim not completed yet)
    was published nowhere, and the completion's own ToolEffect was published
    EFFECT_CONFLICT twice. Now the completion's ToolEffect publishes the earlier run,
    and the completion is decided by its turn (refused: the effect id is conflicted)."""
    h = Harness()
    conv, key, effect_id, stale, done = _stale_run_then_completion(h)
    assert _orphans(h, _attempt_effect(conv, key, done, effect_id, 2)) == [
        (effect_id, R.EFFECT_CONFLICT, stale.content_digest)]
    handled = h.processor.handle(h.record(_takers_turn(conv, key, done, effect_id)))
    assert handled.outbound[0].model.reason is RejectionReason.DUPLICATE_TOOL_EFFECT
    assert sorted((o.model.effect_id, o.model.reason, o.model.output_digest)
                  for o in handled.outbound[1:]) == sorted([
        (effect_id, R.EFFECT_CONFLICT, done.content_digest),
        (effect_id, R.EFFECT_CONFLICT, stale.content_digest)])  # named again: deduped


def test_the_completions_own_tool_effect_is_not_orphaned_when_the_promotion_used_it():
    """Attempt 3 reused the completion (rule 3: its own call id) and was promoted; the
    stale holder's run then arrives (published), then the completion's own ToolEffect,
    delayed: before, it was published EFFECT_CONFLICT (a compensator would have undone
    the action the history reports)."""
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    effect_id, taker = _takeover(h, conv, key)
    done = function_call_output("c2", '{"sent": "m-2"}', item_id="fco_a2")
    _complete(h, conv, key, effect_id, taker, done)
    reused = function_call_output("c3", '{"sent": "m-2"}', item_id="fco_a3")
    items = [function_call("c3", "send_email", {"to": "bob"}, item_id="fc_3"), reused,
             message("sent", role="assistant", item_id=new_id("msg"))]
    promoted = h.outcome(turn(conv, 0, items=items, idempotency_key=key, attempt=3,
                              tool_effect_ids=(effect_id,)))
    assert isinstance(promoted, CheckpointPromoted)
    stale = function_call_output("c1", '{"sent": "m-1"}', item_id="fco_a1")
    assert _orphans(h, _attempt_effect(conv, key, stale, effect_id, 1)) == [
        (effect_id, R.EFFECT_CONFLICT, stale.content_digest)]
    published = _orphans(h, _attempt_effect(conv, key, done, effect_id, 2))
    assert (effect_id, R.EFFECT_CONFLICT, done.content_digest) not in published
    # the stale run may be named again (compensators dedupe by effect id and digest)
    assert set(published) <= {(effect_id, R.EFFECT_CONFLICT, stale.content_digest)}


def test_a_stale_holders_run_is_named_by_the_turns_verdict_without_the_completions_effect():
    """The taker completes the claim but its ToolEffect never comes (a SHOULD, or a
    crash): the stale holder's run, recorded first, was named by no verdict (a review,
    session 31). Every verdict of the request names it now, under an outcome id of its
    own beside the effect id's own orphan."""
    h = Harness()
    conv, key, effect_id, stale, done = _stale_run_then_completion(h)
    handled = h.processor.handle(h.record(_takers_turn(conv, key, done, effect_id)))
    assert handled.outbound[0].model.reason is RejectionReason.DUPLICATE_TOOL_EFFECT
    orphans = [o.model for o in handled.outbound[1:]]
    assert sorted((o.reason, o.output_digest) for o in orphans) == sorted([
        (R.EFFECT_CONFLICT, stale.content_digest), (R.EFFECT_CONFLICT, done.content_digest)])
    assert len({o.event_id for o in orphans}) == 2
    # a retry that does without the tool is promoted, and names the stale run again
    retry = turn(conv, 0, items=[message("no mail", role="assistant", item_id=new_id("msg"))],
                 idempotency_key=key, attempt=3)
    handled = h.processor.handle(h.record(retry))
    assert isinstance(handled.outbound[0].model, CheckpointPromoted)
    assert (R.EFFECT_CONFLICT, stale.content_digest) in [
        (o.model.reason, o.model.output_digest) for o in handled.outbound[1:]]
