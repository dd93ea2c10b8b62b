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
from schemas.canonical import sha256_hex
from services.gateway.claims import EffectClaims, EffectOutputUnusable
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


def test_a_recorded_output_with_no_canonical_form_is_a_typed_error_never_a_rerun():
    # A server from before the claims API refused 1e400 may have recorded it: the output
    # cannot be re-keyed (infinity has no canonical JSON); the tool is not run again.
    content = (b'{"call_id":"c0","id":"fco_0","output":"sent","score":1e400,'
               b'"type":"function_call_output"}')
    recorded = {"item_id": "fco_0", "type": "function_call_output", "role": None,
                "call_id": "c0", "content": content.decode(),
                "content_digest": sha256_hex(content), "format_version": 1}

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"state": "COMPLETED", "attempt": 1,
                                         "status": "succeeded", "output": recorded})

    identity = TurnIdentity(tenant_id="t", response_id="r1", conversation_id="conv",
                            expected_head_seq=0)
    claims = EffectClaims("http://claims.test", identity, idempotency_key="k", attempt=2,
                          transport=httpx.MockTransport(answer))
    ran: list[str] = []
    with pytest.raises(EffectOutputUnusable, match="range of a double") as refused, \
            claims.effect(CALLS["function_call"], subturn_index=0) as effect:
        effect.run(lambda: ran.append("ran") or "done")
    assert refused.value.effect_id == effect.effect_id and not refused.value.retryable
    assert ran == [] and not effect.executed


def test_a_claim_answered_by_a_bug_is_not_retried_as_an_outage():
    """500 ``INTERNAL`` with ``"retryable": false`` from the claims API is
    ``RehydrationServerError`` (not retryable), not ``RehydrationUnavailable``."""
    from services.gateway.errors import RehydrationServerError, RehydrationUnavailable

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json={"error": "INTERNAL", "detail": "KeyError",
                                         "retryable": False})

    identity = TurnIdentity(tenant_id="t", response_id="r1", conversation_id="conv",
                            expected_head_seq=0)
    claims = EffectClaims("http://claims.test", identity, idempotency_key="k", attempt=1,
                          transport=httpx.MockTransport(answer))
    ran = []
    with pytest.raises(RehydrationServerError) as err, \
            claims.effect(CALLS["function_call"], subturn_index=0) as effect:
        effect.run(lambda: ran.append(1) or "done")
    assert not isinstance(err.value, RehydrationUnavailable) and not err.value.retryable
    assert ran == []  # the tool never ran
