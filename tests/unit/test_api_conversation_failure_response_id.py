"""A Conversation-endpoint failure body has no response_id.

Promise (docs/gateway-protocol.md, section 8, "History body"): "A failure body has
`outcome`, `reason` and `detail`; ... `response_id` is the path's id for `NOT_PROMOTED`
(always) and for a `CORRUPT_HISTORY` found while rendering stored content; it is null
for `NOT_FOUND`, `EXPIRED` and every other integrity failure, and always on the
Conversation endpoint." When the head's stored checkpoint cannot be rendered (a router
receipt that is not its canonical JSON), the Conversation endpoint's CORRUPT_HISTORY
body has a null response_id on the cold read, a plain miss and an extension alike
(found by an outside review: it carried the head's response id).
"""

from __future__ import annotations

import pytest

from tests.unit.test_api_cache import turn_to_damage

NO_CACHE = {"Cache-Control": "no-cache"}


@pytest.mark.parametrize("load", ["cold", "miss", "extension"])
def test_conversation_render_failure_has_no_response_id(load):
    stack, tenant, conv, target = turn_to_damage(load)
    stack.rewrite_checkpoint(tenant, conv, target, router_receipt='{"b":1,"a":2}')
    resp = stack.conversation(tenant, conv, **(NO_CACHE if load == "cold" else {}))
    body = resp.json()
    assert (resp.status_code, body["outcome"], body["reason"]) == (
        500, "failure", "CORRUPT_HISTORY"
    )
    assert body["response_id"] is None, body
