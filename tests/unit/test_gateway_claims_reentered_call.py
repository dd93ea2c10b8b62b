"""The gateway library keeps a call's effect key when the call is entered again.

Promise (docs/gateway-protocol.md section 8: ``occurrence`` is "the n-th call of
``tool_name`` in this subturn, from 0, in model output order"; docs/service.md:
concurrent attempts never both get CLAIMED while a lease is live, StillInProgress is
retryable, and the same call entered again is the same effect). Attempt 2 retries the
subturn's only send_email call, held live by attempt 1, by entering ``claims.effect``
again: it keeps occurrence 0 and its key, and the e-mail is not sent (found by an
outside review: the second entry counted occurrence 1, a new key, CLAIMED and sent).
"""

from __future__ import annotations

import hashlib
import uuid

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.samples import NOW_MS
from services.api.claims import claims_router
from services.gateway.claims import EffectClaims, StillInProgress
from services.gateway.events import TurnIdentity, arguments_digest_of
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore

CALL = {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "send_email",
        "arguments": "{\"to\": \"bob\"}"}


def test_a_retried_call_keeps_its_effect_key_and_does_not_run_beside_the_holder():
    ledger = MemoryLedger()
    app = FastAPI()
    app.include_router(claims_router(ledger,
                                     MemoryCheckpointStore(StoreOptions()).mark_request_facts,
                                     lambda: NOW_MS))
    server = TestClient(app)

    def forward(request: httpx.Request) -> httpx.Response:
        answer = server.post(request.url.path, content=request.content,
                             headers={"content-type": "application/json"})
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"content-type": "application/json"})

    # attempt 1 holds the subturn's only send_email call (live lease, still running)
    held = effect_id_for_claim("k1", 0, "send_email", 0)
    ledger.claim_effect(ClaimRequest("t1", "k1", held, 1, 0, "c1", "send_email",
                                     arguments_digest_of(CALL), uuid.uuid4().hex, 600_000,
                                     EffectPolicy.AT_MOST_ONCE), NOW_MS)
    identity = TurnIdentity(tenant_id="t1", response_id="r2", conversation_id="conv_1",
                            expected_head_seq=0)
    claims = EffectClaims("http://claims.test", identity, idempotency_key="k1", attempt=2,
                          max_wait_s=0.0, transport=httpx.MockTransport(forward))
    sent: list[str] = []
    for _ in range(2):  # StillInProgress is retryable: the gateway retries the call
        try:
            with claims.effect(CALL, subturn_index=0) as effect:
                effect.run(lambda: sent.append(hashlib.sha256(b"mail").hexdigest()) or "ok")
        except StillInProgress:
            continue
    assert effect.effect_id == held, (
        f"the retried call was keyed {effect.effect_id} (occurrence {effect.occurrence}), "
        f"not {held}: it is the 0th send_email call of subturn 0")
    assert sent == [], "the e-mail was sent while attempt 1's claim on it was live"
