"""Damage that lands on a claim row between the claim's write and the check that
follows it (session 52's outside review left it untested), on both backends.

Two claims are written before a promotion: the response id's (``response_claims``,
``start_claiming`` / ``_claim``) and, for a chain's first response, its request's
(``request_claims``, ``request_held`` / ``_claim_request``). Each is an ``INSERT ... IF
NOT EXISTS`` whose answer is the holder: applied, it is the claim as written (whole),
never read back; not applied, the row it found; unknown, a SERIAL read of the row.
The claims API writes an effect claim between two ``mark_claim`` calls, each of which
reads a chain's first request's claim.

- The response id's claim damaged after its LWT applied: the write goes on with the
  LWT's answer (the row was whole when this request bound the id: CONTRACT 4, the same
  request "goes on") and the turn is promoted; the damage is met by later readers
  (a redelivery is answered from the partition's view; a lookup by id of a claim
  naming no partition raises ``CorruptPartition``).
- An unknown outcome settled by a SERIAL read that finds the row damaged (Cassandra;
  memory's claim has no unknown outcome): the response id's claim, ``CorruptPartition``
  (``check_claim``: every intact cell agrees, it may be the turn's own); the request's,
  ``CorruptPartition`` (``check_request_claim``). Nothing written.
- The claims API: a request claim damaged between the effect claim's write and the
  second mark is the documented 500 ``CORRUPT_HISTORY`` (not retryable); the effect
  claim stays written, and the same claim sent again is the same 500.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

import pytest
from fastapi.testclient import TestClient

from ratchet.domain.plan import CorruptPartition, ResponseClaim
from ratchet.domain.promotion import promotion_request
from ratchet.samples import NOW_MS, TENANT, make_turn, new_id
from schemas.models import Certification
from services.api.app import create_app
from services.api.claims import claims_router
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.test_claim_without_digest import cold, set_null
from tests.contract.test_processor_handover import ENTRIES
from tests.integration.flaky_session import cas_timeout

RESPONSE_CELLS = pytest.mark.parametrize(
    "cell", ["request_digest", "idempotency_key", "partition_key"])
REQUEST_CELLS = pytest.mark.parametrize("cell", ["response_id", "partition_key"])


def damage_after_lwt(store, cell: str):
    """``store.start_claiming`` and ``claim_async`` (the two entries' claims) whose
    claim row gets ``cell`` null right after its LWT answered, before the holder
    reaches ``promote``."""
    taking, taking_async = store.start_claiming, store.claim_async
    taken = []

    def start_claiming(claim: ResponseClaim):
        holder = taking(claim)()
        set_null(store, claim.response_id, cell)
        taken.append(holder)
        return lambda: holder

    async def claim_async(claim: ResponseClaim):
        holder = await taking_async(claim)
        set_null(store, claim.response_id, cell)
        taken.append(holder)
        return holder
    store.start_claiming, store.claim_async = start_claiming, claim_async
    return taken


@RESPONSE_CELLS
@ENTRIES
def test_a_claim_damaged_after_its_own_lwt_is_promoted_and_read_as_damage_later(
        store_and_ledger, entry, cell):
    store, _ = store_and_ledger
    turn = make_turn(conversation_id=new_id("conv"))
    worker = cold(store_and_ledger, entry)
    taken = damage_after_lwt(store, cell)
    first = worker.handle(turn)
    assert taken and taken[0] == ResponseClaim(  # its own LWT applied, then the damage
        TENANT, turn.response_id, turn.conversation_id, turn.idempotency_key,
        turn.request_digest), taken
    assert first.kind == "promoted", first
    del store.start_claiming, store.claim_async  # the damage stays; claims as ever
    again = cold(store_and_ledger, entry).handle(turn)  # its redelivery: the view answers
    assert again.kind == "promoted", again
    assert again.outbound[0].model.seq == first.outbound[0].model.seq
    if cell == "partition_key":  # where the response lives cannot be told
        with pytest.raises(CorruptPartition, match="names no partition"):
            store.get_checkpoint(TENANT, turn.response_id)
    else:
        assert store.get_checkpoint(TENANT, turn.response_id).partition_key == (
            turn.conversation_id)


class LostAnswer:
    """A driver session whose next ``statement`` lands, then its row is damaged, then
    its answer is lost (a CAS timeout: outcome unknown, settled by a SERIAL read)."""

    def __init__(self, session, statement, damage) -> None:
        self._session, self._statement, self._damage = session, statement, damage

    def __getattr__(self, name):
        return getattr(self._session, name)

    def execute(self, statement, *args, **kwargs):
        answer = self._session.execute(statement, *args, **kwargs)
        if statement is self._statement:
            self._statement = None
            self._damage()
            raise cas_timeout()
        return answer


@pytest.fixture
def cassandra_store_and_ledger(ledger_session):
    """The Cassandra pair alone: memory's claims have no unknown outcome (its LWT answers
    always arrive), so these cases are Cassandra's only, not skipped on memory."""
    from services.ledger.cassandra import CassandraLedger

    return (CassandraCheckpointStore(ledger_session, StoreOptions(), timeout_s=30),
            CassandraLedger(ledger_session, timeout_s=30))


@RESPONSE_CELLS
def test_an_unknown_claim_settled_on_its_damaged_row_is_corrupt(cassandra_store_and_ledger, cell):
    store, _ = cassandra_store_and_ledger
    turn = make_turn(conversation_id=new_id("conv"))
    session = store._session
    store._session = LostAnswer(session, store.cql.insert_claim,
                                lambda: set_null(store, turn.response_id, cell))
    try:
        with pytest.raises(CorruptPartition, match="names no "):
            store.promote(promotion_request(turn, Certification.CERTIFIED))
    finally:
        store._session = session
    assert not store._turn_row_serial(TENANT, turn.conversation_id, turn.response_id)


def null_request_cell(store, idempotency_key: str, cell: str) -> None:
    if isinstance(store, CassandraCheckpointStore):
        store._session.execute(
            f"UPDATE request_claims SET {cell} = null "
            "WHERE tenant_id = %s AND idempotency_key = %s",
            (TENANT, idempotency_key), timeout=30)
        return
    key = (TENANT, idempotency_key)
    claims = store._request_claims
    claims[key] = dataclasses.replace(claims[key], **{cell: None})


def chain_first(**kw):
    response_id = new_id("resp")
    return make_turn(conversation_id=None, chain_root_id=response_id,
                     expected_head_seq=None, response_id=response_id, **kw)


@REQUEST_CELLS
def test_an_unknown_request_claim_settled_on_its_damaged_row_is_corrupt(
        cassandra_store_and_ledger, cell):
    store, _ = cassandra_store_and_ledger
    turn = chain_first()
    session = store._session
    store._session = LostAnswer(session, store.cql.insert_request_claim,
                                lambda: null_request_cell(store, turn.idempotency_key, cell))
    try:
        with pytest.raises(CorruptPartition, match="names no "):
            store.promote(promotion_request(turn, Certification.CERTIFIED))
    finally:
        store._session = session
    assert not store._turn_row_serial(TENANT, turn.response_id, turn.response_id)


class DamagingLedger:
    """The ledger, whose effect claim's write is followed by the request claim's damage
    (before the claims API's second ``mark_claim``)."""

    def __init__(self, ledger, damage) -> None:
        self._ledger, self._damage = ledger, damage

    def __getattr__(self, name):
        return getattr(self._ledger, name)

    def claim_effect(self, *args, **kwargs):
        answer = self._ledger.claim_effect(*args, **kwargs)
        self._damage()
        return answer


@REQUEST_CELLS
def test_a_request_claim_damaged_between_the_effect_claim_and_its_second_mark_is_500(
        store_and_ledger, cell):
    store, ledger = store_and_ledger
    first = chain_first()
    store.hold_request(TENANT, first.idempotency_key, first.response_id)
    retry = chain_first(idempotency_key=first.idempotency_key,
                        request_digest=first.request_digest)
    damaging = DamagingLedger(ledger, lambda: null_request_cell(
        store, first.idempotency_key, cell))
    app = create_app(RehydrationService(store, ledger, PromotionWaiters()), lambda: True,
                     routers=[claims_router(damaging, store, lambda: NOW_MS)])
    http = TestClient(app, raise_server_exceptions=False)
    body = {"tenant_id": TENANT, "idempotency_key": retry.idempotency_key,
            "partition_key": retry.response_id, "response_id": retry.response_id,
            "attempt": 1, "subturn_index": 0, "tool_name": "send_email", "occurrence": 0,
            "arguments_digest": hashlib.sha256(b"{}").hexdigest(), "call_id": "call_1",
            "token": uuid.uuid4().hex, "lease_ms": 30_000, "policy": "at_most_once"}
    for attempt in ("first", "the same claim again"):
        answer = http.post("/v1/effects/claims", json=body)
        assert answer.status_code == 500, (attempt, answer.status_code, answer.text)
        out = answer.json()
        assert out["error"] == "CORRUPT_HISTORY" and out["retryable"] is False, (attempt, out)
        assert "names no" in out["detail"], (attempt, out)
    # The effect claim stays written (by this token; nobody was told to run the tool).
    written = ledger.claims_for(TENANT, retry.idempotency_key)
    assert [c.token for c in written] == [body["token"]], written
