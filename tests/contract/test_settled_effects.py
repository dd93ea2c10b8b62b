"""Compensation of a request's effects once the request stands promoted (an outside
review, session 38; both backends, both entry points; each test failed before its fix).

1. An effect recorded after its request's promotion whose output the promoted turn
   carries is used. A later record of its id with another output (an attempt re-ran
   the tool) marks it conflicted; that must not make the run in the history look
   unused: a redelivery of the promoted turn, a retry under its response id and one
   under another published it ``ATTEMPT_SUPERSEDED`` / ``EFFECT_CONFLICT`` under the
   used output, and compensators undid the booking the model saw.
2. A rejected retry (a ``failed`` status, a reused key) of a request that stands
   promoted orphans what it ran ``ATTEMPT_SUPERSEDED``, final: the request is settled.
   It was ``TURN_NOT_PROMOTABLE`` / ``TURN_REJECTED``, after which the docs tell a
   compensator to wait for a later promotion that can never come."""

from __future__ import annotations

import uuid

import pytest

from ratchet.domain.claims import (
    ClaimRequest,
    ClaimState,
    EffectPolicy,
    effect_id_for_claim,
)
from ratchet.samples import NOW_MS, TENANT, make_turn_cancelled, new_id
from schemas.canonical import canonical_digest
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.models import CheckpointPromoted, EffectOrphaned, OrphanReason
from tests.contract.test_late_carried_effects import _carried_turn, _late_effect, _promoted
from tests.contract.test_processor_handover import ENTRIES
from tests.contract.test_processor_races import turn as race_turn
from tests.contract.test_processor_races import uid
from tests.unit.test_processor_carried_effects import _claim_and_complete
from tests.unit.test_processor_rules import Harness, conv_id, turn

BOOKED = function_call_output("call_a", '{"booked": "PNR123"}', item_id="fco_a")
REBOOKED = function_call_output("call_a", '{"booked": "PNR999"}', item_id="fco_b")


def _orphans(handled) -> list[tuple[str, OrphanReason, str]]:
    return [(o.model.effect_id, o.model.reason, o.model.output_digest)
            for o in handled.outbound if isinstance(o.model, EffectOrphaned)]


def _compensates_the_booking(orphans) -> list:
    final = (OrphanReason.ATTEMPT_SUPERSEDED, OrphanReason.EFFECT_CONFLICT)
    return [o for o in orphans if o[1] in final and o[2] == BOOKED.content_digest]


@ENTRIES
def test_a_redelivery_never_orphans_the_carried_run_after_a_rerun(data, entry):
    worker = data.worker(entry)
    promoted = _carried_turn(output=BOOKED)
    _promoted(worker, promoted)
    assert _orphans(worker.handle(_late_effect(promoted, BOOKED))) == []  # carried: used
    rerun = _late_effect(promoted, REBOOKED)
    # The re-run is another execution no turn uses: final, under its own output.
    assert _orphans(worker.handle(rerun)) == [
        (rerun.effect_id, OrphanReason.EFFECT_CONFLICT, REBOOKED.content_digest)]
    assert _compensates_the_booking(_orphans(worker.handle(promoted))) == []


@ENTRIES
@pytest.mark.parametrize("lists", [False, True])
def test_a_retry_under_another_response_id_never_orphans_the_carried_run(
        data, entry, lists):
    worker = data.worker(entry)
    promoted = _carried_turn(output=BOOKED)
    _promoted(worker, promoted)
    late = _late_effect(promoted, BOOKED)
    worker.handle(late)
    worker.handle(_late_effect(promoted, REBOOKED))
    retry = _carried_turn(output=BOOKED, key=promoted.idempotency_key,
                          conv=promoted.conversation_id, attempt=2,
                          tool_effect_ids=(late.effect_id,) if lists else ())
    assert _compensates_the_booking(_orphans(worker.handle(retry))) == []


@ENTRIES
def test_a_retry_that_reran_the_tool_never_orphans_the_carried_run(data, entry):
    """Attempt 1 promoted carrying PNR123 (its ToolEffect produced after the turn);
    attempt 2, whose gateway lost the answer, re-runs the tool (PNR999) and sends its
    turn under the same response id: answered with the promotion."""
    worker = data.worker(entry)
    promoted = _carried_turn(output=BOOKED)
    _promoted(worker, promoted)
    worker.handle(_late_effect(promoted, BOOKED))
    worker.handle(_late_effect(promoted, REBOOKED).model_copy(update={"attempt": 2}))
    retry = _carried_turn(output=REBOOKED, key=promoted.idempotency_key,
                          conv=promoted.conversation_id, attempt=2,
                          response_id=promoted.response_id)
    answer = worker.handle(retry)
    assert isinstance(answer.outbound[0].model, CheckpointPromoted)
    assert _compensates_the_booking(_orphans(answer)) == []


@pytest.mark.parametrize("how", ["failed", "key_reused"])
def test_a_rejected_retry_of_a_promoted_request_orphans_its_run_final(how):
    h = Harness()
    conv, key = conv_id(), new_id("idem")
    assert isinstance(h.outcome(turn(conv, 0, idempotency_key=key, attempt=1)),
                      CheckpointPromoted)
    # Attempt 2 (attempt 1's answer lost) takes another path and runs another tool.
    sent = function_call_output("c9", '{"sent": "id-9"}', item_id="fco_9")
    effect_id = _claim_and_complete(h, key, conv, "c9", sent, tool="send_sms", attempt=2)
    extra = ({"status": "failed"} if how == "failed"
             else {"request_digest": canonical_digest(["other", key])})
    retry = turn(conv, 1, idempotency_key=key, attempt=2, response_id=new_id("resp"),
                 items=[function_call("c9", "send_sms", {"to": "bob"}, item_id="fc_9"), sent,
                        message("done", role="assistant", item_id=new_id("msg"))],
                 tool_effect_ids=(effect_id,), **extra)
    handled = h.processor.handle(h.record(retry))
    assert [(o[0], o[1]) for o in _orphans(handled)] == [
        (effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


@ENTRIES
@pytest.mark.parametrize("cancel_first", [False, True])
def test_a_cancelled_requests_vanished_claim_is_published_in_either_order(
        data, entry, cancel_first):
    """Attempt 1 claims ``pay`` and vanishes (no outcome, no turn); attempt 2 gets
    ``LEASE_EXPIRED``, fails its turn, and the gateway cancels the request. With the
    failed turn first, the claim (which may have run) was published nowhere: the turn
    orphaned its own attempt's effects, the cancellation nothing. It is published
    ``TURN_CANCELLED`` with ``effect_completed`` false in either order now."""
    ledger, store = data.ledger(), data.store()
    worker = data.worker(entry, store=store, ledger=ledger)
    conv, key = uid("conv"), uid("idem")
    effect_id = effect_id_for_claim(key, 0, "pay", 0)

    def claim(attempt: int, now_ms: int):
        request = ClaimRequest(TENANT, key, effect_id, attempt, 0, f"c{attempt}", "pay",
                               arguments_digest({"eur": 10}), uuid.uuid4().hex, 1_000,
                               EffectPolicy.AT_MOST_ONCE)
        store.mark_request_facts(TENANT, conv, key)
        answer = ledger.claim_effect(request, now_ms)
        store.mark_request_facts(TENANT, conv, key)
        return answer.state

    assert claim(1, NOW_MS) is ClaimState.CLAIMED  # runs pay() and dies
    assert claim(2, NOW_MS + 5_000) is ClaimState.LEASE_EXPIRED  # must not run it
    failed = race_turn(conv, 0, idempotency_key=key, attempt=2, status="failed")
    cancel = make_turn_cancelled(failed)
    published = []
    for event in ([cancel, failed] if cancel_first else [failed, cancel]):
        published += [(o.model.effect_id, o.model.reason, o.model.effect_completed,
                       o.model.output_digest)
                      for o in worker.handle(event).outbound
                      if isinstance(o.model, EffectOrphaned)]
    # No outcome recorded: no output digest either (null, never an empty string; a
    # mutation review, session 43).
    assert (effect_id, OrphanReason.TURN_CANCELLED, False, None) in published, published


@ENTRIES
def test_a_cancellation_after_the_promotion_publishes_nothing(data, entry):
    """The promotion decided the request's effects; a cancellation after it is dropped."""
    worker = data.worker(entry)
    promoted = _carried_turn(output=BOOKED)
    _promoted(worker, promoted)
    assert _orphans(worker.handle(_late_effect(promoted, BOOKED))) == []
    assert _orphans(worker.handle(make_turn_cancelled(promoted))) == []
