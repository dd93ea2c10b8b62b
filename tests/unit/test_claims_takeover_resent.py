"""A takeover's claim call re-sent with its token answers the takeover again.

Promise (docs/gateway-protocol.md section 8: re-send the same token to repeat a call
whose answer was lost; `previous_attempt`: CLAIMED by taking over that attempt's
expired lease). The repeated call answers CLAIMED with the same `previous_attempt`
(found by an outside review: it answered null, the claim keeping only a count).
"""

from __future__ import annotations

import hashlib
import uuid

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS
from services.api.claims import claims_router
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore


class Clock:
    def __init__(self) -> None:
        self.now = NOW_MS

    def __call__(self) -> int:
        return self.now


def _claim(attempt: int, token: str, policy: str, lease_ms: int) -> dict:
    return {"tenant_id": "t1", "idempotency_key": "k1", "partition_key": "conv_1",
            "attempt": attempt, "subturn_index": 0, "tool_name": "send_email",
            "occurrence": 0, "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
            "call_id": f"call_{attempt}", "token": token, "lease_ms": lease_ms,
            "policy": policy}


def test_a_resent_takeover_claim_still_names_the_vanished_attempt():
    clock = Clock()
    app = FastAPI()
    app.include_router(claims_router(MemoryLedger(),
                                     MemoryCheckpointStore(StoreOptions()),
                                     clock))
    http = TestClient(app)
    first = http.post("/v1/effects/claims",
                      json=_claim(1, uuid.uuid4().hex, "at_most_once", 100)).json()
    assert first["state"] == "CLAIMED"
    clock.now += 1_000  # attempt 1 vanished: its lease ran out with no outcome
    taker = uuid.uuid4().hex
    took = http.post("/v1/effects/claims",
                     json=_claim(2, taker, "at_least_once", 30_000)).json()
    assert (took["state"], took["previous_attempt"]) == ("CLAIMED", 1)
    # that answer was lost: the same call is repeated with the same token
    clock.now += 50
    again = http.post("/v1/effects/claims",
                      json=_claim(2, taker, "at_least_once", 30_000)).json()
    assert again["state"] == "CLAIMED"
    assert again["previous_attempt"] == took["previous_attempt"], (
        f"the repeated call answers previous_attempt={again['previous_attempt']!r}, the "
        f"lost answer said {took['previous_attempt']!r}")
