"""End-to-end fixtures: a real worker and a real API process on real Kafka, Cassandra and
the registry, isolated in a keyspace, a topic prefix and a consumer group of their own.

Marked ``integration``: without the services they fail in CI (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from services.demo.stack import RunningStack


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
        delete_topics(e2e_settings)


def delete_topics(settings) -> None:
    """Delete the ratchet topics of ``settings`` (best effort)."""
    from confluent_kafka.admin import AdminClient

    from streams.topics import topic_names

    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    names = list(vars(topic_names(settings)).values())
    for future in admin.delete_topics(names, operation_timeout=30).values():
        # Best effort: a leftover topic only costs disk.
        with contextlib.suppress(Exception):
            future.result(timeout=30)


@pytest.fixture(scope="session")
def cql(e2e_stack, cassandra_cluster):
    """A session on the e2e keyspace, for corrupting rows directly."""
    return cassandra_cluster.connect(e2e_stack.settings.keyspace)
