"""The gateway library sends a completion whose call failed again on the next ``run``.

Promise (docs/gateway-protocol.md section 8: "A claim call or completion that timed out
may be re-sent with the same token"; docs/service.md section 3: ``run`` records the
outcome, ``RehydrationUnavailable`` is retryable, and a completion that did not get
through is sent again by the next ``run``; a listed claimed effect must be completed,
else MISSING_TOOL_EFFECT). The completion is answered 503 once: the retried ``run``
re-sends it (same token) without running the tool again, and the claim is completed
(found by an outside review: the retry returned the output and the claim stayed
without an outcome for good).
"""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.samples import NOW_MS
from services.api.claims import claims_router
from services.gateway.claims import EffectClaims
from services.gateway.errors import RehydrationUnavailable
from services.gateway.events import TurnIdentity
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore

CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "send_email",
        "arguments": "{}"}


def test_a_retried_run_records_the_outcome_whose_completion_failed():
    ledger = MemoryLedger()
    app = FastAPI()
    app.include_router(claims_router(ledger,
                                     MemoryCheckpointStore(StoreOptions()).mark_request_facts,
                                     lambda: NOW_MS))
    server = TestClient(app)
    failures = {"complete": 1}  # the first completion is answered 503 (lost)

    def forward(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/complete") and failures["complete"]:
            failures["complete"] -= 1
            return httpx.Response(503, json={"error": "UNAVAILABLE", "retryable": True})
        answer = server.post(request.url.path, content=request.content,
                             headers={"content-type": "application/json"})
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"content-type": "application/json"})

    identity = TurnIdentity(tenant_id="t1", response_id="r1", conversation_id="conv_1",
                            expected_head_seq=0)
    claims = EffectClaims("http://claims.test", identity, idempotency_key="k1", attempt=1,
                          transport=httpx.MockTransport(forward))
    runs: list[int] = []
    with claims.effect(CALL, subturn_index=0) as effect:
        try:
            effect.run(lambda: runs.append(1) or "sent")
        except RehydrationUnavailable:
            pass  # retryable: the gateway retries the same effect
        else:
            raise AssertionError("the lost completion should have been reported")
        output = effect.run(lambda: runs.append(1) or "sent")
    assert len(runs) == 1 and output is not None  # not executed twice: fine
    recorded = ledger.claim("t1", "k1", effect.effect_id)
    assert recorded is not None and recorded.completed, (
        "run returned the output after a retry, but the claim has no recorded outcome: "
        "the completion was never re-sent")
