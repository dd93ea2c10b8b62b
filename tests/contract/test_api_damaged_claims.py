"""A response whose claim names no partition gets the HTTP API's documented answers.

A response id's claim (``response_claims``) says which partition its turn row is in. A
claim row naming no partition is damage (every claim is written with its partition):
the store raises ``CorruptPartition`` where it must ask the claim (Cassandra's
``_claimed_partition``; memory's ``DamagedClaims`` raises alike). Session 51 left the
API's answer to it open: a history read without the right partition hint came out of
the service as that exception, and the app's handler answered the status endpoint's
error shape, 500 ``{"error": "CORRUPT_HISTORY"}``, where a history endpoint promises
the typed failure body ``{"outcome": "failure", "reason": "CORRUPT_HISTORY", ...}``
(CONTRACT section 5; docs/gateway-protocol.md section 8, the table of outcomes).

What a gateway gets, on both backends, through the app (the routes, the fast path and
the exception handlers):

- the history endpoint, every way a lookup reaches the claim (no hint, with and without
  the cache, a wrong hint naming a cached partition, ``wait_ms`` > 0): 500, the typed
  failure body ``CORRUPT_HISTORY``; never ``INTERNAL``, never a
  history, nothing cached;
- a right hint needs no claim: the row is read and verified there, 200;
- the status endpoint: 500 ``{"error": "CORRUPT_HISTORY"}`` (its documented shape for
  damaged checkpoint cells), never ``unknown``.
"""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from ratchet.domain.history import HistoryFailure, HistoryFailureReason
from services.api.app import create_app
from services.api.cache import HistoryCache
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import conversation_turn, uid
from tests.contract.test_damaged_claim_reads import DamagedClaims

FP = "a" * 64  # any well-formed fingerprint (a fallback answers 200 too)


@pytest.fixture(params=["memory", "cassandra"])
def store(request):
    if request.param == "memory":
        return DamagedClaims()
    return CassandraCheckpointStore(request.getfixturevalue("store_session"), StoreOptions(),
                                    timeout_s=30)


def damage_claim(store, tenant: str, response_id: str) -> None:
    if isinstance(store, DamagedClaims):
        store.damaged.add(response_id)
        return
    store._session.execute(
        "UPDATE response_claims SET partition_key = null "
        "WHERE tenant_id = %s AND response_id = %s", (tenant, response_id), timeout=30)


@pytest.fixture(params=["cache", "no-cache-process"])
def api(request, store):
    """The app over ``store``: with the verified-history cache, or with it off."""
    cache = HistoryCache(1 << 20 if request.param == "cache" else 0)
    service = RehydrationService(store, MemoryLedger(), PromotionWaiters(), cache=cache)
    with TestClient(create_app(service, lambda: True), raise_server_exceptions=False) as client:
        client.service = service  # type: ignore[attr-defined]
        yield client


@pytest.fixture
def damaged(store):
    """A Conversation of two promoted turns, the last one's claim damaged; and another
    Conversation (intact) a wrong hint can name. (tenant, conversation, last, other)."""
    tenant, conv, other = uid("tenant"), uid("conv"), uid("conv")
    turns = [conversation_turn(tenant, conv, 0), conversation_turn(tenant, conv, 1)]
    elsewhere = conversation_turn(tenant, other, 0)
    for turn in (*turns, elsewhere):
        store.promote(turn)
    damage_claim(store, tenant, turns[-1].response_id)
    # The store learned where it promoted each response (its hints): an API process,
    # which promoted nothing, knows none, and asks the claim. Forgotten here.
    store._hints.__init__(store.options.hint_capacity)
    return tenant, conv, turns[-1].response_id, other, elsewhere.response_id


def history(api, tenant, response_id, **params):
    headers = params.pop("headers", {})
    return api.get(f"/v1/responses/{response_id}/history",
                   params={"tenant_id": tenant, "fingerprint_hash": FP, **params},
                   headers=headers)


def assert_typed_corrupt(answer) -> None:
    """The history endpoints' typed integrity failure (gateway-protocol.md section 8:
    ``response_id`` null, as for every integrity failure but one found rendering)."""
    assert answer.status_code == 500, answer.text
    body = answer.json()
    assert "error" not in body, body  # the error shape (status endpoint's, or INTERNAL)
    assert body["outcome"] == "failure" and body["reason"] == "CORRUPT_HISTORY", body
    assert body["items"] is None and body["head_seq"] is None and body["checkpoint"] is None
    assert body["response_id"] is None


@pytest.mark.parametrize("how", [
    {},                                        # the plain read: the claim says where
    {"headers": {"Cache-Control": "no-cache"}},  # the full read at once
    {"wait_ms": "200"},                        # a wait's lookups
])
def test_a_history_read_that_must_ask_a_damaged_claim_is_the_typed_failure(
        api, store, damaged, how):
    tenant, _, last, _, _ = damaged
    for attempt in ("first", "again"):  # nothing cached by the first
        assert_typed_corrupt(history(api, tenant, last, **dict(how)))
        cache = api.service._cache  # type: ignore[attr-defined]
        assert cache is None or cache.get(tenant, last) is None, attempt


def test_a_wrong_hint_naming_a_cached_partition_then_a_damaged_claim(api, store, damaged):
    tenant, _, last, other, elsewhere = damaged
    # The other Conversation's history cached: the hint's partition is extendable, so
    # the lookup reads the turn row there first, then asks the claim.
    assert history(api, tenant, elsewhere, partition_key=other).status_code == 200
    assert_typed_corrupt(history(api, tenant, last, partition_key=other))


def test_a_right_hint_reads_the_row_without_the_claim(api, store, damaged):
    tenant, conv, last, _, _ = damaged
    answer = history(api, tenant, last, partition_key=conv)
    assert answer.status_code == 200, answer.text
    assert answer.json()["response_id"] == last


def test_the_status_of_a_response_whose_claim_is_damaged(api, store, damaged):
    tenant, _, last, _, _ = damaged
    answer = api.get(f"/v1/responses/{last}/status", params={"tenant_id": tenant})
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"] == "CORRUPT_HISTORY", answer.json()


def test_the_store_answers_it_as_a_history_failure(store, damaged):
    """The store's own answer, both reads: ``HistoryFailure(CORRUPT_HISTORY)``, as for
    damaged rows, not the exception (which every caller had to catch)."""
    tenant, _, last, other, _ = damaged
    for hint in (None, other):  # no hint, a wrong one: both ask the claim
        answers = [
            store.read_history(tenant, response_id=last, partition_key=hint),
            asyncio.run(store.read_history_async(tenant, response_id=last,
                                                 partition_key=hint)),
        ]
        for found in answers:
            assert isinstance(found, HistoryFailure), found
            assert found.reason is HistoryFailureReason.CORRUPT_HISTORY, found
            assert "names no partition" in found.detail


def damage_request(store, tenant: str, conversation: str, response_id: str) -> None:
    """The response's turn row lost, and its claim naming its partition but no request
    (the key's cell null): whether it was promoted cannot be told (``turn_lost`` asks
    the request's idempotency record)."""
    if isinstance(store, DamagedClaims):
        partition = store._partitions[(tenant, conversation)]
        del partition.checkpoints[response_id], partition.items[response_id]
        store.keyless.add(response_id)
        return
    store._session.execute(
        "DELETE FROM turns WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s", (tenant, conversation, response_id), timeout=30)
    store._session.execute(
        "UPDATE response_claims SET idempotency_key = null "
        "WHERE tenant_id = %s AND response_id = %s", (tenant, response_id), timeout=30)


@pytest.fixture
def keyless(store):
    """A Conversation's first turn whose row is lost and whose claim names no request
    (tenant, conversation, that response, an intact second Conversation)."""
    tenant, conv, other = uid("tenant"), uid("conv"), uid("conv")
    lost = conversation_turn(tenant, conv, 0)
    for turn in (lost, conversation_turn(tenant, other, 0)):
        store.promote(turn)
    damage_request(store, tenant, conv, lost.response_id)
    store._hints.__init__(store.options.hint_capacity)
    return tenant, conv, lost.response_id, other


def test_a_claim_naming_no_request_is_a_history_failure_of_the_store(store, keyless):
    """Before: memory answered ``NOT_FOUND`` (never promoted: the promoted turn's loss
    hidden), Cassandra raised ``StoreUnavailable`` (the null key refused)."""
    tenant, conv, lost, other = keyless
    for hint in (None, conv, other):
        answers = [
            store.read_history(tenant, response_id=lost, partition_key=hint),
            asyncio.run(store.read_history_async(tenant, response_id=lost,
                                                 partition_key=hint)),
        ]
        for found in answers:
            assert isinstance(found, HistoryFailure), (hint, found)
            assert found.reason is HistoryFailureReason.CORRUPT_HISTORY, (hint, found)
            assert "names no request" in found.detail, (hint, found)


@pytest.mark.parametrize("how", [
    {},
    {"headers": {"Cache-Control": "no-cache"}},
    {"wait_ms": "200"},
    {"partition_key": "right"},
])
def test_a_claim_naming_no_request_is_the_typed_failure_over_http(api, store, keyless, how):
    tenant, conv, lost, _ = keyless
    how = dict(how)
    if how.get("partition_key") == "right":
        how["partition_key"] = conv
    for attempt in ("first", "again"):
        assert_typed_corrupt(history(api, tenant, lost, **how))
        cache = api.service._cache  # type: ignore[attr-defined]
        assert cache is None or cache.get(tenant, lost) is None, attempt


def test_the_status_of_a_response_whose_claim_names_no_request(api, store, keyless):
    """The status endpoint's shape for damage (was 503 ``UNAVAILABLE`` on Cassandra,
    ``unknown`` on memory)."""
    tenant, _, lost, _ = keyless
    answer = api.get(f"/v1/responses/{lost}/status", params={"tenant_id": tenant})
    assert answer.status_code == 500, answer.text
    assert answer.json()["error"] == "CORRUPT_HISTORY", answer.json()
