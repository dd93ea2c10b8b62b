"""One frozen settings object per process, read from ``RATCHET_*`` variables in one place.

Every adapter (launcher, store, processor, API, gateway client) takes a ``Settings``
instead of reading the environment itself, so tests can inject their own.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


class SettingsError(ValueError):
    """A ``RATCHET_*`` variable holds a value that cannot be used."""


LOOP_DRIVERS = ("acsylla", "cassandra-driver")
EVENT_LOOPS = ("uvloop", "asyncio")
WORKER_CONSUMERS = ("loop", "thread")
# Where the workers and APIs of one deployment run (RATCHET_DATACENTERS): "one"
# datacenter (replicas may be elsewhere), or "several", where every read a decision or a
# gateway relies on must overlap a commit made in any of them (services/cassandra_cluster.py,
# ``store_levels``).
DATACENTERS = ("one", "several")
# What a worker's or an API's drivers do when Cassandra announces a schema change of any
# keyspace (RATCHET_CASSANDRA_SCHEMA_EVENTS): "ignore" it (the schema read at connect is
# kept) or "follow" it (re-read the changed keyspace: the drivers' default).
SCHEMA_EVENTS = ("ignore", "follow")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_PORT = 65535
# Upper bounds, so that a value no deployment means fails at start naming its variable,
# not later in a driver or a client (2**31 partitions, 2**63 us: an outside review,
# session 26).
MAX_PARTITIONS = 10_000
MAX_MICROSECONDS = 1_000_000
MAX_BYTES = 1 << 40
MAX_COUNT = 100_000_000
MAX_WINDOW = 1_000
MAX_STALL_S = 86_400
# RATCHET_KAFKA_REQUEST_TIMEOUT_S: Faust's own default (1 200 s) is the most it may be;
# below 5 s a publish of an outcome at the topics' size limit (schemas/limits.py) to a
# busy broker may time out on every attempt, and its partition never move.
MIN_KAFKA_REQUEST_S = 5
MAX_KAFKA_REQUEST_S = 1_200
# A held Kafka fetch waits at most this (RATCHET_FETCH_WAIT_MS): each paced turn may wait
# the whole of it, so more than a second is never what a deployment wants.
MAX_FETCH_WAIT_MS = 1_000
# A retention whose expiry would pass the year 9999 cannot be stored (a Cassandra
# timestamp, a Python datetime): 100 years is far beyond any use and safely inside.
MAX_RETENTION_S = 100 * 366 * 24 * 3600
# Unquoted CQL names fold to lower case: a keyspace given in upper case would be
# created under another name than the one the processes then ask for.
_KEYSPACE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]*$")  # Kafka's legal topic characters
# A host name as resolvers take it: an absolute one (a trailing dot), underscores
# (docker-compose's service_1); no port, no scheme, no spaces.
_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252}[A-Za-z0-9_.])?")
# A CQL replication map: quoted names, quoted names or integers as values. Pasted into
# ``CREATE KEYSPACE`` by ``ratchet migrate``: anything beyond the map (``} AND
# durable_writes = false``) was run as CQL (an operator's review, session 38).
_REPLICATION_ENTRY = r"\s*'[A-Za-z0-9_.-]+'\s*:\s*(?:'[A-Za-z0-9_.-]+'|[0-9]+)\s*"
_REPLICATION = re.compile(rf"\{{{_REPLICATION_ENTRY}(?:,{_REPLICATION_ENTRY})*\}}")
_REPLICATION_CLASS = re.compile(r"[{,]\s*'class'\s*:")
MAX_GROUP = 249 - len("-__assignor-__leader")
_GROUP = re.compile(rf"^[A-Za-z0-9._-]{{1,{MAX_GROUP}}}$")


def _raw(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, None when unset. Set but empty is refused: an unset shell
    variable expanded into it (``RATCHET_HOME=$HOME_OF_TEST``) must not silently mean
    the default, e.g. the home whose servers ``infra down`` then stops."""
    raw = env.get(name)
    if raw is not None and raw.strip() == "":
        raise SettingsError(f"{name} is set but empty: unset it to use its default")
    return raw


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = _raw(env, name)
    if raw is None:
        return default
    if raw not in allowed:
        raise SettingsError(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return raw


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0,
         maximum: int | None = None) -> int:
    raw = _raw(env, name)
    if raw is None:
        return default
    # Plain ASCII digits (a leading '-' for the minimum's message): Python's int() also
    # takes '1_0', '+3' and other scripts' digits, which no document describes.
    if not re.fullmatch(r"-?[0-9]+", raw.strip()):
        raise SettingsError(f"{name}={raw!r} is not an integer (digits only)")
    value = int(raw)
    if value < minimum:
        raise SettingsError(f"{name}={value} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name}={value} must be <= {maximum}")
    return value


def _port(env: Mapping[str, str], name: str, default: int, minimum: int = 1) -> int:
    return _int(env, name, default, minimum, MAX_PORT)


def _log_level(env: Mapping[str, str], default: str) -> str:
    """Any case, as Faust and logging read it; ``WARN`` is ``WARNING``."""
    raw = _raw(env, "RATCHET_LOG_LEVEL")
    if raw is None:
        return default
    level = {"WARN": "WARNING"}.get(raw.strip().upper(), raw.strip().upper())
    if level not in LOG_LEVELS:
        raise SettingsError(f"RATCHET_LOG_LEVEL={raw!r} is not one of "
                            f"{', '.join(LOG_LEVELS)} (any case)")
    return level


def _is_host(value: str) -> bool:
    """An IP address, or a host name that is not digits and dots alone: the resolver
    reads '0' as 0.0.0.0 (every interface) and '1.5' as 1.0.0.5 (an outside review,
    session 26). A port is never part of it (the ports are settings of their own)."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(_HOST_NAME.fullmatch(value)) and not value.replace(".", "").isdigit()


def _bind_host(env: Mapping[str, str], name: str, default: str) -> str:
    """An address to listen on. ``0.0.0.0:8080`` made the API exit with a bare
    name-resolution error and the worker serve no metrics (an outside review)."""
    value = _text(env, name, default)
    if not _is_host(value):
        raise SettingsError(f"{name}={value!r}: an IP address or a host name, without "
                            "a port (the ports have settings of their own)")
    return value


def _cassandra_host(value: str) -> None:
    """``127.0.0.1:9042``, as Kafka's bootstrap takes it, ended in the driver's
    traceback (an outside review of the operator's commands, session 26)."""
    if not _is_host(value):
        raise SettingsError(f"RATCHET_CASSANDRA_HOSTS entry {value!r}: an IP address or a "
                            "host name, without a port (RATCHET_CASSANDRA_PORT is the port)")


_DC_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _local_dc(env: Mapping[str, str], default: str) -> str:
    """A datacenter name as the snitch gives it (``dc1``, ``us-east``); spaces and
    commas are refused (a list of datacenters is no local one)."""
    raw = _raw(env, "RATCHET_CASSANDRA_LOCAL_DC")
    if raw is None:
        return default
    if not _DC_NAME.fullmatch(raw):
        raise SettingsError(f"RATCHET_CASSANDRA_LOCAL_DC={raw!r}: one datacenter name "
                            "(letters, digits, '_', '.', ':' or '-', at most 64)")
    return raw


def _group(env: Mapping[str, str], default: str) -> str:
    value = _text(env, "RATCHET_CONSUMER_GROUP", default)
    if not _GROUP.match(value):
        # Faust names a topic of its own ``<group>-__assignor-__leader``: 20 characters
        # more, within Kafka's 249 (a longer group failed after the topics were made).
        raise SettingsError(f"RATCHET_CONSUMER_GROUP={value!r}: 1 to {MAX_GROUP} of letters, "
                            "digits, '.', '_' and '-'")
    return value


def _replication(env: Mapping[str, str], default: str) -> str:
    value = _text(env, "RATCHET_REPLICATION", default)
    if not (_REPLICATION.fullmatch(value) and _REPLICATION_CLASS.search(value)):
        raise SettingsError(
            f"RATCHET_REPLICATION={value!r}: a CQL replication map with its 'class', e.g. "
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3}")
    return value


def _home(raw: str) -> Path:
    """``RATCHET_HOME`` as an absolute path (``~`` expanded). The launcher starts each
    server in its data directory, so a relative home named jars and config that were
    not there: Kafka exited "Could not find or load main class kafka.Kafka" (an
    operator's review, session 43)."""
    return Path(os.path.abspath(os.path.expanduser(raw)))


def _text(env: Mapping[str, str], name: str, default: str) -> str:
    raw = _raw(env, name)
    return default if raw is None else raw


def _bootstrap(env: Mapping[str, str], name: str, default: str) -> str:
    """``host[:port][,host[:port]...]`` as every Kafka client here reads it (a host
    without a port is 9092; empty entries are skipped); a port that is not a number in
    range is refused."""
    value = _text(env, name, default)
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise SettingsError(f"{name}={value!r} names no server")
    for server in servers:
        host, colon, port = server.rpartition(":")
        if not colon or host.endswith(":") or server.endswith("]"):
            continue  # a bare host (IPv6 in brackets too): the clients' default port
        if not host or not port.isdigit() or not 1 <= int(port) <= MAX_PORT:
            raise SettingsError(f"{name}={value!r}: {server!r} is not host[:port]")
    return value


def _urls(env: Mapping[str, str], name: str, default: str) -> str:
    """One ``http(s)://host[:port][/path]`` URL, or several separated by commas (the
    registry client fails over between them)."""
    value = _text(env, name, default).rstrip("/")
    for url in value.split(","):
        try:
            parts = urlsplit(url.strip())
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as exc:
            raise SettingsError(f"{name}={value!r}: {url.strip()!r} is not a URL: "
                                f"{exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"{name}={value!r}: {url.strip()!r} is not an "
                                f"http(s)://host[:port] URL")
    return value


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str = "127.0.0.1:9092"
    schema_registry_url: str = "http://127.0.0.1:8081/apis/ccompat/v7"
    cassandra_hosts: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 9042
    # The datacenter whose nodes this process sends its requests to (the driver's
    # DCAwareRoundRobinPolicy local_dc); "": the datacenter of the contact point the
    # driver reaches first. Named, an API or a worker cannot end up on another
    # datacenter because of the order of RATCHET_CASSANDRA_HOSTS (docs/operations.md,
    # "Several datacenters").
    cassandra_local_dc: str = ""
    # "ignore": cassandra-driver does not re-read the schema when Cassandra announces a schema
    # change (any keyspace's, any client's DDL: a schema agreement check and a re-read of
    # that keyspace's system_schema tables per change, per process); "follow": they do
    # (the drivers' defaults). Nothing a worker or an API does needs the re-read
    # (docs/decisions.md, "What an idle ratchet costs Cassandra").
    cassandra_schema_events: str = "ignore"
    # Cassandra's inter-node (gossip) port of the node `ratchet infra` launches; a second
    # local node (another RATCHET_HOME, e.g. a chaos run's own servers) needs its own.
    cassandra_storage_port: int = 7000
    # Timer slack (microseconds) of the Cassandra JVM `ratchet infra` launches: its
    # worker pool waits for work in timed sleeps of 10 us and up, which a coarser slack
    # merges (docs/decisions.md, "Cassandra's spin-waits"). 0: the kernel's default.
    cassandra_timer_slack_us: int = 200
    keyspace: str = "ratchet"
    # CQL replication map used when `ratchet migrate` creates the keyspace.
    replication: str = "{'class': 'SimpleStrategy', 'replication_factor': 1}"
    topic_prefix: str = "ratchet."
    partitions: int = 12
    # Where `ratchet infra` keeps downloaded servers, their data and logs (outside git).
    home: Path = field(default_factory=lambda: Path.home() / ".cache" / "ratchet")
    api_host: str = "127.0.0.1"
    # The worker's Kafka consumer group: workers of one deployment share it; a second
    # deployment on the same Kafka needs its own (a topic prefix alone does not part
    # them: a group rebalances over every topic its members subscribe to).
    consumer_group: str = "ratchet-promoter"
    api_port: int = 8080
    # The worker's Prometheus exporter (0 = off); it binds to api_host like the API.
    worker_metrics_port: int = 9108
    # How long a logical history is kept after its last promotion (0 = forever).
    logical_retention_s: int = 0
    # Bytes of rendered verified histories each API process keeps (LRU; 0 = no cache).
    # 64 MiB holds ~1000 50-turn histories of 100 items.
    api_history_cache_bytes: int = 64 * 1024 * 1024
    # The largest request body the API reads (services/api/app.py, MAX_BODY_BYTES: every
    # valid effect completion fits, however its JSON is escaped); larger: 413.
    api_max_body_bytes: int = 32 * 1024 * 1024
    # The bytes of large request bodies (above 256 KiB) the API reads and handles at once;
    # more wait (services/api/body_limit.py). Its pod's memory limit rests on it.
    api_body_budget_bytes: int = 64 * 1024 * 1024
    # Seconds a client may take none of an answer's waiting bytes before the API aborts
    # its connection (services/api/slow_readers.py; 0 = never): what a client that does
    # not read holds in the API's memory is freed then.
    api_send_stall_s: int = 30
    # Bytes of full reads running and of the answers they built that are their request's
    # own copy (not the cache's), until written (services/api/answer_budget.py): a full
    # read waits for room, 503 after 5 s. The API pod's memory limit rests on it.
    api_answer_budget_bytes: int = 64 * 1024 * 1024
    # Entries per map of the worker's tail cache (streams/tail_cache.py; 0 = off): it
    # saves the lineage and owner reads of a conversation's next turn.
    tail_cache_entries: int = 10_000
    # Seconds an assigned partition may owe records with none dispatched before the
    # worker's fetch watchdog steps in (streams/fetchwatch.py; 0 = off).
    fetch_stall_s: int = 15
    # Seconds the worker's producer (Faust's, aiokafka's) waits for Kafka's answer to a
    # request: its bootstrap at start (a Kafka that accepts and never answers ends the
    # start, one line, exit 1) and each publish of outcomes (one unanswered is retried,
    # its record unacked). Faust's default, 1 200 s, held a start 20 minutes.
    kafka_request_timeout_s: int = 30
    # Events of one partition the worker handles at once (streams/lanes.py): never two
    # of one Kafka key (a Conversation, a chain), acks in offset order; 1 = one at a time.
    lane_window: int = 1
    # Record bytes (key + value) the worker's lanes may hold at once, waiting or in
    # flight (streams/lanes.py); one record larger than this still runs, alone.
    lane_max_bytes: int = 16 * 1024 * 1024
    # The driver of the requests awaited on an event loop (services/cassandra_loop.py):
    # the worker's promotions and the API's reads. "acsylla" (the C++ driver) or
    # "cassandra-driver" (its callbacks); see docs/decisions.md, "Promotion cost".
    loop_driver: str = "acsylla"
    # Microseconds the API's C++ driver holds a read back, waiting for more requests to
    # share its write (the driver's coalesce delay; its own default, 200, stays the
    # worker's). 0: each read is written at once; a lookup's read is on the gateway's
    # critical path (docs/decisions.md, "Coalesce delay").
    api_coalesce_us: int = 0
    # The worker's asyncio event loop implementation (its main loop, and the loop of
    # Faust's consumer thread if it has one): "uvloop" (libuv, the default) or "asyncio" (the
    # standard library's); see docs/decisions.md, "Promotion cost".
    worker_event_loop: str = "uvloop"
    # Where the worker's Kafka consumer runs (streams/consumer_loop.py): "loop" (on the
    # worker's event loop, the default) or "thread" (faust-streaming's own thread).
    worker_consumer: str = "loop"
    # Milliseconds the broker may hold the worker's fetch, while records flow, until 64
    # KiB of records are there (streams/consumer_loop.py): paced turns share fetches, a
    # backlog is fetched at once, an idle worker does not poll. 0: every fetch is
    # answered at its first record (Faust's default); docs/decisions.md, "Fetches that
    # wait".
    fetch_wait_ms: int = 5
    # "one": every worker and API in one datacenter, the store reading and committing at
    # LOCAL_QUORUM. "several": workers or APIs in more than one, reads and commits at
    # QUORUM (a round trip to the other datacenters each); docs/operations.md, "Several
    # datacenters".
    datacenters: str = "one"
    # The process's own, so not passed on by ``to_env``: a test or a chaos run sets its
    # children's log level itself, and ratchet/speedups.py reads RATCHET_SPEEDUPS from
    # the environment it inherits. Checked here so that a bad value stops the process
    # at start, like every other setting, before anything connects.
    log_level: str = "INFO"
    speedups: str = "1"  # "0": the Python twins of ratchet/_speedups.c

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        d = cls()
        hosts = _raw(env, "RATCHET_CASSANDRA_HOSTS")
        cassandra_hosts = d.cassandra_hosts if hosts is None else tuple(
            h.strip() for h in hosts.split(",") if h.strip())
        if not cassandra_hosts:
            raise SettingsError(f"RATCHET_CASSANDRA_HOSTS={hosts!r} names no host")
        for host in cassandra_hosts:
            _cassandra_host(host)
        keyspace = _text(env, "RATCHET_KEYSPACE", d.keyspace)
        if not _KEYSPACE.match(keyspace):
            raise SettingsError(f"RATCHET_KEYSPACE={keyspace!r}: a lower-case letter, then "
                                f"lower-case letters, digits or _, at most 48 in all")
        # Empty is a valid prefix (topics without one), so not _text.
        topic_prefix = env.get("RATCHET_TOPIC_PREFIX", d.topic_prefix)
        if not _TOPIC_CHARS.match(topic_prefix) or len(topic_prefix) > 200:
            raise SettingsError(f"RATCHET_TOPIC_PREFIX={topic_prefix!r}: at most 200 of "
                                f"letters, digits, '.', '_' and '-' (Kafka topic names)")
        home = _raw(env, "RATCHET_HOME")
        return cls(
            kafka_bootstrap=_bootstrap(env, "RATCHET_KAFKA_BOOTSTRAP", d.kafka_bootstrap),
            schema_registry_url=_urls(env, "RATCHET_SCHEMA_REGISTRY_URL",
                                      d.schema_registry_url),
            cassandra_hosts=cassandra_hosts,
            cassandra_port=_port(env, "RATCHET_CASSANDRA_PORT", d.cassandra_port),
            cassandra_local_dc=_local_dc(env, d.cassandra_local_dc),
            cassandra_schema_events=_choice(env, "RATCHET_CASSANDRA_SCHEMA_EVENTS",
                                            d.cassandra_schema_events, SCHEMA_EVENTS),
            cassandra_storage_port=_port(
                env, "RATCHET_CASSANDRA_STORAGE_PORT", d.cassandra_storage_port
            ),
            cassandra_timer_slack_us=_int(
                env, "RATCHET_CASSANDRA_TIMER_SLACK_US", d.cassandra_timer_slack_us, 0,
                MAX_MICROSECONDS),
            keyspace=keyspace,
            replication=_replication(env, d.replication),
            topic_prefix=topic_prefix,
            partitions=_int(env, "RATCHET_PARTITIONS", d.partitions, 1, MAX_PARTITIONS),
            home=d.home if home is None else _home(home),
            api_host=_bind_host(env, "RATCHET_API_HOST", d.api_host),
            consumer_group=_group(env, d.consumer_group),
            api_port=_port(env, "RATCHET_API_PORT", d.api_port),
            worker_metrics_port=_port(env, "RATCHET_WORKER_METRICS_PORT",
                                      d.worker_metrics_port, 0),
            logical_retention_s=_int(env, "RATCHET_LOGICAL_RETENTION_S", d.logical_retention_s,
                                     0, MAX_RETENTION_S),
            api_history_cache_bytes=_int(
                env, "RATCHET_API_HISTORY_CACHE_BYTES", d.api_history_cache_bytes, 0, MAX_BYTES),
            api_max_body_bytes=_int(env, "RATCHET_API_MAX_BODY_BYTES", d.api_max_body_bytes, 1,
                                    MAX_BYTES),
            api_body_budget_bytes=_int(env, "RATCHET_API_BODY_BUDGET_BYTES",
                                       d.api_body_budget_bytes, 1, MAX_BYTES),
            tail_cache_entries=_int(env, "RATCHET_TAIL_CACHE_ENTRIES", d.tail_cache_entries, 0,
                                    MAX_COUNT),
            fetch_stall_s=_int(env, "RATCHET_FETCH_STALL_S", d.fetch_stall_s, 0, MAX_STALL_S),
            kafka_request_timeout_s=_int(env, "RATCHET_KAFKA_REQUEST_TIMEOUT_S",
                                         d.kafka_request_timeout_s, MIN_KAFKA_REQUEST_S,
                                         MAX_KAFKA_REQUEST_S),
            lane_window=_int(env, "RATCHET_LANE_WINDOW", d.lane_window, 1, MAX_WINDOW),
            lane_max_bytes=_int(env, "RATCHET_LANE_MAX_BYTES", d.lane_max_bytes, 1, MAX_BYTES),
            loop_driver=_choice(env, "RATCHET_LOOP_DRIVER", d.loop_driver, LOOP_DRIVERS),
            api_answer_budget_bytes=_int(env, "RATCHET_API_ANSWER_BUDGET_BYTES",
                                         d.api_answer_budget_bytes, 1, MAX_BYTES),
            api_send_stall_s=_int(env, "RATCHET_API_SEND_STALL_S", d.api_send_stall_s, 0,
                                  MAX_STALL_S),
            api_coalesce_us=_int(env, "RATCHET_API_COALESCE_US", d.api_coalesce_us, 0,
                                 MAX_MICROSECONDS),
            worker_event_loop=_choice(env, "RATCHET_WORKER_EVENT_LOOP", d.worker_event_loop,
                                      EVENT_LOOPS),
            worker_consumer=_choice(env, "RATCHET_WORKER_CONSUMER", d.worker_consumer,
                                    WORKER_CONSUMERS),
            fetch_wait_ms=_int(env, "RATCHET_FETCH_WAIT_MS", d.fetch_wait_ms, 0,
                               MAX_FETCH_WAIT_MS),
            datacenters=_choice(env, "RATCHET_DATACENTERS", d.datacenters, DATACENTERS),
            log_level=_log_level(env, d.log_level),
            speedups=_choice(env, "RATCHET_SPEEDUPS", d.speedups, ("0", "1")),
        )

    def to_env(self) -> dict[str, str]:
        """The ``RATCHET_*`` variables that make a child process's ``from_env`` equal self,
        but for the process's own ``log_level`` and ``speedups`` (see the fields)."""
        return {
            "RATCHET_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "RATCHET_SCHEMA_REGISTRY_URL": self.schema_registry_url,
            "RATCHET_CASSANDRA_HOSTS": ",".join(self.cassandra_hosts),
            "RATCHET_CASSANDRA_PORT": str(self.cassandra_port),
            # Unset means "" (set but empty is refused): only a named one is passed on.
            **({"RATCHET_CASSANDRA_LOCAL_DC": self.cassandra_local_dc}
               if self.cassandra_local_dc else {}),
            "RATCHET_CASSANDRA_SCHEMA_EVENTS": self.cassandra_schema_events,
            "RATCHET_CASSANDRA_STORAGE_PORT": str(self.cassandra_storage_port),
            "RATCHET_CASSANDRA_TIMER_SLACK_US": str(self.cassandra_timer_slack_us),
            "RATCHET_KEYSPACE": self.keyspace,
            "RATCHET_REPLICATION": self.replication,
            "RATCHET_TOPIC_PREFIX": self.topic_prefix,
            "RATCHET_PARTITIONS": str(self.partitions),
            "RATCHET_HOME": str(self.home),
            "RATCHET_API_HOST": self.api_host,
            "RATCHET_CONSUMER_GROUP": self.consumer_group,
            "RATCHET_API_PORT": str(self.api_port),
            "RATCHET_WORKER_METRICS_PORT": str(self.worker_metrics_port),
            "RATCHET_LOGICAL_RETENTION_S": str(self.logical_retention_s),
            "RATCHET_API_HISTORY_CACHE_BYTES": str(self.api_history_cache_bytes),
            "RATCHET_API_MAX_BODY_BYTES": str(self.api_max_body_bytes),
            "RATCHET_API_BODY_BUDGET_BYTES": str(self.api_body_budget_bytes),
            "RATCHET_TAIL_CACHE_ENTRIES": str(self.tail_cache_entries),
            "RATCHET_FETCH_STALL_S": str(self.fetch_stall_s),
            "RATCHET_KAFKA_REQUEST_TIMEOUT_S": str(self.kafka_request_timeout_s),
            "RATCHET_LANE_WINDOW": str(self.lane_window),
            "RATCHET_LANE_MAX_BYTES": str(self.lane_max_bytes),
            "RATCHET_LOOP_DRIVER": self.loop_driver,
            "RATCHET_API_COALESCE_US": str(self.api_coalesce_us),
            "RATCHET_API_SEND_STALL_S": str(self.api_send_stall_s),
            "RATCHET_API_ANSWER_BUDGET_BYTES": str(self.api_answer_budget_bytes),
            "RATCHET_WORKER_EVENT_LOOP": self.worker_event_loop,
            "RATCHET_WORKER_CONSUMER": self.worker_consumer,
            "RATCHET_FETCH_WAIT_MS": str(self.fetch_wait_ms),
            "RATCHET_DATACENTERS": self.datacenters,
        }

    def topic(self, name: str) -> str:
        """Full topic name, e.g. ``topic("checkpoints") -> "ratchet.checkpoints"``."""
        return f"{self.topic_prefix}{name}"
