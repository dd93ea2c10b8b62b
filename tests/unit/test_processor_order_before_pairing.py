"""A Conversation turn that does not extend the current head is decided by ordering
(``CONFLICT`` / ``OUT_OF_ORDER``) before the pairing rules, whatever head it expected,
0 included: docs/gateway-protocol.md section 6 ("decided before the pairing rules of
section 5"). A turn expecting head 0 was taken for a new Conversation from the turn
alone, so its own unpaired items answered ``UNPAIRED_TOOL_CALL`` when the Conversation
existed, where the same turn expecting head 1 of a Conversation at head 2 answered
``CONFLICT``.

(Found by an outside review: a gateway written in Node from the docs alone.)
"""

from __future__ import annotations

import pytest

from ratchet.samples import new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import RejectionReason as R
from streams.tail_cache import TailCache
from tests.unit.test_processor_rules import Harness, conv_id, turn


@pytest.fixture(params=["cached", "read"], ids=["lineage-cached", "lineage-read"])
def h(request) -> Harness:
    harness = Harness()
    if request.param == "read":
        harness.rewire(tails=TailCache(capacity=0))
    return harness


def self_unpaired() -> list:
    """Items no history can pair: an output answering a call that was never made."""
    return [function_call_output("call_never_made", "{}", item_id=new_id("fco")),
            message("x", role="assistant", item_id=new_id("msg"))]


def promoted_conversation(h: Harness, turns: int) -> str:
    conv = conv_id()
    for head in range(turns):
        call_id = f"call_{head}"
        items = [function_call(call_id, "lookup", {}, item_id=new_id("fc")),
                 function_call_output(call_id, "{}", item_id=new_id("fco")),
                 message("ok", role="assistant", item_id=new_id("msg"))]
        assert h.outcome(turn(conv, head, items=items)).seq == head + 1
    return conv


@pytest.mark.parametrize("expected", [0, 1])
def test_a_stale_turn_with_unpaired_items_is_conflict(h, expected):
    conv = promoted_conversation(h, 2)
    out = h.outcome(turn(conv, expected, items=self_unpaired()))
    assert (out.reason, out.head_seq) == (R.CONFLICT, 2)


def test_a_turn_beyond_the_head_with_unpaired_items_is_out_of_order(h):
    conv = promoted_conversation(h, 1)
    out = h.outcome(turn(conv, 3, items=self_unpaired()))
    assert (out.reason, out.head_seq) == (R.OUT_OF_ORDER, 1)


def test_a_first_turn_with_unpaired_items_of_a_new_conversation_is_unpaired(h):
    out = h.outcome(turn(conv_id(), 0, items=self_unpaired()))
    assert out.reason is R.UNPAIRED_TOOL_CALL


def test_a_turn_at_the_head_with_unpaired_items_is_unpaired(h):
    conv = promoted_conversation(h, 2)
    assert h.outcome(turn(conv, 2, items=self_unpaired())).reason is R.UNPAIRED_TOOL_CALL
