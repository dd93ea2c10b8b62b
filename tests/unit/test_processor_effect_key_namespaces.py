"""An mcp_call whose item id equals a call_id does not hide that call's output.

Promise (docs/gateway-protocol.md section 6: a ToolEffect's `call_id` is the call's, or
for an `mcp_call` its item id; the item answering each used effect, found by that key,
must have the recorded digest). The two are separate namespaces: a turn whose
mcp_call and function_call_output share one key, each matching its recorded effect, is
promoted (found by an outside review: one output shadowed the other in the index and
the turn was DUPLICATE_TOOL_EFFECT).
"""

from __future__ import annotations

from ratchet.samples import make_tool_effect, make_turn, new_id
from schemas.items import function_call, function_call_output, mcp_call, message
from tests.unit.test_processor_rules import Harness


def test_an_mcp_call_id_equal_to_a_call_id_does_not_shadow_its_output():
    h = Harness()
    key, rid, conv = new_id("idem"), new_id("resp"), new_id("conv")
    shared = "x1"
    mcp = mcp_call("srv", "lookup", {"q": "a"}, "found", item_id=shared)
    fco = function_call_output(shared, '{"temperature_c": 24}', item_id="fco_x1")
    mcp_effect = make_tool_effect(shared, mcp, idempotency_key=key, subturn_index=0,
                                  tool_name="lookup", response_id=rid, conversation_id=conv)
    fn_effect = make_tool_effect(shared, fco, idempotency_key=key, subturn_index=1,
                                 response_id=rid, conversation_id=conv)
    assert mcp_effect.effect_id != fn_effect.effect_id
    h.feed(mcp_effect, fn_effect)
    items = [mcp,
             function_call(shared, "get_weather", {"city": "Paris"}, item_id="fc_x1"),
             fco,
             message("done", role="assistant", item_id=new_id("msg"))]
    turn = make_turn(items, idempotency_key=key, response_id=rid, conversation_id=conv,
                     tool_effect_ids=(mcp_effect.effect_id, fn_effect.effect_id))
    outcome = h.outcome(turn)
    assert getattr(outcome, "seq", None) == 1, (
        f"valid turn not promoted: {getattr(outcome, 'reason', None)}: "
        f"{getattr(outcome, 'detail', '')}")
