"""``RATCHET_CASSANDRA_LOCAL_DC`` names the datacenter a process sends its requests to
(session 52, the first run on a real two-datacenter cluster): an API in dc2 whose first
contact point is in dc1 must still read from dc2's replicas. Unset, the driver takes the
DC of the contact point it reaches first, as before.

No connection is made: the policy is given hosts the way the driver gives them.
"""

from __future__ import annotations

import pytest
from cassandra.policies import SimpleConvictionPolicy
from cassandra.pool import Host

from ratchet.settings import Settings, SettingsError
from services.cassandra_cluster import open_cluster


def _hosts() -> list[Host]:
    out = []
    for address, dc in (("127.0.0.2", "dc1"), ("127.0.0.3", "dc2"), ("127.0.0.4", "dc2")):
        host = Host(address, SimpleConvictionPolicy)
        host.set_location_info(dc, "rack1")
        host.set_up()
        out.append(host)
    return out


def _planned(settings: Settings) -> set[str]:
    """The hosts the default profile's policy would send a request to."""
    cluster = open_cluster(settings)
    try:
        policy = cluster.profile_manager.default.load_balancing_policy
        policy.populate(cluster, _hosts())
        return {h.address for h in policy.make_query_plan()}
    finally:
        cluster.shutdown()


def test_the_named_datacenter_is_the_only_one_requests_go_to():
    settings = Settings.from_env({"RATCHET_CASSANDRA_HOSTS": "127.0.0.2",
                                  "RATCHET_CASSANDRA_LOCAL_DC": "dc2"})
    assert settings.cassandra_local_dc == "dc2"
    assert _planned(settings) == {"127.0.0.3", "127.0.0.4"}


def test_unset_leaves_the_choice_to_the_driver():
    settings = Settings.from_env({})
    assert settings.cassandra_local_dc == ""
    policy = open_cluster(settings).profile_manager.default.load_balancing_policy
    assert policy._child_policy.local_dc == ""  # filled in from the contact points


def test_it_passes_to_a_child_process_only_when_named():
    named = Settings(cassandra_local_dc="dc2")
    assert Settings.from_env(named.to_env()) == named
    assert "RATCHET_CASSANDRA_LOCAL_DC" not in Settings().to_env()


@pytest.mark.parametrize("value", ["dc1,dc2", "dc 1", "", "x" * 65])
def test_anything_but_one_name_is_refused(value):
    with pytest.raises(SettingsError, match="RATCHET_CASSANDRA_LOCAL_DC"):
        Settings.from_env({"RATCHET_CASSANDRA_LOCAL_DC": value})
