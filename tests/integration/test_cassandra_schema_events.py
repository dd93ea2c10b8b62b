"""On a real Cassandra: a cluster opened as the worker and the API open theirs
(``open_cluster``) sends nothing when another client changes the schema, unless
``RATCHET_CASSANDRA_SCHEMA_EVENTS=follow``; its token-aware routing still knows the
keyspace's replicas (the schema read at connect). Session 53: on the shared node every
idle worker and API re-read ``system_schema`` at each of the other clients' DDL, ~13.6
to 79 requests a second each (docs/decisions.md, "What an idle ratchet costs
Cassandra")."""

from __future__ import annotations

import dataclasses
import time

import pytest

from services.cassandra_cluster import connect, open_cluster

pytestmark = pytest.mark.integration


def _schema_reads_after_a_change(settings, cassandra_session, keyspace, unique_name,
                                 seconds: float) -> tuple[int, object]:
    """The control connection's requests reading ``system_schema`` or the schema version
    within ``seconds`` of a table created in ``keyspace`` by another client, and the
    cluster (shut down by the caller)."""
    cluster = open_cluster(settings)
    connect(cluster, settings)
    sent: list[str] = []
    conn = cluster.control_connection._connection
    send = conn.send_msg

    def counting(msg, *args, **kwargs):
        sent.append(getattr(msg, "query", "") or "")
        return send(msg, *args, **kwargs)

    conn.send_msg = counting
    cassandra_session.execute(f"CREATE TABLE {keyspace}.{unique_name('t')} (k int PRIMARY KEY)",
                              timeout=60)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not _schema(sent):
        time.sleep(0.1)
    return len(_schema(sent)), cluster


def _schema(sent: list[str]) -> list[str]:
    return [q for q in sent if "system_schema" in q or "schema_version" in q]


@pytest.mark.parametrize("mode", ["ignore", "follow"])
def test_a_schema_change_elsewhere_is_re_read_only_when_following(
        settings, cassandra_session, fresh_keyspace, unique_name, mode):
    own = dataclasses.replace(settings, keyspace=fresh_keyspace, cassandra_schema_events=mode)
    # the driver's refresh comes within its 2 s window of the event, under load later
    reads, cluster = _schema_reads_after_a_change(own, cassandra_session, fresh_keyspace,
                                                  unique_name, seconds=8.0)
    try:
        if mode == "ignore":
            assert reads == 0
        else:
            assert reads > 0
        # token-aware routing knows the keyspace's replicas either way
        assert cluster.metadata.get_replicas(fresh_keyspace, b"\x00\x00\x00\x01")
    finally:
        cluster.shutdown()
