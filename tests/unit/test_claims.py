"""The claim state machine and the effect key (ratchet/domain/claims.py), pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratchet.domain import claims
from ratchet.domain.claims import (
    Answer,
    ClaimRequest,
    ClaimState,
    CompletionState,
    EffectPolicy,
    Insert,
    TakeOver,
)
from ratchet.domain.plan import CorruptPartition
from schemas.items import function_call_output, mcp_call

NOW = 1_000_000


def request(**kw) -> ClaimRequest:
    fields = dict(tenant_id="t", idempotency_key="k", effect_id="eff_x", attempt=1,
                  subturn_index=0, call_id="call_1", tool_name="send", arguments_digest="a1",
                  token="tok1", lease_ms=1000, policy=EffectPolicy.AT_MOST_ONCE)
    fields.update(kw)
    return ClaimRequest(**fields)


HELD = claims.new_claim(request(), NOW)


def test_effect_key_ignores_call_id_and_arguments_but_not_slot():
    key = claims.effect_id_for_claim("k", 0, "send", 0)
    assert key == claims.effect_id_for_claim("k", 0, "send", 0)
    assert len({key, claims.effect_id_for_claim("k", 1, "send", 0),
                claims.effect_id_for_claim("k", 0, "send", 1),
                claims.effect_id_for_claim("k", 0, "other", 0),
                claims.effect_id_for_claim("k2", 0, "send", 0)}) == 5
    assert key.startswith("eff_") and len(key) == 36
    with pytest.raises(ValueError):
        claims.effect_id_for_claim("k", -1, "send", 0)


def test_new_claim_inserted_unless_cancelled():
    action = claims.decide_claim(None, request(), NOW, cancelled=False)
    assert isinstance(action, Insert) and action.claim.lease_until == NOW + 1000
    refused = claims.decide_claim(None, request(), NOW, cancelled=True)
    assert isinstance(refused, Answer) and refused.state is ClaimState.CANCELLED


@pytest.mark.parametrize("cells", [{"token": None}, {"lease_until": None}, {"completed": None},
                                   {"completed": True}])  # completed: no status, no output
def test_a_claim_row_with_a_null_cell_decides_nothing(cells):
    """``claim_damage``: no rule is read off a row missing a cell it is written with
    (a null lease was a ``TypeError`` in rule 6, an API 500 ``INTERNAL``)."""
    damaged = replace(HELD, **cells)
    with pytest.raises(CorruptPartition, match="is damaged: it names no "):
        claims.decide_claim(damaged, request(token="tok2"), NOW, cancelled=False)


@pytest.mark.parametrize(("existing", "req", "now", "cancelled", "state"), [
    (HELD, request(arguments_digest="a2"), NOW, False, ClaimState.CONFLICT),
    (replace(HELD, completed=True, status="succeeded",  # a completed row: its outcome
             output=function_call_output("call_1", "ok", item_id="o1")),
     request(token="tok2"), NOW, True, ClaimState.COMPLETED),
    (HELD, request(token="tok2"), NOW, True, ClaimState.CANCELLED),
    (HELD, request(), NOW + 500, False, ClaimState.CLAIMED),  # same token: re-sent call
    (HELD, request(token="tok2"), NOW + 400, False, ClaimState.IN_PROGRESS),
    (HELD, request(token="tok2"), NOW + 1000, False, ClaimState.LEASE_EXPIRED),
])
def test_state_machine_answers(existing, req, now, cancelled, state):
    action = claims.decide_claim(existing, req, now, cancelled)
    assert isinstance(action, Answer) and action.state is state
    if state is ClaimState.IN_PROGRESS:
        assert action.wait_ms == 600


def test_a_resent_claim_whose_lease_ran_out_renews_it():
    """Rule 5 after the lease: the holder never started (its answer was lost), so its
    lease is renewed by the takeover's conditional write, never answered over."""
    for policy in EffectPolicy:
        action = claims.decide_claim(HELD, request(policy=policy), NOW + 5000, False)
        assert isinstance(action, TakeOver) and action.previous == HELD
        assert action.claim == replace(HELD, lease_until=NOW + 6000, claimed_at=NOW + 5000)
        answer = claims.answer_for(action)
        assert (answer.state, answer.claim.lease_until) == (ClaimState.CLAIMED, NOW + 6000)


def test_expired_lease_taken_over_only_at_least_once():
    taker = request(token="tok2", attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
    action = claims.decide_claim(HELD, taker, NOW + 1000, cancelled=False)
    assert isinstance(action, TakeOver) and action.previous == HELD
    assert (action.claim.token, action.claim.attempt, action.claim.takeovers) == ("tok2", 2, 1)
    answer = claims.answer_for(action)
    assert (answer.state, answer.previous_attempt) == (ClaimState.CLAIMED, 1)


def test_completion_only_by_holder():
    out = function_call_output("call_1", "ok", item_id="o1")
    other = function_call_output("call_1", "ko", item_id="o1")
    assert claims.decide_completion(None, "tok1", "succeeded", out) is (
        CompletionState.UNKNOWN_CLAIM)
    assert claims.decide_completion(HELD, "tok2", "succeeded", out) is CompletionState.NOT_HOLDER
    assert claims.decide_completion(HELD, "tok1", "succeeded", out) is None
    done = claims.completed(HELD, "succeeded", out, NOW)
    assert claims.decide_completion(done, "tok1", "succeeded", out) is (
        CompletionState.ALREADY_COMPLETED)
    assert claims.decide_completion(done, "tok1", "succeeded", other) is (
        CompletionState.OUTCOME_CONFLICT)
    # the same output under another status is another outcome: never silently accepted
    assert claims.decide_completion(done, "tok1", "failed", out) is (
        CompletionState.OUTCOME_CONFLICT)
    assert claims.decide_completion(done, "tok2", "succeeded", out) is (
        CompletionState.NOT_HOLDER)


def test_rekeyed_output_keeps_the_result_not_the_ids():
    out = function_call_output("call_1", "sent", item_id="o1")
    again = claims.rekey_output(out, call_id="call_9", item_id="o9")
    assert (again.call_id, again.item_id, again.digest_ok()) == ("call_9", "o9", True)
    assert again.content_digest != out.content_digest
    assert claims.result_digest(again) == claims.result_digest(out)
    assert claims.result_digest(function_call_output("call_1", "other", item_id="o1")) \
        != claims.result_digest(out)
    mcp = mcp_call("srv", "tool", {"a": 1}, "out", item_id="mcp_1")
    assert claims.rekey_output(mcp, call_id="x", item_id="mcp_2").call_id is None
    assert claims.output_from_json(claims.output_to_json(out)) == out
