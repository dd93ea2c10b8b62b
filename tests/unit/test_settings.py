"""Settings come from RATCHET_* variables in one place, with local defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratchet.settings import Settings, SettingsError


def test_defaults_point_at_the_local_launcher():
    s = Settings.from_env({})
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.schema_registry_url == "http://127.0.0.1:8081/apis/ccompat/v7"
    assert s.cassandra_hosts == ("127.0.0.1",) and s.cassandra_port == 9042
    assert s.keyspace == "ratchet" and s.topic_prefix == "ratchet."
    assert s.home == Path.home() / ".cache" / "ratchet"
    assert s.topic("checkpoints") == "ratchet.checkpoints"
    assert s.loop_driver == "acsylla"
    assert s.api_coalesce_us == 0  # each API read written at once (not the driver's 200)
    assert s.cassandra_timer_slack_us == 200  # the launched Cassandra's spin-waits merge


def test_environment_overrides():
    s = Settings.from_env({
        "RATCHET_KAFKA_BOOTSTRAP": "k1:19092",
        "RATCHET_SCHEMA_REGISTRY_URL": "http://sr:8081/apis/ccompat/v7/",
        "RATCHET_CASSANDRA_HOSTS": " c1, c2 ,",
        "RATCHET_CASSANDRA_PORT": "19042",
        "RATCHET_CASSANDRA_STORAGE_PORT": "17000",
        "RATCHET_CASSANDRA_TIMER_SLACK_US": "0",
        "RATCHET_KEYSPACE": "ks_test",
        "RATCHET_TOPIC_PREFIX": "",
        "RATCHET_PARTITIONS": "3",
        "RATCHET_HOME": "/tmp/ratchet-home",
    })
    assert s.kafka_bootstrap == "k1:19092"
    assert s.schema_registry_url == "http://sr:8081/apis/ccompat/v7"  # trailing slash dropped
    assert s.cassandra_hosts == ("c1", "c2") and s.cassandra_port == 19042
    assert s.cassandra_storage_port == 17000
    assert s.cassandra_timer_slack_us == 0
    assert s.keyspace == "ks_test" and s.partitions == 3
    assert s.topic("checkpoints") == "checkpoints"  # an empty prefix is allowed
    assert s.home == Path("/tmp/ratchet-home")


@pytest.mark.parametrize("name,value", [("RATCHET_PARTITIONS", "0"), ("RATCHET_CASSANDRA_PORT", "x"),
                                        ("RATCHET_API_PORT", "-1"),
                                        ("RATCHET_LOOP_DRIVER", "libev"),
                                        ("RATCHET_API_COALESCE_US", "-5"),
                                        ("RATCHET_API_MAX_BODY_BYTES", "0"),
                                        ("RATCHET_CASSANDRA_TIMER_SLACK_US", "-1"),
                                        ("RATCHET_WORKER_EVENT_LOOP", "trio"),
                                        ("RATCHET_WORKER_CONSUMER", "process")])
def test_bad_values_are_refused_with_the_variable_name(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        Settings().keyspace = "other"  # type: ignore[misc]


def test_to_env_round_trips_through_from_env():
    """A child process started with ``to_env()`` sees exactly the parent's settings."""
    s = Settings.from_env({
        "RATCHET_CASSANDRA_HOSTS": "c1,c2",
        "RATCHET_TOPIC_PREFIX": "",
        "RATCHET_PARTITIONS": "5",
        "RATCHET_HOME": "/tmp/ratchet-home",
        "RATCHET_LOGICAL_RETENTION_S": "60",
        "RATCHET_LOOP_DRIVER": "cassandra-driver",
        "RATCHET_API_COALESCE_US": "150",
        "RATCHET_API_MAX_BODY_BYTES": "1048576",
        "RATCHET_CASSANDRA_TIMER_SLACK_US": "1000",
        "RATCHET_WORKER_EVENT_LOOP": "asyncio",
        "RATCHET_WORKER_CONSUMER": "thread",
        "RATCHET_REPLICATION": "{'class': 'NetworkTopologyStrategy', 'dc1': 3}",
    })
    assert Settings.from_env(s.to_env()) == s
    assert Settings.from_env(Settings().to_env()) == Settings()
