"""The effect-claims API refuses outcomes that break what a turn or a holder relies on
(services/api/claims.py; docs/gateway-protocol.md, section 8): an output no turn could
carry, and a holder's second completion with another outcome; and a body that is not
JSON is a 400, as documented."""

from __future__ import annotations

import hashlib
import json
import uuid

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS
from schemas.canonical import canonical_json
from services.api.app import create_app
from services.api.claims import MAX_OUTPUT_CONTENT_BYTES, claims_router
from services.api.fastpath import HistoryFastPath
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore


def client() -> TestClient:
    app = FastAPI()
    store = MemoryCheckpointStore(StoreOptions())
    app.include_router(claims_router(MemoryLedger(), store, lambda: NOW_MS))
    return TestClient(app, raise_server_exceptions=False)


def api_client() -> TestClient:
    """The routes as ``ratchet api`` serves them: in the app, behind ``HistoryFastPath``."""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    service = RehydrationService(store, ledger, PromotionWaiters())
    app = create_app(service, lambda: True,
                     routers=[claims_router(ledger, store, lambda: NOW_MS)])
    return TestClient(HistoryFastPath(app, service), raise_server_exceptions=False)


def claimed(http: TestClient) -> tuple[str, str]:
    token = uuid.uuid4().hex
    answer = http.post("/v1/effects/claims", json={
        "tenant_id": "t1", "idempotency_key": "k1", "partition_key": "conv_1", "attempt": 1,
        "subturn_index": 0, "tool_name": "send_email", "occurrence": 0,
        "arguments_digest": hashlib.sha256(b"{}").hexdigest(), "call_id": "call_1",
        "token": token, "lease_ms": 30_000, "policy": "at_most_once"}).json()
    assert answer["state"] == "CLAIMED"
    return answer["effect_id"], token


def complete(http: TestClient, effect_id: str, token: str, status: str = "succeeded",
             format_version: int = 1, content: bytes | None = None):
    content = content or canonical_json({"type": "function_call_output", "id": "fco_1",
                                         "call_id": "call_1", "output": "sent"})
    output = {"item_id": "fco_1", "type": "function_call_output", "role": None,
              "call_id": "call_1", "content": content.decode(),
              "content_digest": hashlib.sha256(content).hexdigest(),
              "format_version": format_version}
    return http.post(f"/v1/effects/claims/{effect_id}/complete", json={
        "tenant_id": "t1", "idempotency_key": "k1", "partition_key": "conv_1",
        "token": token, "status": status, "output": output})


def test_an_output_in_a_format_no_turn_could_carry_is_refused():
    # Recorded, it would be replayed to every retry, and every turn carrying it would
    # be UNSUPPORTED_FORMAT: the request could never be promoted.
    http = client()
    effect_id, token = claimed(http)
    refused = complete(http, effect_id, token, format_version=7)
    assert refused.status_code == 422
    assert "format_version 7 is not supported" in refused.text
    assert complete(http, effect_id, token).json()["state"] == "COMPLETED"


def test_a_holders_second_completion_with_another_status_is_an_outcome_conflict():
    http = client()
    effect_id, token = claimed(http)
    assert complete(http, effect_id, token, "succeeded").json()["state"] == "COMPLETED"
    assert complete(http, effect_id, token, "succeeded").json()["state"] == "ALREADY_COMPLETED"
    conflict = complete(http, effect_id, token, "failed")
    assert (conflict.status_code, conflict.json()["error"]) == (409, "OUTCOME_CONFLICT")


def test_an_output_with_a_number_beyond_a_double_is_refused():
    # Parsed, 1e400 is infinity: no canonical JSON, so the result digest every turn of
    # the request is compared with could not be computed.
    http = client()
    effect_id, token = claimed(http)
    content = (b'{"call_id":"call_1","id":"fco_1","output":"sent","score":1e400,'
               b'"type":"function_call_output"}')
    refused = complete(http, effect_id, token, content=content)
    assert (refused.status_code, refused.json()["error"]) == (422, "INVALID_REQUEST")
    assert "range of a double" in refused.json()["detail"]
    assert complete(http, effect_id, token).json()["state"] == "COMPLETED"


def test_an_output_above_8_mib_of_utf8_is_refused_whatever_its_character_count():
    http = client()
    effect_id, token = claimed(http)
    empty = canonical_json({"type": "function_call_output", "id": "fco_1",
                            "call_id": "call_1", "output": ""})
    fill = MAX_OUTPUT_CONTENT_BYTES - len(empty)
    # one two-byte character: 8 MiB + 1 bytes in 8 MiB characters (the old, wrong count)
    over = canonical_json({"type": "function_call_output", "id": "fco_1",
                           "call_id": "call_1", "output": "\u00e9" + "x" * (fill - 1)})
    assert len(over) == MAX_OUTPUT_CONTENT_BYTES + 1 == len(over.decode()) + 1
    refused = complete(http, effect_id, token, content=over)
    assert (refused.status_code, refused.json()["error"]) == (422, "INVALID_REQUEST")
    assert "bytes of UTF-8" in refused.json()["detail"]
    # exactly 8 MiB is recorded (and nothing was recorded before it: no OUTCOME_CONFLICT)
    exact = canonical_json({"type": "function_call_output", "id": "fco_1",
                            "call_id": "call_1", "output": "x" * fill})
    assert len(exact) == MAX_OUTPUT_CONTENT_BYTES
    assert complete(http, effect_id, token, content=exact).json()["state"] == "COMPLETED"


@pytest.mark.parametrize("served", ["router", "api"])
def test_a_body_that_is_not_json_is_a_400_on_both_endpoints(served):
    http = client() if served == "router" else api_client()
    for path in ("/v1/effects/claims", f"/v1/effects/claims/eff_{'0' * 32}/complete"):
        # not JSON; not UTF-8; no body at all
        for body in (b'{"tenant_id": "t1", oops', b'{"tenant_id": "\xff"}', b""):
            answer = http.post(path, content=body,
                               headers={"content-type": "application/json"})
            assert (answer.status_code, answer.json()["error"]) == (400, "INVALID_REQUEST"), \
                (path, body, answer.text)
        # JSON with fields missing stays a 422
        assert http.post(path, json={"tenant_id": "t1"}).status_code == 422


# Found by an outside review of the HTTP surface (2026-12-04): Java's HttpClient sends
# a body without a Content-Type unless told; FastAPI then left it unparsed and answered
# 422 "Input should be a valid dictionary" for a valid JSON claim.

def _claim_body() -> bytes:
    return json.dumps({
        "tenant_id": "t1", "idempotency_key": "k1", "partition_key": "conv_1", "attempt": 1,
        "subturn_index": 0, "tool_name": "send_email", "occurrence": 0,
        "arguments_digest": hashlib.sha256(b"{}").hexdigest(), "call_id": "call_1",
        "token": uuid.uuid4().hex, "lease_ms": 30_000, "policy": "at_most_once"}).encode()


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/json; charset=utf-8"},
                                     {"content-type": "application/vnd.x+json"}],
                         ids=["none", "json-with-charset", "plus-json"])
def test_a_json_claim_without_a_json_content_type_header_is_read(headers):
    answer = api_client().post("/v1/effects/claims", content=_claim_body(), headers=headers)
    assert (answer.status_code, answer.json()["state"]) == (200, "CLAIMED"), answer.text


def test_a_claim_declared_as_another_type_is_415_typed():
    answer = api_client().post("/v1/effects/claims", content=_claim_body(),
                               headers={"content-type": "text/plain"})
    assert answer.status_code == 415
    assert answer.json()["error"] == "INVALID_REQUEST"
    assert "'text/plain' is not JSON" in answer.json()["detail"]


def test_openapi_lists_every_status_the_claim_endpoints_answer():
    """An outside gateway review (session 28): 413 and 415 were answered as documented
    but missing from /openapi.json, so a generated client met them untyped."""
    spec = api_client().get("/openapi.json").json()
    paths = spec["paths"]
    claim = paths["/v1/effects/claims"]["post"]["responses"]
    complete = paths["/v1/effects/claims/{effect_id}/complete"]["post"]["responses"]
    assert {"200", "400", "409", "413", "415", "422", "503"} <= set(claim)
    assert {"200", "400", "404", "409", "413", "415", "422", "503"} <= set(complete)
    for responses in (claim, complete):
        for status in ("400", "413", "415"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}


def test_an_output_holding_too_many_arrays_and_objects_is_refused():
    """Every turn carrying it would be UNSUPPORTED_FORMAT (docs/gateway-protocol.md,
    "Size limit"): refused before its content is parsed; one fewer is recorded."""
    from schemas.limits import MAX_ITEM_CONTAINERS

    def output(containers: int) -> bytes:  # the item's own object, its "x" array, then []s
        return canonical_json({"type": "function_call_output", "id": "fco_1",
                               "call_id": "call_1", "output": "sent",
                               "x": [[]] * (containers - 2)})

    http = client()
    effect_id, token = claimed(http)
    refused = complete(http, effect_id, token, content=output(MAX_ITEM_CONTAINERS + 1))
    assert refused.status_code == 422
    assert f"more than {MAX_ITEM_CONTAINERS} arrays and objects" in refused.text
    done = complete(http, effect_id, token, content=output(MAX_ITEM_CONTAINERS))
    assert done.json()["state"] == "COMPLETED"


@pytest.mark.parametrize("size", [100, 200_000])
def test_a_large_output_is_judged_off_the_event_loop(monkeypatch, size):
    """Judging an output parses it: 1.95 s for 8 MiB on the loop every request shares (a
    review). Above 64 KiB it is judged on a worker thread; a small one inline."""
    import asyncio

    from services.api import claims as claims_module
    judged_on_loop: list[bool] = []
    real = claims_module._output_item

    def spy(output):
        try:
            asyncio.get_running_loop()
            judged_on_loop.append(True)
        except RuntimeError:
            judged_on_loop.append(False)
        return real(output)

    monkeypatch.setattr(claims_module, "_output_item", spy)
    http = client()
    effect_id, token = claimed(http)
    content = canonical_json({"type": "function_call_output", "id": "fco_1",
                              "call_id": "call_1", "output": "x" * size})
    assert complete(http, effect_id, token, content=content).json()["state"] == "COMPLETED"
    assert judged_on_loop == [size < 64 * 1024]
