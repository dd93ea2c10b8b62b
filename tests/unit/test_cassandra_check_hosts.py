"""The Cassandra health check (``infra/servers/cassandra.py``, used by ``ratchet infra
status`` and the tests' services check) looks where ``RATCHET_CASSANDRA_HOSTS`` says,
not at 127.0.0.1 (session 52: a two-datacenter trial on 127.0.0.2 and 127.0.0.3 was
"not healthy" while both nodes served)."""

from __future__ import annotations

import socket

import pytest

from infra.servers.base import Unhealthy
from infra.servers.cassandra import Cassandra
from ratchet.settings import Settings

HOST = "127.0.0.9"  # a loopback alias: nothing of the machine's own listens there


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def test_nothing_listening_on_the_named_host_is_reported_there():
    port = _free_port()
    node = Cassandra(Settings(cassandra_hosts=(HOST,), cassandra_port=port))
    with pytest.raises(Unhealthy, match=f"nothing accepts connections on {HOST}:{port}"):
        node.check(timeout_s=2)


def test_a_listener_on_the_named_host_is_asked_a_cql_query():
    with socket.socket() as listener:
        listener.bind((HOST, 0))
        listener.listen()
        port = listener.getsockname()[1]
        node = Cassandra(Settings(cassandra_hosts=(HOST,), cassandra_port=port))
        # Not Cassandra: the query fails, after the port was found open.
        with pytest.raises(Unhealthy, match="CQL query failed"):
            node.check(timeout_s=2)
