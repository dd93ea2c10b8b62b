"""A plain write that a Paxos condition reads is written at QUORUM (session 51).

A promotion batch's ``IF facts_mark = ?`` is checked by Paxos reading at QUORUM of every
datacenter's replicas (SERIAL), as is the view's SERIAL read. The facts mark
(``mark_request_facts``) was a plain write at the store's write consistency,
LOCAL_QUORUM: with replicas in two datacenters the two need not overlap, and a batch
could pass its condition without a fact marked just before it. docs/decisions.md,
"Plain writes a Paxos condition reads". A stand-in for cassandra-driver's session
records what each statement is prepared and executed at.
"""

from __future__ import annotations

import pytest
from cassandra import ConsistencyLevel

from services.ledger.cassandra import CassandraLedger
from services.store.cassandra import CassandraCheckpointStore

# Levels whose replicas overlap a QUORUM read of every datacenter in any topology.
OVERLAPPING = {ConsistencyLevel.QUORUM, ConsistencyLevel.EACH_QUORUM, ConsistencyLevel.ALL}


class _Prepared:
    """What the store and ledger set on a prepared statement, and nothing else."""

    def __init__(self, query: str) -> None:
        self.query_string = query
        self.consistency_level: int | None = None


class RecordingSession:
    """Prepares by remembering the statement; executes by recording the statement, its
    values and the consistency level it carries at that moment."""

    keyspace = "ks"

    def __init__(self) -> None:
        self.prepared: list[_Prepared] = []
        self.executed: list[tuple[str, tuple, int | None]] = []

    def prepare(self, query: str) -> _Prepared:
        statement = _Prepared(query)
        self.prepared.append(statement)
        return statement

    def execute(self, statement, params=None, **_kwargs):
        self.executed.append((statement.query_string, tuple(params or ()),
                              statement.consistency_level))
        return None

    def execution_profile_clone_update(self, *_args, **_kwargs):
        raise RuntimeError("no profiles here: the backends keep the default")


@pytest.mark.parametrize("write_consistency", [ConsistencyLevel.LOCAL_QUORUM,
                                               ConsistencyLevel.ONE])
def test_a_facts_mark_is_written_at_quorum_whatever_the_store_writes_at(write_consistency):
    session = RecordingSession()
    store = CassandraCheckpointStore(session, write_consistency=write_consistency)
    mark = store.mark_request_facts("t1", "conv-1", "key-1")
    [(cql, values, level)] = session.executed
    assert cql.startswith("UPDATE ks.turns SET facts_mark = ?") and " IF " not in cql
    assert values == (mark, "t1", "conv-1", "key-1")
    assert level == ConsistencyLevel.QUORUM


def _plain_writes(session: RecordingSession) -> list[_Prepared]:
    return [s for s in session.prepared
            if s.query_string.split()[0] in ("INSERT", "UPDATE", "DELETE")
            and " IF " not in f"{s.query_string} "]


@pytest.mark.parametrize("backend", [CassandraCheckpointStore, CassandraLedger])
def test_every_plain_write_the_store_and_ledger_prepare_overlaps_a_paxos_read(backend):
    """The audit as a guard: today the mark is the only plain write a Paxos condition
    depends on, and the ledger's plain writes are at QUORUM already; a plain write added
    later at LOCAL_QUORUM is caught here rather than by a second datacenter."""
    session = RecordingSession()
    backend(session)
    writes = _plain_writes(session)
    assert writes, "the audit found plain writes in both backends"
    below = [(s.query_string, ConsistencyLevel.value_to_name[s.consistency_level])
             for s in writes if s.consistency_level not in OVERLAPPING]
    assert below == []
