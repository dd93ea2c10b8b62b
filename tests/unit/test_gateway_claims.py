"""The gateway library's claims helper records the output item of the CALL'S OWN type.

A custom tool's (or a shell's) recorded output must be the item that answers that call
in the turn (``custom_tool_call_output``, ...): recording a ``function_call_output`` for
it would never match the turn's output and the promotion would be refused. Items that
carry their own result (``mcp_call``) cannot go through the helper: a typed error says so.
The claims API is replaced by an in-process HTTP transport that answers CLAIMED and
records what was completed.
"""

from __future__ import annotations

import json

import httpx
import pytest

from ratchet.domain.catalogue import CATALOGUE
from services.gateway.claims import EffectClaims
from services.gateway.events import InvalidGatewayItem, TurnIdentity, tool_effect

CALLS = {
    "function_call": {"type": "function_call", "id": "fc_1", "call_id": "c1",
                      "name": "book", "arguments": "{}"},
    "custom_tool_call": {"type": "custom_tool_call", "id": "ct_1", "call_id": "c2",
                         "name": "grep", "input": "needle"},
    "local_shell_call": {"type": "local_shell_call", "id": "ls_1", "call_id": "c3",
                         "action": {"type": "exec", "command": ["ls"]}, "status": "completed"},
}


def _claims(completed: list[dict]) -> EffectClaims:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path.endswith("/complete"):
            completed.append(body)
            return httpx.Response(200, json={"state": "COMPLETED"})
        return httpx.Response(200, json={"state": "CLAIMED", "lease_until": 0, "attempt": 1})

    identity = TurnIdentity(tenant_id="t", response_id="r1", conversation_id="conv",
                            expected_head_seq=0)
    return EffectClaims("http://claims.test", identity, idempotency_key="k", attempt=1,
                        transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("call_type", sorted(CALLS))
def test_the_recorded_output_answers_the_call_by_its_own_type(call_type):
    completed: list[dict] = []
    claims = _claims(completed)
    call = CALLS[call_type]
    with claims.effect(call, subturn_index=0) as effect:
        output = effect.run(lambda: "done")
    expected = CATALOGUE[call_type].output_type
    assert output.type == expected and output.call_id == call["call_id"]
    assert [c["output"]["type"] for c in completed] == [expected]
    # the same output is a valid ToolEffect of this call (the promotion's match rule)
    effect_record = tool_effect(claims.identity, idempotency_key="k", subturn_index=0,
                                call=call, output=json.loads(output.content))
    assert effect_record.output.type == expected


def test_an_item_that_carries_its_own_result_is_refused_with_a_typed_error():
    claims = _claims([])
    mcp = {"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "n",
           "arguments": "{}"}
    with pytest.raises(InvalidGatewayItem, match="mcp_call"), \
            claims.effect(mcp, subturn_index=0):
        pass
