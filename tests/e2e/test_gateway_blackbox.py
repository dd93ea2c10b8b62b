"""ratchet as an outside gateway sees it (issue 12): raw Confluent-framed Avro in, output
topics and HTTP out, digests computed by the test itself (tests/e2e/outside.py).

One test per defect of issue 12 and per contract decision it lists (all fixed; a new
defect found this way gets a ``xfail(strict=True)`` test naming it until its fix).
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.outside import (
    FINGERPRINT_HASH,
    OutsideGateway,
    assistant,
    epoch_ms,
    item_contents,
    now_ms,
    raw_item,
    turn,
    uid,
    user,
)

INTEGRITY_FAILURES = ("CORRUPT_HISTORY", "MISSING_HISTORY")


@pytest.fixture(scope="module")
def gw(e2e_stack):
    settings = e2e_stack.settings
    gateway = OutsideGateway(settings.kafka_bootstrap, settings.schema_registry_url,
                             settings.topic_prefix, e2e_stack.base_url)
    yield gateway
    gateway.close()


@pytest.fixture
def tenant() -> str:
    return uid("tenant")


def conversation(gw: OutsideGateway, tenant: str, turns: int) -> tuple[str, list[dict], list[dict]]:
    """Promote ``turns`` two-item turns in a new Conversation: (id, events, promotions)."""
    conv, events, promotions = uid("conv"), [], []
    for head in range(turns):
        event = turn(tenant, uid("resp"), [user(f"q{head}")], [assistant(f"a{head}")],
                     conversation_id=conv, expected_head_seq=head)
        promotions.append(gw.promoted(event))
        events.append(event)
    return conv, events, promotions


def contents(*events: dict) -> list[str]:
    return [i["content"].decode() for e in events for i in e["input_items"] + e["output_items"]]


# --- defect 1: a response id is bound once per tenant, across partitions -------------------


@pytest.mark.parametrize("where", ["another conversation", "another chain"])
def test_response_id_reused_in_another_partition_is_conflict(gw, tenant, where):
    rid = uid("resp")
    first = turn(tenant, rid, [user("in A")], [assistant("A")],
                 conversation_id=uid("conv"), expected_head_seq=0)
    gw.promoted(first)
    if where == "another conversation":
        reuse = turn(tenant, rid, [user("in B")], [assistant("B")],
                     conversation_id=uid("conv"), expected_head_seq=0)
    else:  # a child of another chain's root: keyed by that root
        root = turn(tenant, uid("resp"), [user("root")], [assistant("root")])
        gw.promoted(root)
        reuse = turn(tenant, rid, [user("in B")], [assistant("B")],
                     chain_root_id=root["response_id"],
                     previous_response_id=root["response_id"])

    gw.send_turn(reuse)
    seen = gw.outcome(reuse)
    assert (seen.record, seen.value.get("reason")) == ("PromotionRejected", "CONFLICT")
    promotions = gw.records(lambda s: s.record == "CheckpointPromoted"
                            and s.value["tenant_id"] == tenant and s.value["response_id"] == rid)
    assert len(promotions) == 1
    answer = gw.response_history(tenant, rid, **{"Cache-Control": "no-cache"})
    assert answer.status_code == 200, answer.text
    assert item_contents(answer.json()) == contents(first)


# --- defect 2: content a reader could not decode is never promoted --------------------------

BAD_CONTENT = {
    "not JSON": b'{"id": "msg_1", "type": "message", oops',
    "not UTF-8": b'{"id":"msg_1","type":"message","x":"\xff\xfe"}',
    "JSON array": b'[{"id":"msg_1","type":"message"}]',
    "JSON string": b'"an assistant message"',
}


@pytest.mark.parametrize("case", sorted(BAD_CONTENT))
def test_content_that_is_not_a_json_object_is_corrupt_and_the_head_stays(gw, tenant, case):
    conv, events, _ = conversation(gw, tenant, 1)
    bad = raw_item({"id": uid("msg"), "type": "message", "role": "assistant"}, BAD_CONTENT[case])
    second = turn(tenant, uid("resp"), [user("next")], [bad],
                  conversation_id=conv, expected_head_seq=1)
    assert gw.rejected(second)["reason"] == "CORRUPT"
    head = gw.conversation_history(tenant, conv, **{"Cache-Control": "no-cache"})
    assert head.status_code == 200, head.text
    body = head.json()
    assert (body["response_id"], body["head_seq"]) == (events[0]["response_id"], 1)
    assert item_contents(body) == contents(events[0])


# --- defect 3: CheckpointPromoted.item_count counts the complete history --------------------


def test_item_count_is_the_complete_historys_count_in_a_conversation(gw, tenant):
    _, _, promotions = conversation(gw, tenant, 3)
    assert [p["item_count"] for p in promotions] == [2, 4, 6]
    assert [p["seq"] for p in promotions] == [1, 2, 3]


def test_item_count_is_the_complete_historys_count_in_a_chain(gw, tenant):
    root = turn(tenant, uid("resp"), [user("q0")], [assistant("a0")])
    child = turn(tenant, uid("resp"), [user("q1")], [assistant("a1")],
                 chain_root_id=root["response_id"], previous_response_id=root["response_id"])
    counts = [gw.promoted(root)["item_count"], gw.promoted(child)["item_count"]]
    assert counts == [2, 4]


# --- defect 4: a head that no checkpoint backs is an integrity failure everywhere ----------


@pytest.fixture
def head_beyond_its_checkpoints(gw, tenant, cql):
    """Two promoted turns, every endpoint read once (warm caches), then the head's static
    row moved to seq 3 with no turn 3: fault injection through CQL, tests only."""
    conv, events, _ = conversation(gw, tenant, 2)
    for event in events:
        assert gw.response_history(tenant, event["response_id"]).status_code == 200
    assert gw.conversation_history(tenant, conv).status_code == 200
    cql.execute("UPDATE turns SET head_seq = 3 WHERE tenant_id = %s AND partition_key = %s",
                (tenant, conv))
    return conv, events


@pytest.mark.parametrize("cache_control", [None, "no-cache"])
def test_head_without_checkpoint_fails_the_conversation_endpoint(
        gw, tenant, head_beyond_its_checkpoints, cache_control):
    conv, _ = head_beyond_its_checkpoints
    headers = {"Cache-Control": cache_control} if cache_control else {}
    answer = gw.conversation_history(tenant, conv, **headers)
    assert answer.status_code == 500, answer.text
    body = answer.json()
    assert body["outcome"] == "failure" and body["reason"] in INTEGRITY_FAILURES
    assert body["items"] is None


@pytest.mark.parametrize("cache_control", [None, "no-cache"])
def test_head_without_checkpoint_fails_the_response_endpoint(
        gw, tenant, head_beyond_its_checkpoints, cache_control):
    _, events = head_beyond_its_checkpoints
    headers = {"Cache-Control": cache_control} if cache_control else {}
    for event in events:
        answer = gw.response_history(tenant, event["response_id"], **headers)
        assert answer.status_code == 500, answer.text
        body = answer.json()
        assert body["outcome"] == "failure" and body["reason"] in INTEGRITY_FAILURES
        assert body["items"] is None


# --- defect 6 and the DUPLICATE decision: a retry that minted a new response id ------------


def _retry_with_a_new_response_id(gw, tenant) -> tuple[dict, dict, dict]:
    """(original, retry, the retry's rejection): same idempotency key and request."""
    conv, request, key = uid("conv"), {"input": "same request"}, uid("idem")
    original = turn(tenant, uid("resp"), [user("q")], [assistant("a")], conversation_id=conv,
                    expected_head_seq=0, idempotency_key=key, request=request)
    gw.promoted(original)
    retry = turn(tenant, uid("resp"), [user("q")], [assistant("a again")], conversation_id=conv,
                 expected_head_seq=0, idempotency_key=key, request=request)
    return original, retry, gw.rejected(retry)


def test_duplicate_rejection_names_the_original_response(gw, tenant):
    original, _, rejection = _retry_with_a_new_response_id(gw, tenant)
    assert rejection["reason"] == "DUPLICATE"
    assert rejection["existing_response_id"] == original["response_id"]


def test_status_of_a_duplicate_is_rejected_and_names_the_original(gw, tenant):
    original, retry, _ = _retry_with_a_new_response_id(gw, tenant)
    status = gw.status(tenant, retry["response_id"])
    assert (status["state"], status["reason"]) == ("rejected", "DUPLICATE")
    assert status["existing_response_id"] == original["response_id"]
    assert gw.status(tenant, original["response_id"])["state"] == "promoted"


# --- contract decisions of issue 12 -------------------------------------------------------


def test_completed_turn_without_artifact_falls_back_no_artifact(gw, tenant):
    event = turn(tenant, uid("resp"), [user("q")], [assistant("a")], certified=False)
    promoted = gw.promoted(event)
    assert promoted["certification"] == "certified" and promoted["artifact_id"] is None
    answer = gw.response_history(tenant, event["response_id"])
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["outcome"], body["reason"]) == ("fallback", "NO_ARTIFACT")
    assert item_contents(body) == contents(event) and body["checkpoint"] is None


def test_incomplete_turn_is_logical_only_and_falls_back_not_certified(gw, tenant):
    event = turn(tenant, uid("resp"), [user("q")], [assistant("a")], status="incomplete")
    assert gw.promoted(event)["certification"] == "logical_only"
    body = gw.response_history(tenant, event["response_id"]).json()
    assert (body["outcome"], body["reason"]) == ("fallback", "NOT_CERTIFIED")
    assert item_contents(body) == contents(event)


def test_head_seq_of_a_response_is_its_own_seq_with_the_conversation_head_beside(gw, tenant):
    conv, events, _ = conversation(gw, tenant, 3)
    first = gw.response_history(tenant, events[0]["response_id"]).json()
    assert (first["head_seq"], first["conversation_head_seq"]) == (1, 3)
    assert item_contents(first) == contents(events[0])
    whole = gw.conversation_history(tenant, conv).json()
    assert (whole["head_seq"], whole["conversation_head_seq"]) == (3, 3)


def test_turn_expires_at_is_honoured(gw, tenant):
    expires_at = now_ms() + 6_000
    event = turn(tenant, uid("resp"), [user("q")], [assistant("a")], expires_at=expires_at)
    promoted = gw.promoted(event)
    # The e2e stack has no server retention, so nothing caps the gateway's expiry.
    assert epoch_ms(promoted["expires_at"]) == expires_at
    time.sleep(max(0.0, (expires_at - now_ms()) / 1000) + 0.2)
    answer = gw.response_history(tenant, event["response_id"])
    assert answer.status_code == 410, answer.text
    assert (answer.json()["outcome"], answer.json()["reason"]) == ("failure", "EXPIRED")


@pytest.mark.parametrize("expires_at", [0, -1])
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_a_turn_continuing_one_that_expired_before_1970_is_promoted(gw, tenant, mode,
                                                                    expires_at):
    """Promotion ignores expiry (docs/gateway-protocol.md, "Logical expiry"), whatever
    the expiry: a first turn sent with ``expires_at`` 0 or -1 (a gateway's "none", a
    clock gone wrong) is promoted, reads 410, and the turn continuing it is promoted,
    its history whole. An outside review, session 42: the child was rejected
    ``CORRUPT``."""
    if mode == "conversation":
        conv = uid("conv")
        first = turn(tenant, uid("resp"), [user("q0")], [assistant("a0")],
                     conversation_id=conv, expected_head_seq=0, expires_at=expires_at)
        child = turn(tenant, uid("resp"), [user("q1")], [assistant("a1")],
                     conversation_id=conv, expected_head_seq=1)
    else:
        first = turn(tenant, uid("resp"), [user("q0")], [assistant("a0")],
                     expires_at=expires_at)
        child = turn(tenant, uid("resp"), [user("q1")], [assistant("a1")],
                     chain_root_id=first["response_id"],
                     previous_response_id=first["response_id"])
    assert epoch_ms(gw.promoted(first)["expires_at"]) == expires_at
    assert gw.response_history(tenant, first["response_id"]).status_code == 410
    assert gw.promoted(child)["seq"] == 2
    answer = gw.response_history(tenant, child["response_id"])
    assert answer.status_code == 200, answer.text
    assert item_contents(answer.json()) == contents(first, child)


def test_turns_of_one_conversation_expire_apart_on_every_endpoint(gw, tenant):
    """Expiry is per response (docs/gateway-protocol.md, "Logical expiry"), on the real
    worker, API and Cassandra, cached or not: turns 1 and 3 are sent already expired,
    turn 2 never expires. Turn 2's history is whole (turn 1's items in it) and reports
    head 3; turns 1 and 3 and the Conversation (its head is turn 3) answer 410;
    ``/status`` ignores expiry; turn 4 continues the expired head and renews the
    Conversation's history. An outside review, session 42."""
    conv, past = uid("conv"), now_ms() - 1_000
    events = [turn(tenant, uid("resp"), [user(f"q{i}")], [assistant(f"a{i}")],
                   conversation_id=conv, expected_head_seq=i,
                   expires_at=past if i in (0, 2) else None) for i in range(3)]
    for event in events:
        gw.promoted(event)
    first, second, third = (e["response_id"] for e in events)
    for headers in ({}, {"Cache-Control": "no-cache"}, {}):
        for rid in (first, third):
            answer = gw.response_history(tenant, rid, **headers)
            assert (answer.status_code, answer.json()["reason"]) == (410, "EXPIRED")
        answer = gw.response_history(tenant, second, **headers)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["head_seq"], body["conversation_head_seq"]) == (2, 3)
        assert item_contents(body) == contents(*events[:2])
        whole = gw.conversation_history(tenant, conv, **headers)
        assert (whole.status_code, whole.json()["reason"]) == (410, "EXPIRED")
    assert [gw.status(tenant, rid)["seq"] for rid in (first, second, third)] == [1, 2, 3]
    fourth = turn(tenant, uid("resp"), [user("q3")], [assistant("a3")],
                  conversation_id=conv, expected_head_seq=3)
    assert gw.promoted(fourth)["seq"] == 4
    whole = gw.conversation_history(tenant, conv)
    assert whole.status_code == 200, whole.text
    assert item_contents(whole.json()) == contents(*events, fourth)


def test_outside_digests_are_what_the_api_serves(gw, tenant):
    """The outside implementation of canonical JSON and digests agrees with ratchet's."""
    _, events, promotions = conversation(gw, tenant, 1)
    assert promotions[0]["fingerprint_hash"] == FINGERPRINT_HASH
    body = gw.response_history(tenant, events[0]["response_id"]).json()
    sent = events[0]["input_items"] + events[0]["output_items"]
    assert [(i["item_id"], i["content"].encode(), i["content_digest"]) for i in body["items"]] \
        == [(i["item_id"], i["content"], i["content_digest"]) for i in sent]
