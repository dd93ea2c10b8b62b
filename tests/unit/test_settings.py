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
    assert s.fetch_wait_ms == 5  # paced turns share the worker's fetches
    assert s.api_send_stall_s == 30  # a client that takes nothing for 30 s is cut off
    assert s.api_answer_budget_bytes == 64 * 1024 * 1024


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
        "RATCHET_FETCH_WAIT_MS": "0",
    })
    assert s.fetch_wait_ms == 0
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
                                        ("RATCHET_WORKER_CONSUMER", "process"),
                                        ("RATCHET_FETCH_WAIT_MS", "-1"),
                                        ("RATCHET_API_SEND_STALL_S", "-1"),
                                        ("RATCHET_API_ANSWER_BUDGET_BYTES", "0")])
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
        "RATCHET_API_SEND_STALL_S": "0",
        "RATCHET_API_ANSWER_BUDGET_BYTES": "1048576",
        "RATCHET_API_MAX_BODY_BYTES": "1048576",
        "RATCHET_CASSANDRA_TIMER_SLACK_US": "1000",
        "RATCHET_WORKER_EVENT_LOOP": "asyncio",
        "RATCHET_WORKER_CONSUMER": "thread",
        "RATCHET_REPLICATION": "{'class': 'NetworkTopologyStrategy', 'dc1': 3}",
        "RATCHET_CONSUMER_GROUP": "ratchet-staging",
        "RATCHET_API_HOST": "::",
    })
    assert (s.consumer_group, s.api_host) == ("ratchet-staging", "::")
    assert Settings.from_env(s.to_env()) == s
    assert Settings.from_env(Settings().to_env()) == Settings()


# A bad value stops the process at start, naming the variable (docs/operations.md); each
# of these used to be accepted and fail later, or silently meant the default. (Found by
# an outside review of the operator's commands, 2026-12-04.)
@pytest.mark.parametrize("name,value", [
    ("RATCHET_HOME", ""),  # an unset shell variable: it meant the default home
    ("RATCHET_KEYSPACE", " "),
    ("RATCHET_CASSANDRA_PORT", ""),
    ("RATCHET_KAFKA_BOOTSTRAP", ""),
    ("RATCHET_CASSANDRA_HOSTS", " , "),
    ("RATCHET_API_PORT", "70000"),  # the API bound 70000 - 65536 and logged 70000
    ("RATCHET_CASSANDRA_PORT", "99999"),
    ("RATCHET_WORKER_METRICS_PORT", "65536"),
    ("RATCHET_LOGICAL_RETENTION_S", str(10**12)),  # every promotion dead-lettered
    ("RATCHET_KAFKA_BOOTSTRAP", "k1:abc"),
    ("RATCHET_KAFKA_BOOTSTRAP", "k1:70000"),
    ("RATCHET_KAFKA_BOOTSTRAP", " , "),
    ("RATCHET_SCHEMA_REGISTRY_URL", "notaurl"),
    ("RATCHET_SCHEMA_REGISTRY_URL", "http://sr:abc/x"),
    ("RATCHET_SCHEMA_REGISTRY_URL", "http://sr-0:8081,notaurl"),
    ("RATCHET_KEYSPACE", "MixedCase"),  # created as "mixedcase", then not found
    ("RATCHET_KEYSPACE", "has-dash"),
    ("RATCHET_TOPIC_PREFIX", "bad prefix/"),
    ("RATCHET_LOG_LEVEL", "LOUD"),
    ("RATCHET_SPEEDUPS", "2"),
    # Found by an outside review of the deployment (session 25): a port in the host made
    # the API exit on a name-resolution error and the worker serve no metrics; an empty
    # group (an unset shell variable) silently meant the production group.
    ("RATCHET_API_HOST", "0.0.0.0:8080"),
    ("RATCHET_API_HOST", "http://0.0.0.0"),
    ("RATCHET_CONSUMER_GROUP", ""),
    ("RATCHET_CONSUMER_GROUP", "a group"),
    # Pasted into CREATE KEYSPACE: more than a map ran as CQL, "rf=3" failed only at
    # migrate (an operator's review, session 38).
    ("RATCHET_REPLICATION", "rf=3"),
    ("RATCHET_REPLICATION", "{'class': 'SimpleStrategy', 'replication_factor': 1} "
                            "AND durable_writes = false"),
    ("RATCHET_REPLICATION", "{'replication_factor': 1}"),
    ("RATCHET_REPLICATION", "{'class': 'SimpleStrategy', 'replication_factor': 1}; DROP"),
])
def test_values_that_cannot_work_are_refused_at_start(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


@pytest.mark.parametrize("value", [
    "{'class': 'SimpleStrategy', 'replication_factor': 1}",
    "{'class':'NetworkTopologyStrategy','dc1':3,'dc-2':2}",
    "{ 'class' : 'org.apache.cassandra.locator.NetworkTopologyStrategy', 'eu_west' : 3 }",
])
def test_a_replication_map_is_accepted_as_written(value):
    assert Settings.from_env({"RATCHET_REPLICATION": value}).replication == value


def test_the_largest_values_that_work_are_accepted():
    from ratchet.settings import MAX_RETENTION_S

    s = Settings.from_env({"RATCHET_API_PORT": "65535", "RATCHET_WORKER_METRICS_PORT": "0",
                           "RATCHET_LOGICAL_RETENTION_S": str(MAX_RETENTION_S),
                           "RATCHET_KAFKA_BOOTSTRAP": "k1:9092, k2:9093",
                           "RATCHET_SCHEMA_REGISTRY_URL": "https://sr.example/apis/ccompat/v7",
                           "RATCHET_LOG_LEVEL": "WARNING", "RATCHET_SPEEDUPS": "0"})
    assert s.api_port == 65535 and s.log_level == "WARNING" and s.speedups == "0"


def test_the_longest_retention_still_gives_a_storable_expiry():
    """The cap exists because a checkpoint's expiry (promoted_at + retention) must stay
    a datetime Cassandra and Python can hold: check it from a promotion far ahead."""
    import datetime

    from ratchet.settings import MAX_RETENTION_S

    far_ahead = datetime.datetime(2200, 1, 1, tzinfo=datetime.UTC)
    assert far_ahead + datetime.timedelta(seconds=MAX_RETENTION_S) < datetime.datetime(
        9999, 12, 31, tzinfo=datetime.UTC)


@pytest.mark.parametrize("name,value,read", [
    # Found by an outside review of the checks above (2026-12-04): values that worked
    # before them and that the clients accept must still work.
    ("RATCHET_LOG_LEVEL", "debug", "DEBUG"),  # Faust upper-cases it
    ("RATCHET_LOG_LEVEL", "warn", "WARNING"),
    ("RATCHET_KAFKA_BOOTSTRAP", "kafka-bootstrap.kafka.svc", None),  # port 9092
    ("RATCHET_KAFKA_BOOTSTRAP", "k1:9092,k2:9092,", None),
    ("RATCHET_KAFKA_BOOTSTRAP", "[::1]:9092,[::1]", None),
    ("RATCHET_KAFKA_BOOTSTRAP", "PLAINTEXT://k1:9092", None),
    ("RATCHET_SCHEMA_REGISTRY_URL", "http://sr-0:8081,http://sr-1:8081", None),  # failover
    ("RATCHET_SCHEMA_REGISTRY_URL", "https://user:pw@sr.example/apis/ccompat/v7/", None),
    ("RATCHET_API_HOST", "0.0.0.0", None),
    ("RATCHET_API_HOST", "ratchet-api.default.svc", None),
    ("RATCHET_API_HOST", "fe80::1", None),
])
def test_values_the_clients_accept_are_accepted(name, value, read):
    s = Settings.from_env({name: value})
    field = {"RATCHET_LOG_LEVEL": "log_level", "RATCHET_KAFKA_BOOTSTRAP": "kafka_bootstrap",
             "RATCHET_SCHEMA_REGISTRY_URL": "schema_registry_url",
             "RATCHET_API_HOST": "api_host"}[name]
    assert getattr(s, field) == (read if read is not None else value.rstrip("/"))


# --- values no deployment means, refused at start naming the variable (found by an
# outside review of the operator's commands, session 26) ---------------------------------

@pytest.mark.parametrize("name,value", [
    ("RATCHET_PARTITIONS", str(2**31)),  # the worker: OverflowError from NewTopic
    ("RATCHET_API_COALESCE_US", str(2**63)),  # the API: healthy, every lookup a 500
    ("RATCHET_LANE_WINDOW", "1001"),
    ("RATCHET_API_MAX_BODY_BYTES", str(2**41)),
    ("RATCHET_FETCH_STALL_S", "86401"),
    ("RATCHET_API_SEND_STALL_S", "86401"),
    ("RATCHET_FETCH_WAIT_MS", "1001"),  # every paced turn would wait up to it
])
def test_integers_above_their_bound_are_refused(name, value):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env({name: value})


@pytest.mark.parametrize("raw", ["1_0", "\u0663", "+3", " 3 4"])
def test_integers_are_plain_digits(raw):
    """Python's int() takes all of these; no document describes them."""
    with pytest.raises(SettingsError, match="RATCHET_PARTITIONS"):
        Settings.from_env({"RATCHET_PARTITIONS": raw})


def test_a_consumer_group_leaves_room_for_fausts_own_topic():
    """Faust names a topic ``<group>-__assignor-__leader``: a group of 230-249
    characters passed, and the worker failed after making its topics."""
    with pytest.raises(SettingsError, match="RATCHET_CONSUMER_GROUP"):
        Settings.from_env({"RATCHET_CONSUMER_GROUP": "g" * 230})
    assert Settings.from_env({"RATCHET_CONSUMER_GROUP": "g" * 229}).consumer_group == "g" * 229


@pytest.mark.parametrize("hosts", ["127.0.0.1:9042", "cassandra:9042", "1.5"])
def test_cassandra_hosts_take_no_port(hosts):
    with pytest.raises(SettingsError, match="RATCHET_CASSANDRA_HOSTS"):
        Settings.from_env({"RATCHET_CASSANDRA_HOSTS": hosts})
    ok = Settings.from_env({"RATCHET_CASSANDRA_HOSTS": "cassandra-0.cassandra.svc, 10.0.0.1, ::1"})
    assert ok.cassandra_hosts == ("cassandra-0.cassandra.svc", "10.0.0.1", "::1")


@pytest.mark.parametrize("host", ["0", "1.5", "99999999999999999999999"])
def test_an_api_host_of_digits_is_no_name(host):
    """The resolver reads '0' as 0.0.0.0: every interface, for an API without
    authentication."""
    with pytest.raises(SettingsError, match="RATCHET_API_HOST"):
        Settings.from_env({"RATCHET_API_HOST": host})


def test_a_relative_home_or_one_with_a_tilde_is_made_absolute(monkeypatch, tmp_path):
    """The launcher starts each server in its data directory: a relative RATCHET_HOME
    named a class path and a config that were not there from it (Kafka exited "Could
    not find or load main class kafka.Kafka"; an operator's review, session 43), and a
    quoted ``~`` made a directory called ``~``."""
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({"RATCHET_HOME": "rel/home"}).home == tmp_path / "rel" / "home"
    assert Settings.from_env({"RATCHET_HOME": "~/r h"}).home == Path.home() / "r h"
    assert Settings.from_env({"RATCHET_HOME": "/a/b/../c"}).home == Path("/a/c")


# The Cassandra host check refused names that resolve: an absolute name (trailing
# dot) and one with underscores (an outside red team of session 26's own fixes).
@pytest.mark.parametrize("host", ["cassandra-0.cassandra.svc.cluster.local.",
                                  "ratchet_cassandra_1"])
def test_cassandra_host_names_that_resolve_are_accepted(host):
    assert Settings.from_env({"RATCHET_CASSANDRA_HOSTS": host}).cassandra_hosts == (host,)
