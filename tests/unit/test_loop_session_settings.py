"""The API's C++ driver writes each read at once: its coalesce delay (how long it holds
a request back for others to share the write) comes from the settings, 0 by default,
not the driver's 200 us, because a lookup waits for its read. The worker keeps the
driver's default."""

from __future__ import annotations

import asyncio

import pytest

from ratchet.settings import Settings
from services import cassandra_loop


class _Built(Exception):
    pass


def _cluster_options(monkeypatch, session: cassandra_loop.LoopSession) -> dict:
    seen: dict = {}

    def create_cluster(hosts, **options):
        seen.update(options, hosts=hosts)
        raise _Built

    monkeypatch.setattr(cassandra_loop.acsylla, "create_cluster", create_cluster)
    with pytest.raises(_Built):
        asyncio.run(session._connect())
    return seen


@pytest.mark.parametrize("env,expected", [({}, 0), ({"RATCHET_API_COALESCE_US": "200"}, 200)])
def test_the_api_session_gets_the_coalesce_delay_of_the_settings(monkeypatch, env, expected):
    from services.api.server import api_loop_session

    options = _cluster_options(monkeypatch, api_loop_session(Settings.from_env(env)))
    assert options["coalesce_delay_us"] == expected
    assert options["hosts"] == ["127.0.0.1"]


def test_without_a_delay_the_driver_keeps_its_default(monkeypatch):
    options = _cluster_options(monkeypatch, cassandra_loop.LoopSession(Settings.from_env({})))
    assert "coalesce_delay_us" not in options


@pytest.mark.parametrize("make", ["api", "worker"])
def test_the_cpp_driver_sends_to_the_named_local_datacenter(monkeypatch, make):
    """``RATCHET_CASSANDRA_LOCAL_DC`` reaches the C++ driver too (session 52's review,
    rrevv): before, only cassandra-driver's policy had it, and the API's reads and the
    worker's loop path went to the datacenter of whichever contact point the C++ driver
    reached first (it shuffles them)."""
    from services.api.server import api_loop_session

    settings = Settings.from_env({"RATCHET_CASSANDRA_HOSTS": "127.0.0.2,127.0.0.3",
                                  "RATCHET_CASSANDRA_LOCAL_DC": "dc2"})
    session = (api_loop_session(settings) if make == "api"
               else cassandra_loop.LoopSession(settings))
    options = _cluster_options(monkeypatch, session)
    assert options["load_balance_dc_aware"] == "dc2"


def test_unset_the_cpp_driver_picks_the_datacenter_itself(monkeypatch):
    options = _cluster_options(monkeypatch, cassandra_loop.LoopSession(Settings.from_env({})))
    assert "load_balance_dc_aware" not in options
