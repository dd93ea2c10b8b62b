"""The Cassandra health check (``infra/servers/cassandra.py``, used by ``ratchet infra
status`` and the tests' services check) looks where ``RATCHET_CASSANDRA_HOSTS`` says,
not at 127.0.0.1 (session 52: a two-datacenter trial on 127.0.0.2 and 127.0.0.3 was
"not healthy" while both nodes served)."""

from __future__ import annotations

import socket
import time

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


# A host that takes the SYN of no connection: a listener that never accepts, its queue
# full (the kernel drops further SYNs), as a node whose machine is gone or firewalled
# looks to a client. A refused port would answer at once and hide a per-host timeout.
def _hung(host: str, port: int) -> list[socket.socket]:
    listener = socket.socket()
    listener.bind((host, port))
    listener.listen(0)
    held = [listener]
    for _ in range(4):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex((host, port))
        held.append(client)
    with pytest.raises(OSError):  # it does hang: the premise of the tests below
        socket.create_connection((host, port), timeout=0.3).close()
    return held


def _closed(held: list[socket.socket]) -> None:
    for s in held:
        s.close()


def test_hosts_that_hang_are_given_the_callers_deadline_not_one_each():
    """Session 52's review (rrevv): each host was tried for 1 s in turn, so three hung
    hosts took 3 s of a 1 s check (``ratchet infra status`` gives 5 s, the launcher 10)."""
    hosts = ("127.0.0.211", "127.0.0.212", "127.0.0.213")
    port = _free_port()
    held = [s for h in hosts for s in _hung(h, port)]
    try:
        node = Cassandra(Settings(cassandra_hosts=hosts, cassandra_port=port))
        started = time.monotonic()
        with pytest.raises(Unhealthy, match="nothing accepts connections"):
            node.check(timeout_s=1.0)
        assert time.monotonic() - started < 1.5
    finally:
        _closed(held)


def test_one_hung_host_and_one_live_is_healthy_within_the_deadline(settings):
    """A contact point that hangs listed first, the live node second: healthy, and
    within the deadline (before: 1 s of probing, then the driver's connect waited its
    whole connect_timeout on the hung host, 7.9 s of a 5 s check)."""
    live = settings.cassandra_hosts[0]
    held = _hung("127.0.0.214", settings.cassandra_port)
    try:
        node = Cassandra(Settings(cassandra_hosts=("127.0.0.214", live),
                                  cassandra_port=settings.cassandra_port))
        # The driver tries its contact points in a random order: three checks, so that
        # the hung host comes first in at least one (7 times in 8).
        for _ in range(3):
            started = time.monotonic()
            node.check(timeout_s=3.0)
            assert time.monotonic() - started < 3.5
    finally:
        _closed(held)
