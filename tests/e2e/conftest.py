"""End-to-end fixtures: a real worker and a real API process on real Kafka, Cassandra and
the registry, isolated in a keyspace, a topic prefix and a consumer group of their own.

Marked ``integration``: without the services they fail in CI (tests/conftest.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from services.demo.stack import RunningStack
from streams.topics import delete_topics_with_prefix


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def e2e_stack(settings, tmp_path_factory, cassandra_session) -> Iterator[RunningStack]:
    run = uuid.uuid4().hex[:8]
    e2e_settings = replace(
        settings,
        keyspace=f"e2e_{run}",
        topic_prefix=f"e2e{run}.",
        partitions=2,
    )
    stack = RunningStack.start(
        e2e_settings, tmp_path_factory.mktemp("e2e-logs"), group_id=f"ratchet-e2e-{run}"
    )
    try:
        yield stack
    finally:
        stack.stop()
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {e2e_settings.keyspace}", timeout=60)
        # Its topics and its consumer group's Faust internal topics (leftovers slow
        # every later broker start, see streams/topics.py).
        delete_topics_with_prefix(settings.kafka_bootstrap,
                                  [e2e_settings.topic_prefix, f"ratchet-e2e-{run}-"])


@pytest.fixture(scope="session")
def cql(e2e_stack, cassandra_cluster):
    """A session on the e2e keyspace, for corrupting rows directly."""
    return cassandra_cluster.connect(e2e_stack.settings.keyspace)
