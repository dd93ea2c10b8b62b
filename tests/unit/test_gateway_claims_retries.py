"""The gateway library's retries of a claimed effect (services/gateway/claims.py).

Promises (docs/gateway-protocol.md section 8: "A claim call or completion that timed
out may be re-sent with the same token"; ``occurrence`` is "the n-th call of
``tool_name`` in this subturn, from 0, in model output order"; docs/service.md section
3: ``RehydrationUnavailable`` and ``StillInProgress`` are retryable, a completion that
did not get through is sent again by the next ``run``, and the same call entered again
is the same effect). Both were found by an outside review: a retried ``run`` returned
the output and left the claim without an outcome for good; entering ``claims.effect``
again counted a new occurrence, a new key, CLAIMED beside the live holder.
"""

from __future__ import annotations

import uuid

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.samples import NOW_MS
from services.api.claims import claims_router
from services.gateway.claims import EffectClaims, StillInProgress
from services.gateway.errors import RehydrationUnavailable
from services.gateway.events import TurnIdentity, arguments_digest_of
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore

CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "send_email",
        "arguments": "{\"to\": \"bob\"}"}


def _claims(ledger: MemoryLedger, attempt: int, *, lost_completions: int = 0,
            max_wait_s: float = 60.0,
            policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE) -> EffectClaims:
    """An attempt's claims against the real claims API on ``ledger`` (in process); its
    first ``lost_completions`` completions are answered 503."""
    app = FastAPI()
    app.include_router(claims_router(
        ledger, MemoryCheckpointStore(StoreOptions()), lambda: NOW_MS))
    server = TestClient(app)
    lost = [lost_completions]

    def forward(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/complete") and lost[0]:
            lost[0] -= 1
            return httpx.Response(503, json={"error": "UNAVAILABLE", "retryable": True})
        answer = server.post(request.url.path, content=request.content,
                             headers={"content-type": "application/json"})
        return httpx.Response(answer.status_code, content=answer.content,
                              headers={"content-type": "application/json"})

    identity = TurnIdentity(tenant_id="t1", response_id=f"r{attempt}",
                            conversation_id="conv_1", expected_head_seq=0)
    return EffectClaims("http://claims.test", identity, idempotency_key="k1",
                        attempt=attempt, max_wait_s=max_wait_s, default_policy=policy,
                        transport=httpx.MockTransport(forward))


def test_a_retried_run_sends_the_lost_completion_again():
    ledger = MemoryLedger()
    claims = _claims(ledger, 1, lost_completions=1)
    runs: list[int] = []
    with claims.effect(CALL, subturn_index=0) as effect:
        try:
            effect.run(lambda: runs.append(1) or "sent")
        except RehydrationUnavailable:
            pass  # retryable: the gateway retries the same effect
        else:
            raise AssertionError("the lost completion should have been reported")
        assert effect.output is None  # not the effect's output before it is recorded
        output = effect.run(lambda: runs.append(1) or "sent")
    assert len(runs) == 1 and output is not None  # the tool ran once
    recorded = ledger.claim("t1", "k1", effect.effect_id)
    assert recorded is not None and recorded.completed, "the completion was never re-sent"
    assert recorded.output == output


def test_a_call_entered_again_keeps_its_effect_key_and_never_runs_beside_the_holder():
    ledger = MemoryLedger()
    # attempt 1 holds the subturn's only send_email call (live lease, still running)
    held = effect_id_for_claim("k1", 0, "send_email", 0)
    ledger.claim_effect(ClaimRequest("t1", "k1", held, 1, 0, "c0", "send_email",
                                     arguments_digest_of(CALL), uuid.uuid4().hex, 600_000,
                                     EffectPolicy.AT_MOST_ONCE), NOW_MS)
    claims = _claims(ledger, 2, max_wait_s=0.0)
    sent: list[str] = []
    entered = []
    for _ in range(2):  # StillInProgress is retryable: the gateway retries the call
        try:
            with claims.effect(CALL, subturn_index=0) as effect:
                entered.append(effect)
                effect.run(lambda: sent.append("mail") or "ok")
        except StillInProgress:
            continue
    assert [e.effect_id for e in entered] == [held, held]
    assert entered[0] is entered[1]  # one effect: its occurrence, key and token
    assert sent == [], "the e-mail was sent while attempt 1's claim on it was live"


def test_an_effect_says_which_vanished_attempt_it_took_over():
    """docs/gateway-protocol.md section 8, rule 7: under ``at_least_once`` a claim whose
    holder's lease expired is taken over (``CLAIMED``, ``previous_attempt``); the tool
    may then have run twice, which a gateway wants to log. A first claim names none."""
    ledger = MemoryLedger()
    held = effect_id_for_claim("k1", 0, "send_email", 0)
    # attempt 1 claimed and vanished: its lease ended before NOW_MS
    ledger.claim_effect(ClaimRequest("t1", "k1", held, 1, 0, "c0", "send_email",
                                     arguments_digest_of(CALL), uuid.uuid4().hex, 100,
                                     EffectPolicy.AT_LEAST_ONCE), NOW_MS - 1_000)
    claims = _claims(ledger, 2, policy=EffectPolicy.AT_LEAST_ONCE)
    with claims.effect(CALL, subturn_index=0) as effect:
        effect.run(lambda: "sent again")
    assert (effect.state, effect.executed, effect.previous_attempt) == ("CLAIMED", True, 1)

    fresh = _claims(MemoryLedger(), 1)
    with fresh.effect(CALL, subturn_index=0) as first:
        first.run(lambda: "sent")
    assert (first.state, first.previous_attempt) == ("CLAIMED", None)


def test_a_claim_of_a_promoted_request_is_never_run():
    """PROMOTED (docs/gateway-protocol.md section 8): another attempt's turn stands
    promoted; the library raises ``RequestPromoted`` naming it and never runs the tool."""
    from ratchet.samples import make_turn
    from services.gateway.claims import RequestPromoted
    from tests.unit.test_processor_rules import Harness

    h = Harness()
    promoted = make_turn(tenant_id="t1", conversation_id="conv_1", idempotency_key="k1")
    h.processor.handle(h.record(promoted))
    app = FastAPI()
    app.include_router(claims_router(h.ledger, h.store, lambda: NOW_MS))
    server = TestClient(app)

    def forward(request: httpx.Request) -> httpx.Response:
        answer = server.post(request.url.path, content=request.content,
                             headers={"content-type": "application/json"})
        return httpx.Response(answer.status_code, content=answer.content)

    identity = TurnIdentity(tenant_id="t1", response_id="r2", conversation_id="conv_1",
                            expected_head_seq=0)
    claims = EffectClaims("http://claims.test", identity, idempotency_key="k1", attempt=2,
                          transport=httpx.MockTransport(forward))
    runs: list[int] = []
    with claims.effect(CALL, subturn_index=0) as effect:
        try:
            effect.run(lambda: runs.append(1) or "sent")
        except RequestPromoted as exc:
            assert (exc.response_id, exc.request_digest) == (promoted.response_id,
                                                             promoted.request_digest)
        else:
            raise AssertionError("a claim of a promoted request was run")
    assert runs == []
