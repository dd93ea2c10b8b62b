"""A damaged checkpoint row gets a typed answer from every read of it, and harms no
other read (real Cassandra).

- GET /v1/responses/{id}/status answers 500 ``{"error": "CORRUPT_HISTORY"}``, as the
  response's history does: never "unknown" (which tells a gateway to wait for a
  decision that was made), never an untyped 500 or a retryable 503 for damage that
  stays (docs/gateway-protocol.md section 8, "Status body").
- A timestamp cell past year 9999 (only damage writes one: every writer keeps years
  1-9999) is a damaged row like any other. It used to fail cassandra-driver's decode of
  the whole response, which closes the connection: the damaged read answered 503
  retryable and, for a moment, so did every other tenant's read and /healthz.

(Found by an outside review of the HTTP surface, 2026-12-04.)
"""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from ratchet.domain.history import HistoryFailure, HistoryFailureReason
from services.api.app import create_app
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.ledger.memory import MemoryLedger
from services.store.base import CorruptPartition
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import conversation_turn, uid

pytestmark = pytest.mark.integration

YEAR_11476_MS = 300_000_000_000_000
# A token artifact whose expiry, taken to UTC, passes the calendar's edge.
EDGE_ARTIFACT = (
    '{"artifact_id":"a","expires_at":"9999-12-31T23:00:00-05:00","fingerprint_hash":"f",'
    '"safe_append_boundary":1,"token_count":1,"token_hash":"h"}'
)


@pytest.fixture
def store(store_session):
    return CassandraCheckpointStore(store_session, timeout_s=30)


@pytest.fixture
def api(store):
    service = RehydrationService(store, MemoryLedger(), PromotionWaiters())
    return TestClient(create_app(service, lambda: True), raise_server_exceptions=False)


def promoted_pair(store):
    """Two promoted first turns of two tenants: (damaged one, healthy one)."""
    turns = [conversation_turn(uid("tenant"), uid("conv"), 0) for _ in range(2)]
    for turn in turns:
        store.promote(turn)
    return turns


def damage(session, turn, column: str, value) -> None:
    session.execute(
        f"UPDATE turns SET {column} = %s WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s",
        (value, turn.tenant_id, turn.partition_key, turn.response_id), timeout=30)


def status(api, turn):
    return api.get(f"/v1/responses/{turn.response_id}/status",
                   params={"tenant_id": turn.tenant_id})


@pytest.mark.parametrize("column,value", [
    ("promoted_at", YEAR_11476_MS),
    ("logical_expires_at", YEAR_11476_MS),
    ("artifact_expires_at", YEAR_11476_MS),  # read by the worker's view, not decoded
    ("mode", "bogus"),
    ("token_artifact", EDGE_ARTIFACT),
])
def test_status_of_a_damaged_row_is_corrupt_history_and_others_are_unharmed(
        store, store_session, api, column, value):
    damaged, healthy = promoted_pair(store)
    damage(store_session, damaged, column, value)
    answer = status(api, damaged)
    if column == "artifact_expires_at":  # a copy no read decodes: the row stands
        assert answer.json()["state"] == "promoted", answer.text
    else:
        assert answer.status_code == 500, answer.text
        body = answer.json()
        assert body["error"] == "CORRUPT_HISTORY" and body["retryable"] is False
        assert damaged.response_id in body["detail"]
    # The same connection serves the next reads: another tenant's status, readiness.
    assert status(api, healthy).json() == {
        "response_id": healthy.response_id, "state": "promoted", "reason": None, "seq": 1,
        "existing_response_id": None}
    assert api.get("/healthz").status_code == 200


@pytest.mark.parametrize("column", ["promoted_at", "logical_expires_at"])
def test_a_timestamp_past_the_calendar_is_a_damaged_row_on_every_read(
        store, store_session, column):
    damaged, healthy = promoted_pair(store)
    damage(store_session, damaged, column, YEAR_11476_MS)
    with pytest.raises(CorruptPartition, match="outside years 1-9999"):
        store.read_checkpoint(damaged.tenant_id, damaged.response_id)
    # A lookup too (it read the row as absent until session 49: a bound id's damage
    # then got the ordering's answer where the write says CORRUPT).
    with pytest.raises(CorruptPartition, match="outside years 1-9999"):
        store.get_checkpoint(damaged.tenant_id, damaged.response_id)
    for read in (lambda **ids: store.read_history(damaged.tenant_id, **ids),
                 lambda **ids: asyncio.run(store.read_history_async(damaged.tenant_id, **ids))):
        result = read(response_id=damaged.response_id)
        assert isinstance(result, HistoryFailure), result
        assert result.reason is HistoryFailureReason.CORRUPT_HISTORY
    assert store.get_checkpoint(healthy.tenant_id, healthy.response_id).seq == 1


def test_a_promoted_turn_whose_row_is_deleted_is_missing_history_on_every_endpoint(
        store, store_session, api):
    """Rows never expire (docs/store.md): a promoted turn's row that is gone is data
    loss, 500 ``MISSING_HISTORY`` on /status and on its history (``wait_ms`` too: no
    notice will come for a decision made long ago), never ``unknown`` / ``NOT_FOUND``
    (the damage chaos phase, session 41). A response id claimed and never promoted keeps
    ``unknown`` / ``NOT_FOUND``."""
    from ratchet.domain.plan import ResponseClaim  # noqa: PLC0415

    lost, healthy = promoted_pair(store)
    store_session.execute(
        "DELETE FROM turns WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'checkpoint' AND ref = %s",
        (lost.tenant_id, lost.partition_key, lost.response_id), timeout=30)
    answer = status(api, lost)
    assert answer.status_code == 500, answer.text
    body = answer.json()
    assert set(body) == {"error", "detail", "retryable"}
    assert (body["error"], body["retryable"]) == ("MISSING_HISTORY", False)
    assert lost.response_id in body["detail"]
    for params in ({}, {"partition_key": lost.partition_key}, {"wait_ms": 3000}):
        answer = api.get(f"/v1/responses/{lost.response_id}/history",
                         params={"tenant_id": lost.tenant_id,
                                 "fingerprint_hash": "f" * 64, **params})
        assert (answer.status_code, answer.json()["reason"]) == (500, "MISSING_HISTORY"), (
            params, answer.text)

    never = ResponseClaim(healthy.tenant_id, uid("resp"), healthy.partition_key, uid("key"),
                          "d" * 64)
    assert store.start_claiming(never)() == never
    assert status(api, healthy).json()["state"] == "promoted"
    assert api.get(f"/v1/responses/{never.response_id}/status",
                   params={"tenant_id": never.tenant_id}).json()["state"] == "unknown"
    answer = api.get(f"/v1/responses/{never.response_id}/history",
                     params={"tenant_id": never.tenant_id,
                             "fingerprint_hash": "f" * 64})
    assert (answer.status_code, answer.json()["reason"]) == (404, "NOT_FOUND")
