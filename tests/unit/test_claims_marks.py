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


class MarkSeenAtTheWrite(MemoryLedger):
    """Writes, notes the request's facts mark at that moment (what a promotion that
    read the facts just before the write asserts), then loses the answer."""

    def __init__(self, store) -> None:
        super().__init__()
        self.store = store
        self.mark_at_write: str | None = None

    def _seen(self) -> None:
        self.mark_at_write = self.store.request_facts_mark("t1", "conv_1", "k1")
        raise LedgerUnavailable("timed out after the write")

    def claim_effect(self, request, now_ms):
        super().claim_effect(request, now_ms)
        self._seen()

    def complete_claim(self, *args):
        super().complete_claim(*args)
        self._seen()


def output_body() -> dict:
    content = '{"call_id":"call_1","id":"fco_1","output":"sent","type":"function_call_output"}'
    return {"item_id": "fco_1", "type": "function_call_output", "role": None,
            "call_id": "call_1", "content": content,
            "content_digest": hashlib.sha256(content.encode()).hexdigest(),
            "format_version": 1}


def test_a_completion_whose_outcome_is_unknown_is_marked_after_it_too():
    """A completion that landed with its answer lost (503): a promotion that read the
    request's facts between the mark before it and the write asserts that mark, so
    the mark is written again after the failed write; else that batch lands without
    the completion (its claim published "may or may not have run", or its turn refused
    MISSING_TOOL_EFFECT) whenever the gateway does not send it again."""
    store = MemoryCheckpointStore(StoreOptions())
    ledger = MarkSeenAtTheWrite(store)
    http = client(ledger, store)
    claim = body("k1", "conv_1")
    MemoryLedger.claim_effect(ledger, _request(claim), NOW_MS)  # held, no mark needed here
    effect_id = ledger.claims_for("t1", "k1")[0].effect_id
    resp = http.post(f"/v1/effects/claims/{effect_id}/complete", json={
        "tenant_id": "t1", "idempotency_key": "k1", "partition_key": "conv_1",
        "token": claim["token"], "status": "succeeded", "output": output_body()})
    assert resp.status_code == 500  # no error handlers in this bare app: it failed
    assert ledger.claims_for("t1", "k1")[0].completed  # ... after the write landed
    assert ledger.mark_at_write is not None
    assert store.request_facts_mark("t1", "conv_1", "k1") != ledger.mark_at_write


def test_a_claim_whose_outcome_is_unknown_is_marked_after_it_too():
    store = MemoryCheckpointStore(StoreOptions())
    ledger = MarkSeenAtTheWrite(store)
    resp = client(ledger, store).post("/v1/effects/claims", json=body("k1", "conv_1"))
    assert resp.status_code == 500
    assert ledger.claims_for("t1", "k1")
    assert ledger.mark_at_write is not None
    assert store.request_facts_mark("t1", "conv_1", "k1") != ledger.mark_at_write


def _request(claim: dict):
    from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim

    return ClaimRequest(
        claim["tenant_id"], claim["idempotency_key"],
        effect_id_for_claim(claim["idempotency_key"], 0, claim["tool_name"], 0),
        1, 0, claim["call_id"], claim["tool_name"], claim["arguments_digest"],
        claim["token"], claim["lease_ms"], EffectPolicy(claim["policy"]))
