"""Apache Cassandra 5.0.6 as one node, launched as plain ``java`` (no bin/cassandra).

The yaml is minimal and tuned for a 2-core machine: one token, small thread pools,
no snapshots on drop, Paxos v2 (two round trips per LWT instead of four), and a
timer slack of 200 us for the JVM (``RATCHET_CASSANDRA_TIMER_SLACK_US``).
"""

from __future__ import annotations

import json
import socket
import threading
import time

from infra.fetch import fetch_jars
from infra.jdk import java17
from infra.servers.base import Port, Server, Unhealthy

VERSION = "5.0.6"
ARTIFACTS = [f"org.apache.cassandra:cassandra-all:{VERSION}"]
HEAP = ["-Xms1g", "-Xmx1g", "-Xmn256m"]

# Module access that Cassandra needs on Java 17 (the list of its conf/jvm17-server.options).
_EXPORTS = [
    "java.base/jdk.internal.misc", "java.base/jdk.internal.ref", "java.base/sun.nio.ch",
    "java.management.rmi/com.sun.jmx.remote.internal.rmi", "java.rmi/sun.rmi.registry",
    "java.rmi/sun.rmi.server", "java.sql/java.sql", "java.base/java.lang.ref",
    "jdk.unsupported/sun.misc",
]
_OPENS = [
    "java.base/java.lang.module", "java.base/jdk.internal.loader", "java.base/jdk.internal.ref",
    "java.base/jdk.internal.reflect", "java.base/jdk.internal.math",
    "java.base/jdk.internal.module", "java.base/jdk.internal.util.jar",
    "jdk.management/com.sun.management.internal", "java.base/sun.nio.ch", "java.base/java.io",
    "java.base/java.nio", "java.base/java.util.concurrent", "java.base/java.util",
    "java.base/java.util.concurrent.atomic", "java.base/java.lang", "java.base/java.math",
    "java.base/java.lang.reflect", "java.base/java.net",
]

_LOGBACK = """<configuration scan="false">
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%date{ISO8601} %-5level [%thread] %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <logger name="org.apache.cassandra" level="INFO"/>
  <root level="WARN"><appender-ref ref="STDOUT"/></root>
</configuration>
"""


def _accepting(hosts: tuple[str, ...], port: int, timeout_s: float) -> list[str]:
    """The hosts that accept a TCP connection on ``port``, all tried at once for at most
    ``timeout_s`` together: one at a time, each hung host (a machine gone, a firewall
    dropping SYNs) added its own timeout past the caller's deadline (session 52's
    review)."""
    accepted = [False] * len(hosts)

    def probe(i: int) -> None:
        try:
            with socket.create_connection((hosts[i], port), timeout=timeout_s):
                accepted[i] = True
        except OSError:
            pass

    threads = [threading.Thread(target=probe, args=(i,), daemon=True)
               for i in range(len(hosts))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [h for h, ok in zip(hosts, accepted, strict=True) if ok]


class Cassandra(Server):
    name = "cassandra"
    version = VERSION
    start_timeout_s = 180.0
    port_setting = "RATCHET_CASSANDRA_PORT"
    storage_port_setting = "RATCHET_CASSANDRA_STORAGE_PORT"
    heap: tuple[str, ...] = tuple(HEAP)
    cluster_name = "ratchet"
    snitch = "SimpleSnitch"
    #: the datacenter ``check`` requires system.local to name (None: any)
    datacenter: str | None = None

    def client_port(self) -> int:
        return self.settings.cassandra_port

    def timer_slack_ns(self) -> int:
        """Its worker pool's spin-waits are timed sleeps of 10 us and up: a coarser
        slack lets them merge (infra/timer_slack.py, docs/decisions.md)."""
        return self.settings.cassandra_timer_slack_us * 1000

    def storage_port(self) -> int:
        """Inter-node port: from settings, so two local nodes (two homes) can coexist."""
        return self.settings.cassandra_storage_port

    def ports(self) -> list[Port]:
        return [*super().ports(), Port(self.storage_port(),
                                       f"{self.name}'s storage (gossip) port",
                                       self.storage_port_setting, self.host)]

    def seeds(self) -> str:
        return f"{self.host}:{self.storage_port()}"

    def endpoint(self) -> str:
        hosts = ",".join(self.settings.cassandra_hosts)
        return f"cassandra  {hosts}:{self.settings.cassandra_port}  (CQL native protocol)"

    def fetch(self) -> None:
        fetch_jars(self.dist_dir, ARTIFACTS)

    def _yaml(self) -> dict:
        d = self.data_dir
        return {
            "cluster_name": self.cluster_name,
            "num_tokens": 1,
            "allocate_tokens_for_local_replication_factor": 1,
            "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
            "endpoint_snitch": self.snitch,
            "seed_provider": [{"class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                               "parameters": [{"seeds": self.seeds()}]}],
            "listen_address": self.host,
            "rpc_address": self.host,
            "storage_port": self.storage_port(),
            "native_transport_port": self.client_port(),
            "start_native_transport": True,
            "data_file_directories": [str(d / "data")],
            "commitlog_directory": str(d / "commitlog"),
            "saved_caches_directory": str(d / "saved_caches"),
            "hints_directory": str(d / "hints"),
            "cdc_raw_directory": str(d / "cdc_raw"),
            "commitlog_sync": "periodic",
            "commitlog_sync_period": "10000ms",
            "commitlog_segment_size": "32MiB",
            "auto_snapshot": False,
            "snapshot_before_compaction": False,
            "paxos_variant": "v2",
            "concurrent_reads": 8,
            "concurrent_writes": 8,
            "concurrent_counter_writes": 4,
            "concurrent_materialized_view_writes": 2,
            "concurrent_compactors": 1,
            "memtable_flush_writers": 1,
            "native_transport_max_threads": 32,
            "dynamic_snitch": False,
            "hinted_handoff_enabled": False,
            "authenticator": "AllowAllAuthenticator",
            "authorizer": "AllowAllAuthorizer",
            "key_cache_size": "16MiB",
            "counter_cache_size": "4MiB",
            "prepared_statements_cache_size": "16MiB",
        }

    def prepare(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("data", "commitlog", "saved_caches", "hints", "cdc_raw"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        # JSON is valid YAML: no YAML library needed to write the config.
        (self.conf_dir / "cassandra.yaml").write_text(json.dumps(self._yaml(), indent=2) + "\n")
        (self.conf_dir / "logback.xml").write_text(_LOGBACK)
        (self.conf_dir / "triggers").mkdir(exist_ok=True)

    def command(self) -> list[str]:
        lib = self.dist_dir / "lib"
        jamm = sorted(lib.glob("jamm-*.jar"))
        return [
            java17(), *self.heap, "-Xss256k",
            "-XX:+UseG1GC", "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
            "-XX:G1HeapRegionSize=16m", "-XX:+PerfDisableSharedMem", "-XX:+ExitOnOutOfMemoryError",
            "-XX:CICompilerCount=2", "-XX:ParallelGCThreads=2", "-XX:ConcGCThreads=1",
            "-Djava.net.preferIPv4Stack=true", "-Djdk.attach.allowAttachSelf=true",
            "-Dio.netty.tryReflectionSetAccessible=true",
            *(f"--add-exports={m}=ALL-UNNAMED" for m in _EXPORTS),
            *(f"--add-opens={m}=ALL-UNNAMED" for m in _OPENS),
            *([f"-javaagent:{jamm[0]}"] if jamm else []),
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.config=file://{self.conf_dir / 'cassandra.yaml'}",
            f"-Dcassandra.storagedir={self.data_dir}",
            f"-Dcassandra.logdir={self.log_path.parent}",
            f"-Dlogback.configurationFile={self.conf_dir / 'logback.xml'}",
            f"-Dcassandra.triggers_dir={self.conf_dir / 'triggers'}",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.ring_delay_ms=1000",
            "-Dcassandra.superuser_setup_delay_ms=0",
            "-cp", f"{self.conf_dir}:{lib}/*",
            "org.apache.cassandra.service.CassandraDaemon",
        ]

    def check(self, timeout_s: float = 10.0) -> None:
        """Connect with cassandra-driver and run a CQL query."""
        # The hosts the settings name, not 127.0.0.1: a cluster elsewhere (e.g. the
        # loopback aliases of a two-datacenter trial, session 52) is checked where it is.
        hosts = self.settings.cassandra_hosts
        deadline = time.monotonic() + timeout_s
        live = _accepting(hosts, self.client_port(), min(1.0, timeout_s))
        if not live:
            raise Unhealthy(f"nothing accepts connections on "
                            f"{', '.join(f'{h}:{self.client_port()}' for h in hosts)}")
        import logging

        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import WhiteListRoundRobinPolicy

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        logging.getLogger("cassandra").setLevel(logging.CRITICAL)
        # Only the hosts that accepted, for the control connection and the query: the
        # driver would otherwise wait its connect timeout on a hung one first.
        profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy(live))
        cluster = Cluster(live, port=self.client_port(),
                          connect_timeout=left(), control_connection_timeout=left(),
                          protocol_version=5, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
        try:
            session = cluster.connect()
            row = session.execute("SELECT release_version, data_center FROM system.local",
                                  timeout=left()).one()
            if not row or not row.release_version:
                raise Unhealthy("system.local returned no release_version")
            if self.datacenter is not None and row.data_center != self.datacenter:
                raise Unhealthy(f"the node names datacenter {row.data_center!r}, not "
                                f"{self.datacenter!r}")
        except Unhealthy:
            raise
        except Exception as exc:
            raise Unhealthy(f"CQL query failed: {exc}") from exc
        finally:
            cluster.shutdown()
