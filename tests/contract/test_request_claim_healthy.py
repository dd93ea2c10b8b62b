"""The request claims a healthy run writes are never read as damage, and a damaged one
gets the claims API's documented answer (session 52's second outside review).

``check_request_claim`` (session 52) refuses a request claim with a null response id or
partition cell; ``hold_request`` (a cancellation of a chain's first response) writes the
claim's digest cell empty on purpose. These are the healthy sequences that write and
read such rows, on both backends, both worker entries, cold workers (what they know
comes from the store), through the app as ``ratchet api`` serves the claims routes:

- an effect claimed (``mark_claim``), then the turn, its redelivery to a restarted
  worker, a retry under another response id (``DUPLICATE``), the claim again
  (``PROMOTED``): never ``CORRUPT``/500;
- a cancellation first, then a late effect (the empty-digest hold), then claims and
  turns of the request under its own and another response id: ``CANCELLED``, never ``CORRUPT``/500;
- a worker that stopped after claiming the request and the response id, before its
  batch: the restarted worker promotes the turn.

A damaged request claim met by the claims API is 500 ``CORRUPT_HISTORY``, not
retryable, and the routes' OpenAPI says so (it listed 503 as the only 5xx).
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

import pytest
from fastapi.testclient import TestClient

from ratchet.domain.plan import ResponseClaim
from ratchet.domain.promotion import promotion_request
from ratchet.samples import NOW_MS, TENANT, make_tool_effect, make_turn, make_turn_cancelled, new_id
from schemas.models import (
    Certification,
    CheckpointPromoted,
    PromotionRejected,
    RejectionReason,
)
from services.api.app import create_app
from services.api.claims import claims_router
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.test_claim_without_digest import (
    claim_only,
    cold,
    set_null,
)
from tests.contract.test_processor_handover import ENTRIES

R = RejectionReason


def chain_first(**kw):
    response_id = new_id("resp")
    return make_turn(conversation_id=None, chain_root_id=response_id,
                     expected_head_seq=None, response_id=response_id, **kw)


def api(store_and_ledger) -> TestClient:
    """The claims routes in the app, with its exception handlers."""
    store, ledger = store_and_ledger
    service = RehydrationService(store, ledger, PromotionWaiters())
    app = create_app(service, lambda: True,
                     routers=[claims_router(ledger, store, lambda: NOW_MS)])
    return TestClient(app, raise_server_exceptions=False)


def claim(http: TestClient, turn, occurrence: int = 0):
    """A claim of the request's first tool call, sent by the attempt ``turn``."""
    return http.post("/v1/effects/claims", json={
        "tenant_id": turn.tenant_id, "idempotency_key": turn.idempotency_key,
        "partition_key": turn.response_id, "response_id": turn.response_id,
        "attempt": 1, "subturn_index": 0, "tool_name": "send_email",
        "occurrence": occurrence, "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
        "call_id": "call_1", "token": uuid.uuid4().hex, "lease_ms": 30_000,
        "policy": "at_most_once"})


def state(answer) -> str:
    assert answer.status_code == 200, (answer.status_code, answer.text)
    return answer.json()["state"]


def never_corrupt(handled) -> object:
    out = handled.outbound[0].model
    assert not (isinstance(out, PromotionRejected) and out.reason is R.CORRUPT), out.detail
    return out


@ENTRIES
def test_an_effect_claimed_then_the_turn_retried_is_never_corrupt(store_and_ledger, entry):
    http = api(store_and_ledger)
    first = chain_first()
    assert state(claim(http, first)) == "CLAIMED"
    assert isinstance(never_corrupt(cold(store_and_ledger, entry).handle(first)), CheckpointPromoted)
    # Redelivered to a restarted worker: the same promotion, answered again.
    again = never_corrupt(cold(store_and_ledger, entry).handle(first))
    assert isinstance(again, CheckpointPromoted), again
    retry = chain_first(idempotency_key=first.idempotency_key,
                        request_digest=first.request_digest)
    assert state(claim(http, retry)) == "PROMOTED"
    answered = never_corrupt(cold(store_and_ledger, entry).handle(retry))
    assert isinstance(answered, PromotionRejected), answered  # a retry of a done request
    assert answered.reason is R.DUPLICATE, (answered.reason, answered.detail)
    assert answered.existing_response_id == first.response_id
    assert state(claim(http, first, occurrence=1)) == "PROMOTED"


@ENTRIES
def test_a_cancellation_first_holds_the_request_and_is_never_corrupt(store_and_ledger, entry):
    store, _ = store_and_ledger
    http = api(store_and_ledger)
    first = chain_first()
    worker = cold(store_and_ledger, entry)
    worker.handle(make_turn_cancelled(first))
    # A tool that ran past the cancellation: its effect settles the request, held by
    # this response (``_settle_request`` -> ``hold_request``, the empty digest).
    late = worker.handle(make_tool_effect(
        "call_late", idempotency_key=first.idempotency_key, conversation_id=None,
        chain_root_id=first.response_id, response_id=first.response_id))
    assert [o.model.reason.value for o in late.outbound] == ["TURN_CANCELLED"], late
    held = store._request_holder(TENANT, first.idempotency_key)
    assert held is not None and held.request_digest in ("", None)  # the hold's own row
    retry = chain_first(idempotency_key=first.idempotency_key,
                        request_digest=first.request_digest)
    for attempt in (first, retry):
        assert state(claim(http, attempt)) == "CANCELLED", attempt.response_id
    for attempt in (first, retry, first):  # the last: a restarted worker's redelivery
        out = never_corrupt(cold(store_and_ledger, entry).handle(attempt))
        assert isinstance(out, PromotionRejected), out
        assert out.reason is R.CANCELLED, (out.reason, out.detail)
        assert "None" not in out.detail, out.detail
    assert store.get_checkpoint(TENANT, first.response_id) is None
    assert store.get_checkpoint(TENANT, retry.response_id) is None


@ENTRIES
def test_a_worker_stopped_after_its_claims_is_promoted_on_restart(store_and_ledger, entry):
    store, _ = store_and_ledger
    first = chain_first()
    request = promotion_request(first, Certification.CERTIFIED)
    assert store._requests.request_held(request) is None  # the request's claim, taken
    mine = ResponseClaim.of(request)
    assert store.start_claiming(mine)() == mine  # the response id's, then it stopped
    out = never_corrupt(cold(store_and_ledger, entry).handle(first))
    assert isinstance(out, CheckpointPromoted), out


def test_a_damaged_request_claim_is_the_claims_apis_documented_500(store_and_ledger):
    store, _ = store_and_ledger
    first = chain_first()
    store.hold_request(TENANT, first.idempotency_key, first.response_id)
    if isinstance(store, CassandraCheckpointStore):
        store._session.execute(
            "UPDATE request_claims SET partition_key = null "
            "WHERE tenant_id = %s AND idempotency_key = %s",
            (TENANT, first.idempotency_key), timeout=30)
    else:
        key = (TENANT, first.idempotency_key)
        store._request_claims[key] = dataclasses.replace(store._request_claims[key],
                                                         partition_key=None)
    http = api(store_and_ledger)
    retry = chain_first(idempotency_key=first.idempotency_key,
                        request_digest=first.request_digest)
    answer = claim(http, retry)
    assert answer.status_code == 500, answer.text
    body = answer.json()
    assert body["error"] == "CORRUPT_HISTORY" and body["retryable"] is False, body
    assert "names no partition" in body["detail"], body
    documented = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/effects/claims", "/v1/effects/claims/{effect_id}/complete"):
        assert "500" in documented[path]["post"]["responses"], path


@pytest.mark.parametrize("nulls", [("partition_key",), ("partition_key", "idempotency_key")])
@ENTRIES
def test_a_conflict_with_a_claim_naming_no_partition_never_prints_none(
        store_and_ledger, entry, nulls):
    """A response id's claim whose partition cell (and key cell) reads null, met by a turn
    of another request (its key, or its digest, differs from an intact cell):
    ``ResponseClaimed`` by ``check_claim``, answered ``CONFLICT``. The answer named the
    null partition: "bound to request K in None" (the key's null was handled, the
    partition's was not), the same on both backends."""
    store, _ = store_and_ledger
    held = make_turn(conversation_id=new_id("conv"))
    claim_only(store, held)
    for cell in nulls:
        set_null(store, held.response_id, cell)
    other = make_turn(conversation_id=held.conversation_id, response_id=held.response_id)
    for attempt in ("first", "redelivery"):
        out = cold(store_and_ledger, entry).handle(other).outbound[0].model
        assert isinstance(out, PromotionRejected), (attempt, out)
        assert out.reason is R.CONFLICT, (attempt, out.reason, out.detail)
        assert "None" not in out.detail, (attempt, out.detail)
        assert out.existing_response_id == held.response_id
    # Nothing written (asked of the partition: Cassandra's lookup by the claim raises).
    assert not store._turn_row_serial(TENANT, held.conversation_id, other.response_id)
