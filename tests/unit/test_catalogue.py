"""The item catalogue: every stored Responses item type, its shape and its pairing rule.

One sample item per type (``SAMPLES``) is built with the typed builders; each test
breaks exactly one thing and expects exactly one reason.
"""

from __future__ import annotations

import json

import pytest

from ratchet.domain import catalogue
from ratchet.domain.catalogue import CATALOGUE, KNOWN_ITEM_TYPES, NOT_STORED, Kind
from ratchet.domain.promotion import (
    Facts,
    Promote,
    Reject,
    decide_turn,
    used_effect_ids,
    validate,
)
from ratchet.domain.validation import (
    PairingState,
    Rejected,
    Unpaired,
    Valid,
    check_pairing,
    pairing_state_of,
    validate_turn,
)
from ratchet.samples import NOW_MS, make_turn
from schemas import items as b
from schemas.canonical import canonical_json, sha256_hex
from schemas.keys import partition_key
from schemas.models import Item, RejectionReason
from services.gateway.events import InvalidGatewayItem, TurnIdentity, to_item, tool_effect
from streams.outcomes import recorded_effect

R = RejectionReason

# call type -> (call builder, output builder), each taking a call_id
CALLS = {
    "function_call": (
        lambda c: b.function_call(c, "get_weather", {"city": "Lyon"}, item_id=f"fc_{c}"),
        lambda c: b.function_call_output(c, "21 C", item_id=f"fco_{c}"),
    ),
    "custom_tool_call": (
        lambda c: b.custom_tool_call(c, "sql", "SELECT 1", item_id=f"ctc_{c}"),
        lambda c: b.custom_tool_call_output(c, "1", item_id=f"ctco_{c}"),
    ),
    "computer_call": (
        lambda c: b.computer_call(c, {"type": "click", "x": 1, "y": 2}, item_id=f"cu_{c}"),
        lambda c: b.computer_call_output(c, "data:image/png;base64,AA==", item_id=f"cuo_{c}"),
    ),
    "local_shell_call": (
        lambda c: b.local_shell_call(c, ["ls", "-l"], item_id=f"lsh_{c}"),
        lambda c: b.local_shell_call_output(c, "README.md", item_id=f"lsho_{c}"),
    ),
    "shell_call": (
        lambda c: b.shell_call(c, ["pytest -q"], item_id=f"sh_{c}"),
        lambda c: b.shell_call_output(c, "1 passed", item_id=f"sho_{c}"),
    ),
    "apply_patch_call": (
        lambda c: b.apply_patch_call(c, "a.py", "@@ -1 +1 @@\n-x\n+y", item_id=f"ap_{c}"),
        lambda c: b.apply_patch_call_output(c, item_id=f"apo_{c}"),
    ),
}
SELF_CONTAINED = {
    "web_search_call": lambda: b.web_search_call("weather Lyon", item_id="ws_1"),
    "file_search_call": lambda: b.file_search_call(["refund policy"], item_id="fs_1"),
    "code_interpreter_call": lambda: b.code_interpreter_call(
        "print(2+2)", "4", container_id="cntr_1", item_id="ci_1"),
    "image_generation_call": lambda: b.image_generation_call("iVBORw0KGgo=", item_id="ig_1"),
    "mcp_list_tools": lambda: b.mcp_list_tools("docs", ["search"], item_id="mcpl_1"),
    "mcp_call": lambda: b.mcp_call("docs", "search", {"q": "ratchet"}, "3 hits", item_id="mcp_1"),
}


def say(text: str = "ok", role: str = "assistant") -> Item:
    return b.message(text, role=role, item_id=f"msg_{text}_{role}")


def think(text: str = "hmm") -> Item:
    return b.reasoning(text, item_id=f"rs_{text}")


def request(rid: str = "mcpr_1") -> Item:
    return b.mcp_approval_request("docs", "delete", {"path": "/tmp"}, item_id=rid)


def response(rid: str = "mcpr_1", approve: bool = True, item_id: str = "") -> Item:
    return b.mcp_approval_response(rid, approve, item_id=item_id or f"resp_{rid}")


def call(call_type: str, cid: str) -> Item:
    return CALLS[call_type][0](cid)


def out(call_type: str, cid: str) -> Item:
    return CALLS[call_type][1](cid)


def samples() -> dict[str, Item]:
    """One valid item of every catalogue type."""
    found: dict[str, Item] = {
        "message": say(),
        "reasoning": think(),
        "compaction": b.compaction("gAAAAB...", item_id="cmp_1"),
        "mcp_approval_request": request(),
        "mcp_approval_response": response(),
    }
    for name, build in SELF_CONTAINED.items():
        found[name] = build()
    for name in CALLS:
        found[name] = call(name, "c1")
        found[CATALOGUE[name].output_type] = out(name, "c1")
    return found


def every_type_history() -> list[Item]:
    """A legal history holding every catalogue type (reused by the e2e test's idea)."""
    history = [say("q", "user"), b.compaction("gAAAAB...", item_id="cmp_1"), think()]
    history += [build() for build in SELF_CONTAINED.values()]
    for i, name in enumerate(CALLS):
        history += [call(name, f"c{i}"), out(name, f"c{i}")]
    return history + [request(), response(), say("done")]


def with_content(item: Item, **changes) -> Item:
    """``item`` with content fields changed (None removes one), digest recomputed."""
    content = json.loads(item.content)
    for key, value in changes.items():
        if value is None:
            content.pop(key, None)
        else:
            content[key] = value
    raw = canonical_json(content)
    return item.model_copy(update={"content": raw, "content_digest": sha256_hex(raw)})


def reason(turn, **kw) -> RejectionReason | None:
    result = validate_turn(turn, NOW_MS, **kw)
    return result.reason if isinstance(result, Rejected) else None


def detail(turn) -> str:
    result = validate_turn(turn, NOW_MS)
    assert isinstance(result, Rejected)
    return result.detail


# --- the table ------------------------------------------------------------------------


def test_one_builder_per_catalogue_type_and_each_has_its_shape() -> None:
    built = samples()
    assert set(built) == KNOWN_ITEM_TYPES
    for name, item in built.items():
        assert item.type == name
        assert catalogue.shape_problem(item) is None, name


def test_the_catalogue_holds_the_stored_responses_types() -> None:
    assert {
        "message", "reasoning", "compaction",
        "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call",
        "mcp_list_tools", "mcp_call", "mcp_approval_request", "mcp_approval_response",
        "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
        "computer_call", "computer_call_output", "local_shell_call", "local_shell_call_output",
        "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
    } == KNOWN_ITEM_TYPES
    assert not set(NOT_STORED) & KNOWN_ITEM_TYPES


def test_every_call_names_an_output_type_of_kind_output() -> None:
    for entry in CATALOGUE.values():
        if entry.kind is Kind.CALL:
            assert CATALOGUE[entry.output_type].kind is Kind.OUTPUT
            assert entry.effect_output == entry.output_type
        else:
            assert entry.output_type is None


def test_executed_types_are_the_calls_a_gateway_runs() -> None:
    executed = {name for name, entry in CATALOGUE.items() if entry.executed}
    assert executed == set(CALLS) | {"mcp_call"}
    assert {CATALOGUE[c].output_type for c in CALLS} | {
        "mcp_call"} == catalogue.EFFECT_OUTPUT_TYPES


def test_a_history_with_every_type_is_valid() -> None:
    history = every_type_history()
    assert {i.type for i in history} == KNOWN_ITEM_TYPES
    result = validate_turn(make_turn(input_items=history[:1], items=history[1:]), NOW_MS)
    assert isinstance(result, Valid), result


@pytest.mark.parametrize("item_type", sorted(KNOWN_ITEM_TYPES))
def test_each_type_alone_in_its_legal_context_is_valid(item_type: str) -> None:
    item = samples()[item_type]
    kind = CATALOGUE[item_type].kind
    if kind in (Kind.CALL, Kind.OUTPUT):
        call_type = item_type if kind is Kind.CALL else next(
            c for c in CALLS if CATALOGUE[c].output_type == item_type)
        items = [call(call_type, "c1"), out(call_type, "c1"), say()]
    elif kind in (Kind.APPROVAL_REQUEST, Kind.APPROVAL_RESPONSE):
        items = [request(), response(), say()]
    else:
        items = [item, say()] if item_type != "message" else [item]
    assert isinstance(validate_turn(make_turn(items=items), NOW_MS), Valid)


# --- unknown types --------------------------------------------------------------------


def test_a_type_outside_the_catalogue_is_unknown() -> None:
    odd = b.make_item("hologram", {"x": 1}, item_id="holo_1")
    assert reason(make_turn(items=[odd])) is R.UNKNOWN_ITEM_TYPE


@pytest.mark.parametrize("item_type", sorted(NOT_STORED))
def test_types_left_out_on_purpose_are_unknown_with_the_reason(item_type: str) -> None:
    left_out = b.make_item(item_type, {}, item_id=f"{item_type}_1")
    turn = make_turn(items=[left_out, say()])
    assert reason(turn) is R.UNKNOWN_ITEM_TYPE
    assert NOT_STORED[item_type] in detail(turn)


def test_item_reference_is_refused_as_unknown_even_pointing_at_a_real_item() -> None:
    ref = b.from_responses({"type": "item_reference", "id": "msg_ok_assistant"})
    turn = make_turn(input_items=[say()], items=[ref])
    assert reason(turn) is R.UNKNOWN_ITEM_TYPE
    assert "resolved item" in detail(turn)


# --- shapes: CORRUPT --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("item_type", "field"),
    [(name, field) for name, entry in sorted(CATALOGUE.items()) for field, _ in entry.required],
)
def test_a_missing_required_field_is_corrupt(item_type: str, field: str) -> None:
    item = with_content(samples()[item_type], **{field: None})
    if field == "call_id" or field == "role":  # the record mirrors the content
        item = item.model_copy(update={field: None})
    assert reason(make_turn(items=[item, say("after")])) is R.CORRUPT


@pytest.mark.parametrize(
    ("item_type", "field", "value"),
    [
        ("function_call", "arguments", {"city": "Lyon"}),  # an object, not JSON text
        ("message", "content", 7),
        ("mcp_approval_response", "approve", "yes"),
        ("mcp_approval_response", "approval_request_id", ""),
        ("local_shell_call", "action", ["ls"]),
        ("file_search_call", "queries", "refund"),
    ],
)
def test_a_field_of_the_wrong_json_type_is_corrupt(item_type, field, value) -> None:
    item = with_content(samples()[item_type], **{field: value})
    assert reason(make_turn(items=[item, say("after")])) is R.CORRUPT


def test_an_output_without_call_id_is_corrupt() -> None:
    output = b.make_item("custom_tool_call_output", {"output": "1"}, item_id="ctco_x")
    turn = make_turn(items=[call("custom_tool_call", "c1"), output, say()])
    assert reason(turn) is R.CORRUPT
    assert "call_id" in detail(turn)


def test_record_fields_must_mirror_the_content() -> None:
    fc = call("function_call", "c1")
    assert reason(make_turn(items=[fc.model_copy(update={"call_id": "c2"})])) is R.CORRUPT
    msg = say()
    assert reason(make_turn(items=[msg.model_copy(update={"role": "user"})])) is R.CORRUPT
    assert reason(make_turn(items=[with_content(msg, id="msg_other")])) is R.CORRUPT
    assert reason(make_turn(items=[with_content(msg, type="reasoning")])) is R.CORRUPT


@pytest.mark.parametrize(
    "raw", [b"[1, 2]", b"not json", b'"text"', b"\xff\xfe", b'{"a":"\xff"}', b'{"a":NaN}'])
def test_content_that_is_not_a_json_object_is_corrupt(raw: bytes) -> None:
    item = say().model_copy(update={"content": raw, "content_digest": sha256_hex(raw)})
    assert reason(make_turn(items=[item])) is R.CORRUPT


def test_extra_fields_a_gateway_adds_are_fine() -> None:
    item = with_content(SELF_CONTAINED["web_search_call"](), provider_latency_ms=12,
                        action={"type": "open_page", "url": "https://example.org"})
    assert isinstance(validate_turn(make_turn(items=[item, say()]), NOW_MS), Valid)


# --- pairing of calls, for every call type ------------------------------------------------


@pytest.mark.parametrize("t", sorted(CALLS))
def test_call_pairing_rules(t: str) -> None:
    legal = [
        [call(t, "a"), out(t, "a"), say()],
        [say(), call(t, "a")],  # client tool: open at the end
        [call(t, "a"), call(t, "b"), out(t, "b"), out(t, "a"), say()],  # parallel
    ]
    for items in legal:
        assert isinstance(check_pairing(items), PairingState), items
    illegal = [
        [out(t, "a")],  # output without a call
        [out(t, "a"), call(t, "a")],  # output before its call
        [call(t, "a"), out(t, "a"), out(t, "a")],  # answered twice
        [call(t, "a"), out(t, "a"), call(t, "a")],  # call_id reused
        [call(t, "a"), say()],  # open call not at the end
        [call(t, "a"), SELF_CONTAINED["web_search_call"]()],  # ... whatever follows it
    ]
    for items in illegal:
        assert isinstance(check_pairing(items), Unpaired), items


@pytest.mark.parametrize("t", sorted(CALLS))
def test_an_output_of_another_call_type_does_not_answer(t: str) -> None:
    other = next(c for c in sorted(CALLS) if c != t)
    result = check_pairing([call(t, "a"), out(other, "a"), say()])
    assert isinstance(result, Unpaired)
    assert CATALOGUE[t].output_type in result.detail
    turn = make_turn(items=[call(t, "a"), out(other, "a"), say()])
    assert reason(turn) is R.UNPAIRED_TOOL_CALL


def test_call_ids_are_unique_across_call_types() -> None:
    items = [call("function_call", "a"), out("function_call", "a"),
             call("custom_tool_call", "a"), out("custom_tool_call", "a")]
    assert isinstance(check_pairing(items), Unpaired)


def test_parallel_calls_of_different_types_answer_in_any_order() -> None:
    items = [call("function_call", "a"), call("shell_call", "b"), request(),
             out("shell_call", "b"), response(), out("function_call", "a"), say()]
    assert check_pairing(items) == PairingState(
        frozenset({"a", "b"}), (), frozenset({"mcpr_1"}), ())


# --- pairing of MCP approvals ------------------------------------------------------------------


@pytest.mark.parametrize(
    "items",
    [
        [request(), response(), say()],
        [request(), response(approve=False), say()],
        [say(), request()],  # waiting for the client at the end
        [request("r1"), request("r2"), response("r2"), response("r1"), say()],
        [request(), response(), b.mcp_call("docs", "delete", {"path": "/tmp"}, "deleted",
                                           item_id="mcp_9", approval_request_id="mcpr_1")],
    ],
    ids=["approved", "refused", "open-at-end", "two", "then-run"],
)
def test_legal_approvals(items) -> None:
    assert isinstance(check_pairing(items), PairingState)


@pytest.mark.parametrize(
    "items",
    [
        [response("nope")],  # no such request
        [response(), request()],  # response first
        [request(), response(), response(item_id="again")],  # answered twice
        [request(), say()],  # open request not at the end
        [request(), response(), request()],  # request id reused
        [request(), think(), response()],  # something between request and response
    ],
    ids=["orphan", "response-first", "twice", "open-mid", "reused", "between"],
)
def test_illegal_approvals(items) -> None:
    assert isinstance(check_pairing(items), Unpaired)


# --- across turns ---------------------------------------------------------------------------------


@pytest.mark.parametrize("t", sorted(CALLS))
def test_a_client_call_is_answered_in_the_next_turn(t: str) -> None:
    first = make_turn(input_items=[say("q", "user")], items=[call(t, "a")])
    first_result = validate_turn(first, NOW_MS)
    assert isinstance(first_result, Valid)
    assert first_result.pairing.open_calls == (("a", t),)
    history = list(first.items)
    answered = make_turn(input_items=[out(t, "a")], items=[say("thanks")])
    assert validate(answered, NOW_MS, history).reason is None
    # the stored history's state and the remembered one agree
    assert pairing_state_of(history) == first_result.pairing
    not_answered = make_turn(input_items=[say("again", "user")], items=[say()])
    assert validate(not_answered, NOW_MS, history).reason is R.UNPAIRED_TOOL_CALL
    reused = make_turn(input_items=[out(t, "a")], items=[call(t, "a")])
    assert validate(reused, NOW_MS, history).reason is R.UNPAIRED_TOOL_CALL


def test_a_call_id_answered_in_an_earlier_turn_cannot_be_answered_or_reused() -> None:
    history = [call("custom_tool_call", "a"), out("custom_tool_call", "a"), say()]
    twice = make_turn(input_items=[out("custom_tool_call", "a")], items=[say("x")])
    assert validate(twice, NOW_MS, history).reason is R.UNPAIRED_TOOL_CALL
    reused = make_turn(items=[call("local_shell_call", "a"), out("local_shell_call", "a"), say()])
    assert validate(reused, NOW_MS, history).reason is R.UNPAIRED_TOOL_CALL


def test_an_approval_is_answered_in_the_next_turn() -> None:
    history = [say("delete /tmp", "user"), b.mcp_list_tools("docs", ["delete"], item_id="l1"),
               request()]
    assert pairing_state_of(history) == PairingState(
        frozenset(), (), frozenset({"mcpr_1"}), ("mcpr_1",))
    run = b.mcp_call("docs", "delete", {"path": "/tmp"}, "deleted", item_id="mcp_2",
                     approval_request_id="mcpr_1")
    approved = make_turn(input_items=[response()], items=[run, say("deleted")])
    assert validate(approved, NOW_MS, history).reason is None
    ignored = make_turn(input_items=[say("never mind", "user")], items=[say()])
    assert validate(ignored, NOW_MS, history).reason is R.UNPAIRED_TOOL_CALL
    unknown = make_turn(input_items=[response("mcpr_other")], items=[say()])
    assert validate(unknown, NOW_MS, history).reason is R.UNPAIRED_TOOL_CALL


# --- tool effects of every executed type ----------------------------------------------------------

IDENTITY = TurnIdentity.conversation("tenant-1", "conv_1", "resp_1", 0)


def as_dict(item: Item) -> dict:
    return json.loads(item.content)


def effect_turn(items: list[Item], *effects) -> tuple:
    turn = make_turn(items=items, idempotency_key="idem_fx",
                     tool_effect_ids=tuple(e.effect_id for e in effects))
    facts = Facts(effects={e.effect_id: recorded_effect(e) for e in effects})
    return turn, facts


def decision(turn, facts):
    validation = validate(turn, NOW_MS, [])
    decided = decide_turn(turn, validation, facts)
    # The caller's own used effect ids and key (the loop path hands them over) give the
    # same decision, the same request.
    used, key = used_effect_ids(turn), partition_key(turn)
    assert decide_turn(turn, validation, facts, used=used, key=key) == decided
    if isinstance(decided, Promote):  # and the request keeps them, computed once
        assert decided.request.effect_ids[:len(used)] == used
        assert decided.request.partition_key == key
    return decided


@pytest.mark.parametrize("t", sorted(CALLS))
def test_an_executed_call_of_every_type_is_recorded_and_matched(t: str) -> None:
    c, o = call(t, "c1"), out(t, "c1")
    effect = tool_effect(IDENTITY, idempotency_key="idem_fx", subturn_index=0,
                         call=as_dict(c), output=as_dict(o))
    assert effect.output == o and effect.call_id == "c1"
    turn, facts = effect_turn([c, o, say()], effect)
    assert isinstance(decision(turn, facts), Promote)


def test_custom_tool_effect_with_a_mismatched_output_type_is_rejected() -> None:
    c, o = call("custom_tool_call", "c1"), out("custom_tool_call", "c1")
    # the gateway library refuses to record a custom tool run as a function output
    wrong = as_dict(out("function_call", "c1"))
    with pytest.raises(InvalidGatewayItem, match="custom_tool_call_output"):
        tool_effect(IDENTITY, idempotency_key="idem_fx", subturn_index=0, call=as_dict(c),
                    output=wrong)
    # a gateway that records it anyway (another implementation) gets the turn rejected
    recorded = tool_effect(IDENTITY, idempotency_key="idem_fx", subturn_index=0,
                           call=as_dict(call("function_call", "c1")), output=wrong)
    turn, facts = effect_turn([c, o, say()], recorded)
    verdict = decision(turn, facts)
    assert isinstance(verdict, Reject) and verdict.reason is R.DUPLICATE_TOOL_EFFECT
    assert "custom_tool_call_output" in verdict.detail
    # and the right record promotes
    right = tool_effect(IDENTITY, idempotency_key="idem_fx", subturn_index=0, call=as_dict(c),
                        output=as_dict(o))
    assert right.effect_id == recorded.effect_id
    turn, facts = effect_turn([c, o, say()], right)
    assert isinstance(decision(turn, facts), Promote)


def test_custom_tool_effect_with_other_output_bytes_is_rejected() -> None:
    c = call("custom_tool_call", "c1")
    effect = tool_effect(IDENTITY, idempotency_key="idem_fx", subturn_index=0, call=as_dict(c),
                         output=as_dict(out("custom_tool_call", "c1")))
    other = b.custom_tool_call_output("c1", "2", item_id="ctco_c1")
    turn, facts = effect_turn([c, other, say()], effect)
    verdict = decision(turn, facts)
    assert isinstance(verdict, Reject) and verdict.reason is R.DUPLICATE_TOOL_EFFECT


def test_an_mcp_call_is_its_own_effect_output() -> None:
    run = SELF_CONTAINED["mcp_call"]()
    effect = tool_effect(IDENTITY, idempotency_key="idem_fx", subturn_index=0, call=as_dict(run))
    assert effect.output == run and effect.call_id == run.item_id
    assert effect.tool_name == "search"
    turn, facts = effect_turn([run, say()], effect)
    assert isinstance(decision(turn, facts), Promote)
    changed = b.mcp_call("docs", "search", {"q": "ratchet"}, "0 hits", item_id="mcp_1")
    turn, facts = effect_turn([changed, say()], effect)
    assert decision(turn, facts).reason is R.DUPLICATE_TOOL_EFFECT


@pytest.mark.parametrize("name", ["web_search_call", "code_interpreter_call"])
def test_provider_run_tools_are_not_gateway_effects(name: str) -> None:
    with pytest.raises(InvalidGatewayItem, match="not a call a gateway executes"):
        tool_effect(IDENTITY, idempotency_key="k", subturn_index=0,
                    call=as_dict(SELF_CONTAINED[name]()))


def test_an_effect_output_without_its_call_id_is_refused_by_the_library() -> None:
    c = call("computer_call", "c1")
    output = {k: v for k, v in as_dict(out("computer_call", "c1")).items() if k != "call_id"}
    with pytest.raises(InvalidGatewayItem, match="call_id"):
        tool_effect(IDENTITY, idempotency_key="k", subturn_index=0, call=as_dict(c),
                    output=output)


# --- the gateway's Responses dicts -------------------------------------------------------------


def test_sdk_shaped_dicts_become_the_same_items_as_the_builders() -> None:
    for name, item in samples().items():
        assert to_item(as_dict(item), default_id="unused") == item, name


def test_a_dict_without_an_id_gets_the_default_one() -> None:
    raw = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    item = to_item(raw, default_id="resp_1:in:0")
    assert item.item_id == "resp_1:in:0" and json.loads(item.content)["id"] == "resp_1:in:0"
    assert item.call_id is None and catalogue.shape_problem(item) is None
