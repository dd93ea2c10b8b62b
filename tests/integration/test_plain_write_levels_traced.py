"""The facts mark reaches a real Cassandra at QUORUM (session 51's outside review).

``tests/unit/test_plain_write_levels.py`` checks the level the store's statement carries,
through a stand-in session. Here the coordinator says what it was sent: a traced request
records its consistency level in ``system_traces.sessions`` (``parameters``), so a level
the driver would take from elsewhere (the session's execution profile, the store's write
consistency) shows. docs/decisions.md, "Plain writes a Paxos condition reads"."""

from __future__ import annotations

import pytest
from cassandra import ConsistencyLevel

from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import uid

pytestmark = pytest.mark.integration


class TracingSession:
    """A real session whose every ``execute`` is traced; keeps each request's CQL and the
    consistency level the coordinator's trace recorded for it."""

    def __init__(self, real) -> None:
        self._real = real
        self.levels: list[tuple[str, str]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def execute(self, statement, *args, **kwargs):
        result = self._real.execute(statement, *args, trace=True, **kwargs)
        trace = result.get_query_trace(20)
        self.levels.append((getattr(statement, "query_string", str(statement)),
                            trace.parameters["consistency_level"]))
        return result


@pytest.mark.parametrize("write_consistency", [ConsistencyLevel.LOCAL_QUORUM,
                                               ConsistencyLevel.ONE], ids=["LOCAL_QUORUM", "ONE"])
def test_the_facts_mark_is_sent_at_quorum_whatever_the_store_writes_at(store_session,
                                                                        write_consistency):
    traced = TracingSession(store_session)
    store = CassandraCheckpointStore(traced, write_consistency=write_consistency,
                                     timeout_s=30)
    tenant, key = uid("t"), uid("k")
    mark = store.mark_request_facts(tenant, "conv", key)
    [(cql, level)] = traced.levels
    assert "SET facts_mark = ?" in cql and " IF " not in cql
    assert level == "QUORUM"
    # What it wrote, read back: the mark the store returned.
    assert store.request_facts_mark(tenant, "conv", key) == mark
