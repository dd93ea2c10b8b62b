"""Gateway builders: Responses-style dicts become events the domain accepts as valid."""

from __future__ import annotations

import hashlib
import json

import pytest

from ratchet.domain.catalogue import shape_problem
from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.domain.validation import Valid, validate_turn
from ratchet.samples import make_artifact_and_proof, make_fingerprint
from schemas.items import make_item
from schemas.keys import MissingChainRoot
from services.gateway.errors import UnservableId
from services.gateway.events import (
    InvalidGatewayItem,
    TurnIdentity,
    now_ms,
    to_item,
    tool_effect,
    turn_cancelled,
    turn_completed,
)

USER = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris?"}]}
CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "id": "fc_1",
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny", "id": "fco_1"}
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "ok"}]}
ANSWER = {
    "type": "message",
    "role": "assistant",
    "id": "msg_2",
    "content": [{"type": "output_text", "text": "Sunny."}],
}


def conversation(head: int = 0) -> TurnIdentity:
    return TurnIdentity.conversation("tenant-1", "conv_1", "resp_1", head)


def build(identity: TurnIdentity | None = None, **overrides):
    fp = make_fingerprint()
    artifact, proof = make_artifact_and_proof(fingerprint_hash(fp), now_ms=now_ms())
    args = dict(
        idempotency_key="idem_1",
        request={"model": "gpt-oss", "input": [USER]},
        input_items=[USER],
        output_items=[REASONING, CALL, OUTPUT, ANSWER],
        fingerprint=fp,
        token_artifact=artifact,
        boundary_proof=proof,
    )
    args.update(overrides)
    return turn_completed(identity or conversation(), **args)


def test_item_content_is_canonical_json_with_its_digest():
    item = to_item({"role": "user", "type": "message", "content": []}, default_id="x:in:0")
    assert item.content == b'{"content":[],"id":"x:in:0","role":"user","type":"message"}'
    assert item.content_digest == hashlib.sha256(item.content).hexdigest()
    assert (item.item_id, item.type, item.role, item.call_id) == ("x:in:0", "message", "user", None)


def test_item_ids_are_kept_or_derived_stably():
    turn = build()
    assert turn.input_items[0].item_id == "resp_1:in:0"  # no id in the dict
    assert [i.item_id for i in turn.output_items] == ["rs_1", "fc_1", "fco_1", "msg_2"]
    assert build().input_items == turn.input_items  # same inputs, same bytes


def test_unknown_types_pass_through_as_strings_for_ratchet_to_judge():
    assert to_item({"type": "web_search_call"}, default_id="a").type == "web_search_call"
    with pytest.raises(InvalidGatewayItem):
        to_item({"role": "user"}, default_id="a")


@pytest.mark.parametrize("field", ["role", "call_id"])
@pytest.mark.parametrize("value", [5, True, ["user"], {"x": 1}])
def test_an_item_whose_role_or_call_id_is_not_a_string_is_refused(field, value):
    """The processor takes the record's ``role`` / ``call_id`` to be the content's and
    rejects the turn ``CORRUPT`` when they differ, so a content value that is no string
    (which no record column can equal) was built into a record of ``None`` and always
    rejected: the library refuses it before producing, as a non-string ``type``."""
    obj = {"type": "web_search_call", "status": "completed", field: value}
    with pytest.raises(InvalidGatewayItem, match=field):
        to_item(obj, default_id="ws_1")
    built = make_item("web_search_call", {"status": "completed", field: value}, item_id="ws_1")
    assert shape_problem(built) is not None  # what the processor says of such an item
    null = to_item({**obj, field: None}, default_id="ws_1")  # null stays allowed
    assert getattr(null, field) is None and shape_problem(null) is None


@pytest.mark.parametrize("value", [5, True, ["ws_1"], {"x": 1}])
def test_an_item_whose_id_is_not_a_string_is_refused(value):
    """The processor compares the content's ``id`` with the record's ``item_id``: an id
    that is no string was written as ``str(id)`` beside it and the turn always
    rejected ``CORRUPT``; the library refuses it before producing."""
    obj = {"type": "web_search_call", "status": "completed", "id": value}
    with pytest.raises(InvalidGatewayItem, match="id"):
        to_item(obj, default_id="ws_1")
    # what the library built before: content id ``value``, record id ``str(value)``
    built = make_item("web_search_call", {"status": "completed", "id": value},
                      item_id=str(value))
    assert shape_problem(built) is not None  # what the processor says of it


def test_built_turn_is_valid_for_the_domain():
    turn = build()
    assert turn.fingerprint_hash == fingerprint_hash(turn.fingerprint)
    assert turn.effective_config.tools_digest == turn.fingerprint.tools_digest
    assert turn.partition_key == "conv_1" and turn.expected_head_seq == 0
    assert isinstance(validate_turn(turn, now_ms()), Valid)


def test_request_digest_is_stable_across_retries_and_attempts():
    first, retry = build(attempt=1), build(attempt=2)
    assert first.request_digest == retry.request_digest
    assert first.event_id != retry.event_id
    other = build(request={"model": "gpt-oss", "input": [USER], "temperature": 0})
    assert other.request_digest != first.request_digest


def test_chain_mode_keys_by_the_root():
    root = TurnIdentity.chain("tenant-1", "resp_a")
    assert root.partition_key == "resp_a" and root.previous_response_id is None
    child = TurnIdentity.chain(
        "tenant-1", "resp_b", previous_response_id="resp_a", chain_root_id="resp_a"
    )
    turn = build(child)
    assert turn.partition_key == "resp_a" and turn.expected_head_seq is None
    assert turn.previous_response_id == "resp_a"
    # What docs/service.md names (a ValueError too): the partition is unknown.
    with pytest.raises(MissingChainRoot, match="resp_c continues resp_b without chain_root_id"):
        TurnIdentity.chain("tenant-1", "resp_c", previous_response_id="resp_b")


def test_identity_needs_one_mode():
    with pytest.raises(ValueError):
        TurnIdentity("t", "r")
    with pytest.raises(ValueError):
        TurnIdentity("t", "r", conversation_id="c")  # no expected head


@pytest.mark.parametrize("identity", [
    dict(tenant_id="tenant 1", response_id="resp_1", conversation_id="conv_1",
         expected_head_seq=0),
    dict(tenant_id="tenant-1", response_id="dl 8-x", conversation_id="conv_1",
         expected_head_seq=0),
    dict(tenant_id="tenant-1", response_id="resp_1", conversation_id="conv/1",
         expected_head_seq=0),
    dict(tenant_id="tenant-1", response_id="resp_2", chain_root_id="root?"),
    dict(tenant_id="tenant-1", response_id="resp_2", chain_root_id="resp_1",
         previous_response_id="r" * 201),
], ids=["tenant_id", "response_id", "conversation_id", "chain_root_id",
        "previous_response_id"])
def test_identity_refuses_ids_the_api_cannot_serve(identity):
    with pytest.raises(UnservableId, match="id pattern") as refused:
        TurnIdentity(**identity)
    assert not refused.value.retryable and isinstance(refused.value, ValueError)


def test_conversation_identity_refuses_a_previous_response_id():
    with pytest.raises(ValueError, match="previous_response_id"):
        TurnIdentity("tenant-1", "resp_2", conversation_id="conv_1", expected_head_seq=1,
                     previous_response_id="resp_1")


def test_tool_effect_id_is_stable_across_retries_and_output_matches_the_turn():
    a = tool_effect(
        conversation(), idempotency_key="idem_1", subturn_index=0, call=CALL, output=OUTPUT
    )
    b = tool_effect(
        conversation(),
        idempotency_key="idem_1",
        subturn_index=0,
        call=CALL,
        output=OUTPUT,
        attempt=2,
    )
    assert a.effect_id == b.effect_id and a.event_id != b.event_id
    assert (
        a.effect_id
        != tool_effect(
            conversation(), idempotency_key="idem_2", subturn_index=0, call=CALL, output=OUTPUT
        ).effect_id
    )
    turn = build()
    assert a.output == turn.output_items[2]  # same bytes as the turn's output item
    assert (
        a.arguments_digest
        == tool_effect(
            conversation(),
            idempotency_key="idem_1",
            subturn_index=0,
            call={**CALL, "arguments": json.dumps({"city": "Paris"}, indent=2)},
            output=OUTPUT,
        ).arguments_digest
    )  # formatting of the arguments text does not matter


def test_tool_effect_refuses_mismatched_call_ids():
    with pytest.raises(InvalidGatewayItem):
        tool_effect(
            conversation(),
            idempotency_key="i",
            subturn_index=0,
            call=CALL,
            output={**OUTPUT, "call_id": "other"},
        )


def test_turn_with_its_effects_validates():
    effect = tool_effect(
        conversation(), idempotency_key="idem_1", subturn_index=0, call=CALL, output=OUTPUT
    )
    turn = build(tool_effect_ids=[effect.effect_id])
    assert isinstance(validate_turn(turn, now_ms()), Valid)


def test_cancellation_carries_the_turn_keys():
    cancel = turn_cancelled(conversation(), idempotency_key="idem_1")
    assert cancel.partition_key == "conv_1" and cancel.response_id == "resp_1"
