"""Every item type of the catalogue through the real stack: gateway library -> Kafka ->
worker -> Cassandra -> API, rehydrated byte for byte; a type outside it is refused."""

from __future__ import annotations

import hashlib
import json

from ratchet.domain.catalogue import KNOWN_ITEM_TYPES
from services.demo.simulator import SimulatedGateway, uid
from services.gateway import items as b
from services.gateway.client import Certified, Failure
from services.gateway.events import TurnIdentity

WAIT_MS = 10_000


def as_dict(item) -> dict:
    return json.loads(item.content)


def test_a_conversation_holding_every_item_type_rehydrates_byte_exact(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    conv, key = uid("conv"), uid("idem")
    first_id = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0)

    def pair(call, output, cid):
        return call(cid), output(cid)

    ids = {name: uid(name) for name in ("fc", "ctc", "cu", "lsh", "sh", "ap", "client")}
    fc, fco = pair(lambda c: b.function_call(c, "get_weather", {"city": "Lyon"}, item_id=uid("fc")),
                   lambda c: b.function_call_output(c, "21 C", item_id=uid("fco")), ids["fc"])
    ctc, ctco = pair(lambda c: b.custom_tool_call(c, "sql", "SELECT 1", item_id=uid("ctc")),
                     lambda c: b.custom_tool_call_output(c, "1", item_id=uid("ctco")), ids["ctc"])
    cu, cuo = pair(lambda c: b.computer_call(c, {"type": "screenshot"}, item_id=uid("cu")),
                   lambda c: b.computer_call_output(c, "data:image/png;base64,AA==",
                                                    item_id=uid("cuo")), ids["cu"])
    lsh, lsho = pair(lambda c: b.local_shell_call(c, ["ls"], item_id=uid("lsh")),
                     lambda c: b.local_shell_call_output(c, "a.txt", item_id=uid("lsho")),
                     ids["lsh"])
    sh, sho = pair(lambda c: b.shell_call(c, ["pytest -q"], item_id=uid("sh")),
                   lambda c: b.shell_call_output(c, "1 passed", item_id=uid("sho")), ids["sh"])
    ap, apo = pair(lambda c: b.apply_patch_call(c, "a.py", "@@ -1 +1 @@\n-x\n+y",
                                                item_id=uid("ap")),
                   lambda c: b.apply_patch_call_output(c, item_id=uid("apo")), ids["ap"])
    mcp = b.mcp_call("docs", "search", {"q": "ratchet"}, "3 hits", item_id=uid("mcp"))
    client_call = b.custom_tool_call(ids["client"], "ask_user", "Which day?",
                                     item_id=uid("ctc"))
    approval = b.mcp_approval_request("tickets", "book", {"day": "Mon"}, item_id=uid("mcpr"))
    # gateway-run tools, recorded before the turn: a custom tool and an MCP call
    effects = [
        gw.effect(first_id, key, 0, as_dict(ctc), as_dict(ctco)),
        gw.effect(first_id, key, 0, as_dict(mcp)),
    ]
    first = gw.turn(
        first_id,
        [b.compaction("gAAAAB-opaque", item_id=uid("cmp")),
         b.message("Plan Monday in Lyon.", role="user", item_id=uid("msg"))],
        [
            b.reasoning("several tools", item_id=uid("rs")),
            b.web_search_call("Lyon Monday", item_id=uid("ws")),
            b.file_search_call(["museums"], item_id=uid("fs")),
            b.code_interpreter_call("print(1)", "1", container_id="cntr", item_id=uid("ci")),
            b.image_generation_call("iVBORw0KGgo=", item_id=uid("ig")),
            b.mcp_list_tools("docs", ["search"], item_id=uid("mcpl")),
            mcp, fc, fco, ctc, ctco, cu, cuo, lsh, lsho, sh, sho, ap, apo,
            b.message("Two questions first.", role="assistant", item_id=uid("msg")),
            client_call,  # answered by the client in the next turn
            approval,  # approved by the client in the next turn
        ],
        idempotency_key=key,
        tool_effect_ids=[e.effect_id for e in effects],
    )
    gw.publish(first, effects)
    assert isinstance(gw.rehydrate(first.response_id, wait_ms=WAIT_MS), Certified)

    second = gw.turn(
        TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 1),
        [b.custom_tool_call_output(ids["client"], "Monday", item_id=uid("ctco")),
         b.mcp_approval_response(approval.item_id, True, item_id=uid("mcpa"))],
        [b.mcp_call("tickets", "book", {"day": "Mon"}, "booking 42", item_id=uid("mcp"),
                    approval_request_id=approval.item_id),
         b.message("Booked.", role="assistant", item_id=uid("msg"))],
    )
    gw.publish(second)
    outcome = gw.rehydrate(second.response_id, wait_ms=WAIT_MS)

    assert isinstance(outcome, Certified), outcome
    assert outcome.head_seq == 2
    sent = first.items + second.items
    assert {i.type for i in sent} == KNOWN_ITEM_TYPES
    assert len(outcome.items) == len(sent)
    for item, original in zip(outcome.items, sent, strict=True):
        assert (item.item_id, item.type, item.call_id, item.role) == (
            original.item_id, original.type, original.call_id, original.role)
        assert item.content.encode() == original.content  # byte-exact
        assert hashlib.sha256(item.content.encode()).hexdigest() == original.content_digest


def test_a_turn_leaving_a_client_call_open_mid_history_is_unpaired(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    conv = uid("conv")
    call = b.shell_call(uid("call"), ["rm -rf build"], item_id=uid("sh"))
    first = gw.turn(TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0),
                    [b.message("clean up", role="user", item_id=uid("msg"))], [call])
    gw.publish(first)
    assert isinstance(gw.rehydrate(first.response_id, wait_ms=WAIT_MS), Certified)
    # the next turn ignores the open shell call: the pairing state crosses turns
    second = gw.turn(TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 1),
                     [b.message("never mind", role="user", item_id=uid("msg"))],
                     [b.message("ok", role="assistant", item_id=uid("msg"))])
    gw.publish(second)
    outcome = gw.rehydrate(second.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Failure) and outcome.reason == "NOT_PROMOTED"
    status = e2e_stack.client.status(gw.tenant_id, second.response_id)
    assert (status.state, status.reason) == ("rejected", "UNPAIRED_TOOL_CALL")


def test_an_item_reference_is_refused_as_unknown_item_type(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    identity = TurnIdentity.conversation(gw.tenant_id, uid("conv"), uid("resp"), 0)
    turn = gw.turn(identity, [{"type": "item_reference", "id": uid("msg")}],
                   [b.message("hi", role="assistant", item_id=uid("msg"))])
    gw.publish(turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Failure) and outcome.reason == "NOT_PROMOTED"
    status = e2e_stack.client.status(gw.tenant_id, turn.response_id)
    assert (status.state, status.reason) == ("rejected", "UNKNOWN_ITEM_TYPE")
