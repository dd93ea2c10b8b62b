"""A chain's first request's claim (``request_claims``) with a null response id or
partition cell is damage: a retry of the request meeting it is answered ``CORRUPT``,
and the store's reads of it raise ``CorruptPartition``, on both backends.

Such a claim names the response (and its partition) that holds a chain's first request;
a retry under another response id reads that response's partition
(``RequestFacts.request_held``). Until session 52's outside review the row was trusted
as read: memory answered ``RequestHeld`` by response ``None`` and the worker waited for
that response's decision without end (``StoreUnavailable``, retried); Cassandra sent the
null key in its view read, which Cassandra refused (``StoreUnavailable``, retried without
end too). The partition stalled on a row nobody can check, and the backends disagreed.
"""

from __future__ import annotations

import dataclasses

import pytest

from ratchet.domain.plan import CorruptPartition
from ratchet.domain.promotion import promotion_request
from ratchet.samples import TENANT, make_turn, new_id
from schemas.models import Certification, PromotionRejected, RejectionReason
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.test_claim_without_digest import cold
from tests.contract.test_processor_handover import ENTRIES

CELLS = pytest.mark.parametrize("cell", ["response_id", "partition_key"])


def chain_first(**kw):
    """A chain's first response: its own partition (and Kafka key)."""
    response_id = new_id("resp")
    return make_turn(conversation_id=None, chain_root_id=response_id,
                     expected_head_seq=None, response_id=response_id, **kw)


def held_and_damaged(store, cell: str):
    """A first response that claimed its request but never wrote (a stopped worker),
    then its request claim's ``cell`` read null; and a retry of it under another id."""
    first = chain_first()
    store.hold_request(TENANT, first.idempotency_key, first.response_id)
    if isinstance(store, CassandraCheckpointStore):
        store._session.execute(
            f"UPDATE request_claims SET {cell} = null "
            "WHERE tenant_id = %s AND idempotency_key = %s",
            (TENANT, first.idempotency_key), timeout=30)
    else:
        claims = store._request_claims
        key = (TENANT, first.idempotency_key)
        claims[key] = dataclasses.replace(claims[key], **{cell: None})
    retry = chain_first(idempotency_key=first.idempotency_key,
                        request_digest=first.request_digest)
    return first, retry


@CELLS
@ENTRIES
def test_a_retry_meeting_a_damaged_request_claim_is_corrupt(store_and_ledger, entry, cell):
    store, _ = store_and_ledger
    _, retry = held_and_damaged(store, cell)
    for attempt in ("first", "redelivery"):
        handled = cold(store_and_ledger, entry).handle(retry)
        assert handled.kind == "rejected", (attempt, handled)
        out = handled.outbound[0].model
        assert isinstance(out, PromotionRejected), (attempt, out)
        assert out.reason is RejectionReason.CORRUPT, (attempt, out.reason, out.detail)
        assert "names no" in out.detail, (attempt, out.detail)
    assert store.get_checkpoint(TENANT, retry.response_id) is None


@CELLS
def test_the_stores_reads_of_a_damaged_request_claim_raise(store_and_ledger, cell):
    """The write, the request's lookups and its hold (a cancellation's): each one
    ``CorruptPartition``, never a holder named ``None`` nor a null key sent."""
    store, _ = store_and_ledger
    first, retry = held_and_damaged(store, cell)
    request = promotion_request(retry, Certification.CERTIFIED)
    reads = {
        "promote": lambda: store.promote(request),
        "promoted_request": lambda: store.promoted_request(request),
        "promoted_key": lambda: store.promoted_key(
            TENANT, retry.response_id, retry.idempotency_key, retry.response_id,
            first_of_chain=True),
        "hold_request": lambda: store.hold_request(TENANT, retry.idempotency_key,
                                                   retry.response_id),
        "mark_claim": lambda: store.mark_claim(TENANT, retry.response_id,
                                               retry.idempotency_key, first_of_chain=True),
    }
    for name, read in reads.items():
        with pytest.raises(CorruptPartition, match="names no"):
            read()
            pytest.fail(name)
    assert not store._turn_row_serial(TENANT, retry.response_id, retry.response_id)
