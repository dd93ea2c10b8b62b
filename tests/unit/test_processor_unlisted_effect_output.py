"""A turn's output for a call must be the output recorded for that call, listed or not.

Promise (CONTRACT section 4, tool effects: "the `function_call_output` items in the
turn must match the recorded outputs", else DUPLICATE_TOOL_EFFECT;
docs/gateway-protocol.md section 6, `tool_effect_ids`). A ToolEffect of the request
records call_a's output; a turn that does not list it and answers call_a with another
output is DUPLICATE_TOOL_EFFECT (found by an outside review: it was promoted and the
recorded effect orphaned).
"""

from __future__ import annotations

from ratchet.samples import make_tool_effect, make_turn, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import RejectionReason
from tests.unit.test_processor_rules import TOPICS, Harness


def test_output_differing_from_the_recorded_effect_of_its_call_is_not_promoted():
    h = Harness()
    key, rid, conv = new_id("idem"), new_id("resp"), new_id("conv")
    effect = make_tool_effect("call_a", '{"temperature_c": 24}', idempotency_key=key,
                              response_id=rid, conversation_id=conv)
    h.feed(effect)
    items = [
        function_call("call_a", "get_weather", {"city": "Paris"}, item_id="fc_a"),
        function_call_output("call_a", '{"temperature_c": -99}', item_id="fco_a"),
        message("It is -99 C.", role="assistant", item_id=new_id("msg")),
    ]
    turn = make_turn(items, idempotency_key=key, response_id=rid, conversation_id=conv,
                     tool_effect_ids=())  # the recorded effect is not listed
    handled = h.processor.handle(h.record(turn))
    first = handled.outbound[0]
    assert first.topic == TOPICS.rejections, (
        f"promoted a turn whose function_call_output for call_a differs from the "
        f"recorded effect's output: {first.model}")
    assert first.model.reason is RejectionReason.DUPLICATE_TOOL_EFFECT
