"""Backends for the store contract: memory always, Cassandra as an integration test."""

from __future__ import annotations

import uuid

import pytest

from tests.contract.store_support import create_store_keyspace, migrated_keyspace


@pytest.fixture(scope="session")
def store_session(cassandra_cluster, settings):
    """A session on a keyspace of its own holding the store's tables."""
    keyspace = f"store_contract_{uuid.uuid4().hex[:8]}"
    session = create_store_keyspace(cassandra_cluster, keyspace, settings.replication)
    yield session
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)


@pytest.fixture(scope="session")
def ledger_session(cassandra_cluster, settings):
    """A session on a keyspace of its own with every migration applied (the ledger's
    tables, at the schema this tree defines)."""
    yield from migrated_keyspace(cassandra_cluster, settings, "ledger_contract")


@pytest.fixture(params=["memory", "cassandra"])
def data(request):
    """One backend's shared data for the processor's contract tests (both backends):
    ``tests.contract.test_processor_handover.Data``, memory always, Cassandra on a
    migrated keyspace of the session."""
    from services.ledger.cassandra import CassandraLedger
    from services.ledger.memory import MemoryLedger
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore
    from services.store.memory import MemoryCheckpointStore
    from tests.contract.test_processor_handover import Data

    if request.param == "memory":
        store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
        return Data(lambda: store, lambda: ledger)
    session = request.getfixturevalue("ledger_session")
    return Data(lambda: CassandraCheckpointStore(session, StoreOptions(), timeout_s=30),
                lambda: CassandraLedger(session, timeout_s=30))


@pytest.fixture(params=["memory", "cassandra"])
def store_and_ledger(request):
    """A plain ``(store, ledger)`` pair of one backend on shared data: memory always
    (``MemoryCheckpointStore``, ``MemoryLedger``, default ``StoreOptions``), Cassandra on
    a migrated keyspace of the session. Tests that damage rows reach into the store's
    tables (memory: its dicts) themselves."""
    from services.ledger.cassandra import CassandraLedger
    from services.ledger.memory import MemoryLedger
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore
    from services.store.memory import MemoryCheckpointStore

    if request.param == "memory":
        return MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    session = request.getfixturevalue("ledger_session")
    return (CassandraCheckpointStore(session, StoreOptions(), timeout_s=30),
            CassandraLedger(session, timeout_s=30))
