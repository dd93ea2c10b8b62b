"""A worker's or an API's drivers do not re-read the schema at every schema change in
the cluster (``RATCHET_CASSANDRA_SCHEMA_EVENTS``, default ``ignore``; session 53).

Left to the drivers, every connected cassandra-driver ``Cluster`` answers each
SCHEMA_CHANGE event Cassandra pushes (any keyspace's, any client's DDL) with a schema
agreement check and a re-read of the changed keyspace's ``system_schema`` tables, and
the C++ driver likewise: on the shared node, ~13.6 requests a second per idle process,
none of them ratchet's own business (docs/decisions.md, "What an idle ratchet costs
Cassandra"). ``ignore``: cassandra-driver's ``schema_event_refresh_window`` is negative
(its documented "no refresh on schema events"; the schema read at connect stays, so
token-aware routing keeps the keyspace's replication). ``follow``: the driver's
default. The C++ driver is left as it was (its ``use_schema=False`` failed a first
connect through a Cassandra that answers late). No connection is made here: a ``Cluster`` is configured when built.
"""

from __future__ import annotations

import pytest

from ratchet.settings import Settings, SettingsError
from services.cassandra_cluster import open_cluster


def test_the_default_is_ignore_and_follow_is_accepted():
    assert Settings.from_env({}).cassandra_schema_events == "ignore"
    follow = Settings.from_env({"RATCHET_CASSANDRA_SCHEMA_EVENTS": "follow"})
    assert follow.cassandra_schema_events == "follow"
    assert Settings.from_env(follow.to_env()) == follow


@pytest.mark.parametrize("value", ["", "Ignore", "off", "0"])
def test_a_bad_value_is_refused_naming_the_variable(value):
    with pytest.raises(SettingsError, match="RATCHET_CASSANDRA_SCHEMA_EVENTS"):
        Settings.from_env({"RATCHET_CASSANDRA_SCHEMA_EVENTS": value})


def test_ignore_turns_off_cassandra_drivers_refresh_on_schema_events():
    cluster = open_cluster(Settings.from_env({}))
    assert cluster.schema_event_refresh_window < 0
    assert cluster.schema_metadata_enabled  # the schema read at connect is kept
    # follow: the driver's own default window; a caller's own window is kept
    follow = Settings.from_env({"RATCHET_CASSANDRA_SCHEMA_EVENTS": "follow"})
    assert open_cluster(follow).schema_event_refresh_window == 2
    own = open_cluster(Settings.from_env({}), schema_event_refresh_window=5)
    assert own.schema_event_refresh_window == 5
