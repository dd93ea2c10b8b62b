"""Fixtures for the store's integration tests (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from infra.migrate import apply_migrations
from streams.topics import delete_topics_with_prefix
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
    own (a topic prefix, a home, a keyspace migrated first) has an ``own`` of its own,
    most of them made with ``own_migrated``."""
    s = dataclasses.replace(settings, keyspace=unique_name("own"))
    yield s
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


@pytest.fixture
def own_migrated(settings, cassandra_cluster, cassandra_session, unique_name, tmp_path):
    """A maker of settings of the test's own, ``own_migrated("sigterm")``: a keyspace
    (``sigterm_<hex>``) migrated here, a topic prefix (``sigterm-<tag>.``), a home in
    ``tmp_path``. Afterwards the keyspace is dropped and the topics under the prefix, and
    under ``sigterm-<tag>-`` (a consumer group a test names so: faust's own topics
    start with it), deleted. For the files whose worker or API runs on it (each checks
    the schema at its start)."""
    made: list = []

    def make(name: str):
        tag = uuid.uuid4().hex[:8]
        s = dataclasses.replace(settings, keyspace=unique_name(name),
                                topic_prefix=f"{name}-{tag}.", home=tmp_path / "home")
        made.append((s, f"{name}-{tag}-"))  # before migrating: a half-made one is dropped
        apply_migrations(cassandra_cluster, s)
        return s

    yield make
    for s, group_prefix in made:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)
        delete_topics_with_prefix(s.kafka_bootstrap, [s.topic_prefix, group_prefix])
