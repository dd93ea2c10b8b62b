"""An effect claim row whose call id, tool name, arguments digest or subturn index reads
null is damage too, to the claims API and to the processor alike (both backends; an
outside review of session 53's damaged effect-claim rule).

Every claim is written with them (``ClaimIn`` requires each, non-empty:
``claims.new_claim``), yet ``claims.claim_damage`` checked only the token, attempt,
lease, claim time and completion flag. So a row missing one of these four was read by
the cell: a valid turn of another attempt of the request was dead-lettered (its
``EffectOrphaned`` could not be built without the call id or tool name: the very
failure session 53 fixed for a null attempt), the turn carrying the recorded result was
promoted on a row that no longer says which call ran, and the claims API answered a
later claimant ``CONFLICT`` ("claimed with other arguments") for a digest the row does
not hold.
"""

from __future__ import annotations

import uuid

import pytest

from ratchet.samples import TENANT, make_tool_effect, make_turn_cancelled, new_id
from schemas.models import CheckpointPromoted
from tests.contract.claim_damage import IDENTITY_CELLS, null_claim_cell
from tests.contract.test_api_damaged_effect_claims import Client, corrupt
from tests.contract.test_processor_damaged_effect_claims import (
    _completed_claim,
    _corrupt,
    _orphans,
    _using,
)
from tests.unit.test_processor_rules import turn

# The turn-side cases of these cells run in test_processor_damaged_effect_claims.py
# (its CELLS are every cell of the row); here the claims API and the late effects.


@pytest.mark.parametrize("cell", IDENTITY_CELLS)
def test_the_claims_api_answers_such_a_row_corrupt(store_and_ledger, cell):
    api = Client(store_and_ledger)
    token = uuid.uuid4().hex
    claimed = api.claim(token)
    assert claimed.status_code == 200 and claimed.json()["state"] == "CLAIMED", claimed.text
    effect_id = claimed.json()["effect_id"]
    null_claim_cell(api.ledger, api.key, effect_id, cell)
    corrupt(api.claim(uuid.uuid4().hex, attempt=2), cell)  # another claimant
    corrupt(api.complete(effect_id, token), cell)  # the holder's completion


# --- a late ToolEffect of another effect of the request -------------------------------


def _other_effect(conv: str, key: str):
    """Attempt 1's run of another tool (no claim): an effect of the same request."""
    return make_tool_effect("c9", idempotency_key=key, conversation_id=conv,
                            response_id=new_id("resp"))


@pytest.mark.parametrize("first", ["effect", "cancellation"])
def test_a_cancelled_requests_effects_are_withheld_whichever_comes_first(data, first):
    """The request's claim A is damaged; it is cancelled, and another effect B of it is
    recorded. B recorded first, the cancellation withheld it (its claims cannot be
    read); recorded after, it was published ``TURN_CANCELLED``: the same facts, an
    order to compensate or none by arrival order."""
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    null_claim_cell(data.ledger(), key, effect_id, "claim_completed")
    worker = data.worker("handle")
    cancel = make_turn_cancelled(turn(conv, 0, idempotency_key=key, attempt=2))
    events = ([_other_effect(conv, key), cancel] if first == "effect"
              else [cancel, _other_effect(conv, key)])
    published = [o for event in events for o in _orphans(worker.handle(event))]
    assert published == [], (first, published)


def test_a_promoted_requests_late_effect_is_withheld_as_its_redelivery_withholds(data):
    """Promoted (attempt 2, the claim intact then), the claim damaged, attempt 1's late
    effect B: its redelivered promotion publishes no orphan of the request, and B
    alone was published ``ATTEMPT_SUPERSEDED``."""
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    worker = data.worker("handle")
    promoted = turn(conv, 0, idempotency_key=key, attempt=2)
    assert isinstance(worker.handle(promoted).outbound[0].model, CheckpointPromoted)
    null_claim_cell(data.ledger(), key, effect_id, "attempt")
    again = worker.handle(promoted)
    assert isinstance(again.outbound[0].model, CheckpointPromoted)
    assert _orphans(again) == []
    late = _orphans(worker.handle(_other_effect(conv, key)))
    assert late == [], late


def test_another_requests_damaged_claim_changes_nothing_here(data):
    """A guard: claims are found by tenant and key, so request K1's damaged claim is
    nothing to request K2 of the same Conversation (promoted, its run orphaned as
    ever)."""
    conv, damaged_key, key = new_id("conv"), new_id("idem"), new_id("idem")
    damaged = _completed_claim(data, conv, damaged_key)
    null_claim_cell(data.ledger(), damaged_key, damaged, "claim_completed")
    effect_id = _completed_claim(data, conv, key)
    handled = data.worker("handle").handle(turn(conv, 0, idempotency_key=key, attempt=2))
    assert isinstance(handled.outbound[0].model, CheckpointPromoted), handled.outbound
    assert [o[0] for o in _orphans(handled)] == [effect_id]


@pytest.mark.parametrize("cell", ["call_id", "claim_completed"])
def test_status_says_what_the_processor_decided(data, cell):
    """A guard: ``/status``'s record of the turn is the rejection published."""
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    null_claim_cell(data.ledger(), key, effect_id, cell)
    using = _using(conv, key, effect_id)
    _corrupt(data.worker("handle").handle(using), cell)
    status = data.ledger().status(TENANT, using.response_id)
    assert (status.status.value, status.reason) == ("rejected", "CORRUPT"), status
