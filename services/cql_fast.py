"""The C++ Cassandra driver (acsylla) for the promotion path's two simplest requests.

Why (docs/decisions.md, "Promotion cost"): the worker is CPU-bound and most of its
CPU per turn is cassandra-driver building, encoding and decoding requests in Python
(~0.45 ms of client CPU per LWT from 12 threads, against ~0.2 ms for acsylla behind
this facade, same run). A promoted turn sends three requests; the two whose values are
plain text go through here: the response id's claim (``INSERT ... IF NOT EXISTS``) and
the owners write (an unlogged batch of plain inserts). Everything else (the promotion
batch, its SERIAL reads, the unknown-outcome resolution, every read) stays on
cassandra-driver.

acsylla is asyncio-only while the processor is synchronous (one thread per lane), so
this module runs acsylla on an event loop of its own thread and hands out
``concurrent.futures.Future`` s: ``submit`` returns at once (the caller overlaps the
request with its own work) and ``Future.result()`` waits. Requests are never retried
by the driver (``fallthrough``): the caller decides what an error means (a claim's
unknown outcome is settled by a SERIAL read; a plain write is retried whole).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["FastCql", "available"]


def available() -> bool:
    """True when acsylla can be imported (a wheel for this platform is installed)."""
    try:
        import acsylla  # noqa: F401
    except ImportError:
        return False
    return True


class FastCql:
    """One acsylla session on a loop thread of its own; thread-safe."""

    def __init__(self, hosts: Sequence[str], port: int, keyspace: str,
                 timeout_s: float = 5.0) -> None:
        import acsylla

        self._acsylla = acsylla
        self._quorum = acsylla.Consistency.LOCAL_QUORUM
        self._serial = acsylla.Consistency.SERIAL
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cql-fast",
                                        daemon=True)
        self._thread.start()

        async def connect() -> Any:  # acsylla objects are made on their loop
            cluster = acsylla.create_cluster(list(hosts), port=port, request_timeout=timeout_s,
                                             connect_timeout=timeout_s,
                                             retry_policy="fallthrough", log_level="error")
            return await cluster.create_session(keyspace=keyspace)

        try:
            self._session = self._run(connect()).result(timeout_s * 6)
        except BaseException:
            self._stop_loop()
            raise

    def prepare(self, cql: str) -> Any:
        """A prepared statement (blocks until Cassandra prepared it)."""
        return self._run(self._session.create_prepared(cql)).result()

    def submit(self, prepared: Any, values: Sequence[Any], *,
               conditional: bool = False) -> concurrent.futures.Future[Any]:
        """Send one bound statement now; the future holds acsylla's ``Result``."""
        return self._run(self._execute(prepared, values, conditional))

    def submit_batch(self, statements: Sequence[tuple[Any, Sequence[Any]]], *,
                     logged: bool = False) -> concurrent.futures.Future[Any]:
        """Send one batch of bound statements now (plain writes: unlogged)."""
        return self._run(self._execute_batch(statements, logged))

    def close(self) -> None:
        try:
            self._run(self._session.close()).result(10)
        finally:
            self._stop_loop()

    # -- on the loop thread -----------------------------------------------------------
    def _bound(self, prepared: Any, values: Sequence[Any], conditional: bool) -> Any:
        statement = prepared.bind()
        statement.bind_list(list(values))
        statement.set_consistency(self._quorum)
        if conditional:
            statement.set_serial_consistency(self._serial)
        return statement

    async def _execute(self, prepared: Any, values: Sequence[Any], conditional: bool) -> Any:
        return await self._session.execute(self._bound(prepared, values, conditional))

    async def _execute_batch(self, statements: Sequence[tuple[Any, Sequence[Any]]],
                             logged: bool) -> Any:
        batch = (self._acsylla.create_batch_logged() if logged
                 else self._acsylla.create_batch_unlogged())
        batch.set_consistency(self._quorum)
        for prepared, values in statements:
            batch.add_statement(self._bound(prepared, values, False))
        return await self._session.execute_batch(batch)

    def _run(self, coroutine: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
