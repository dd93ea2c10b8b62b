"""Claim before execute on the real stack: the API's claim routes over HTTP, the ledger
on Cassandra, the gateway library's ``EffectClaims``, and the processor promoting a
retried turn that reuses a claimed output (orphans on the real Kafka topic)."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from ratchet.domain.claims import EffectPolicy, effect_id_for_claim
from schemas.avro import EventSerde
from schemas.models import Subturn
from services.demo.simulator import SimulatedGateway, assistant, call, user
from services.gateway.claims import (
    EffectClaims,
    EffectOutcomeUnknown,
    RequestCancelled,
    RequestPromoted,
)
from services.gateway.events import TurnIdentity, turn_cancelled
from streams.testing import OutcomeCollector
from streams.topics import topic_names

ARGS = "a" * 64


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def claim_body(tenant: str, key: str, **kw) -> dict:
    body = {"tenant_id": tenant, "idempotency_key": key, "attempt": 1, "subturn_index": 0,
            "tool_name": "send_email", "occurrence": 0, "arguments_digest": ARGS,
            "call_id": uid("call"), "token": uid("tok"), "lease_ms": 30_000,
            "policy": "at_most_once", "partition_key": uid("conv")}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not None}


def chain(tenant: str) -> TurnIdentity:
    rid = uid("resp")
    return TurnIdentity(tenant_id=tenant, response_id=rid, chain_root_id=rid)


class Counter:
    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, text: str = "sent"):
        def run() -> str:
            self.runs += 1
            return text
        return run


@pytest.fixture
def http(e2e_stack):
    with httpx.Client(base_url=e2e_stack.base_url, timeout=15) as client:
        yield client


def claims_for(e2e_stack, identity: TurnIdentity, key: str, attempt: int, **kw) -> EffectClaims:
    return EffectClaims(e2e_stack.base_url, identity, idempotency_key=key, attempt=attempt,
                        **kw)


def test_concurrent_claims_by_two_attempts_one_wins(http):
    tenant, key = uid("tenant"), uid("idem")
    bodies = [claim_body(tenant, key, attempt=a) for a in (1, 2)]
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda b: http.post("/v1/effects/claims", json=b).json(),
                                bodies))
    assert sorted(a["state"] for a in answers) == ["CLAIMED", "IN_PROGRESS"]
    winner = next(a for a in answers if a["state"] == "CLAIMED")
    loser = next(a for a in answers if a["state"] == "IN_PROGRESS")
    assert loser["attempt"] == winner["attempt"] and 0 < loser["wait_ms"] <= 30_000
    assert winner["effect_id"] == effect_id_for_claim(key, 0, "send_email", 0)


def test_crashed_attempt_under_each_policy(e2e_stack):
    tenant, key = uid("tenant"), uid("idem")
    identity = chain(tenant)
    email = call("send_email", '{"to":"a@b.c"}')
    crashed = claims_for(e2e_stack, identity, key, 1, lease_ms=200)
    with crashed.effect(email, subturn_index=0) as effect:
        crashed._claim(effect)  # claimed, then the process "dies" before completing
    time.sleep(0.4)
    runs = Counter()
    careful = claims_for(e2e_stack, identity, key, 2)  # default: at_most_once
    with careful.effect(call("send_email", '{"to":"a@b.c"}'), subturn_index=0) as effect, \
            pytest.raises(EffectOutcomeUnknown) as unknown:
        effect.run(runs())
    assert runs.runs == 0 and unknown.value.attempt == 1
    eager = claims_for(e2e_stack, identity, key, 3,
                       policies={"send_email": EffectPolicy.AT_LEAST_ONCE})
    with eager.effect(call("send_email", '{"to":"a@b.c"}'), subturn_index=0) as effect:
        out = effect.run(runs("sent again"))
    assert runs.runs == 1 and effect.executed and effect.state == "CLAIMED"
    assert b"sent again" in out.content


def test_retry_with_regenerated_call_ids_reuses_output_and_orphans_the_rest(e2e_stack):
    settings = e2e_stack.settings
    serde = EventSerde(SchemaRegistryClient({"url": settings.schema_registry_url}))
    collector = OutcomeCollector(settings, serde, topic_names(settings))
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    key, runs = uid("idem"), Counter()
    first = chain(gw.tenant_id)
    try:
        # attempt 1: sends the e-mail (recorded), claims the charge, then crashes
        a1 = claims_for(e2e_stack, first, key, 1, producer=e2e_stack.producer, lease_ms=200)
        with a1.effect(call("send_email", '{"to":"a@b.c"}'), subturn_index=0) as sent:
            sent.run(runs("sent"))
        with a1.effect(call("charge", '{"eur":5}'), subturn_index=0) as charge:
            a1._claim(charge)
        e2e_stack.producer.flush()
        # attempt 2: the model regenerates its calls (new call ids), same request
        retry = chain(gw.tenant_id)
        a2 = claims_for(e2e_stack, retry, key, 2, producer=e2e_stack.producer)
        email = call("send_email", '{"to":"a@b.c"}')
        with a2.effect(email, subturn_index=0) as reused:
            output = reused.run(runs("sent twice!"))
        assert runs.runs == 1 and not reused.executed and reused.state == "COMPLETED"
        assert reused.effect_id == sent.effect_id and output.call_id == email["call_id"]
        assert b'"output":"sent"' in output.content
        turn = gw.turn(retry, [user("mail a@b.c")], [email, output, assistant("done")],
                       idempotency_key=key, attempt=2,
                       subturns=[Subturn(index=0, effect_ids=[reused.effect_id])],
                       tool_effect_ids=[reused.effect_id])
        gw.publish(turn)
        outcome = collector.outcome(retry.response_id)
        assert type(outcome).__name__ == "CheckpointPromoted", outcome
        collector.wait(lambda: collector.orphans(retry.response_id), timeout_s=30)
        orphans = collector.orphans(retry.response_id)
        assert [(o.effect_id, o.effect_completed, o.attempt, o.reason.value) for o in orphans] \
            == [(charge.effect_id, False, 1, "ATTEMPT_SUPERSEDED")]
        assert orphans[0].output_digest is None
    finally:
        collector.close()


def test_turn_carrying_another_output_than_the_completed_claim_is_rejected(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    settings = e2e_stack.settings
    serde = EventSerde(SchemaRegistryClient({"url": settings.schema_registry_url}))
    collector = OutcomeCollector(settings, serde, topic_names(settings))
    key = uid("idem")
    try:
        a1 = claims_for(e2e_stack, chain(gw.tenant_id), key, 1)
        with a1.effect(call("lookup", '{"q":1}'), subturn_index=0) as done:
            done.run(lambda: "42")
        retry = chain(gw.tenant_id)
        lookup = call("lookup", '{"q":1}')
        forged = {"type": "function_call_output", "id": uid("fco"),
                  "call_id": lookup["call_id"], "output": "43"}
        turn = gw.turn(retry, [user("q")], [lookup, forged, assistant("43")],
                       idempotency_key=key, attempt=2,
                       subturns=[Subturn(index=0, effect_ids=[done.effect_id])],
                       tool_effect_ids=[done.effect_id])
        gw.publish(turn)
        outcome = collector.outcome(retry.response_id)
        assert outcome.reason.value == "DUPLICATE_TOOL_EFFECT", outcome
    finally:
        collector.close()


def test_cancelled_request_refuses_claims(e2e_stack, http):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    identity, key = chain(gw.tenant_id), uid("idem")
    gw.publish(None, (), turn_cancelled(identity, idempotency_key=key))
    deadline = time.monotonic() + 60
    while True:  # the worker records the cancellation asynchronously
        state = http.post("/v1/effects/claims",
                          json=claim_body(gw.tenant_id, key, occurrence=1,
                                         partition_key=identity.chain_root_id)).json()["state"]
        if state == "CANCELLED" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert state == "CANCELLED"
    runs = Counter()
    a2 = claims_for(e2e_stack, identity, key, 2)
    with a2.effect(call("send_email", "{}"), subturn_index=0) as effect, \
            pytest.raises(RequestCancelled):
        effect.run(runs())
    assert runs.runs == 0


def test_a_retry_of_a_promoted_chain_request_is_told_promoted_and_runs_nothing(e2e_stack):
    """A chain's first response is promoted; a retry of its request under another
    response id (another partition) claims a tool through the library: ``PROMOTED``
    with the first response and its request's digest, and the tool never runs
    (docs/gateway-protocol.md section 8)."""
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    key, first = uid("idem"), chain(gw.tenant_id)
    turn = gw.turn(first, [user("book AF1")], [assistant("booked")], idempotency_key=key)
    gw.publish(turn)
    assert type(gw.rehydrate(first.response_id, wait_ms=10_000)).__name__ in (
        "Certified", "Fallback")
    runs = Counter()
    retry = claims_for(e2e_stack, chain(gw.tenant_id), key, 2)
    with retry.effect(call("book", '{"flight":"AF1"}'), subturn_index=0) as effect, \
            pytest.raises(RequestPromoted) as told:
        effect.run(runs("booked again"))
    assert runs.runs == 0
    assert (told.value.response_id, told.value.request_digest) == (first.response_id,
                                                                   turn.request_digest)


def test_claims_are_tenant_isolated(http):
    key = uid("idem")
    mine, theirs = claim_body(uid("tenant"), key), claim_body(uid("tenant"), key)
    assert http.post("/v1/effects/claims", json=mine).json()["state"] == "CLAIMED"
    assert http.post("/v1/effects/claims", json=theirs).json()["state"] == "CLAIMED"
    effect_id = effect_id_for_claim(key, 0, "send_email", 0)
    output = {"item_id": "out_1", "type": "function_call_output", "role": None,
              "call_id": mine["call_id"], "content": "", "content_digest": "0" * 64,
              "format_version": 1}
    from schemas.items import function_call_output
    item = function_call_output(mine["call_id"], "ok", item_id="out_1")
    output.update(content=item.content.decode(), content_digest=item.content_digest)
    stranger = {"tenant_id": uid("tenant"), "idempotency_key": key, "token": mine["token"],
                "status": "succeeded", "output": output,
                "partition_key": mine["partition_key"]}
    resp = http.post(f"/v1/effects/claims/{effect_id}/complete", json=stranger)
    assert (resp.status_code, resp.json()["error"]) == (404, "UNKNOWN_CLAIM")
    wrong_token = {**stranger, "tenant_id": mine["tenant_id"], "token": theirs["token"]}
    resp = http.post(f"/v1/effects/claims/{effect_id}/complete", json=wrong_token)
    assert (resp.status_code, resp.json()["error"]) == (409, "NOT_HOLDER")
    holder = {**stranger, "tenant_id": mine["tenant_id"]}
    done = http.post(f"/v1/effects/claims/{effect_id}/complete", json=holder).json()
    assert done["state"] == "COMPLETED" and done["output"]["content"] == output["content"]
    # the other tenant's claim of the same key is untouched
    again = http.post("/v1/effects/claims", json={**theirs, "token": uid("tok")}).json()
    assert again["state"] == "IN_PROGRESS"


@pytest.mark.parametrize("change", [
    {"idempotency_key": None},                      # field missing
    {"tenant_id": "bad tenant/"},                   # malformed id
    {"arguments_digest": "xyz"},                    # not a sha256
    {"policy": "exactly_once"},                     # no such policy
    {"lease_ms": 0},
    {"partition_key": None},                        # no partition named
    {"subturn_index": True},                        # a boolean is not an integer
    {"attempt": "2"},                               # nor is a string
    {"occurrence": 1.5},
])
def test_bad_claim_input_is_a_typed_422(http, change):
    body = claim_body(uid("tenant"), uid("idem"))
    body.update(change)
    body = {k: v for k, v in body.items() if v is not None}
    resp = http.post("/v1/effects/claims", json=body)
    assert (resp.status_code, resp.json()["error"]) == (422, "INVALID_REQUEST")


def test_effect_id_not_of_these_parts_is_a_typed_409(http):
    body = claim_body(uid("tenant"), uid("idem"), effect_id="eff_" + "0" * 32)
    resp = http.post("/v1/effects/claims", json=body)
    assert (resp.status_code, resp.json()["error"]) == (409, "EFFECT_KEY_MISMATCH")
    resp = http.post("/v1/effects/claims", content=b"\x00not json",
                     headers={"content-type": "application/json"})
    assert (resp.status_code, resp.json()["error"]) == (400, "INVALID_REQUEST")


def test_bad_completion_input_is_typed(http):
    resp = http.post("/v1/effects/claims/not-a-key/complete", json={})
    assert (resp.status_code, resp.json()["error"]) == (422, "INVALID_REQUEST")
    body = claim_body(uid("tenant"), uid("idem"))
    http.post("/v1/effects/claims", json=body)
    effect_id = effect_id_for_claim(body["idempotency_key"], 0, "send_email", 0)
    not_an_output = {"item_id": "m1", "type": "message", "role": "assistant", "call_id": None,
                     "content": "{}", "content_digest": "0" * 64, "format_version": 1}
    resp = http.post(f"/v1/effects/claims/{effect_id}/complete", json={
        "tenant_id": body["tenant_id"], "idempotency_key": body["idempotency_key"],
        "partition_key": body["partition_key"],
        "token": body["token"], "status": "succeeded", "output": not_an_output})
    assert (resp.status_code, resp.json()["error"]) == (422, "INVALID_REQUEST")


def _complete_body(tenant: str, key: str, body: dict, token: str, output: str,
                   padding: int = 0) -> dict:
    import hashlib

    from schemas.canonical import canonical_json
    content = canonical_json({"type": "function_call_output", "id": "fco_big",
                              "call_id": body["call_id"], "output": output})
    content += b"\n" * padding  # JSON whitespace after the object: valid content
    return {"tenant_id": tenant, "idempotency_key": key, "partition_key": body["partition_key"],
            "token": token, "status": "succeeded",
            "output": {"item_id": "fco_big", "type": "function_call_output", "role": None,
                       "call_id": body["call_id"], "content": content.decode(),
                       "content_digest": hashlib.sha256(content).hexdigest(),
                       "format_version": 1}}


def test_a_completion_whose_stored_form_is_too_large_is_refused_at_once(http):
    """A claim keeps its output's content as a JSON string, where each '"' and '\\'
    counts twice. Content of escaped text under the 8 MiB limit (a tool returning
    JSON-encoded JSON) doubled past Cassandra's largest mutation: every completion was
    a retryable 503 for good (found by an outside review, session 25). Now the stored
    form is bounded at 12 MiB: within it, the real Cassandra records the completion;
    beyond it, a 422 says why, at once."""
    from services.api.claims import MAX_OUTPUT_CONTENT_BYTES, MAX_STORED_OUTPUT_BYTES
    tenant = uid("t")
    # canonical JSON writes each \" pair of the output as 4 bytes, 8 once stored; a
    # newline between JSON tokens takes 1 byte, 2 once stored (an estimate that missed
    # it let 8 MiB of them through: found by a second review, session 25)
    for pairs, padding, want in (((MAX_STORED_OUTPUT_BYTES - 2000) // 8, 0, 200),
                                 ((MAX_OUTPUT_CONTENT_BYTES - 300) // 4, 0, 422),
                                 (0, MAX_OUTPUT_CONTENT_BYTES - 300, 422)):
        key = uid("key")
        body = claim_body(tenant, key)
        assert http.post("/v1/effects/claims", json=body).json()["state"] == "CLAIMED"
        done = _complete_body(tenant, key, body, body["token"], '\\"' * pairs, padding)
        assert len(done["output"]["content"]) <= MAX_OUTPUT_CONTENT_BYTES
        effect_id = effect_id_for_claim(key, 0, "send_email", 0)
        resp = http.post(f"/v1/effects/claims/{effect_id}/complete", json=done, timeout=60)
        assert resp.status_code == want, resp.text[:300]
        if want == 200:
            assert resp.json()["state"] == "COMPLETED"
        else:
            assert "12 MiB" in resp.json()["detail"]
