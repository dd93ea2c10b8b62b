"""The effect-claims API refuses outcomes that break what a turn or a holder relies on
(services/api/claims.py; docs/gateway-protocol.md, section 8): an output no turn could
carry, and a holder's second completion with another outcome."""

from __future__ import annotations

import hashlib
import uuid

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS
from schemas.canonical import canonical_json
from services.api.claims import claims_router
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore


def client() -> TestClient:
    app = FastAPI()
    store = MemoryCheckpointStore(StoreOptions())
    app.include_router(claims_router(MemoryLedger(), store.mark_request_facts, lambda: NOW_MS))
    return TestClient(app, raise_server_exceptions=False)


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
             format_version: int = 1):
    content = canonical_json({"type": "function_call_output", "id": "fco_1",
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
