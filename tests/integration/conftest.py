"""Fixtures for the store's integration tests (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import uuid

import pytest

from tests.contract.store_support import create_store_keyspace


@pytest.fixture(scope="session")
def store_session(cassandra_cluster, settings):
    """A session on a keyspace of its own holding the store's tables."""
    keyspace = f"store_it_{uuid.uuid4().hex[:8]}"
    session = create_store_keyspace(cassandra_cluster, keyspace, settings.replication)
    yield session
    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
