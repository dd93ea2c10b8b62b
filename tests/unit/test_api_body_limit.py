"""The API reads no request body above its limit (RATCHET_API_MAX_BODY_BYTES, 32 MiB by
default): a larger one is refused 413 with the typed bad-input body, whether it
declares its length or is chunked, and nothing is recorded; every valid completion
fits under the default however its JSON is escaped (docs/gateway-protocol.md,
section 8; services/api/app.py)."""

from __future__ import annotations

import hashlib
import json
import uuid

from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS
from schemas.canonical import canonical_json
from services.api.app import MAX_BODY_BYTES, create_app
from services.api.claims import MAX_OUTPUT_CONTENT_BYTES, claims_router
from services.api.fastpath import HistoryFastPath
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.unit.real_api import exchange, served_api

KEYS = {"tenant_id": "t1", "idempotency_key": "k1", "partition_key": "conv_1"}


def api(max_body_bytes: int = MAX_BODY_BYTES) -> TestClient:
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    service = RehydrationService(store, ledger, PromotionWaiters())
    app = create_app(service, lambda: True,
                     routers=[claims_router(ledger, store, lambda: NOW_MS)],
                     max_body_bytes=max_body_bytes)
    return TestClient(HistoryFastPath(app, service), raise_server_exceptions=False)


def claim(http: TestClient) -> tuple[str, str]:
    token = uuid.uuid4().hex
    answer = http.post("/v1/effects/claims", json={
        **KEYS, "attempt": 1, "subturn_index": 0, "tool_name": "send_email", "occurrence": 0,
        "arguments_digest": hashlib.sha256(b"{}").hexdigest(), "call_id": "call_1",
        "token": token, "lease_ms": 30_000, "policy": "at_most_once"}).json()
    assert answer["state"] == "CLAIMED"
    return answer["effect_id"], token


def completion(token: str, output_text: str) -> dict:
    content = canonical_json({"type": "function_call_output", "id": "fco_1",
                              "call_id": "call_1", "output": output_text})
    return {**KEYS, "token": token, "status": "succeeded", "output": {
        "item_id": "fco_1", "type": "function_call_output", "role": None, "call_id": "call_1",
        "content": content.decode(), "content_digest": hashlib.sha256(content).hexdigest(),
        "format_version": 1}}


def test_a_body_declaring_more_than_the_limit_is_refused_413_and_records_nothing():
    http = api(max_body_bytes=4096)
    effect_id, token = claim(http)
    body = json.dumps(completion(token, "x" * 5000)).encode()
    refused = http.post(f"/v1/effects/claims/{effect_id}/complete", content=body,
                        headers={"content-type": "application/json"})
    assert refused.status_code == 413
    assert refused.json() == {
        "error": "INVALID_REQUEST", "retryable": False,
        "detail": "request body exceeds 4096 bytes (RATCHET_API_MAX_BODY_BYTES)"}
    # Nothing was recorded: the same holder completes with a small output.
    done = http.post(f"/v1/effects/claims/{effect_id}/complete", json=completion(token, "ok"))
    assert done.json()["state"] == "COMPLETED"


def test_a_chunked_body_passing_the_limit_is_refused_413():
    http = api(max_body_bytes=4096)
    effect_id, token = claim(http)
    body = json.dumps(completion(token, "x" * 5000)).encode()

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for at in range(0, len(body), 1000):
            yield body[at:at + 1000]

    refused = http.post(f"/v1/effects/claims/{effect_id}/complete", content=chunks(),
                        headers={"content-type": "application/json"})
    assert refused.status_code == 413
    assert refused.json()["error"] == "INVALID_REQUEST"


def test_a_body_at_the_limit_is_read():
    http = api(max_body_bytes=4096)
    effect_id, token = claim(http)
    small = json.dumps(completion(token, "")).encode()
    body = json.dumps(completion(token, "x" * (4096 - len(small)))).encode()
    assert len(body) == 4096
    done = http.post(f"/v1/effects/claims/{effect_id}/complete", content=body,
                     headers={"content-type": "application/json"})
    assert done.status_code == 200, done.text


def test_the_largest_completion_escaped_as_ascii_fits_the_default_limit():
    # 8 MiB of 4-byte characters, each written as a 12-byte surrogate pair escape by an
    # encoder that escapes all non-ASCII (json.dumps' default): the worst expansion.
    http = api()
    effect_id, token = claim(http)
    envelope = len(canonical_json({"type": "function_call_output", "id": "fco_1",
                                   "call_id": "call_1", "output": ""}))
    text = "\U0001F600" * ((MAX_OUTPUT_CONTENT_BYTES - envelope) // 4)
    body = json.dumps(completion(token, text)).encode()  # ensure_ascii=True
    assert 3 * 8 * 1024 * 1024 - 64 < len(body) <= MAX_BODY_BYTES
    done = http.post(f"/v1/effects/claims/{effect_id}/complete", content=body,
                     headers={"content-type": "application/json"})
    assert done.status_code == 200, done.text[:300]
    assert done.json()["state"] == "COMPLETED"


def test_a_real_server_answers_a_declared_oversize_body_without_waiting_for_it():
    # As `ratchet api` serves (uvicorn, httptools with h2c.py): the client declares 64 MiB
    # and sends 10 bytes; the 413 comes without the server waiting for the rest.
    with served_api() as port:
        status, head, body = exchange(port, (
            b"POST /v1/effects/claims/e1/complete HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n{\"tenant_" % (64 * 1024 * 1024)))
    assert status == 413, head
    assert json.loads(body) == {
        "error": "INVALID_REQUEST", "retryable": False,
        "detail": f"request body exceeds {MAX_BODY_BYTES} bytes (RATCHET_API_MAX_BODY_BYTES)"}
