"""A ToolEffect whose output digest is not its content's is never trusted.

Promise (docs/gateway-protocol.md section 5: "ratchet verifies the digest of every item
on every write and read"; section 6, ToolEffect: an output whose content_digest is not
the sha256 of its content is dead-lettered INVALID_EVENT; CONTRACT section 4: the
turn's outputs must match the recorded outputs). A turn listing such an effect and
carrying the output whose digest was put on it is never promoted (found by an outside
review: the effect was recorded and the turn promoted certified with another output
than the one the gateway recorded as executed).
"""

from __future__ import annotations

from ratchet.samples import make_tool_effect, make_turn, new_id
from schemas.items import function_call, function_call_output, message
from tests.unit.test_processor_rules import TOPICS, Harness


def test_an_effect_output_with_a_wrong_digest_is_not_trusted():
    h = Harness()
    key, rid, conv = new_id("idem"), new_id("resp"), new_id("conv")
    executed = function_call_output("call_a", '{"temperature_c": 24}', item_id="fco_a")
    other = function_call_output("call_a", '{"temperature_c": -99}', item_id="fco_a")
    forged = executed.model_copy(update={"content_digest": other.content_digest})
    assert not forged.digest_ok()
    effect = make_tool_effect("call_a", forged, idempotency_key=key, response_id=rid,
                              conversation_id=conv)
    effect_handled = h.processor.handle(h.record(effect))
    dead_lettered = any(o.topic == TOPICS.dead_letters for o in effect_handled.outbound)

    items = [function_call("call_a", "get_weather", {"city": "Paris"}, item_id="fc_a"),
             other, message("It is -99 C.", role="assistant", item_id=new_id("msg"))]
    turn = make_turn(items, idempotency_key=key, response_id=rid, conversation_id=conv,
                     tool_effect_ids=(effect.effect_id,))
    turn_handled = h.processor.handle(h.record(turn))
    promoted = turn_handled.outbound[0].topic == TOPICS.checkpoints
    assert dead_lettered or not promoted, (
        "ToolEffect with an output whose content_digest does not match its content was "
        f"recorded ({effect_handled.kind}) and the turn carrying another output was "
        f"promoted: {turn_handled.outbound[0].model}")
