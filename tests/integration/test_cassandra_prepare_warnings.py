"""The store and the ledger start on a real Cassandra without its "USE <keyspace>"
warning (session 45).

Cassandra warns once per statement and keyspace it had not prepared yet, so each test
takes a keyspace nobody prepared anything on (every migration applied) and a session
connected to it, as the worker and the API connect. cassandra-driver logs a server's
warning at WARNING under ``cassandra.protocol`` ("Server warning: ..."). The statements
themselves: ``tests/unit/test_cassandra_keyspace_qualified.py``.
"""

from __future__ import annotations

import logging

import pytest

from services.ledger.cassandra import CassandraLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import migrated_keyspace

pytestmark = pytest.mark.integration
USE_WARNING = "`USE <keyspace>` with prepared statements"


@pytest.fixture
def fresh_session(cassandra_cluster, settings):
    yield from migrated_keyspace(cassandra_cluster, settings, "prepare_warnings")


def _server_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "cassandra.protocol" and "Server warning" in r.getMessage()]


def test_the_probe_sees_the_warning_of_a_bare_table(fresh_session, caplog):
    """What the next test would see if a statement left its keyspace to the session."""
    with caplog.at_level(logging.WARNING, logger="cassandra.protocol"):
        fresh_session.prepare("SELECT tenant_id FROM response_owners WHERE response_id = ?")
    assert any(USE_WARNING in w for w in _server_warnings(caplog))


def test_a_store_and_a_ledger_prepare_without_a_server_warning(fresh_session, caplog):
    with caplog.at_level(logging.WARNING, logger="cassandra.protocol"):
        store = CassandraCheckpointStore(fresh_session, StoreOptions())
        ledger = CassandraLedger(fresh_session)
    assert _server_warnings(caplog) == []
    # and they read the keyspace's tables, as before
    assert store.head("tenant", "nothing") is None
    assert ledger.conversation_owner("nothing") is None
