"""Production wiring of the API process: Cassandra store + ledger, Kafka notifier, uvicorn.

``ratchet api`` calls ``cli_api``. Startup order:
1. connect to Cassandra (store + ledger share one session);
2. start the decision notifier (Kafka) - the API serves even while it connects; once
   positioned it wakes every waiting request, whose re-read sees what was decided
   meanwhile (notifier.py);
3. serve HTTP until SIGTERM; uvicorn lets in-flight requests (waits <= 10 s) finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from infra.migrate import check_schema
from ratchet import early_log, speedups
from ratchet.settings import Settings
from ratchet.startup import explain
from ratchet.stops import Terminated
from schemas.avro import EventSerde, registry_client
from services.api import logs
from services.api.answer_budget import AnswerBudget
from services.api.app import create_app
from services.api.cache import HistoryCache
from services.api.claims import claims_router
from services.api.fastpath import HistoryFastPath
from services.api.h2c import UpgradeTolerantHttpToolsProtocol
from services.api.notifier import DecisionNotifier, ResponseIdDecoder
from services.api.prewarm import Prewarmer
from services.api.service import RehydrationService
from services.api.slow_readers import with_stall_guard
from services.api.waiters import PromotionWaiters
from services.cassandra_cluster import connect, open_cluster, store_levels
from services.cassandra_loop import LoopSession
from services.ledger.cassandra import CassandraLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore

# On SIGTERM, requests in flight get this long to finish: longer than the wait_ms cap
# (10 s), so a waiting request is answered (deploy/k8s/api-deployment.yaml's grace
# period covers it).
GRACEFUL_SHUTDOWN_S = 12

log = logging.getLogger("ratchet.api")


def registry_response_id_decoder(settings: Settings) -> ResponseIdDecoder:
    """Decode a decision record (Confluent wire format, writer schema from the registry)
    just to learn its ``response_id``."""
    serde = EventSerde(registry_client(settings.schema_registry_url))
    expected = ("CheckpointPromoted", "PromotionRejected")

    def decode(topic: str, value: bytes):
        return serde.decode(value, topic, -1, -1, expected=expected)

    return decode


class ApiProcess:
    """Everything the API process owns, so it can be started and closed in one place."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cluster = open_cluster(settings)
        try:
            self._start(settings)
        except BaseException:
            # A failed start exits: the driver's threads must not keep the process alive.
            self.cluster.shutdown()
            raise

    def _start(self, settings: Settings) -> None:
        session = connect(self.cluster, settings, settings.keyspace)
        check_schema(session, settings.keyspace)
        # The reads awaited on the server's event loop (histories, heads, a wait's status)
        # go through the C++ driver (services/cassandra_loop.py): ~0.4 ms less CPU per
        # 51-row history read. Closed with the process; the claims endpoints and the
        # status endpoint use cassandra-driver.
        loop_session = api_loop_session(settings) if settings.loop_driver == "acsylla" else None
        # logical_retention_s is used only when a checkpoint is written (by the worker,
        # at promotion); reads compare the expiry stored then, so the API's own value
        # changes nothing (docs/gateway-protocol.md, "Logical expiry").
        self.store = CassandraCheckpointStore(
            session, StoreOptions(logical_retention_s=settings.logical_retention_s),
            loop_session=loop_session, **store_levels(settings),
        )
        self.ledger = CassandraLedger(session, loop_session=loop_session)
        self.waiters = PromotionWaiters()
        self.cache = HistoryCache(settings.api_history_cache_bytes)
        self.service = RehydrationService(
            self.store, self.ledger, self.waiters, cache=self.cache,
            answers=AnswerBudget(settings.api_answer_budget_bytes),
        )
        self.prewarmer = Prewarmer(self.service.prewarm)
        self.notifier = DecisionNotifier(
            settings.kafka_bootstrap,
            {
                settings.topic("checkpoints"): "promoted",
                settings.topic("rejections"): "rejected",
            },
            self.waiters,
            registry_response_id_decoder(settings),
            on_promoted=self.prewarmer.promoted if self.cache.enabled else None,
        )
        self.app: FastAPI = create_app(
            self.service,
            lambda: self.notifier.up,
            routers=[claims_router(self.ledger, self.store)],
            # Warm-ups read on the serving loop, like the requests (prewarm.py).
            on_start=lambda: self.prewarmer.attach(asyncio.get_running_loop()),
            max_body_bytes=settings.api_max_body_bytes,
            body_budget_bytes=settings.api_body_budget_bytes,
        )

    def close(self) -> None:
        self.notifier.stop()
        self.cluster.shutdown()


def api_loop_session(settings: Settings) -> LoopSession:
    """The API's C++ driver session: each read written at once (RATCHET_API_COALESCE_US,
    0 by default), because a lookup waits for its read."""
    return LoopSession(settings, coalesce_us=settings.api_coalesce_us)


def cli_api(settings: Settings) -> int:
    # What connecting logs is kept until it is known whether the API starts: if it
    # cannot, one line says why (docs/operations.md), not the driver's tracebacks first.
    held = early_log.hold(settings.log_level)
    try:
        process = ApiProcess(settings)
    except Exception as exc:
        line = explain(exc, settings)
        if line is None:
            logs.configure(settings.log_level)
            held.replay()
            raise
        print(f"ratchet api: cannot start: {line}", file=sys.stderr, flush=True)
        return 1
    try:
        return _serve(settings, process, held)
    except (KeyboardInterrupt, Terminated):
        # Ctrl-C or SIGTERM before the handlers below are installed (``ratchet api``
        # says so).
        process.close()
        raise


def _serve(settings: Settings, process: ApiProcess, held: early_log.EarlyRecords) -> int:
    """Listen, start the notifier and serve until SIGTERM or SIGINT; 0 after either."""
    logs.configure(settings.log_level)
    held.replay()
    try:
        # Bound before anything says "listening": a port in use or a host that does not
        # resolve is one line and exit 1 (uvicorn logged the line, then exited 3).
        sock = _listen(settings.api_host, settings.api_port)
    except OSError as exc:
        process.close()
        print(f"ratchet api: cannot start: cannot listen on {settings.api_host}:"
              f"{settings.api_port}: {exc.strerror or exc} (RATCHET_API_HOST, "
              f"RATCHET_API_PORT)", file=sys.stderr, flush=True)
        return 1
    process.notifier.start()
    log.info(
        "rehydration API listening",
        extra={"ctx": {"host": settings.api_host, "port": settings.api_port,
                       "history_codec": speedups.describe()}},
    )
    # uvicorn re-raises the SIGTERM or SIGINT it shut down on once it is done, with the
    # handler it found: the default ones ended the process there (exit 143 before
    # ``close``; Ctrl-C: KeyboardInterrupt, click's "Aborted!", exit 1). A handler that
    # only remembers the signal lets the process close its clients and exit 0, as the
    # worker does; one that came before uvicorn's handlers is handed to uvicorn
    # (``_Server``): a handler doing nothing swallowed it, and the API served on.
    early: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, _frame: early.append(signum))
    try:
        _Server(early, uvicorn.Config(
            # The history GETs skip FastAPI's per-request machinery (fastpath.py).
            HistoryFastPath(process.app, process.service),
            host=settings.api_host,
            port=settings.api_port,
            log_config=None,  # keep our JSON-lines handlers
            access_log=False,
            # libuv's loop and the C HTTP parser: ~1 ms less per request than asyncio's
            # loop + h11 (docs/decisions.md, "Service"); both are dependencies. The
            # parser's protocol serves a request offering `Upgrade: h2c` (Java's
            # HttpClient) with its body, which uvicorn's own drops (h2c.py).
            loop="uvloop",
            # A client that takes none of its answer for RATCHET_API_SEND_STALL_S is
            # cut off (slow_readers.py).
            http=with_stall_guard(UpgradeTolerantHttpToolsProtocol,
                                  settings.api_send_stall_s),
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )).run(sockets=[sock])
    finally:
        process.close()
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, told of the stops that came before it installed its handlers."""

    def __init__(self, early: list[int], config: uvicorn.Config) -> None:
        super().__init__(config)
        self._early = early

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            # Its handlers are in place: a stop before them is handled as one after.
            for signum in self._early:
                self.handle_exit(signum, None)
            yield


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket uvicorn serves on (its own default backlog)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=2048)
