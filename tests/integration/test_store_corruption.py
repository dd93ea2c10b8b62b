"""Corruption written straight into Cassandra is caught on read with a typed failure."""

from __future__ import annotations

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import conversation_turn, uid

pytestmark = pytest.mark.integration
R = HistoryFailureReason
WHERE = "WHERE tenant_id = %s AND partition_key = %s"


@pytest.fixture
def store(store_session):
    return CassandraCheckpointStore(store_session, timeout_s=30)


@pytest.fixture
def conversation(store):
    """Three promoted turns of 2, 3 and 2 items; returns (tenant, conv, response ids)."""
    tenant, conv = uid("tenant"), uid("conv")
    turns = [conversation_turn(tenant, conv, i, n_items=n) for i, n in enumerate((2, 3, 2))]
    for turn in turns:
        store.promote(turn)
    assert isinstance(store.read_history(tenant, conversation_id=conv), VerifiedHistory)
    return tenant, conv, [t.response_id for t in turns]


def read_reason(store, tenant, conv, rid=None):
    result = (
        store.read_history(tenant, conversation_id=conv)
        if rid is None
        else store.read_history(tenant, response_id=rid)
    )
    assert isinstance(result, HistoryFailure), result
    return result.reason


def cql(session, statement, *params):
    session.execute(statement, params, timeout=30)


def test_deleted_middle_item(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"DELETE FROM histories {WHERE} AND kind = 'item' AND ref = %s AND pos = 1",
        tenant,
        conv,
        rids[1],
    )
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY
    assert read_reason(store, tenant, conv, rids[2]) is R.MISSING_HISTORY
    assert isinstance(store.read_history(tenant, response_id=rids[0]), VerifiedHistory)


def test_flipped_content_byte(store, store_session, conversation):
    tenant, conv, rids = conversation
    row = store_session.execute(
        f"SELECT content FROM histories {WHERE} AND kind = 'item' AND ref = %s AND pos = 0",
        (tenant, conv, rids[0]),
    ).one()
    flipped = bytearray(row.content)
    flipped[3] ^= 0x20
    cql(
        store_session,
        f"UPDATE histories SET content = %s {WHERE} AND kind = 'item' AND ref = %s AND pos = 0",
        bytes(flipped),
        tenant,
        conv,
        rids[0],
    )
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_unknown_item_type(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"UPDATE histories SET item_type = 'hologram' {WHERE} AND kind = 'item' "
        "AND ref = %s AND pos = 1",
        tenant,
        conv,
        rids[2],
    )
    assert read_reason(store, tenant, conv) is R.UNKNOWN_ITEM_TYPE


def test_inserted_extra_item(store, store_session, conversation):
    tenant, conv, rids = conversation
    first = store_session.execute(
        f"SELECT item_id, content, content_digest FROM histories {WHERE} AND kind = 'item' "
        "AND ref = %s AND pos = 0",
        (tenant, conv, rids[1]),
    ).one()
    cql(
        store_session,
        "INSERT INTO histories (tenant_id, partition_key, kind, ref, pos, item_seq, "
        "item_id, item_type, content, content_digest, format_version) "
        "VALUES (%s, %s, 'item', %s, 3, 6, %s, 'hologram', %s, %s, 1)",
        tenant,
        conv,
        rids[1],
        "intruder",
        first.content,
        first.content_digest,
    )
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_bumped_format_version(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"UPDATE histories SET format_version = 2 {WHERE} AND kind = 'item' "
        "AND ref = %s AND pos = 2",
        tenant,
        conv,
        rids[1],
    )
    assert read_reason(store, tenant, conv) is R.UNSUPPORTED_FORMAT


def test_broken_lineage_link(store, store_session, conversation):
    tenant, conv, rids = conversation
    update = (
        f"UPDATE histories SET parent_response_id = %s {WHERE} AND kind = 'checkpoint' "
        "AND ref = %s AND pos = 0"
    )
    cql(store_session, update, rids[0], tenant, conv, rids[2])
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    cql(store_session, update, "resp_nowhere", tenant, conv, rids[2])
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY


def test_deleted_checkpoint(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"DELETE FROM histories {WHERE} AND kind = 'checkpoint' AND ref = %s AND pos = 0",
        tenant,
        conv,
        rids[1],
    )
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY


def test_undecodable_rows(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"UPDATE histories SET mode = 'sideways' {WHERE} AND kind = 'checkpoint' "
        "AND ref = %s AND pos = 0",
        tenant,
        conv,
        rids[0],
    )
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_nulled_content(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"DELETE content FROM histories {WHERE} AND kind = 'item' AND ref = %s AND pos = 0",
        tenant,
        conv,
        rids[2],
    )
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_head_moved_without_a_checkpoint(store, store_session, conversation):
    tenant, conv, _ = conversation
    cql(store_session, f"UPDATE histories SET head_seq = 9 {WHERE}", tenant, conv)
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_promoting_onto_an_undecodable_head_row_is_corrupt_partition(
    store, store_session, conversation
):
    from services.store.base import CorruptPartition

    tenant, conv, rids = conversation
    cql(
        store_session,
        f"UPDATE histories SET mode = 'sideways' {WHERE} AND kind = 'checkpoint' "
        "AND ref = %s AND pos = 0",
        tenant,
        conv,
        rids[2],
    )
    retry = conversation_turn(tenant, conv, 3, response_id=rids[2])
    with pytest.raises(CorruptPartition):
        store.promote(retry)
