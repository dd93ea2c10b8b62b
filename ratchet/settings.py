"""One frozen settings object per process, read from ``RATCHET_*`` variables in one place.

Every adapter (launcher, store, processor, API, gateway client) takes a ``Settings``
instead of reading the environment itself, so tests can inject their own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class SettingsError(ValueError):
    """A ``RATCHET_*`` variable holds a value that cannot be used."""


LOOP_DRIVERS = ("acsylla", "cassandra-driver")
EVENT_LOOPS = ("uvloop", "asyncio")
WORKER_CONSUMERS = ("loop", "thread")


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    if raw not in allowed:
        raise SettingsError(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return raw


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be >= {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str = "127.0.0.1:9092"
    schema_registry_url: str = "http://127.0.0.1:8081/apis/ccompat/v7"
    cassandra_hosts: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 9042
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
    api_port: int = 8080
    # The worker's Prometheus exporter (0 = off); it binds to api_host like the API.
    worker_metrics_port: int = 9108
    # How long a logical history is kept after its last promotion (0 = forever).
    logical_retention_s: int = 0
    # Bytes of rendered verified histories each API process keeps (LRU; 0 = no cache).
    # 64 MiB holds ~1000 50-turn histories of 100 items; every hit is revalidated.
    api_history_cache_bytes: int = 64 * 1024 * 1024
    # The largest request body the API reads (services/api/app.py, MAX_BODY_BYTES: every
    # valid effect completion fits, however its JSON is escaped); larger: 413.
    api_max_body_bytes: int = 32 * 1024 * 1024
    # Entries per map of the worker's tail cache (streams/tail_cache.py; 0 = off): it
    # saves the lineage and owner reads of a conversation's next turn.
    tail_cache_entries: int = 10_000
    # Seconds an assigned partition may owe records with none dispatched before the
    # worker's fetch watchdog steps in (streams/fetchwatch.py; 0 = off).
    fetch_stall_s: int = 15
    # Events of one partition the worker handles at once (streams/lanes.py): never two
    # of one Kafka key (a Conversation, a chain), acks in offset order; 1 = one at a time.
    lane_window: int = 1
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

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        d = cls()
        hosts = env.get("RATCHET_CASSANDRA_HOSTS")
        return cls(
            kafka_bootstrap=env.get("RATCHET_KAFKA_BOOTSTRAP") or d.kafka_bootstrap,
            schema_registry_url=(
                env.get("RATCHET_SCHEMA_REGISTRY_URL") or d.schema_registry_url
            ).rstrip("/"),
            cassandra_hosts=tuple(h.strip() for h in hosts.split(",") if h.strip())
            if hosts
            else d.cassandra_hosts,
            cassandra_port=_int(env, "RATCHET_CASSANDRA_PORT", d.cassandra_port, 1),
            cassandra_storage_port=_int(
                env, "RATCHET_CASSANDRA_STORAGE_PORT", d.cassandra_storage_port, 1
            ),
            cassandra_timer_slack_us=_int(
                env, "RATCHET_CASSANDRA_TIMER_SLACK_US", d.cassandra_timer_slack_us
            ),
            keyspace=env.get("RATCHET_KEYSPACE") or d.keyspace,
            replication=env.get("RATCHET_REPLICATION") or d.replication,
            topic_prefix=env.get("RATCHET_TOPIC_PREFIX", d.topic_prefix),
            partitions=_int(env, "RATCHET_PARTITIONS", d.partitions, 1),
            home=Path(env["RATCHET_HOME"]) if env.get("RATCHET_HOME") else d.home,
            api_host=env.get("RATCHET_API_HOST") or d.api_host,
            api_port=_int(env, "RATCHET_API_PORT", d.api_port, 1),
            worker_metrics_port=_int(env, "RATCHET_WORKER_METRICS_PORT", d.worker_metrics_port),
            logical_retention_s=_int(env, "RATCHET_LOGICAL_RETENTION_S", d.logical_retention_s),
            api_history_cache_bytes=_int(
                env, "RATCHET_API_HISTORY_CACHE_BYTES", d.api_history_cache_bytes
            ),
            api_max_body_bytes=_int(env, "RATCHET_API_MAX_BODY_BYTES", d.api_max_body_bytes, 1),
            tail_cache_entries=_int(env, "RATCHET_TAIL_CACHE_ENTRIES", d.tail_cache_entries),
            fetch_stall_s=_int(env, "RATCHET_FETCH_STALL_S", d.fetch_stall_s),
            lane_window=_int(env, "RATCHET_LANE_WINDOW", d.lane_window, 1),
            loop_driver=_choice(env, "RATCHET_LOOP_DRIVER", d.loop_driver, LOOP_DRIVERS),
            api_coalesce_us=_int(env, "RATCHET_API_COALESCE_US", d.api_coalesce_us),
            worker_event_loop=_choice(env, "RATCHET_WORKER_EVENT_LOOP", d.worker_event_loop,
                                      EVENT_LOOPS),
            worker_consumer=_choice(env, "RATCHET_WORKER_CONSUMER", d.worker_consumer,
                                    WORKER_CONSUMERS),
        )

    def to_env(self) -> dict[str, str]:
        """The ``RATCHET_*`` variables that make a child process's ``from_env`` equal self."""
        return {
            "RATCHET_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "RATCHET_SCHEMA_REGISTRY_URL": self.schema_registry_url,
            "RATCHET_CASSANDRA_HOSTS": ",".join(self.cassandra_hosts),
            "RATCHET_CASSANDRA_PORT": str(self.cassandra_port),
            "RATCHET_CASSANDRA_STORAGE_PORT": str(self.cassandra_storage_port),
            "RATCHET_CASSANDRA_TIMER_SLACK_US": str(self.cassandra_timer_slack_us),
            "RATCHET_KEYSPACE": self.keyspace,
            "RATCHET_REPLICATION": self.replication,
            "RATCHET_TOPIC_PREFIX": self.topic_prefix,
            "RATCHET_PARTITIONS": str(self.partitions),
            "RATCHET_HOME": str(self.home),
            "RATCHET_API_HOST": self.api_host,
            "RATCHET_API_PORT": str(self.api_port),
            "RATCHET_WORKER_METRICS_PORT": str(self.worker_metrics_port),
            "RATCHET_LOGICAL_RETENTION_S": str(self.logical_retention_s),
            "RATCHET_API_HISTORY_CACHE_BYTES": str(self.api_history_cache_bytes),
            "RATCHET_API_MAX_BODY_BYTES": str(self.api_max_body_bytes),
            "RATCHET_TAIL_CACHE_ENTRIES": str(self.tail_cache_entries),
            "RATCHET_FETCH_STALL_S": str(self.fetch_stall_s),
            "RATCHET_LANE_WINDOW": str(self.lane_window),
            "RATCHET_LOOP_DRIVER": self.loop_driver,
            "RATCHET_API_COALESCE_US": str(self.api_coalesce_us),
            "RATCHET_WORKER_EVENT_LOOP": self.worker_event_loop,
            "RATCHET_WORKER_CONSUMER": self.worker_consumer,
        }

    def topic(self, name: str) -> str:
        """Full topic name, e.g. ``topic("checkpoints") -> "ratchet.checkpoints"``."""
        return f"{self.topic_prefix}{name}"
