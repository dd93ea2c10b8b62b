"""Fixtures for the store's integration tests (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import dataclasses
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


@pytest.fixture
def own(cassandra_session, settings, unique_name):
    """Settings on a keyspace of the test's own, not made here (what the test runs makes
    it: ``ratchet migrate``), dropped afterwards. A file whose tests need more of their
    own (a topic prefix, a home) has an ``own`` of its own."""
    s = dataclasses.replace(settings, keyspace=unique_name("own"))
    yield s
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)
