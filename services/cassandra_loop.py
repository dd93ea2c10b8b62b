"""Cassandra requests awaited on the worker's event loop through the C++ driver (acsylla).

Why: cassandra-driver does its I/O in a Python thread of its own (libev) and builds
every request in Python; on the promotion path that thread's wake-ups and GIL
hand-offs, the binding and the request path are the worker's largest CPU cost
(docs/decisions.md, "Promotion cost"). acsylla wraps the DataStax C++ driver: it binds,
encodes and does its I/O in C++ threads without the GIL and resolves asyncio futures
on the caller's loop. Used only by the loop path's requests (the claim, the promotion
batch, the owners); everything else (SERIAL reads, paging, the thread path) stays on
cassandra-driver. Statements are the store's and ledger's own cassandra-driver
``PreparedStatement``s: same CQL (each names its keyspace, so the session's keyspace
draws no server warning; ``services/cassandra_cluster.py``, ``keyspace_of``), same
consistency levels, prepared again here once.

A failed request raises ``LoopRequestFailed``: the worker's loop path then hands the
record to the thread path, which decides with cassandra-driver (every loop write is
idempotent); the API's reads answer it as the store being unavailable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import acsylla
from acsylla import errors as acsylla_errors
from cassandra import ConsistencyLevel
from cassandra.query import UNSET_VALUE, PreparedStatement

from ratchet.settings import Settings
from services.cassandra_cluster import CONNECT_TIMEOUT_S


class _Level:
    """A consistency level as the driver's binding reads it: it reads only ``.value``
    of what ``set_consistency`` is given, and ``acsylla.Consistency.X.value`` is an
    enum property (two Python calls each time, ~8 a turn); here it is a plain slot.
    Its ``value`` is the enum's (``tests/unit/test_loop_session_levels.py``)."""

    __slots__ = ("name", "value")

    def __init__(self, level: acsylla.Consistency) -> None:
        self.name, self.value = level.name, level.value

    def __repr__(self) -> str:
        return f"<consistency {self.name}: {self.value}>"


_CONSISTENCY = {value: _Level(getattr(acsylla.Consistency, name))
                for value, name in ConsistencyLevel.value_to_name.items()
                if hasattr(acsylla.Consistency, name)}


@dataclass(frozen=True)
class LoopResult:
    """A request's rows as plain tuples, read like cassandra-driver's result set."""

    column_names: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]

    def one(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    @property
    def was_applied(self) -> bool:
        """A conditional write's ``[applied]``: a missing column is an error, not False."""
        if not self.column_names or self.column_names[0] != "[applied]" or not self.rows:
            raise ValueError("not the answer of a conditional write")
        return bool(self.rows[0][0])


class LoopSession:
    """One acsylla session, connected on first use, for the event loop it connected on
    (the driver resolves its futures on that loop): used from another loop it raises
    ``WrongLoop``, and the caller's thread path takes over."""

    def __init__(self, settings: Settings, *, timeout_s: float = 5.0,
                 coalesce_us: int | None = None) -> None:
        """``coalesce_us``: how long the driver holds a request back for others to share
        its write (None: the driver's default, 200 us; see docs/decisions.md, "Coalesce
        delay")."""
        self._settings = settings
        self._timeout = timeout_s
        self._coalesce_us = coalesce_us
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None
        self._prepared: dict[str, Any] = {}
        self._closes = 0  # how many times ``close`` ran: a connect it overtook is not kept

    async def _connected(self) -> Any:
        """The session, connected first if need be. A ``close`` while this request
        connected, or waited for another's connect, fails it (``SessionClosed``) and
        the session that connect made is closed, not kept: before session 46 the
        close found no session and returned, then the connect kept one nobody closed
        and the request ran on it after the shutdown's close."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop, self._connecting = loop, asyncio.Lock()
        elif loop is not self._loop:
            raise WrongLoop("this LoopSession serves another event loop")
        if self._session is not None:
            return self._session
        closes = self._closes
        assert self._connecting is not None
        async with self._connecting:
            if self._session is None and self._closes == closes:
                session = await self._connect()
                if self._closes == closes:
                    self._session = session
                else:
                    await session.close()
            if self._closes != closes:
                raise LoopRequestFailed(SessionClosed(
                    "the session was closed while the request connected"))
            return self._session

    async def _connect(self) -> Any:
        cluster = acsylla.create_cluster(
            list(self._settings.cassandra_hosts),
            port=self._settings.cassandra_port,
            protocol_version=4,  # as cassandra-driver's (services/cassandra_cluster.py)
            request_timeout=self._timeout,
            # A first connect's bound, as cassandra-driver's (services/cassandra_cluster
            # .py): its handshake and the control connection's schema read take many
            # round trips, 10 s with answers 1 s late, and a busy node failed this
            # session's first request "Connection timeout" within the request's 5 s.
            connect_timeout=CONNECT_TIMEOUT_S,
            num_threads_io=1,
            core_connections_per_host=1,
            **({} if self._coalesce_us is None else {"coalesce_delay_us": self._coalesce_us}),
            # The datacenter cassandra-driver's policy sends to (services/cassandra_cluster
            # .py): unset, the C++ driver takes the DC of the contact point it reaches
            # first, and it shuffles them, so a worker or an API on contact points in two
            # DCs could read and write through the other DC's coordinators.
            **({"load_balance_dc_aware": self._settings.cassandra_local_dc}
               if self._settings.cassandra_local_dc else {}),
            # Back within seconds after an outage, like the worker's cassandra-driver
            # (the C++ driver's default backs off up to a minute).
            exponential_reconnect_base_delay_ms=500,
            exponential_reconnect_max_delay_ms=4000,
            # Its notes (e.g. "no shard awareness": Cassandra is not ScyllaDB) are not
            # the operator's business; errors reach the caller as exceptions.
            log_level="disabled",
        )
        return await cluster.create_session(keyspace=self._settings.keyspace)

    async def _prepare(self, session: Any, statement: PreparedStatement) -> Any:
        """The driver's own prepared statement for ``statement``: prepared once, then
        found in ``_prepared`` by the callers themselves (a coroutine per statement of
        every request was most of the loop's binding cost in calls). A statement prepared
        while a ``close`` ran is not kept for the next session: the request fails
        (``_open``)."""
        prepared = self._prepared.get(statement.query_string)
        if prepared is None:
            prepared = await session.create_prepared(statement.query_string)
            self._open(session)
            self._prepared[statement.query_string] = prepared
        return prepared

    def _open(self, session: Any) -> None:
        """Raises ``LoopRequestFailed`` when ``close`` ran since ``session`` was taken (a
        request awaiting its preparation or its previous page at shutdown): the request
        fails like one the driver could not send. Before session 46 it called the
        closed session's ``None`` (``AttributeError``)."""
        if self._session is not session:
            raise LoopRequestFailed(SessionClosed("the session was closed during the request"))

    async def execute(self, statement: PreparedStatement, values: Sequence[Any], *,
                      serial_consistency: int | None = None) -> LoopResult:
        """``statement`` at its own consistency level (the serial level of a conditional
        write: the statement's, else ``serial_consistency``), every page of its rows."""
        try:
            session = await self._connected()
            bound = _bound(self._prepared.get(statement.query_string)
                           or await self._prepare(session, statement), values)
            if statement.consistency_level is not None:
                bound.set_consistency(_CONSISTENCY[statement.consistency_level])
            serial = statement.serial_consistency_level or serial_consistency
            if serial is not None:
                bound.set_serial_consistency(_CONSISTENCY[serial])
            bound.set_retry_policy("fallthrough")
            if isinstance(statement.fetch_size, int):  # else cassandra-driver's "unset"
                bound.set_page_size(statement.fetch_size)
            result = await session.execute(bound)
            names, rows = tuple(result.columns_names()), [row.as_tuple() for row in result]
            while result.has_more_pages():
                bound.set_page_state(result.page_state())
                self._open(session)
                result = await session.execute(bound)
                rows.extend(row.as_tuple() for row in result)
        except acsylla_errors.CassException as exc:
            raise LoopRequestFailed(exc) from exc
        return LoopResult(names, tuple(rows))

    async def execute_batch(self, parts: Sequence[tuple[PreparedStatement, Sequence[Any]]],
                            *, consistency: int, serial_consistency: int | None = None,
                            logged: bool = True) -> LoopResult:
        try:
            session = await self._connected()
            batch = (acsylla.create_batch_logged() if logged
                     else acsylla.create_batch_unlogged())
            for statement, values in parts:
                batch.add_statement(_bound(self._prepared.get(statement.query_string)
                                           or await self._prepare(session, statement), values))
            batch.set_consistency(_CONSISTENCY[consistency])
            if serial_consistency is not None:
                batch.set_serial_consistency(_CONSISTENCY[serial_consistency])
            batch.set_retry_policy("fallthrough")
            result = await session.execute_batch(batch)
        except acsylla_errors.CassException as exc:
            raise LoopRequestFailed(exc) from exc
        return LoopResult(tuple(result.columns_names()), tuple(row.as_tuple() for row in result))

    async def close(self) -> None:
        """Close the session (on the loop it serves); a later use connects again. A
        request connecting meanwhile fails (``_connected``)."""
        self._closes += 1
        if self._session is not None:
            session, self._session = self._session, None
            self._prepared.clear()
            await session.close()


def _bound(prepared: Any, values: Sequence[Any]) -> Any:
    """``prepared`` bound to ``values``."""
    bound = prepared.bind()
    if UNSET_VALUE in values:  # unset, not null: a null is a tombstone cell
        for index, value in enumerate(values):
            if value is not UNSET_VALUE:
                bound.bind(index, value)
    else:
        bound.bind_list(list(values))
    return bound


# Server answers that no retry changes: the statement or the schema is wrong.
_PERMANENT = (
    acsylla_errors.CassErrorServerInvalidQuery,
    acsylla_errors.CassErrorServerSyntaxError,
    acsylla_errors.CassErrorServerUnauthorized,
    acsylla_errors.CassErrorServerConfigError,
)


class LoopRequestFailed(Exception):
    """A request of the C++ driver that failed: no answer, or an error answer.
    ``permanent``: the statement or the schema is wrong (retrying cannot help)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.permanent = isinstance(cause, _PERMANENT)


class SessionClosed(RuntimeError):
    """``LoopSession.close`` ran while a request was under way (the cause of its
    ``LoopRequestFailed``: not permanent, like any request the driver could not send)."""


class WrongLoop(RuntimeError):
    """A ``LoopSession`` used from an event loop other than the one it connected on."""
