"""Corruption written straight into Cassandra is caught on read with a typed failure."""

from __future__ import annotations

import asyncio

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from services.store.cassandra import CassandraCheckpointStore
from services.store.rows import decode_turn_items, encode_turn_items
from services.store.statements import HISTORY_FETCH_SIZE
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
    """The failure of a read, the same whether the rows are read blocking or by the
    event loop's reads (``read_history_async``, what the API runs)."""
    ids = {"conversation_id": conv} if rid is None else {"response_id": rid}
    result = store.read_history(tenant, **ids)
    assert isinstance(result, HistoryFailure), result
    awaited = asyncio.run(store.read_history_async(tenant, **ids))
    assert awaited == result
    return result.reason


def cql(session, statement, *params):
    session.execute(statement, params, timeout=30)


def rewrite_items(session, tenant, conv, rid, change):
    """Rewrite a turn row's ``items`` cell with ``change(list of item field lists)``.

    Items travel in their turn row (one blob of item records), so damage to one item
    is a rewrite of that cell with the one item altered, added or removed. Fields
    (``ITEM_RECORD_FIELDS``): item_seq, item_id, item_type, role, call_id, content,
    content_digest, format_version.
    """
    row = session.execute(
        f"SELECT items FROM turns {WHERE} AND kind = 'checkpoint' AND ref = %s",
        (tenant, conv, rid),
        timeout=30,
    ).one()
    items = [list(record) for record in decode_turn_items(row.items)]
    change(items)
    cql(
        session,
        f"UPDATE turns SET items = %s {WHERE} AND kind = 'checkpoint' AND ref = %s",
        encode_turn_items(items),
        tenant,
        conv,
        rid,
    )


ITEM_TYPE, CONTENT, CONTENT_DIGEST, FORMAT_VERSION = 2, 5, 6, 7


def set_field(position, field, value):
    def change(items):
        items[position][field] = value

    return change


def test_deleted_middle_item(store, store_session, conversation):
    tenant, conv, rids = conversation
    rewrite_items(store_session, tenant, conv, rids[1], lambda items: items.pop(1))
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY
    assert read_reason(store, tenant, conv, rids[2]) is R.MISSING_HISTORY
    assert isinstance(store.read_history(tenant, response_id=rids[0]), VerifiedHistory)


def test_flipped_content_byte(store, store_session, conversation):
    tenant, conv, rids = conversation

    def flip(items):
        flipped = bytearray(items[0][CONTENT])
        flipped[3] ^= 0x20
        items[0][CONTENT] = bytes(flipped)

    rewrite_items(store_session, tenant, conv, rids[0], flip)
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_unknown_item_type(store, store_session, conversation):
    tenant, conv, rids = conversation
    rewrite_items(store_session, tenant, conv, rids[2], set_field(1, ITEM_TYPE, "hologram"))
    assert read_reason(store, tenant, conv) is R.UNKNOWN_ITEM_TYPE


def test_inserted_extra_item(store, store_session, conversation):
    tenant, conv, rids = conversation

    def intrude(items):
        first = items[0]
        items.append(
            [6, "intruder", "hologram", None, None, first[CONTENT], first[CONTENT_DIGEST], 1]
        )

    rewrite_items(store_session, tenant, conv, rids[1], intrude)
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_bumped_format_version(store, store_session, conversation):
    tenant, conv, rids = conversation
    rewrite_items(store_session, tenant, conv, rids[1], set_field(2, FORMAT_VERSION, 2))
    assert read_reason(store, tenant, conv) is R.UNSUPPORTED_FORMAT


def test_broken_lineage_link(store, store_session, conversation):
    tenant, conv, rids = conversation
    update = (
        f"UPDATE turns SET parent_response_id = %s {WHERE} AND kind = 'checkpoint' AND ref = %s"
    )
    cql(store_session, update, rids[0], tenant, conv, rids[2])
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    cql(store_session, update, "resp_nowhere", tenant, conv, rids[2])
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY


def test_rewritten_lineage_digest(store, store_session, conversation):
    tenant, conv, rids = conversation
    row = store.read_turn(tenant, conv, rids[1]).checkpoints[rids[1]]
    assert row.lineage_digest is not None  # written by the promotion
    cql(
        store_session,
        f"UPDATE turns SET lineage_digest = %s {WHERE} AND kind = 'checkpoint' AND ref = %s",
        "0" * 64, tenant, conv, rids[1],
    )
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    assert read_reason(store, tenant, conv, rids[2]) is R.CORRUPT_HISTORY


def test_deleted_checkpoint(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"DELETE FROM turns {WHERE} AND kind = 'checkpoint' AND ref = %s",
        tenant,
        conv,
        rids[1],
    )
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY


def test_undecodable_rows(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"UPDATE turns SET mode = 'sideways' {WHERE} AND kind = 'checkpoint' AND ref = %s",
        tenant,
        conv,
        rids[0],
    )
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_nulled_content(store, store_session, conversation):
    tenant, conv, rids = conversation
    rewrite_items(store_session, tenant, conv, rids[2], set_field(0, CONTENT, None))
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_head_moved_without_a_checkpoint(store, store_session, conversation):
    tenant, conv, _ = conversation
    cql(store_session, f"UPDATE turns SET head_seq = 9 {WHERE}", tenant, conv)
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY


def test_promoting_onto_an_undecodable_head_row_is_corrupt_partition(
    store, store_session, conversation
):
    from services.store.base import CorruptPartition

    tenant, conv, rids = conversation
    cql(
        store_session,
        f"UPDATE turns SET mode = 'sideways' {WHERE} AND kind = 'checkpoint' AND ref = %s",
        tenant,
        conv,
        rids[2],
    )
    retry = conversation_turn(tenant, conv, 3, response_id=rids[2])
    with pytest.raises(CorruptPartition):
        store.promote(retry)


def test_deleted_items_cell(store, store_session, conversation):
    tenant, conv, rids = conversation
    cql(
        store_session,
        f"DELETE items FROM turns {WHERE} AND kind = 'checkpoint' AND ref = %s",
        tenant,
        conv,
        rids[1],
    )
    assert read_reason(store, tenant, conv) is R.MISSING_HISTORY
    assert isinstance(store.read_history(tenant, response_id=rids[0]), VerifiedHistory)


def test_flipped_byte_in_the_items_cell_framing(store, store_session, conversation):
    tenant, conv, rids = conversation
    row = store_session.execute(
        f"SELECT items FROM turns {WHERE} AND kind = 'checkpoint' AND ref = %s",
        (tenant, conv, rids[1]),
        timeout=30,
    ).one()
    damaged = bytearray(row.items)
    damaged[14] ^= 0x40  # inside the first record's item_id length
    update = f"UPDATE turns SET items = %s {WHERE} AND kind = 'checkpoint' AND ref = %s"
    cql(store_session, update, bytes(damaged), tenant, conv, rids[1])
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    cql(store_session, update, row.items + b"\x00", tenant, conv, rids[1])
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    assert isinstance(store.read_history(tenant, response_id=rids[0]), VerifiedHistory)


def test_async_reads_equal_blocking_reads_across_pages(store, conversation):
    """The event loop's reads collect every page (here two rows a page) and decode and
    verify exactly as the blocking ones."""
    tenant, conv, rids = conversation
    store.cql.select_partition.fetch_size = 2
    assert len(store._session.execute(store.cql.select_partition, (tenant, conv)).current_rows) == 2
    try:
        for ids in ({"conversation_id": conv}, {"response_id": rids[1]}):
            blocking = store.read_history(tenant, **ids)
            assert isinstance(blocking, VerifiedHistory)
            assert asyncio.run(store.read_history_async(tenant, **ids)) == blocking
    finally:
        store.cql.select_partition.fetch_size = HISTORY_FETCH_SIZE
    assert asyncio.run(store.read_turn_async(tenant, conv, rids[2])) == store.read_turn(
        tenant, conv, rids[2]
    )
    assert asyncio.run(store.locate_async(tenant, rids[0])) == conv
    assert asyncio.run(store.locate_async(tenant, uid("resp"))) is None
    assert asyncio.run(store.read_turn_async(tenant, conv, uid("resp"))) is None


# --- head cells their row does not back (found by an outside review, 2026-12-05) -------
# The head cells are a copy of the head turn's own values, written in its batch. The
# next turn's item seqs and lineage digest are built from them; reads answered such
# damage certified, and the worker built the next turn on it (every read corrupt after).


@pytest.mark.parametrize("cell, value", [("head_item_count", 2),
                                         ("head_lineage_digest", "00")])
def test_head_cells_unlike_their_row_are_corrupt_and_never_built_on(
    store, store_session, conversation, cell, value
):
    from services.store.base import CorruptPartition

    tenant, conv, rids = conversation
    cql(store_session, f"UPDATE turns SET {cell} = %s {WHERE}", value, tenant, conv)
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    for rid in rids:  # whichever turn is read: the head must be backed
        assert read_reason(store, tenant, conv, rid) is R.CORRUPT_HISTORY
    fresh = CassandraCheckpointStore(store_session, timeout_s=30)  # no hints: reads the view
    # The first one's hint is the true head; then each has read the damaged cells once,
    # and must not have kept them as its hint (a second outside review, session 31: the
    # next turn took the fast path, whose conditions are those cells, and was promoted).
    for promoter in (store, fresh, store, fresh):
        with pytest.raises(CorruptPartition):
            promoter.promote(conversation_turn(tenant, conv, 3))
    assert store.head(tenant, conv).seq == 3  # nothing was written


def test_a_lost_head_is_corrupt_and_the_conversation_is_not_begun_again(
    store, store_session, conversation
):
    """Head cells deleted (damage: they have no TTL) while the turns stand: not an
    unknown Conversation (a gateway told NOT_FOUND starts it again at expected 0), and
    a turn expecting 0 is refused by the head marker's ``IF NOT EXISTS``."""
    from services.store.base import CorruptPartition

    tenant, conv, rids = conversation
    cql(store_session, "DELETE head_seq, head_response_id, head_item_count, "
        f"head_lineage_digest, head_token FROM turns {WHERE}", tenant, conv)
    assert store.head(tenant, conv) is None
    assert read_reason(store, tenant, conv) is R.CORRUPT_HISTORY
    assert read_reason(store, tenant, conv, rids[2]) is R.CORRUPT_HISTORY
    with pytest.raises(CorruptPartition):
        store.promote(conversation_turn(tenant, conv, 0))
    rows = store_session.execute(
        f"SELECT ref FROM turns {WHERE} AND kind = 'checkpoint'", (tenant, conv), timeout=30
    )
    assert sorted(r.ref for r in rows) == sorted(rids)  # nothing was written


def test_a_damaged_boundary_proof_is_never_offered_for_reuse(store, store_session, conversation):
    """CONTRACT 1.5: the proof binds the artifact to the turn's fingerprint, with the
    artifact's counts. Damaged after promotion, the history is still served, as a
    ``NO_ARTIFACT`` fallback (it was served certified)."""
    from datetime import UTC, datetime

    from ratchet.domain.rehydration import Certified, FallbackReason, rehydrate

    tenant, conv, rids = conversation
    now = datetime.now(UTC)
    assert isinstance(rehydrate(store.read_history(tenant, response_id=rids[2]), "fp1", now),
                      Certified)
    row = f"{WHERE} AND kind = 'checkpoint' AND ref = %s"
    proof = store_session.execute(f"SELECT boundary_proof FROM turns {row}",
                                  (tenant, conv, rids[2]), timeout=30).one().boundary_proof
    for damaged in (proof.replace('"fp1"', '"fpX"'), proof.replace('"combined_count":42',
                                                                   '"combined_count":41')):
        assert damaged != proof
        cql(store_session, f"UPDATE turns SET boundary_proof = %s {row}", damaged, tenant,
            conv, rids[2])
        answer = rehydrate(store.read_history(tenant, response_id=rids[2]), "fp1", now)
        assert answer.reason is FallbackReason.NO_ARTIFACT and len(answer.items) == 7


def test_a_claim_naming_no_partition_is_damage_not_an_unclaimed_id(
    store, store_session, conversation
):
    """Every claim is written with its partition: one without is damage. Read as absent
    it made a promoted response ``NOT_FOUND`` (and its status ``unknown``, "wait")."""
    from services.store.base import CorruptPartition

    tenant, _, rids = conversation
    cql(store_session, "UPDATE response_claims SET partition_key = null "
        "WHERE tenant_id = %s AND response_id = %s", tenant, rids[1])
    fresh = CassandraCheckpointStore(store_session, timeout_s=30)  # no location hints
    with pytest.raises(CorruptPartition):
        fresh.locate(tenant, rids[1])
    with pytest.raises(CorruptPartition):
        asyncio.run(fresh.locate_async(tenant, rids[1]))
    with pytest.raises(CorruptPartition):
        fresh.read_checkpoint(tenant, rids[1])
    # A history read answers it typed, as damaged rows (session 51: it raised, and the
    # API answered a history request with the status endpoint's error shape).
    found = fresh.read_history(tenant, response_id=rids[1])
    assert isinstance(found, HistoryFailure), found
    assert found.reason is HistoryFailureReason.CORRUPT_HISTORY
    assert fresh.locate(tenant, rids[0])  # the others' claims are intact


@pytest.mark.parametrize("change", ["seq = 7", "lineage_digest = 'ab'", "last_item_seq = 9"])
def test_a_child_is_never_numbered_from_a_parent_row_changed_since(store, store_session,
                                                                   change):
    """A chain parent's row never changes once written. A promoter holding it verified
    (a hint) whose batch is refused because the row changed reads the view: it must
    not plan the child from the changed row (it promoted a child at seq 8 under a
    parent rewritten to seq 7, outside review, session 30)."""
    from ratchet.domain.plan import LineageChanged
    from tests.contract.store_support import chain_turn

    tenant, root = uid("tenant"), uid("resp")
    child = uid("resp")
    store.promote(chain_turn(tenant, root, root, None))
    store.promote(chain_turn(tenant, root, child, root))
    parent = store.read_checkpoint(tenant, child)
    cql(store_session, f"UPDATE turns SET {change} {WHERE} AND kind = 'checkpoint' "
        "AND ref = %s", tenant, root, child)
    grandchild = chain_turn(tenant, root, uid("resp"), child)
    fresh = CassandraCheckpointStore(store_session, timeout_s=30)
    for promoter in (store, fresh):  # the store's own hint, or only the caller's
        # The caller validated the turn against its copy of the parent (``extends``):
        # sent back to a verified read of the lineage, which reports the damage.
        assert promoter.promote(grandchild, parent_hint=parent,
                                extends=child) == LineageChanged(child)
    # that verified read fails (the processor's CORRUPT rejection)
    assert read_reason(fresh, tenant, root, child) in (R.CORRUPT_HISTORY, R.MISSING_HISTORY)
    rows = store_session.execute(f"SELECT ref FROM turns {WHERE} AND kind = 'checkpoint'",
                                 (tenant, root), timeout=30)
    assert sorted(r.ref for r in rows) == sorted([root, child])


def test_a_head_rolled_back_onto_an_earlier_turn_is_not_built_on_by_a_store_that_knew_it(
    store, store_session, conversation
):
    """The head cells rewritten with turn 2's own values while turn 3's row stands: the
    cells are backed by turn 2's row. A store that promoted turn 3 (its hint) planned
    the next turn at seq 3 from the view and promoted it beside the old seq 3 (a
    review, session 31); every read was corrupt after. Now a head behind the hint is
    ``CorruptPartition`` and nothing is written. (A store with no hint cannot tell:
    docs/store.md.)"""
    from services.store.base import CorruptPartition

    tenant, conv, rids = conversation
    second = store.read_history(tenant, response_id=rids[1]).checkpoint
    cql(store_session, "UPDATE turns SET head_seq = %s, head_response_id = %s, "
        f"head_item_count = %s, head_lineage_digest = %s {WHERE}", second.seq,
        second.response_id, second.last_item_seq, second.lineage_digest, tenant, conv)
    for expected in (2, 3):
        with pytest.raises(CorruptPartition, match="went back"):
            store.promote(conversation_turn(tenant, conv, expected))
    snapshot = store._load_partition(tenant, conv)
    assert sorted(c.seq for c in snapshot.checkpoints.values()) == [1, 2, 3]


def test_a_checkpoint_row_filed_under_another_response_id_is_damage(
    store, store_session, conversation
):
    """A checkpoint row whose ``response_id`` cell names another response than the row it
    is filed under is damage: the status endpoint's read raises ``CorruptPartition``
    (answered 500 ``CORRUPT_HISTORY``), never another response's checkpoint as this
    one's (a mutation review, session 43: no test held the check)."""
    from services.store.base import CorruptPartition

    tenant, conv, rids = conversation
    cql(store_session,
        f"UPDATE turns SET response_id = %s {WHERE} AND kind = 'checkpoint' AND ref = %s",
        rids[0], tenant, conv, rids[1])
    with pytest.raises(CorruptPartition):
        store.read_checkpoint(tenant, rids[1])
    assert store.read_checkpoint(tenant, rids[0]).response_id == rids[0]
