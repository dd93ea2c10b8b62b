"""Shared fixtures. Service fixtures are session scoped and come from ``tests/services.py``.

- ``settings``: ``ratchet.settings.Settings`` pointing at live services
- ``cassandra_session``, ``kafka_admin``, ``schema_registry_client``: clients for them
- ``unique_name(prefix)``: a name no other test (or earlier run) uses
- ``unique_topic``: a created single-partition topic; ``fresh_keyspace``: a created keyspace

Without a service a test FAILS when ``CI`` is true (never skips) and is skipped with
the reason otherwise.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator

import pytest

from tests.services import Services, ServiceUnavailable, in_ci


def _unavailable(msg: str) -> None:
    if in_ci():
        pytest.fail(f"service unavailable in CI: {msg}", pytrace=False)
    pytest.skip(f"service unavailable (set CI=true to make this a failure): {msg}")


@pytest.fixture(scope="session")
def _services() -> Iterator[Services]:
    services = Services()
    try:
        services.start()
    except ServiceUnavailable as exc:
        _unavailable(str(exc))
    yield services
    services.close()


@pytest.fixture(scope="session")
def settings(_services: Services):
    return _services.settings


@pytest.fixture(scope="session")
def cassandra_cluster(settings):
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import (
        DCAwareRoundRobinPolicy,
        ExponentialReconnectionPolicy,
        RoundRobinPolicy,
    )

    from services.cassandra_cluster import default_level

    logging.getLogger("cassandra").setLevel(logging.WARNING)
    # A named local datacenter keeps the tests' own statements (their damage, their
    # reads) there; the level is the one ratchet's processes give statements that name
    # none (QUORUM with RATCHET_DATACENTERS=several), so that damage written through
    # one datacenter reaches a store reading through another (session 52, two DCs).
    local_dc = settings.cassandra_local_dc
    policy = DCAwareRoundRobinPolicy(local_dc=local_dc) if local_dc else RoundRobinPolicy()
    profile = ExecutionProfile(load_balancing_policy=policy, request_timeout=30,
                               consistency_level=default_level(settings))
    cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port,
                      protocol_version=5, connect_timeout=20,
                      # The driver's 2 s for the control connection's schema read (every
                      # test keyspace's tables) failed a run's setup under load.
                      control_connection_timeout=20,
                      # Fault tests restart Cassandra: the verifier must be back within
                      # seconds, like the worker (the driver's default waits up to 10 min).
                      reconnection_policy=ExponentialReconnectionPolicy(0.5, 5.0),
                      execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="session")
def cassandra_session(cassandra_cluster):
    return cassandra_cluster.connect()


@pytest.fixture(scope="session")
def kafka_admin(settings):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap})


@pytest.fixture(scope="session")
def schema_registry_client(settings):
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": settings.schema_registry_url})


@pytest.fixture
def unique_name() -> Callable[[str], str]:
    """``unique_name("t") -> "t_1a2b3c4d5e"``: safe as a topic, keyspace or group id."""
    return lambda prefix="t": f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def unique_topic(kafka_admin, settings, unique_name) -> Iterator[str]:
    """A new single-partition topic under the settings' prefix, deleted afterwards."""
    from confluent_kafka.admin import NewTopic

    name = settings.topic(unique_name("test"))
    kafka_admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    yield name
    kafka_admin.delete_topics([name])


@pytest.fixture
def fresh_keyspace(cassandra_session, settings, unique_name) -> Iterator[str]:
    """A new keyspace created with ``settings.replication``, dropped afterwards."""
    name = unique_name("test")
    cassandra_session.execute(
        f"CREATE KEYSPACE {name} WITH replication = {settings.replication}", timeout=60)
    yield name
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {name}", timeout=60)
