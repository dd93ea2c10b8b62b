"""The first connect of a worker, an API, a bench, a chaos run or the smoke check to a
slow Cassandra (session 52, rconnect): cassandra-driver gives a connection's handshake
5 s and the control connection's first queries (the whole cluster's schema: ~700
tables on the shared node) 2 s by default, so a start on a busy node failed
``NoHostAvailable (OperationTimedOut)``, said as "cannot reach Cassandra".
``services/cassandra_cluster.py`` gives both ``CONNECT_TIMEOUT_S``, for every caller."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from cassandra.policies import ExponentialReconnectionPolicy

from ratchet.settings import Settings
from services.cassandra_cluster import CONNECT_TIMEOUT_S, connect_options, open_cluster
from tests.slow_link import SlowLink


def test_every_cluster_opened_gives_the_connect_and_the_control_connection_one_bound():
    """The worker's options (a reconnection policy) or none, and the smoke check's and
    migrate's own clusters, which take ``connect_options()``: the same two timeouts."""
    assert connect_options() == {"connect_timeout": CONNECT_TIMEOUT_S,
                                 "control_connection_timeout": CONNECT_TIMEOUT_S}
    for options in ({}, {"reconnection_policy": ExponentialReconnectionPolicy(0.5, 4.0)}):
        cluster = open_cluster(Settings(), **options)
        assert cluster.connect_timeout == CONNECT_TIMEOUT_S
        assert cluster.control_connection_timeout == CONNECT_TIMEOUT_S


@pytest.mark.integration
def test_a_cluster_opened_connects_through_a_cassandra_that_answers_late(settings):
    """Each of Cassandra's answers 2.5 s late (latency, in order): the connect of an
    ``open_cluster`` cluster (the worker's own options) succeeds and its session reads.
    Before: ``NoHostAvailable`` (the handshake's two round trips over 5 s, the schema
    read over 2 s)."""
    link = SlowLink(settings.cassandra_hosts[0], settings.cassandra_port, delay_s=2.5)
    slow = dataclasses.replace(settings, cassandra_hosts=("127.0.0.1",),
                               cassandra_port=link.port)
    cluster = open_cluster(slow, reconnection_policy=ExponentialReconnectionPolicy(0.5, 4.0))
    try:
        session = cluster.connect()
        row = session.execute("SELECT release_version FROM system.local", timeout=30).one()
        assert row.release_version
    finally:
        cluster.shutdown()
        link.close()


@pytest.mark.integration
def test_the_loop_session_connects_through_a_cassandra_that_answers_late(
    cassandra_session, settings
):
    """The C++ driver's session (the worker's promotions, the API's reads), connected on
    its first request: through the same link it connects (~25 s: many round trips) and
    answers. Before: ``LoopRequestFailed`` ("Connection timeout") after 5 s, the
    request's own bound, at every first request while the node stayed that slow."""
    from cassandra.query import PreparedStatement

    from services.cassandra_loop import LoopSession

    statement: PreparedStatement = cassandra_session.prepare(
        "SELECT release_version FROM system.local")
    link = SlowLink(settings.cassandra_hosts[0], settings.cassandra_port, delay_s=2.5)
    slow = dataclasses.replace(settings, cassandra_hosts=("127.0.0.1",),
                               cassandra_port=link.port, keyspace="system")
    loop_session = LoopSession(slow)
    runner = asyncio.Runner()
    try:
        answer = runner.run(loop_session.execute(statement, ()))
        assert answer.one()[0]
    finally:
        runner.run(loop_session.close())
        runner.close()
        link.close()
