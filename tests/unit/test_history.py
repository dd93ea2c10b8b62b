"""History verification over frozen records: every broken rule has its typed reason."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ratchet.domain.history import (
    FIRST_MS,
    IGNORING_EXPIRY,
    LAST_MS,
    HistoryFailure,
    HistoryFailureReason,
    PartitionSnapshot,
    TurnItems,
    VerifiedHistory,
    lineage_refs,
    logically_expired,
    verify_conversation_history,
    verify_history,
)
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import T0, FakeClock, chain_turn, conversation_turn, uid

R = HistoryFailureReason


@pytest.fixture
def built():
    """A three-turn Conversation (2, 3, 2 items) and its snapshot."""
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock(), logical_retention_s=3600))
    tenant, conv = uid("tenant"), uid("conv")
    turns = [conversation_turn(tenant, conv, i, n_items=n) for i, n in enumerate((2, 3, 2))]
    for turn in turns:
        store.promote(turn)
    return turns, store._load_partition(tenant, conv)


def with_items(snapshot: PartitionSnapshot, response_id: str, entries) -> PartitionSnapshot:
    """``entries``: the turn's (item_seq, item) pairs, as stored."""
    items = TurnItems.of_entries(entries)
    return replace(snapshot, items={**snapshot.items, response_id: items})


def entries_of(snapshot: PartitionSnapshot, response_id: str) -> list:
    return snapshot.items[response_id].entries()


def with_checkpoint(snapshot: PartitionSnapshot, response_id: str, **changes):
    checkpoint = replace(snapshot.checkpoints[response_id], **changes)
    return replace(snapshot, checkpoints={**snapshot.checkpoints, response_id: checkpoint})


def reason_of(snapshot: PartitionSnapshot, response_id: str | None = None):
    if response_id is None:
        result = verify_conversation_history(snapshot, T0)
    else:
        result = verify_history(snapshot, response_id, T0)
    return result.reason if isinstance(result, HistoryFailure) else None


def edit_item(snapshot, response_id, position, **changes):
    entries = entries_of(snapshot, response_id)
    seq, item = entries[position]
    entries[position] = (seq, item.model_copy(update=changes))
    return with_items(snapshot, response_id, entries)


def test_intact_history_verifies(built):
    turns, snapshot = built
    result = verify_conversation_history(snapshot, T0)
    assert isinstance(result, VerifiedHistory)
    assert result.items == tuple(i for t in turns for i in t.items)
    assert [c.seq for c in result.lineage] == [1, 2, 3]


def test_unknown_response_and_foreign_tenant_are_not_found(built):
    turns, snapshot = built
    assert reason_of(snapshot, uid("resp")) is R.NOT_FOUND
    foreign = replace(snapshot, tenant_id=uid("tenant"))
    assert reason_of(foreign, turns[0].response_id) is R.NOT_FOUND


def test_expired(built):
    turns, snapshot = built
    last = snapshot.checkpoints[turns[2].response_id]
    later = last.logical_expires_at + timedelta(seconds=1)
    assert verify_history(snapshot, last.response_id, later).reason is R.EXPIRED


def test_expired_from_the_instant_of_its_expiry(built):
    """``logical_expires_at`` is the first instant the history is ``EXPIRED`` (as every
    other expiry: ``expires_at <= now``, and the API's cached hit, ``_expired_hit``), on
    the full read and on an extension alike. Found by a mutation review: ``>`` passed
    every test (the only expiry test read one second later)."""
    from ratchet.domain.history import verify_extension

    turns, snapshot = built
    tip, middle, last = (snapshot.checkpoints[t.response_id] for t in turns)
    at = last.logical_expires_at
    just_before = at - timedelta(milliseconds=1)
    assert verify_history(snapshot, last.response_id, at).reason is R.EXPIRED
    assert isinstance(verify_history(snapshot, last.response_id, just_before), VerifiedHistory)
    assert verify_extension(tip, [middle, last], snapshot, at).reason is R.EXPIRED
    assert not isinstance(verify_extension(tip, [middle, last], snapshot, just_before),
                          HistoryFailure)


@pytest.mark.parametrize("expires_ms", [FIRST_MS, -1, 0, 1, LAST_MS])
def test_a_read_ignoring_expiry_verifies_any_storable_expiry(built, expires_ms):
    """``IGNORING_EXPIRY`` (the processor's lineage reads: promotion ignores expiry) lies
    before every expiry a row can hold, ``FIRST_MS`` (year 1) included, on the full read
    and on an extension alike; any real instant at or past the expiry is ``EXPIRED``, one
    millisecond before it is not. An outside review, session 42: the processor read "as
    of" epoch 0, which an expiry at or before 1970 is past too."""
    from ratchet.domain.history import verify_extension

    turns, snapshot = built
    expires = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=expires_ms)
    tip, middle, last = (snapshot.checkpoints[t.response_id] for t in turns)
    snapshot = with_checkpoint(snapshot, last.response_id, logical_expires_at=expires)
    last = snapshot.checkpoints[last.response_id]
    assert not logically_expired(expires, IGNORING_EXPIRY)
    assert isinstance(verify_history(snapshot, last.response_id, IGNORING_EXPIRY),
                      VerifiedHistory)
    assert isinstance(verify_extension(tip, [middle, last], snapshot, IGNORING_EXPIRY), tuple)
    if expires_ms > FIRST_MS:  # (no clock reads year 1: that instant is IGNORING_EXPIRY)
        assert logically_expired(expires, expires)
        assert verify_history(snapshot, last.response_id, expires).reason is R.EXPIRED
        before = expires - timedelta(milliseconds=1)
        assert isinstance(verify_history(snapshot, last.response_id, before), VerifiedHistory)
        # A microsecond before its expiry is still the millisecond before it.
        assert not logically_expired(expires, expires - timedelta(microseconds=1))


def test_a_turn_whose_items_do_not_follow_its_parents_is_corrupt(built):
    """A turn's item range must start right after its parent's (no gap): a checkpoint
    shifted by one, its own items shifted with it (so the turn on its own is
    consistent), is ``CORRUPT_HISTORY`` on the full read and on an extension alike.
    Found by a mutation review: the extension's link check could be dropped with every
    test passing."""
    from ratchet.domain.history import verify_extension

    turns, snapshot = built
    tip, middle, last = (snapshot.checkpoints[t.response_id] for t in turns)
    rid = last.response_id
    shifted = with_checkpoint(snapshot, rid, first_item_seq=last.first_item_seq + 1,
                              last_item_seq=last.last_item_seq + 1)
    shifted = with_items(shifted, rid, [(seq + 1, item)
                                        for seq, item in entries_of(snapshot, rid)])
    assert reason_of(shifted, rid) is R.CORRUPT_HISTORY
    moved = shifted.checkpoints[rid]
    failure = verify_extension(tip, [middle, moved], shifted, T0)
    assert isinstance(failure, HistoryFailure) and failure.reason is R.CORRUPT_HISTORY


def test_a_lineage_whose_root_is_not_seq_one_is_corrupt():
    """Seqs step down by one to 1: a chain whose seqs are all shifted by one (each step
    intact) has a root at seq 2, ``CORRUPT_HISTORY``. Found by a mutation review: the
    root's seq could go unchecked with every test passing."""
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, root, child = uid("tenant"), uid("resp"), uid("resp")
    store.promote(chain_turn(tenant, root, root, None))
    store.promote(chain_turn(tenant, root, child, root))
    snapshot = store._load_partition(tenant, root)
    assert isinstance(verify_history(snapshot, child, T0), VerifiedHistory)
    for rid in (root, child):
        snapshot = with_checkpoint(snapshot, rid, seq=snapshot.checkpoints[rid].seq + 1)
    assert reason_of(snapshot, child) is R.CORRUPT_HISTORY


def test_missing_middle_item(built):
    turns, snapshot = built
    rid = turns[1].response_id
    entries = entries_of(snapshot, rid)
    assert reason_of(with_items(snapshot, rid, (entries[0], entries[2]))) is R.MISSING_HISTORY


def test_missing_turn(built):
    turns, snapshot = built
    checkpoints = dict(snapshot.checkpoints)
    del checkpoints[turns[1].response_id]
    assert reason_of(replace(snapshot, checkpoints=checkpoints)) is R.MISSING_HISTORY


def test_duplicated_item(built):
    turns, snapshot = built
    rid = turns[1].response_id
    entries = entries_of(snapshot, rid)
    assert reason_of(with_items(snapshot, rid, (*entries, entries[2]))) is R.CORRUPT_HISTORY


def test_renumbered_item(built):
    turns, snapshot = built
    rid = turns[1].response_id
    entries = entries_of(snapshot, rid)
    entries[1] = (entries[1][0] + 10, entries[1][1])
    assert reason_of(with_items(snapshot, rid, entries)) is R.CORRUPT_HISTORY


def test_items_swapped_between_turns(built):
    turns, snapshot = built
    a, b = turns[0].response_id, turns[2].response_id
    first, last = entries_of(snapshot, a), entries_of(snapshot, b)
    # Each turn gets the other's items, renumbered to fit its own item range.
    swapped = with_items(snapshot, a, [(1 + n, item) for n, (_, item) in enumerate(last)])
    first_b = swapped.checkpoints[b].first_item_seq
    swapped = with_items(swapped, b, [(first_b + n, item) for n, (_, item) in enumerate(first)])
    assert reason_of(swapped) is R.CORRUPT_HISTORY


def test_flipped_content_byte(built):
    turns, snapshot = built
    rid = turns[2].response_id
    content = bytearray(snapshot.items[rid].contents[0])
    content[2] ^= 0x01
    assert reason_of(edit_item(snapshot, rid, 0, content=bytes(content))) is R.CORRUPT_HISTORY


def test_unknown_item_type(built):
    turns, snapshot = built
    snapshot = edit_item(snapshot, turns[0].response_id, 1, type="hologram")
    assert reason_of(snapshot) is R.UNKNOWN_ITEM_TYPE


def test_unsupported_format_version(built):
    turns, snapshot = built
    snapshot = edit_item(snapshot, turns[1].response_id, 0, format_version=99)
    assert reason_of(snapshot) is R.UNSUPPORTED_FORMAT


def test_broken_lineage_link(built):
    turns, snapshot = built
    skip = with_checkpoint(snapshot, turns[2].response_id, parent_response_id=turns[0].response_id)
    assert reason_of(skip) is R.CORRUPT_HISTORY
    dangling = with_checkpoint(snapshot, turns[2].response_id, parent_response_id=uid("resp"))
    assert reason_of(dangling) is R.MISSING_HISTORY


def test_two_checkpoints_at_one_seq(built):
    turns, snapshot = built
    twin = replace(snapshot.checkpoints[turns[1].response_id], response_id=uid("resp"))
    doubled = replace(snapshot, checkpoints={**snapshot.checkpoints, twin.response_id: twin})
    assert reason_of(doubled) is R.CORRUPT_HISTORY
    assert "several checkpoints at seq [2]" in verify_conversation_history(doubled, T0).detail


def test_head_pointing_elsewhere(built):
    turns, snapshot = built
    behind = replace(snapshot, head=replace(snapshot.head, seq=2))
    assert reason_of(behind) is R.CORRUPT_HISTORY
    dangling = replace(snapshot, head=replace(snapshot.head, response_id=uid("resp")))
    assert reason_of(dangling) is R.CORRUPT_HISTORY


def test_undecodable_rows(built):
    turns, snapshot = built
    damaged = replace(snapshot, damaged=frozenset({turns[0].response_id}))
    assert reason_of(damaged) is R.CORRUPT_HISTORY


def test_chain_fork_reads_only_its_path():
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, root, a, b = uid("tenant"), uid("resp"), uid("resp"), uid("resp")
    for rid, parent in ((root, None), (a, root), (b, root)):
        store.promote(chain_turn(tenant, root, rid, parent))
    snapshot = store._load_partition(tenant, root)
    result = verify_history(snapshot, b, T0)
    assert [c.response_id for c in result.lineage] == [root, b]
    # Corrupting the other branch does not affect this one.
    broken = with_items(snapshot, a, ())
    assert isinstance(verify_history(broken, b, T0), VerifiedHistory)
    assert verify_history(broken, a, T0).reason is R.MISSING_HISTORY


def test_lineage_refs_follow_parents_newest_first_and_stop_where_verification_fails():
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, root, a, b, c = (uid("resp") for _ in range(5))
    for rid, parent in ((root, None), (a, root), (b, a), (c, root)):
        store.promote(chain_turn(tenant, root, rid, parent))
    snapshot = store._load_partition(tenant, root)
    assert lineage_refs(snapshot, b) == [b, a, root]
    assert lineage_refs(snapshot, c) == [c, root]
    assert lineage_refs(snapshot, uid("resp")) == []
    # A missing parent ends it, and so does one whose seq is not one less: the
    # response's read then loads those turns' items only, and verification says why.
    without_a = replace(snapshot, checkpoints={k: v for k, v in snapshot.checkpoints.items()
                                               if k != a})
    assert lineage_refs(without_a, b) == [b]
    assert verify_history(without_a, b, T0).reason is R.MISSING_HISTORY
    skewed = with_checkpoint(snapshot, a, seq=5)
    assert lineage_refs(skewed, b) == [b]
    assert verify_history(skewed, b, T0).reason is R.CORRUPT_HISTORY


# --- lineage digests (rule 7) ------------------------------------------------------------


def test_a_promoted_lineage_is_linked(built):
    turns, snapshot = built
    result = verify_history(snapshot, turns[-1].response_id, T0)
    assert isinstance(result, VerifiedHistory) and result.linked


def test_a_lineage_digest_that_does_not_chain_is_corrupt(built):
    turns, snapshot = built
    middle = turns[1].response_id
    damaged = with_checkpoint(snapshot, middle, lineage_digest="0" * 64)
    assert reason_of(damaged) is R.CORRUPT_HISTORY
    assert reason_of(damaged, turns[-1].response_id) is R.CORRUPT_HISTORY


def test_rows_without_lineage_digests_verify_unlinked(built):
    """Rows from before lineage digests: verified by every other rule, never linked.
    A digest over a parent without one cannot be checked: unlinked too."""
    turns, snapshot = built
    legacy = snapshot
    for turn in turns[:2]:
        legacy = with_checkpoint(legacy, turn.response_id, lineage_digest=None)
    result = verify_history(legacy, turns[-1].response_id, T0)
    assert isinstance(result, VerifiedHistory) and not result.linked
    assert len(result.items) == 7


def test_an_extension_is_verified_row_by_row_and_by_its_link(built):
    from ratchet.domain.history import verify_extension

    turns, snapshot = built
    tip, middle, last = (snapshot.checkpoints[t.response_id] for t in turns)
    loaded = verify_extension(tip, [middle, last], snapshot, T0)
    assert isinstance(loaded, tuple) and [len(turn) for turn in loaded] == [3, 2]
    assert loaded == (snapshot.items[middle.response_id], snapshot.items[last.response_id])
    broken = with_checkpoint(snapshot, last.response_id, lineage_digest="0" * 64)
    failure = verify_extension(tip, [middle, broken.checkpoints[last.response_id]], broken, T0)
    assert isinstance(failure, HistoryFailure) and failure.reason is R.CORRUPT_HISTORY
    damaged = edit_item(snapshot, last.response_id, 0, content=b'{"x":1}')
    failure = verify_extension(tip, [middle, last], damaged, T0)
    assert isinstance(failure, HistoryFailure) and failure.reason is R.CORRUPT_HISTORY
    # No digest: the extension cannot decide (None), the full read will.
    unlinked = replace(last, lineage_digest=None)
    assert verify_extension(tip, [middle, unlinked], snapshot, T0) is None
    # Not the tip's continuation: a skipped turn.
    failure = verify_extension(tip, [last], snapshot, T0)
    assert isinstance(failure, HistoryFailure)
