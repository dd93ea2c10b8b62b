"""The processor meets an effect claim row with a null cell the way the claims API
does: damage, never a reading of the cell (both backends, both entry points; an
outside review of session 53).

Session 53 made such a row the claims API's 500 ``CORRUPT_HISTORY``
(``claims.claim_damage``); the processor read the same rows with the request's facts
and decided on them: a null completion flag read "not completed" (the turn that
carried the recorded result ``MISSING_TOOL_EFFECT``, and the run published
``TURN_REJECTED`` for compensation), a null status or token promoted as if whole, a
null attempt dead-lettered a valid turn (its orphan event could not be built), and a
later ``ToolEffect`` of the claim's own execution was published ``EFFECT_CONFLICT``
(ordered undone) because the claim's completion no longer counted as its reference
output. Now every turn of such a request is ``CORRUPT`` and no orphan of the request
is published on it (``orphans withheld``): the partition needs an operator.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ratchet.samples import TENANT, make_tool_effect, make_turn_cancelled, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import (
    CheckpointPromoted,
    DeadLetter,
    EffectOrphaned,
    PromotionRejected,
    RejectionReason,
)
from tests.contract.claim_damage import CLAIM_CELLS, null_claim_cell
from tests.contract.test_processor_handover import ENTRIES
from tests.unit.test_processor_carried_effects import _claim_and_complete
from tests.unit.test_processor_rules import turn

SENT = function_call_output("c1", '{"sent": "m1"}', item_id="fco_1")
RESENT = function_call_output("c1", '{"sent": "m2"}', item_id="fco_2")
# Every cell a claim row is written with, its identity too (session 53's review).
CELLS = list(CLAIM_CELLS)


def _completed_claim(data, conv: str, key: str) -> str:
    """A claim of attempt 1 (call c1, send_email) completed with ``SENT``."""
    return _claim_and_complete(SimpleNamespace(store=data.store(), ledger=data.ledger()),
                               key, conv, "c1", SENT)


def _using(conv: str, key: str, effect_id: str):
    """Attempt 1's turn: it lists the claimed effect and carries its recorded result."""
    return turn(conv, 0, idempotency_key=key, attempt=1, tool_effect_ids=(effect_id,),
                items=[function_call("c1", "send_email", {"to": "bob"}, item_id="fc_1"), SENT,
                       message("sent", role="assistant", item_id=new_id("msg"))])


def _orphans(handled) -> list:
    return [(o.model.effect_id, o.model.reason, o.model.output_digest)
            for o in handled.outbound if isinstance(o.model, EffectOrphaned)]


def _corrupt(handled, cell: str) -> None:
    first = handled.outbound[0].model
    assert isinstance(first, PromotionRejected), (cell, type(first).__name__, first)
    assert first.reason is RejectionReason.CORRUPT, (cell, first.reason, first.detail)
    assert "damaged" in first.detail, (cell, first.detail)
    assert _orphans(handled) == [], (cell, _orphans(handled))


@ENTRIES
@pytest.mark.parametrize("cell", CELLS)
def test_a_turn_using_a_damaged_claim_is_corrupt_and_orphans_nothing(data, entry, cell):
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    null_claim_cell(data.ledger(), key, effect_id, cell)
    _corrupt(data.worker(entry).handle(_using(conv, key, effect_id)), cell)


@ENTRIES
@pytest.mark.parametrize("cell", CELLS)
def test_another_attempt_of_a_request_with_a_damaged_claim_is_corrupt(data, entry, cell):
    """Attempt 2 does not use the claim; its promotion would orphan it, read off the
    damaged row (``ATTEMPT_SUPERSEDED`` with an outcome the row may not hold)."""
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    null_claim_cell(data.ledger(), key, effect_id, cell)
    handled = data.worker(entry).handle(turn(conv, 0, idempotency_key=key, attempt=2))
    # None anywhere in the outbound, as test_claim_identity_cells_damaged.py asserted
    # before the suites were merged (session 53's outside review: only the first was
    # looked at since).
    assert not any(isinstance(o.model, DeadLetter) for o in handled.outbound), (
        cell, handled.outbound)
    _corrupt(handled, cell)


@ENTRIES
@pytest.mark.parametrize("cell", ["claim_completed", "output_item", "attempt"])
def test_a_redelivered_promotion_publishes_no_orphan_of_a_damaged_claim(data, entry, cell):
    """Damage after the promotion: its redelivery is the promotion again (an outcome
    never flips), and nothing is published for the claim it read damaged."""
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    worker = data.worker(entry)
    promoted = turn(conv, 0, idempotency_key=key, attempt=2)
    first = worker.handle(promoted)
    assert isinstance(first.outbound[0].model, CheckpointPromoted)
    assert [o[0] for o in _orphans(first)] == [effect_id]  # intact: superseded
    null_claim_cell(data.ledger(), key, effect_id, cell)
    again = data.worker(entry).handle(promoted)
    assert isinstance(again.outbound[0].model, CheckpointPromoted), (cell, again.outbound)
    assert _orphans(again) == [], (cell, _orphans(again))


@pytest.mark.parametrize("cell", ["claim_completed", "output_item", "attempt"])
def test_a_cancellation_publishes_no_orphan_of_a_damaged_claim(data, cell):
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    null_claim_cell(data.ledger(), key, effect_id, cell)
    cancel = make_turn_cancelled(turn(conv, 0, idempotency_key=key, attempt=2))
    handled = data.worker("handle").handle(cancel)
    assert not any(isinstance(o.model, DeadLetter) for o in handled.outbound), (
        cell, handled.outbound)  # a null attempt could not be built into an orphan event
    assert _orphans(handled) == [], (cell, _orphans(handled))


def test_the_claims_own_execution_is_never_ordered_undone_on_a_null_flag(data):
    """The claim completed with SENT; its flag reads null. Another execution (RESENT)
    is recorded first, then the holder's own ToolEffect (SENT): with the flag whole,
    RESENT is the conflicting run; read as "not completed", the first record became
    the reference and SENT, the run the claim recorded, was published
    ``EFFECT_CONFLICT``: a compensator undid it."""
    conv, key = new_id("conv"), new_id("idem")
    effect_id = _completed_claim(data, conv, key)
    null_claim_cell(data.ledger(), key, effect_id, "claim_completed")
    worker = data.worker("handle")

    def effect(output):
        return make_tool_effect("c1", output, idempotency_key=key, conversation_id=conv,
                                response_id=new_id("resp"), tool_name="send_email",
                                arguments={"to": "bob"}, effect_id=effect_id)

    published = _orphans(worker.handle(effect(RESENT))) + _orphans(worker.handle(effect(SENT)))
    assert [o for o in published if o[2] == SENT.content_digest] == [], published
    assert TENANT  # the claim and both records are this tenant's
