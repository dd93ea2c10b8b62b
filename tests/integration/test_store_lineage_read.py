"""A response's read loads its lineage's items, not its partition's (an outside review,
session 34: a 3-turn response beside 12 forks of 8 MB read all 96 MB, 0.9 s).

On real Cassandra, blocking and awaited. A partition is read whole until the store
finds it WIDE (the turns outside a lineage it read are many, or hold many bytes); then
a response's read takes the structure of the whole partition (every checkpoint, the
head: the rules check it all) and the items of the lineage only. What each read
returned is recorded at the store's own row boundary (``_rows`` / ``_rows_async``)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from services.store import cassandra
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import chain_turn, conversation_turn, item, uid

pytestmark = pytest.mark.integration
WHERE = "WHERE tenant_id = %s AND partition_key = %s"
KB = 1024


class Recorded:
    """Every row query of a store, with the rows it returned (blocking and awaited)."""

    def __init__(self, store: CassandraCheckpointStore) -> None:
        self.store = store
        self.reads: list[tuple[Any, tuple[Any, ...], list[Any]]] = []
        rows, rows_async = store._rows, store._rows_async

        def recorded(statement: Any, params: tuple[Any, ...]) -> list[Any]:
            answer = rows(statement, params)
            self.reads.append((statement, params, answer))
            return answer

        async def recorded_async(operation: str, statement: Any,
                                 params: tuple[Any, ...]) -> list[Any]:
            answer = await rows_async(operation, statement, params)
            self.reads.append((statement, params, answer))
            return answer

        store._rows = recorded  # type: ignore[method-assign]
        store._rows_async = recorded_async  # type: ignore[method-assign]

    def read(self, tenant: str, awaited: bool, **ids: str) -> Any:
        self.reads.clear()
        if awaited:
            return asyncio.run(self.store.read_history_async(tenant, **ids))
        return self.store.read_history(tenant, **ids)

    def items_read(self) -> list[str]:
        """The response ids whose items cells came back, in all reads."""
        return sorted(row[0] for statement, _, rows in self.reads
                      if statement in (self.store.cql.select_items_of,
                                       self.store.cql.select_all_items)
                      for row in rows)

    def statements(self) -> list[Any]:
        return [statement for statement, _, _ in self.reads]


@pytest.fixture
def recorded(store_session):
    return Recorded(CassandraCheckpointStore(store_session, timeout_s=30))


@pytest.fixture
def forks(store_session):
    """A chain root with six forks of two turns; each fork's first turn holds 256 KiB
    of items. Returns (tenant, root, {fork's last response: its lineage})."""
    tenant, root = uid("tenant"), uid("root")
    promoter = CassandraCheckpointStore(store_session, timeout_s=30)
    promoter.promote(chain_turn(tenant, root, root, None))
    lineages = {}
    for n in range(6):
        first, second = uid("a"), uid("b")
        heavy = dataclasses.replace(
            chain_turn(tenant, root, first, root),
            items=tuple(item(f"fork{n}", role="assistant", size=64 * KB) for _ in range(4)))
        promoter.promote(heavy)
        promoter.promote(chain_turn(tenant, root, second, first))
        lineages[second] = [root, first, second]
    return tenant, root, lineages


def whole_read(recorded: Recorded) -> bool:
    return recorded.statements() == [recorded.store.cql.select_partition]


def lineage_read(recorded: Recorded, items: Any) -> bool:
    return recorded.statements() == [recorded.store.cql.select_structure, items]


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_fork_is_read_without_its_siblings_items(recorded, forks, awaited):
    tenant, root, lineages = forks
    for n, (response_id, lineage) in enumerate(lineages.items()):
        history = recorded.read(tenant, awaited, response_id=response_id, partition_key=root)
        assert isinstance(history, VerifiedHistory), history
        assert [c.response_id for c in history.lineage] == lineage
        assert len(history.items) == 2 + 4 + 2
        if n == 0:  # the whole partition, in one query: 5 other forks of 256 KiB
            assert whole_read(recorded)
            continue
        assert lineage_read(recorded, recorded.store.cql.select_items_of)
        assert recorded.items_read() == sorted(lineage)  # 3 of the partition's 13 turns


def promote_chain(store: CassandraCheckpointStore, tenant: str, root: str,
                  turns: int) -> list[str]:
    """A chain of ``turns`` without forks from ``root``: its response ids, root first."""
    ids = [root] + [uid("r") for _ in range(turns - 1)]
    for previous, response_id in zip([None, *ids], ids, strict=False):
        store.promote(chain_turn(tenant, root, response_id, previous))
    return ids


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_narrow_partition_is_read_whole_in_one_query(recorded, awaited):
    tenant, root, fork = uid("tenant"), uid("root"), uid("f")
    ids = promote_chain(recorded.store, tenant, root, 5)
    recorded.store.promote(chain_turn(tenant, root, fork, root))
    for _ in range(2):
        for wanted, turns in ((ids[-1], 5), (fork, 2), (ids[1], 2)):
            history = recorded.read(tenant, awaited, response_id=wanted, partition_key=root)
            assert isinstance(history, VerifiedHistory) and len(history.lineage) == turns
            assert whole_read(recorded)


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_lineage_that_is_most_of_a_wide_partition_takes_one_slice(recorded, awaited):
    tenant, root, heavy = uid("tenant"), uid("root"), uid("heavy")
    ids = promote_chain(recorded.store, tenant, root, 5)
    recorded.store.promote(dataclasses.replace(
        chain_turn(tenant, root, heavy, root),
        items=(item("heavy", role="assistant", size=300 * KB),)))
    for n in range(2):
        history = recorded.read(tenant, awaited, response_id=ids[-1], partition_key=root)
        assert isinstance(history, VerifiedHistory), history
        assert [c.response_id for c in history.lineage] == ids
        if n == 0:
            assert whole_read(recorded)  # and the heavy fork makes it wide
        else:
            assert lineage_read(recorded, recorded.store.cql.select_all_items)
            assert recorded.items_read() == sorted([*ids, heavy])  # decoded: ids only


@pytest.fixture
def conversation(recorded, monkeypatch):
    """Ten promoted turns of one Conversation, read once through turn 2, which makes
    the partition wide here (``_WIDE_ITEM_BYTES`` lowered from 256 KiB to 256 bytes:
    the rule is the same, with fewer bytes to promote): (tenant, conv, response ids)."""
    monkeypatch.setattr(cassandra, "_WIDE_ITEM_BYTES", 256)
    tenant, conv = uid("tenant"), uid("conv")
    turns = [conversation_turn(tenant, conv, seq) for seq in range(10)]
    for turn in turns:
        recorded.store.promote(turn)
    rids = [t.response_id for t in turns]
    assert isinstance(recorded.read(tenant, False, response_id=rids[1], partition_key=conv),
                      VerifiedHistory)
    assert whole_read(recorded)
    return tenant, conv, rids


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_an_early_turn_of_a_conversation_reads_its_own_lineage_only(recorded, conversation,
                                                                    awaited):
    tenant, conv, rids = conversation
    history = recorded.read(tenant, awaited, response_id=rids[1], partition_key=conv)
    assert isinstance(history, VerifiedHistory), history
    assert [c.response_id for c in history.lineage] == rids[:2]
    assert history.head_seq == 10
    assert lineage_read(recorded, recorded.store.cql.select_items_of)
    assert recorded.items_read() == sorted(rids[:2])
    # The whole Conversation is still read whole, in one query.
    whole = recorded.read(tenant, awaited, conversation_id=conv)
    assert isinstance(whole, VerifiedHistory) and whole.head_seq == 10
    assert whole_read(recorded)


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_the_whole_partition_is_still_checked_for_an_early_turn(recorded, store_session,
                                                                conversation, awaited):
    """The structure read covers every row: a head rolled back onto turn 5 (later
    rows still standing) is CORRUPT_HISTORY for a read of turn 2 too, as before."""
    tenant, conv, rids = conversation
    fifth = recorded.store.read_history(tenant, conversation_id=conv).lineage[4]
    store_session.execute(
        f"UPDATE turns SET head_seq = %s, head_response_id = %s, head_item_count = %s, "
        f"head_lineage_digest = %s {WHERE}",
        (fifth.seq, fifth.response_id, fifth.last_item_seq, fifth.lineage_digest, tenant,
         conv), timeout=30)
    result = recorded.read(tenant, awaited, response_id=rids[1], partition_key=conv)
    assert isinstance(result, HistoryFailure), result
    assert result.reason is HistoryFailureReason.CORRUPT_HISTORY
    assert "beyond the head" in result.detail
    assert recorded.statements()[:2] == [recorded.store.cql.select_structure,
                                         recorded.store.cql.select_items_of]


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_damaged_items_fail_their_lineage_only(recorded, store_session, forks, awaited):
    tenant, root, lineages = forks
    (damaged_end, damaged_lineage), (other_end, _) = list(lineages.items())[:2]
    recorded.read(tenant, awaited, response_id=other_end, partition_key=root)  # now wide
    store_session.execute(
        f"UPDATE turns SET items = %s {WHERE} AND kind = 'checkpoint' AND ref = %s",
        (b"\x07 not an items cell", tenant, root, damaged_lineage[1]), timeout=30)
    result = recorded.read(tenant, awaited, response_id=damaged_end, partition_key=root)
    assert isinstance(result, HistoryFailure), result
    assert result.reason is HistoryFailureReason.CORRUPT_HISTORY
    assert lineage_read(recorded, recorded.store.cql.select_items_of) is False  # read twice
    assert recorded.statements()[:2] == [recorded.store.cql.select_structure,
                                         recorded.store.cql.select_items_of]
    assert isinstance(recorded.read(tenant, awaited, response_id=other_end, partition_key=root),
                      VerifiedHistory)
    assert lineage_read(recorded, recorded.store.cql.select_items_of)


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_wrong_partition_hint_reads_no_items_of_a_wide_partition(recorded, forks, awaited):
    """An id that is not in the partition its caller names (a wrong hint, a turn not
    promoted yet): the first read of the partition is whole, and finds it wide (every
    turn is outside the lineage asked for); after that the structure says "not here"
    and no turn's items are read (an outside review, session 36: 33 ms and 36 ms of
    Cassandra CPU per such 404 beside an 8 MB Conversation)."""
    tenant, root, _ = forks
    for n in range(3):
        result = recorded.read(tenant, awaited, response_id=uid("elsewhere"),
                               partition_key=root)
        assert isinstance(result, HistoryFailure), result
        assert result.reason is HistoryFailureReason.NOT_FOUND
        statements = recorded.statements()
        assert (recorded.store.cql.select_partition in statements) is (n == 0)
        if n:
            assert recorded.store.cql.select_structure in statements
            assert recorded.items_read() == []


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_chain_asked_for_as_a_conversation_reads_no_items_again(recorded, forks, awaited):
    """A chain's root id on the Conversation endpoint (an outside review, session 36:
    each such 404 read the chain whole). The first read is whole and finds turns but no
    Conversation; after it the structure alone answers NOT_FOUND again."""
    tenant, root, _ = forks
    for n in range(3):
        result = recorded.read(tenant, awaited, conversation_id=root)
        assert isinstance(result, HistoryFailure), result
        assert result.reason is HistoryFailureReason.NOT_FOUND
        assert recorded.statements() == ([recorded.store.cql.select_partition] if n == 0
                                         else [recorded.store.cql.select_structure])


@pytest.mark.parametrize("awaited", [False, True], ids=["blocking", "event loop"])
def test_a_conversation_found_where_none_was_is_read_whole(recorded, store_session, awaited):
    """The structure says a Conversation is there after all (its id is also a chain's
    root id, and a turn of it was promoted since): the whole read decides, as always,
    on the event loop's reads (the API's) too (a mutation review, session 43: only the
    blocking read was held to it)."""
    tenant, shared = uid("tenant"), uid("shared")
    recorded.store.promote(chain_turn(tenant, shared, shared, None))
    assert recorded.read(tenant, awaited, conversation_id=shared).reason is (
        HistoryFailureReason.NOT_FOUND)
    turn = conversation_turn(tenant, shared, 0)
    recorded.store.promote(turn)
    history = recorded.read(tenant, awaited, conversation_id=shared)
    assert isinstance(history, VerifiedHistory), history
    assert history.checkpoint.response_id == turn.response_id
    assert recorded.statements() == [recorded.store.cql.select_structure,
                                     recorded.store.cql.select_partition]


def test_many_turns_of_small_items_stay_one_query(recorded):
    """Wide is a matter of bytes, not of turns (an outside review, session 36: counted
    by turns, 70 turns of small items became two queries for every response read,
    2.25 -> 2.77 ms): an early turn of a 70-turn Conversation, then its head, one
    whole read each."""
    tenant, conv = uid("tenant"), uid("conv")
    turns = [conversation_turn(tenant, conv, seq) for seq in range(70)]
    for turn in turns:
        recorded.store.promote(turn)
    for wanted in (turns[2], turns[-1], turns[2]):
        history = recorded.read(tenant, False, response_id=wanted.response_id,
                                partition_key=conv)
        assert isinstance(history, VerifiedHistory) and history.head_seq == 70
        assert whole_read(recorded)
