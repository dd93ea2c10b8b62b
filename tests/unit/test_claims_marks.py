"""The claims API marks the request's facts around every claim write, so a promotion
of the request never misses a claim, even one whose call failed and is never re-sent
(services/api/claims.py, ``_marked``)."""

from __future__ import annotations

import hashlib
import uuid

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS
from services.api.claims import claims_router
from services.ledger.base import LedgerUnavailable
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore


class LandsThenFails(MemoryLedger):
    """The claim is written, then the answer is lost (a timeout after the write)."""

    def claim_effect(self, request, now_ms):
        super().claim_effect(request, now_ms)
        raise LedgerUnavailable("timed out after the write")


def body(key: str, partition: str) -> dict:
    return {"tenant_id": "t1", "idempotency_key": key, "partition_key": partition,
            "attempt": 1, "subturn_index": 0, "tool_name": "send_email", "occurrence": 0,
            "arguments_digest": hashlib.sha256(b"{}").hexdigest(), "call_id": "call_1",
            "token": uuid.uuid4().hex, "lease_ms": 30_000, "policy": "at_most_once"}


def client(ledger, store) -> TestClient:
    app = FastAPI()
    app.include_router(claims_router(ledger, store, lambda: NOW_MS))
    return TestClient(app, raise_server_exceptions=False)


def test_a_claim_marks_the_requests_partition_and_no_other():
    store = MemoryCheckpointStore(StoreOptions())
    http = client(MemoryLedger(), store)
    assert http.post("/v1/effects/claims", json=body("k1", "conv_1")).json()["state"] == "CLAIMED"
    assert store.request_facts_mark("t1", "conv_1", "k1") is not None
    assert store.request_facts_mark("t1", "conv_2", "k1") is None
    assert store.request_facts_mark("t1", "conv_1", "k2") is None


def test_a_claim_whose_answer_was_lost_is_marked_all_the_same():
    ledger = LandsThenFails()
    store = MemoryCheckpointStore(StoreOptions())
    resp = client(ledger, store).post("/v1/effects/claims", json=body("k1", "conv_1"))
    assert resp.status_code == 500  # no error handlers in this bare app: it failed
    assert ledger.claims_for("t1", "k1")  # ... after the claim was written
    # the mark written before the claim makes every later promotion read the facts
    assert store.request_facts_mark("t1", "conv_1", "k1") is not None
