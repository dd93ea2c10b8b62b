"""A stale holder's output for a claimed call is never promoted after a takeover.

Promise (docs/gateway-protocol.md section 8, "Recording": "an output answering a call
whose claim has no outcome is `MISSING_TOOL_EFFECT`"; a takeover's claim keeps the call
ids of the holders it replaced). Attempt 1 claims E for call c1, its lease expires,
attempt 2 takes E over for c2; attempt 1's completion is NOT_HOLDER, and its turn
carrying its own output for c1 is MISSING_TOOL_EFFECT (found by an outside review: it
was promoted, the takeover having erased c1).
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
from ratchet.samples import NOW_MS, TENANT, new_id
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.models import RejectionReason
from tests.unit.test_processor_rules import Harness, conv_id, turn


def _claim(h: Harness, key: str, conv: str, call_id: str, attempt: int,
           policy: EffectPolicy, now_ms: int, lease_ms: int) -> tuple[ClaimRequest, object]:
    effect_id = effect_id_for_claim(key, 0, "send_email", 0)
    request = ClaimRequest(TENANT, key, effect_id, attempt, 0, call_id, "send_email",
                           arguments_digest({"to": "bob"}), uuid.uuid4().hex, lease_ms, policy)
    h.store.mark_request_facts(TENANT, conv, key)  # as the claims API does, around the write
    answer = h.ledger.claim_effect(request, now_ms)
    h.store.mark_request_facts(TENANT, conv, key)
    return request, answer


def test_a_stale_holders_output_for_a_taken_over_claim_is_not_promoted():
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    first, answer = _claim(h, key, conv, "c1", 1, EffectPolicy.AT_MOST_ONCE, NOW_MS, 100)
    assert answer.state is ClaimState.CLAIMED
    taker, taken = _claim(h, key, conv, "c2", 2, EffectPolicy.AT_LEAST_ONCE, NOW_MS + 1_000,
                          30_000)
    assert (taken.state, taken.previous_attempt) == (ClaimState.CLAIMED, 1)
    # the stale holder may not record an outcome any more
    stale_output = function_call_output("c1", '{"sent": "by attempt 1"}', item_id="fco_1")
    state, _ = h.ledger.complete_claim(TENANT, key, first.effect_id, first.token,
                                       "succeeded", stale_output, NOW_MS + 1_100)
    assert state is CompletionState.NOT_HOLDER
    # ... yet its turn, carrying that output for the claimed call c1, is promoted
    items = [function_call("c1", "send_email", {"to": "bob"}, item_id="fc_1"), stale_output,
             message("sent", role="assistant", item_id=new_id("msg"))]
    stale_turn = turn(conv, 0, items=items, idempotency_key=key, attempt=1)
    outcome = h.outcome(stale_turn)
    assert getattr(outcome, "reason", None) is RejectionReason.MISSING_TOOL_EFFECT, (
        f"promoted at seq {getattr(outcome, 'seq', None)}: an output answering claimed call "
        "c1, whose (taken over) claim has no outcome")


def test_an_output_for_a_claimed_call_with_no_outcome_is_missing_even_unlisted():
    """An output answering a call whose claim has no outcome is ``MISSING_TOOL_EFFECT``
    (docs/gateway-protocol.md section 8), also when the turn does not list the claim's
    effect id: never ``DUPLICATE_TOOL_EFFECT`` (no outcome was recorded to differ from).
    Found by a mutation review: the unlisted case could fall through to the "differs
    from the recorded outcome" rule with every test passing."""
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    _, answer = _claim(h, key, conv, "c1", 1, EffectPolicy.AT_MOST_ONCE, NOW_MS, 60_000)
    assert answer.state is ClaimState.CLAIMED
    items = [function_call("c1", "send_email", {"to": "bob"}, item_id="fc_1"),
             function_call_output("c1", '{"sent": true}', item_id="fco_1"),
             message("sent", role="assistant", item_id=new_id("msg"))]
    unlisted = turn(conv, 0, items=items, idempotency_key=key, attempt=1)
    assert unlisted.tool_effect_ids == ()
    assert getattr(h.outcome(unlisted), "reason", None) is RejectionReason.MISSING_TOOL_EFFECT
