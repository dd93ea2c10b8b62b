"""The API served as ``ratchet api`` serves it (uvicorn on uvloop, the h2c-tolerant
httptools protocol, ``HistoryFastPath`` over the app with the claims routes), on
in-memory backends and a free port: for tests whose bytes on the wire matter."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
import uvloop

from ratchet.samples import NOW_MS
from services.api.app import create_app
from services.api.claims import claims_router
from services.api.fastpath import HistoryFastPath
from services.api.h2c import UpgradeTolerantHttpToolsProtocol
from services.api.service import RehydrationService
from services.api.slow_readers import with_stall_guard
from services.api.waiters import PromotionWaiters
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore


@contextlib.contextmanager
def served_api() -> Iterator[int]:
    """Yields the port of a running API; stops it after."""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    service = RehydrationService(store, ledger, PromotionWaiters())
    app = create_app(service, lambda: True,
                     routers=[claims_router(ledger, store, lambda: NOW_MS)])
    protocol = with_stall_guard(UpgradeTolerantHttpToolsProtocol, 30)
    with running_server(HistoryFastPath(app, service), protocol) as (port, _):
        yield port


@contextlib.contextmanager
def running_server(app, protocol: type) -> Iterator[tuple[int, uvicorn.Server]]:
    """``app`` served by uvicorn on uvloop with ``protocol``, in a thread, on a free
    port: yields (port, server); stops it after."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(
        app, http=protocol, loop="uvloop", log_config=None, access_log=False,
        lifespan="off"))
    # On uvloop as ``ratchet api`` (uvicorn applies ``loop=`` in ``Server.run`` only).
    def serve() -> None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(server.serve(sockets=[sock]))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def exchange(port: int, request: bytes) -> tuple[int, bytes, bytes]:
    """Send ``request`` as is; (status, head, body) of the answer, read to the close or
    to its Content-Length."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(request)
        answer = b""
        while True:
            head, sep, body = answer.partition(b"\r\n\r\n")
            if sep:
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(body) >= length:
                    break
            chunk = client.recv(65536)  # a timeout here: the server waited for more
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), head, body
