"""``ratchet worker``: wire Cassandra, the registry and Kafka into the Faust app and run it.

Several workers started with the same settings join one consumer group and share the
partitions. SIGTERM (or Ctrl-C) finishes the events in flight, commits, and exits.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
from pathlib import Path

import faust
from cassandra.cluster import Cluster
from cassandra.policies import ExponentialReconnectionPolicy

from infra.migrate import check_schema
from ratchet import early_log, speedups
from ratchet.settings import Settings
from ratchet.startup import StartupFailed, explain
from services.cassandra_cluster import connect, open_cluster, store_levels
from services.cassandra_loop import LoopSession
from services.ledger.cassandra import CassandraLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from streams import lenient_records, metrics
from streams.app import FetchGuard, Runtime, create_app
from streams.codec import RegistryCodec
from streams.health import Health, health_dir, health_path
from streams.processor import PromotionProcessor
from streams.tail_cache import TailCache
from streams.topics import ensure_topics

log = logging.getLogger(__name__)


def build_runtime(settings: Settings) -> tuple[Runtime, Cluster]:
    """Connect to Cassandra and the registry; create topics. Fails fast if one is missing
    (Cassandra first: a keyspace not migrated yet must not leave topics behind)."""
    # Reconnect quickly after an outage (the default backs off up to 10 minutes).
    cluster = open_cluster(settings,
                           reconnection_policy=ExponentialReconnectionPolicy(0.5, 4.0))
    try:
        session = connect(cluster, settings, settings.keyspace)
        check_schema(session, settings.keyspace)
        loop_session = LoopSession(settings) if settings.loop_driver == "acsylla" else None
        store = CassandraCheckpointStore(
            session, StoreOptions(logical_retention_s=settings.logical_retention_s),
            loop_session=loop_session, **store_levels(settings))
        ledger = CassandraLedger(session, loop_session=loop_session)
        codec = RegistryCodec.connect(settings.schema_registry_url)
        topics = ensure_topics(settings)
    except BaseException:
        # Fail fast means exit: the driver's threads must not keep a half-started
        # worker alive (a fault test once waited minutes on one, registry down).
        cluster.shutdown()
        raise
    health = Health(health_path(settings.home))
    processor = PromotionProcessor(store, ledger, codec, topics,
                                   tails=TailCache(capacity=settings.tail_cache_entries))
    return Runtime(processor=processor, codec=codec, health=health, topics=topics,
                   loop_session=loop_session), cluster


def return_large_blocks_when_freed() -> None:
    """Have glibc map every allocation of 1 MiB and more on its own, so it goes back to
    the system when freed. By default glibc raises that threshold after each such free
    (up to 32 MiB), and the blocks of the next large records then come from the heap
    and stay in the RSS after a burst: 0.9 GB left after 100 turns of 9 MiB against 0.3
    GB with this (docs/decisions.md, "Worker memory"). Nothing to do off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_mmap_threshold = -3  # glibc's <malloc.h>
    libc.mallopt(m_mmap_threshold, 1024 * 1024)


def run_worker(settings: Settings, *, group_id: str | None = None, loglevel: str = "INFO") -> int:
    """Run until SIGTERM/SIGINT; returns the process exit code."""
    held = early_log.hold(loglevel)
    return_large_blocks_when_freed()
    use_event_loop(settings.worker_event_loop)
    # A record whose header key is not UTF-8 is read, not fatal (streams/lenient_records.py).
    lenient_records.install()
    _check_home(settings.home)
    try:
        runtime, cluster = build_runtime(settings)
    except Exception as exc:
        line = explain(exc, settings)
        if line is None:
            raise
        raise StartupFailed(line) from exc
    # From here the clients are closed however the worker ends, Ctrl-C before Faust
    # runs included (``ratchet worker`` says so, exit 0; session 47).
    try:
        metrics.serve(settings.api_host, settings.worker_metrics_port)
        group = group_id or settings.consumer_group
        # Tests only: starve this partition once to prove the watchdog recovers it.
        starve = os.environ.get("RATCHET_TEST_STARVE_PARTITION")
        app = create_app(settings, runtime, group_id=group, stall_after_s=float(settings.fetch_stall_s),
                         starve_partition=int(starve) if starve else None)

        @app.task
        async def replay_start_lines() -> None:  # Faust's logging is set up by now
            held.replay()

        runtime.health.write()
        # Everything built so far (modules, clients, the app) lives as long as the worker:
        # out of the collector's view, the oldest generation's collections no longer walk it
        # (a 96 ms pause in a paced run before, 14 ms after; docs/decisions.md).
        gc.collect()
        gc.freeze()
        log.info("worker %d joining group %s on %s; history codec: %s", os.getpid(), group,
                 runtime.topics.gateway_events, speedups.describe())
        try:
            worker = StartingWorker(app, loglevel=loglevel, quiet=True)
            worker.settings = settings
            # No terminal spinner: at WARNING and above Faust would otherwise set the ROOT
            # logger to DEBUG so its spinner turns on every record, and every debug call
            # of aiokafka and the Cassandra driver then builds and handles a LogRecord
            # (~6% of the worker's CPU in a py-spy profile at RATCHET_LOG_LEVEL=WARNING).
            worker.spinner = None
            worker.execute_from_commandline()  # returns (or exits) after a clean stop
        except SystemExit as exc:
            code = int(exc.code or 0)
        else:
            code = 0
    finally:
        runtime.health.remove()
        cluster.shutdown()
    if worker.start_failure is not None:  # Faust stopped what it had started
        raise StartupFailed(worker.start_failure)
    # The fetch watchdog gave up and stopped the worker with a SIGTERM, which mode ends
    # with EX_OK: the exit code must say so, for a supervisor that restarts only failed
    # processes (docs/processor.md).
    return FetchGuard.EXIT_CODE if runtime.fatal and code == 0 else code


class StartingWorker(faust.Worker):
    """Faust's worker, whose start that cannot reach Kafka ends as one line: Faust's
    producer or consumer finding no broker (a Kafka restarting under the start, after
    the topics were made) was ``mode``'s logged traceback and exit 1 (session 53).
    ``start_failure`` is then the line; Faust stops what it started as for any end of
    the start. An error that is not a server away keeps its traceback, and so does one
    raised while the worker is being stopped (SIGTERM or Ctrl-C: the stop's own end)."""

    settings: Settings
    start_failure: str | None = None

    async def start(self) -> None:
        try:
            await super().start()
        except Exception as exc:
            line = None if self.should_stop else explain(exc, self.settings)
            if line is None:
                raise
            self.start_failure = line


def use_event_loop(name: str) -> None:
    """Make ``name`` the event loop of every loop created from here on: the worker's and,
    with ``RATCHET_WORKER_CONSUMER=thread``, the one of Faust's consumer thread
    (``mode.threads.ServiceThread``). Called before any loop exists. uvloop runs the loop, its callbacks, futures and sockets in C:
    the stream stack's per-record cost is mostly event loop work (docs/decisions.md)."""
    if name == "uvloop":
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _check_home(home: Path) -> None:
    """RATCHET_HOME must be a writable directory (the health files live there) before
    anything is made: a read-only one, an unmounted volume or a file in the way ended in
    three tracebacks, after the topics were created (an outside review, session 26)."""
    try:
        health_dir(home).mkdir(parents=True, exist_ok=True)
        probe = health_dir(home) / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StartupFailed(f"RATCHET_HOME={str(home)!r} is not a writable directory "
                            f"({exc.strerror or exc}): the worker keeps its health file "
                            "there") from exc


def cli_worker(settings: Settings) -> int:
    try:
        return run_worker(settings, loglevel=settings.log_level)
    except StartupFailed as exc:
        print(f"ratchet worker: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
