"""How ratchet's processes open a Cassandra cluster: the driver settings in one place.

Native protocol v4, not v5 (which the driver would negotiate with Cassandra 5): v5
wraps every frame in a segment with a CRC24 header and a CRC32 payload checksum, and
cassandra-driver computes the CRC24 in pure Python on both directions. Measured on
this stack (one client, 12 requests in flight, half 1 KiB inserts, half reads):
173-180 us of client CPU per request with v4 against 202-230 us with v5, and the
driver is the worker's largest CPU cost (docs/decisions.md, "Promotion cost"). v4
has everything the store uses: prepared statements, conditional batches, SERIAL
reads, paging. What v5 adds is the segment checksum on top of TCP's.

The default execution profile names its load-balancing policy: the driver's own default
(``TokenAwarePolicy(DCAwareRoundRobinPolicy())``, the local DC taken from the contact
points), so nothing about routing changes. Left to the driver, every ``Cluster`` with
contact points logged "no load_balancing_policy ... this will raise an error" at each
start of the worker, the API and the benches (session 45).
"""

from __future__ import annotations

import asyncio
from typing import Any

from cassandra import ConsistencyLevel, DriverException
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    ResponseFuture,
)
from cassandra.connection import ConnectionException
from cassandra.policies import DCAwareRoundRobinPolicy, LoadBalancingPolicy, TokenAwarePolicy
from cassandra.protocol import ErrorMessage

from ratchet.settings import Settings

PROTOCOL_VERSION = 4

# How long a first connect may take: each connection's handshake (``connect_timeout``,
# the driver's 5 s: two round trips) and the control connection's first queries
# (``control_connection_timeout``, the driver's 2 s), which read the whole cluster's
# schema: 59 keyspaces and 715 tables on the shared node, ~1 s quiet and more under
# load. A worker or an API starting on a busy node failed ``NoHostAvailable
# (OperationTimedOut)``, said as "cannot reach Cassandra" (session 52, rconnect). The
# price: a contact point that accepts and never answers holds a start this long, each
# in turn (one refusing, or down, fails at once). ``ratchet migrate`` takes it too.
CONNECT_TIMEOUT_S = 20.0


def connect_options() -> dict[str, float]:
    """The driver's connect timeouts (``CONNECT_TIMEOUT_S``): every ``Cluster`` ratchet
    opens takes them (``open_cluster``; migrate's and the smoke check's own)."""
    return {"connect_timeout": CONNECT_TIMEOUT_S,
            "control_connection_timeout": CONNECT_TIMEOUT_S}

# What cassandra-driver raises when Cassandra, or the way to it, fails a request: the
# store's and the ledger's guards turn these into an outage to retry, never a record
# dead-lettered as a bug. They share no base class: ``DriverException`` (timeouts and
# the server's answers the driver maps, ``RequestExecutionException`` among them),
# ``NoHostAvailable``, ``ErrorMessage`` (every server error answer, e.g. "Server is
# shutting down", mapped or not) and ``ConnectionException`` (e.g.
# ``ConnectionShutdown``: the connection reset after the request was sent). The last
# two were each once missed by a guard, and a Cassandra restart in a chaos run
# dead-lettered the event they failed (docs/decisions.md, "Every driver outage is
# retried").
DRIVER_OUTAGES: tuple[type[BaseException], ...] = (
    DriverException,
    NoHostAvailable,
    ErrorMessage,
    ConnectionException,
    OSError,
)


def load_balancing_policy(settings: Settings | None = None) -> LoadBalancingPolicy:
    """The policy every request uses: cassandra-driver 3's default, named (token aware,
    over round robin within the local DC; remote DCs' hosts never used). The local DC is
    ``RATCHET_CASSANDRA_LOCAL_DC``, or when unset the DC of the contact point the driver
    reaches first. One per ``Cluster``: a policy holds the hosts it routes to."""
    local_dc = settings.cassandra_local_dc if settings is not None else ""
    return TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=local_dc))


def several_datacenters(settings: Settings) -> bool:
    """Whether workers or APIs run in more than one datacenter (``RATCHET_DATACENTERS``)."""
    return settings.datacenters == "several"


def store_levels(settings: Settings) -> dict[str, int]:
    """The checkpoint store's consistency levels (``CassandraCheckpointStore``'s
    arguments) for ``settings``: the one place the worker, the API and ``connect`` take
    them from.

    One datacenter: reads and commits at ``LOCAL_QUORUM``, Paxos at ``SERIAL``. Several:
    a read at ``LOCAL_QUORUM`` need not overlap a commit acknowledged by another
    datacenter's local quorum (a worker there counts a lineage miss toward ``CORRUPT``,
    an API answers ``NOT_FOUND``), so reads and commits are at ``QUORUM`` of every
    datacenter's replicas, which any two overlap. Paxos stays ``SERIAL``, never
    ``LOCAL_SERIAL`` (two datacenters could both win one conditional write). The
    ledger's levels are ``QUORUM`` and ``SERIAL`` in both cases. docs/decisions.md,
    "Workers and APIs in several datacenters, as a setting"."""
    local = not several_datacenters(settings)
    level = ConsistencyLevel.LOCAL_QUORUM if local else ConsistencyLevel.QUORUM
    return {"read_consistency": level, "write_consistency": level,
            "serial_consistency": ConsistencyLevel.SERIAL}


def default_level(settings: Settings | None) -> int:
    """The level of a statement that names none (e.g. the start's schema check of the
    migrations recorded): the driver's ``LOCAL_ONE``; ``QUORUM`` with several
    datacenters, so that a process in one sees a migration recorded from another."""
    several = settings is not None and several_datacenters(settings)
    return ConsistencyLevel.QUORUM if several else ConsistencyLevel.LOCAL_ONE


def default_profile(settings: Settings | None = None) -> ExecutionProfile:
    """The default execution profile: the driver's own defaults (10 s request timeout,
    ``LOCAL_ONE``, named-tuple rows, ``RetryPolicy``), its load-balancing policy named;
    its level ``default_level(settings)``."""
    return ExecutionProfile(load_balancing_policy=load_balancing_policy(settings),
                            consistency_level=default_level(settings))


# cassandra-driver's ``schema_event_refresh_window`` that turns off its refresh on
# SCHEMA_CHANGE events (any negative value, the driver's documented switch).
NO_SCHEMA_EVENT_REFRESH = -1


def open_cluster(settings: Settings, **options: Any) -> Cluster:
    """A ``Cluster`` for ``settings``' hosts (not connected yet); ``options`` go to the
    driver as they are (e.g. a reconnection policy). Its default execution profile is
    ``default_profile()`` unless ``options`` configure profiles themselves; its connect
    timeouts ``connect_options()``. With ``RATCHET_CASSANDRA_SCHEMA_EVENTS=ignore`` (the
    default) it does not re-read the schema when Cassandra announces a change: each
    announced change of any keyspace cost every connected process a schema agreement
    check and 5-6 ``system_schema`` reads (~13.6 requests/s per idle process on the
    shared node, session 53). The schema read at connect stays: token-aware routing
    takes the keyspace's replication from it; a keyspace's replication altered later is
    routed by the old one until the process restarts (a request to a non-replica is
    forwarded, never wrong)."""
    if "execution_profiles" not in options and "load_balancing_policy" not in options:
        options["execution_profiles"] = {EXEC_PROFILE_DEFAULT: default_profile(settings)}
    if settings.cassandra_schema_events == "ignore":
        options.setdefault("schema_event_refresh_window", NO_SCHEMA_EVENT_REFRESH)
    return Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port,
                   protocol_version=PROTOCOL_VERSION, **{**connect_options(), **options})


class UnknownLocalDatacenter(Exception):
    """``RATCHET_CASSANDRA_LOCAL_DC`` names a datacenter none of the cluster's nodes is
    in: ``str()`` is the operator's line."""


def connect(cluster: Cluster, settings: Settings, keyspace: str | None = None) -> Any:
    """``cluster.connect(keyspace)``; a named local datacenter the cluster lacks is
    ``UnknownLocalDatacenter`` naming it and the datacenters there are. The policy then
    finds no host to use and the driver says only ``NoHostAvailable``, which a start
    read as a keyspace not migrated (session 52's review)."""
    try:
        return cluster.connect(keyspace)
    except NoHostAvailable:
        unknown = _unknown_local_datacenter(cluster, settings)
        if unknown is not None:
            raise unknown from None
        raise


def _unknown_local_datacenter(cluster: Cluster,
                              settings: Settings) -> UnknownLocalDatacenter | None:
    """``UnknownLocalDatacenter`` when the nodes ``cluster`` has read are in datacenters
    none of which is ``RATCHET_CASSANDRA_LOCAL_DC``; None when it names one of them, is
    unset, or no node was read (the control connection reads every node's datacenter
    before a session fails; none read, Cassandra unreachable, is no evidence of a wrong
    name)."""
    local_dc = settings.cassandra_local_dc
    known = sorted({h.datacenter for h in cluster.metadata.all_hosts() if h.datacenter})
    if local_dc and known and local_dc not in known:
        return UnknownLocalDatacenter(
            f"RATCHET_CASSANDRA_LOCAL_DC={local_dc!r}: no node of the cluster at "
            f"{','.join(settings.cassandra_hosts)}:{settings.cassandra_port} is in that "
            f"datacenter (its datacenters: {', '.join(known)})")
    return None


def check_local_datacenter(settings: Settings) -> None:
    """Raise ``UnknownLocalDatacenter`` when ``RATCHET_CASSANDRA_LOCAL_DC`` names a
    datacenter the cluster lacks; return at once when it is unset. The commands that do
    not start through ``connect`` (migrate, smoke, demo, chaos, the benches) call it
    first: each said the driver's ``NoHostAvailable``, or a traceback, or nothing (migrate
    and smoke's keyspace use a round-robin policy and ran) where the worker and the API
    say this line (session 53). The cluster it opens reads the nodes' datacenters only
    (no schema, no token map; a round-robin policy, so no host of the name is needed).
    Cassandra unreachable or unresolvable: it returns, and the command says so its own
    way."""
    if not settings.cassandra_local_dc:
        return
    from cassandra.policies import RoundRobinPolicy

    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy())
    try:  # a host name that resolves to nothing: the command says it
        cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port,
                          protocol_version=PROTOCOL_VERSION, schema_metadata_enabled=False,
                          token_metadata_enabled=False,
                          execution_profiles={EXEC_PROFILE_DEFAULT: profile},
                          **connect_options())
    except DRIVER_OUTAGES:
        return
    try:
        try:
            cluster.connect()
        except DRIVER_OUTAGES:
            return
        unknown = _unknown_local_datacenter(cluster, settings)
    finally:
        cluster.shutdown()
    if unknown is not None:
        raise unknown


async def completed(future: ResponseFuture) -> None:
    """Wait on the event loop, without a thread, until a driver request is answered
    (or failed); ``future.result()`` then returns or raises at once. The driver's I/O
    thread hands the answer over with one ``call_soon_threadsafe``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(_: object = None) -> None:
        loop.call_soon_threadsafe(_resolve, done)

    future.add_callbacks(settle, settle)
    await done


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class NoKeyspace(ValueError):
    """A store or ledger was given no keyspace and a session connected to none."""


def keyspace_of(session: Any, keyspace: str | None) -> str:
    """The keyspace every statement ratchet prepares names before its tables.

    Cassandra (4.0 and later) answers the prepare of a statement that leaves the keyspace
    to the session's ``USE`` with a warning ("`USE <keyspace>` with prepared statements is
    considered to be an anti-pattern"), which cassandra-driver logs at WARNING: once per
    statement and keyspace the server had not prepared yet, so at the start of a worker
    or an API on a keyspace new to the server (session 45). Qualified, the statement
    reads the same table and draws no warning.
    ``keyspace`` None: the session's own (``cluster.connect(keyspace)``); neither is
    ``NoKeyspace``, before any statement is prepared.
    """
    name = keyspace or getattr(session, "keyspace", None)
    if not name:
        raise NoKeyspace("no keyspace: pass one, or a session connected to one")
    return name
