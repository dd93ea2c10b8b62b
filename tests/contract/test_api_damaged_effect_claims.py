"""An effect claim row with a null cell met by the claims API is the typed 500
``CORRUPT_HISTORY`` (not retryable), the same on both ledgers (session 53: the
completion path was never read for null claim cells).

Every claim row is written whole: a token, an attempt, a lease and a completion flag
(false), and, once completed, a status and an output. Before, such a row answered
according to the backend and the cell: a null completion flag on an open claim was a
503 on Cassandra for ever (the conditional ``claim_completed = false`` never applied,
its SERIAL read found the claim open and this holder's: "completion outcome unknown")
and a recorded completion on memory; a null token, status or output was a 409
(``NOT_HOLDER`` / ``OUTCOME_CONFLICT``: a statement about a holder or an outcome the
row does not hold); a completed claim without its output was answered ``COMPLETED``
with ``output: null`` to a later claimant, whose gateway library could not read it.
"""

from __future__ import annotations

import hashlib
import uuid

import pytest
from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS, TENANT, new_id
from services.api.app import create_app
from services.api.claims import claims_router
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from tests.contract.claim_damage import null_claim_cell

OUTPUT = '{"call_id":"call_1","id":"out_1","output":"sent","type":"function_call_output"}'


class Client:
    def __init__(self, store_and_ledger) -> None:
        store, self.ledger = store_and_ledger
        app = create_app(RehydrationService(store, self.ledger, PromotionWaiters()),
                         lambda: True, routers=[claims_router(self.ledger, store,
                                                              lambda: NOW_MS)])
        self.http = TestClient(app, raise_server_exceptions=False)
        self.key, self.partition = new_id("key"), new_id("conv")

    def claim(self, token: str, attempt: int = 1):
        return self.http.post("/v1/effects/claims", json={
            "tenant_id": TENANT, "idempotency_key": self.key, "partition_key": self.partition,
            "attempt": attempt, "subturn_index": 0, "tool_name": "send_email",
            "occurrence": 0, "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
            "call_id": f"call_{attempt}", "token": token, "lease_ms": 30_000,
            "policy": "at_least_once"})

    def complete(self, effect_id: str, token: str):
        return self.http.post(f"/v1/effects/claims/{effect_id}/complete", json={
            "tenant_id": TENANT, "idempotency_key": self.key, "partition_key": self.partition,
            "token": token, "status": "succeeded", "output": {
                "item_id": "out_1", "type": "function_call_output", "call_id": "call_1",
                "content": OUTPUT,
                "content_digest": hashlib.sha256(OUTPUT.encode()).hexdigest()}})


def corrupt(answer, cell: str) -> None:
    assert answer.status_code == 500, (cell, answer.status_code, answer.text)
    body = answer.json()
    assert body["error"] == "CORRUPT_HISTORY" and body["retryable"] is False, (cell, body)
    assert "damaged" in body["detail"], (cell, body)


@pytest.mark.parametrize("cell", ["claim_token", "claim_completed", "lease_until", "attempt"])
def test_completing_an_open_claim_with_a_null_cell_is_corrupt(store_and_ledger, cell):
    api = Client(store_and_ledger)
    token = uuid.uuid4().hex
    claimed = api.claim(token)
    assert claimed.status_code == 200 and claimed.json()["state"] == "CLAIMED", claimed.text
    effect_id = claimed.json()["effect_id"]
    null_claim_cell(api.ledger, api.key, effect_id, cell)
    corrupt(api.complete(effect_id, token), cell)
    corrupt(api.claim(token), cell)  # the holder's claim again: the same answer


@pytest.mark.parametrize("cell", ["status", "output_item", "claim_token"])
def test_a_completed_claim_with_a_null_cell_is_corrupt(store_and_ledger, cell):
    api = Client(store_and_ledger)
    token = uuid.uuid4().hex
    effect_id = api.claim(token).json()["effect_id"]
    done = api.complete(effect_id, token)
    assert done.status_code == 200 and done.json()["state"] == "COMPLETED", done.text
    null_claim_cell(api.ledger, api.key, effect_id, cell)
    corrupt(api.complete(effect_id, token), cell)  # the holder's completion again
    corrupt(api.claim(uuid.uuid4().hex, attempt=2), cell)  # a later attempt's claim
