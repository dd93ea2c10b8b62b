"""The one-LWT fast path on a real Cassandra: what is sent, and what a refusal leaves.

``CountingSession`` wraps a real session and records every conditional batch (and
whether Cassandra applied it) and every SERIAL read, so the tests can say how many
Paxos rounds a promotion cost and prove that a refused batch wrote nothing.
"""

from __future__ import annotations

import dataclasses

import pytest
from cassandra import ConsistencyLevel
from cassandra.query import BatchStatement

from ratchet.domain.history import Head, VerifiedHistory
from ratchet.domain.plan import AheadOfHead, Conflict, Duplicate, KeyReused, ParentMissing, Promoted
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import chain_turn, conversation_turn, uid

pytestmark = pytest.mark.integration

SERIAL = (ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL)


class CountingSession:
    """Delegates to a real session; records batches (with [applied]) and SERIAL reads."""

    def __init__(self, real) -> None:
        self._real = real
        self.batches: list[bool] = []
        self.serial_reads = 0
        # every other statement: its CQL and the consistency it was prepared with
        self.statements: list[tuple[str, int | None]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def execute(self, statement, *args, **kwargs):
        result = self._real.execute(statement, *args, **kwargs)
        if isinstance(statement, BatchStatement):
            self.batches.append(bool(result.was_applied))
        else:
            self.statements.append((getattr(statement, "query_string", str(statement)),
                                    getattr(statement, "consistency_level", None)))
            if self.statements[-1][1] in SERIAL:
                self.serial_reads += 1
        return result

    def reset(self) -> None:
        self.batches.clear()
        self.serial_reads = 0
        self.statements.clear()

    def reads(self, fragment: str = "") -> list[int | None]:
        """The consistency of each SELECT since ``reset`` whose CQL holds ``fragment``."""
        return [cl for cql, cl in self.statements
                if cql.lstrip().upper().startswith("SELECT") and fragment in cql]


@pytest.fixture
def counted(store_session):
    session = CountingSession(store_session)
    return session, CassandraCheckpointStore(session, timeout_s=30)


@pytest.fixture
def healthy(store_session):
    # Hints off: every answer of this store comes from a read, never from memory.
    return CassandraCheckpointStore(store_session, StoreOptions(hint_capacity=0), timeout_s=30)


def rows_of(session, tenant, partition, response_id):
    """The turn row a promotion of ``response_id`` would have written (checkpoint + items)."""
    return list(
        session.execute(
            "SELECT kind, ref, items FROM turns WHERE tenant_id = %s AND partition_key = %s "
            "AND kind = 'checkpoint' AND ref = %s",
            (tenant, partition, response_id),
            timeout=30,
        )
    )


def idempotency_row(session, tenant, partition, key):
    return session.execute(
        "SELECT response_id FROM turns WHERE tenant_id = %s AND partition_key = %s "
        "AND kind = 'idempotency' AND ref = %s",
        (tenant, partition, key),
        timeout=30,
    ).one()


def test_a_conversation_promotes_with_one_lwt_per_turn(counted, healthy):
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    for seq in range(5):
        session.reset()
        outcome = store.promote(conversation_turn(tenant, conv, seq))
        assert isinstance(outcome, Promoted) and outcome.seq == seq + 1
        assert session.batches == [True] and session.serial_reads == 0
    history = healthy.read_history(tenant, conversation_id=conv)
    assert isinstance(history, VerifiedHistory) and history.head_seq == 5


def test_a_read_before_promoting_is_enough_of_a_hint(counted, healthy):
    """The processor reads the history before promoting: that read is the hint."""
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    for seq in range(3):
        assert isinstance(healthy.promote(conversation_turn(tenant, conv, seq)), Promoted)
    assert isinstance(store.read_history(tenant, conversation_id=conv), VerifiedHistory)
    session.reset()
    assert store.promote(conversation_turn(tenant, conv, 3)).seq == 4
    assert session.batches == [True] and session.serial_reads == 0


def test_chain_turns_promote_with_one_lwt_each(counted, healthy):
    session, store = counted
    tenant, root = uid("tenant"), uid("resp")
    previous = None
    for depth in range(1, 4):
        rid = root if previous is None else uid("resp")
        session.reset()
        outcome = store.promote(chain_turn(tenant, root, rid, previous))
        assert isinstance(outcome, Promoted) and outcome.seq == depth
        assert session.batches == [True] and session.serial_reads == 0
        previous = rid
    history = healthy.read_history(tenant, response_id=previous)
    assert isinstance(history, VerifiedHistory) and len(history.lineage) == 3


def test_stale_hint_is_refused_then_promoted_at_the_true_head(counted, healthy):
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    assert isinstance(store.promote(conversation_turn(tenant, conv, 0)), Promoted)
    # Another worker moves the head: this store's hint (seq 1) is now stale.
    rival = healthy.promote(conversation_turn(tenant, conv, 1)).checkpoint
    stale = store._hints.head(conversation_turn(tenant, conv, 1))
    assert stale is not None and stale.seq == 1
    # With a wrong item count for the true head seq the batch must be refused.
    lie = Head(2, rival.response_id, rival.last_item_seq + 5)
    turn = conversation_turn(tenant, conv, 2)
    session.reset()
    outcome = store.promote(turn, head_hint=lie)
    assert isinstance(outcome, Promoted) and outcome.seq == 3
    assert session.batches == [False, True] and session.serial_reads == 1
    assert outcome.checkpoint.first_item_seq == rival.last_item_seq + 1
    assert outcome.checkpoint.parent_response_id == rival.response_id
    history = healthy.read_history(tenant, conversation_id=conv)
    assert isinstance(history, VerifiedHistory) and history.head_seq == 3


@pytest.mark.parametrize("expected", [1, 7])
def test_refused_batch_writes_nothing(counted, healthy, store_session, expected):
    """A batch refused on the head leaves no item, checkpoint or idempotency row."""
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    for seq in range(2):
        assert isinstance(healthy.promote(conversation_turn(tenant, conv, seq)), Promoted)
    turn = conversation_turn(tenant, conv, expected, n_items=3)
    session.reset()
    outcome = store.promote(turn, head_hint=Head(expected, "resp_ghost", 40))
    assert outcome == (Conflict(2) if expected < 2 else AheadOfHead(2))
    assert session.batches == [False]
    assert rows_of(store_session, tenant, conv, turn.response_id) == []
    assert idempotency_row(store_session, tenant, conv, turn.idempotency_key) is None
    assert healthy.head(tenant, conv).seq == 2
    history = healthy.read_history(tenant, conversation_id=conv)
    assert isinstance(history, VerifiedHistory) and len(history.items) == 4


def test_refused_batch_on_the_idempotency_row_writes_nothing(counted, healthy, store_session):
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    first = conversation_turn(tenant, conv, 0)
    promoted = healthy.promote(first)
    head = healthy.head(tenant, conv)
    reused = conversation_turn(tenant, conv, 1, key=first.idempotency_key, digest="other")
    session.reset()
    assert store.promote(reused, head_hint=head) == KeyReused(
        first.request_digest, first.response_id
    )
    assert session.batches == [False]
    assert rows_of(store_session, tenant, conv, reused.response_id) == []
    # A retry of the first turn (expected 0) with a hint of a head: the hint predicts
    # an outcome, so no batch is sent; the SERIAL view decides it.
    session.reset()
    assert store.promote(first, head_hint=head) == Duplicate(promoted.checkpoint)
    assert session.batches == [] and session.serial_reads == 1
    # Without any hint, the same retry is a refused batch first, then the same answer.
    session.reset()
    cold = CassandraCheckpointStore(session, StoreOptions(hint_capacity=0), timeout_s=30)
    assert cold.promote(first) == Duplicate(promoted.checkpoint)
    assert session.batches == [False] and session.serial_reads == 1
    assert rows_of(store_session, tenant, conv, first.response_id) != []
    assert healthy.head(tenant, conv) == head


def test_refused_chain_batch_on_a_missing_parent_writes_nothing(counted, store_session):
    session, store = counted
    tenant, root = uid("tenant"), uid("resp")
    store.promote(chain_turn(tenant, root, root, None))
    # A hint of a chain row that is not there: a copy of a child (a copy of the root
    # under another id is a root outside its partition, which plans nothing: session 49).
    parent = store.promote(chain_turn(tenant, root, uid("resp"), root)).checkpoint
    ghost = dataclasses.replace(parent, response_id=uid("resp"))
    orphan = chain_turn(tenant, root, uid("resp"), ghost.response_id, n_items=3)
    session.reset()
    assert store.promote(orphan, parent_hint=ghost) == ParentMissing(ghost.response_id)
    assert session.batches == [False]
    assert rows_of(store_session, tenant, root, orphan.response_id) == []
    assert rows_of(store_session, tenant, root, ghost.response_id) == []
    assert idempotency_row(store_session, tenant, root, orphan.idempotency_key) is None


def test_read_by_response_id_skips_the_location_lookup_once_known(counted, healthy):
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    turn = conversation_turn(tenant, conv, 0)
    healthy.promote(turn)
    located = []
    real_locate = store._locate
    store._locate = lambda *a: located.append(a) or real_locate(*a)
    for _ in range(3):
        history = store.read_history(tenant, response_id=turn.response_id)
        assert isinstance(history, VerifiedHistory) and history.items == turn.items
    assert len(located) == 1  # only the first read asked the index
    by_partition = healthy.read_history(tenant, response_id=turn.response_id, partition_key=conv)
    assert by_partition == history
    # A wrong partition hint falls back to the index; another tenant still sees nothing.
    wrong = healthy.read_history(tenant, response_id=turn.response_id, partition_key="nope")
    assert wrong == history
    stranger = healthy.read_history(uid("tenant"), response_id=turn.response_id, partition_key=conv)
    assert stranger.reason.value == "NOT_FOUND"


def test_every_read_a_promotion_decides_on_is_serial(counted, healthy):
    """docs/store.md, step 3: the view is read at SERIAL, and so is what it does not
    hold (a QUORUM read never completes a Paxos round in flight: a batch that lands
    after it would be decided against). A mutation review (session 45): the head's own
    row read apart, the original of a key promoted under another response id, and a
    Conversation's head without its marker row could each be read at LOCAL_QUORUM with
    every test passing. Each case below makes exactly that read, and it is SERIAL."""
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    # The first turn, no hint: no marker row yet, so the head is a query of its own.
    session.reset()
    first = conversation_turn(tenant, conv, 0)
    assert isinstance(store.promote(first, head_hint=Head(5, "resp_nowhere", 1)), Promoted)
    assert session.reads() and set(session.reads()) == {ConsistencyLevel.SERIAL}
    assert session.reads("LIMIT 1") == [ConsistencyLevel.SERIAL]  # the head query
    # The second turn with a wrong hint: the head's row is not among the view's rows.
    rival = healthy.promote(conversation_turn(tenant, conv, 1)).checkpoint
    session.reset()
    lie = Head(2, uid("resp"), rival.last_item_seq)
    assert store.promote(conversation_turn(tenant, conv, 2), head_hint=lie).seq == 3
    backing = session.reads("kind = 'checkpoint' AND ref = ?")
    assert backing == [ConsistencyLevel.SERIAL], session.statements
    assert set(session.reads()) == {ConsistencyLevel.SERIAL}
    # A retry of the first request under another response id: its original is read.
    session.reset()
    retry = dataclasses.replace(first, response_id=uid("resp"), expected_head_seq=3)
    assert store.promote(retry) == Duplicate(healthy.get_checkpoint(tenant,
                                                                    first.response_id))
    assert session.reads("kind = 'checkpoint' AND ref = ?") == [ConsistencyLevel.SERIAL]
    assert set(session.reads()) == {ConsistencyLevel.SERIAL}


def test_a_lost_turns_row_is_looked_for_again_at_serial(counted, healthy, store_session):
    """docs/store.md, verification 1: a promoted response's row not found where its claim
    says is looked for once more at SERIAL before it is called lost (a promotion still
    committing is completed first; a QUORUM read would call a late row lost). A
    mutation review (session 45): that read at LOCAL_QUORUM passed every test."""
    session, store = counted
    tenant, conv = uid("tenant"), uid("conv")
    turn = conversation_turn(tenant, conv, 0)
    assert isinstance(healthy.promote(turn), Promoted)
    session.reset()
    assert not store.turn_lost(tenant, turn.response_id, conv)  # there
    assert session.reads("SELECT ref FROM") == [ConsistencyLevel.SERIAL], session.statements
    store_session.execute("DELETE FROM turns WHERE tenant_id = %s AND partition_key = %s "
                          "AND kind = 'checkpoint' AND ref = %s",
                          (tenant, conv, turn.response_id))
    session.reset()
    assert store.turn_lost(tenant, turn.response_id, conv)
    assert session.reads("SELECT ref FROM") == [ConsistencyLevel.SERIAL], session.statements
