"""A session that makes chosen statements' outcomes unknown, for the unknown-outcome
tests of the store and the ledger (CONTRACT 4: "an LWT whose outcome is unknown is
resolved by a SERIAL read, never guessed").

``FlakySession`` delegates to a real cassandra-driver session. The next ``failures``
statements that ``match`` raise ``error()``, after being sent (``land=True``: the write
landed, its answer was lost) or without being sent (``land=False``). The errors are the
ways the driver reports an outcome it does not know (``UNKNOWN_OUTCOMES``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cassandra import ConsistencyLevel, OperationTimedOut, WriteTimeout, WriteType
from cassandra.connection import ConnectionShutdown
from cassandra.protocol import ErrorMessage, ServerError
from cassandra.query import BatchStatement

from services.store.cassandra import CAS_WRITE_UNKNOWN


def cas_timeout() -> Exception:
    return WriteTimeout(
        "injected CAS timeout",
        write_type=WriteType.CAS,
        consistency=ConsistencyLevel.SERIAL,
        required_responses=1,
        received_responses=0,
    )


def cas_write_unknown() -> Exception:
    return ErrorMessage(code=CAS_WRITE_UNKNOWN, message="injected CAS_WRITE_UNKNOWN", info=None)


def server_error() -> Exception:
    return ServerError(code=0x0000, message="injected server error", info=None)


def connection_lost() -> Exception:
    return ConnectionShutdown("injected: connection closed after sending")


def client_timeout() -> Exception:
    return OperationTimedOut("injected client-side timeout")


UNKNOWN_OUTCOMES = [client_timeout, cas_timeout, cas_write_unknown, connection_lost]


def query_of(statement: Any) -> str:
    return getattr(statement, "query_string", "") or ""


def consistency_of(statement: Any) -> int | None:
    return getattr(statement, "consistency_level", None)


def batch(statement: Any) -> bool:
    return isinstance(statement, BatchStatement)


def query(fragment: str) -> Callable[[Any], bool]:
    """Statements whose CQL holds ``fragment``."""
    return lambda statement: fragment in query_of(statement)


def serial_reads_only(session: FlakySession) -> None:
    """The unknown outcome was resolved by SERIAL reads (QUORUM ones see a committed
    write but never complete a Paxos round still in flight): every read made after the
    first failure is at SERIAL, and there is one."""
    reads = [(q, cl) for q, cl in session.after if q.lstrip().upper().startswith("SELECT")]
    assert reads, "the outcome was not read"
    assert all(cl == ConsistencyLevel.SERIAL for _, cl in reads), reads


class FailedFuture:
    """A driver future that failed (its errback runs at once)."""

    def __init__(self, error: Exception):
        self._error = error

    def add_callbacks(self, callback, errback):
        errback(self._error)

    def result(self):
        raise self._error


class FlakySession:
    """Delegates to ``real``; the next ``failures`` statements that ``match`` fail.

    ``land``: send the statement before failing. ``break_reads``: every later statement
    that does not match fails too (the resolution read cannot be made). ``meanwhile``:
    run before the failing statement would have run. ``sent``: matching statements
    sent to the server; ``after``: the query text and consistency level of every other
    statement made after the first failure. ``execute_async`` fails the way the driver's
    futures do (``FailedFuture``).
    """

    def __init__(self, real, match: Callable[[Any], bool], error: Callable[[], Exception], *,
                 land: bool, failures: int = 1, break_reads: bool = False,
                 meanwhile: Callable[[], object] | None = None):
        self._real, self._match, self._error = real, match, error
        self._land, self._failures = land, failures
        self._break_reads, self._meanwhile = break_reads, meanwhile
        self.sent = 0
        self.tripped = False
        self.after: list[tuple[str, int | None]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _fails(self, statement, args, kwargs) -> bool:
        """Whether this statement fails (sent first when it lands)."""
        if self._match(statement):
            if self._failures > 0:
                self._failures -= 1
                self.tripped = True
                if self._meanwhile is not None:
                    self._meanwhile()
                if self._land:
                    self._real.execute(statement, *args, **kwargs)
                    self.sent += 1
                return True
            self.sent += 1
        elif self.tripped:
            self.after.append((query_of(statement), consistency_of(statement)))
            if self._break_reads:
                raise client_timeout()
        return False

    def execute(self, statement, *args, **kwargs):
        if self._fails(statement, args, kwargs):
            raise self._error()
        return self._real.execute(statement, *args, **kwargs)

    def execute_async(self, statement, *args, **kwargs):
        if self._fails(statement, args, kwargs):
            return FailedFuture(self._error())
        return self._real.execute_async(statement, *args, **kwargs)


class FlakyLoopSession:
    """A ``LoopSession`` (the C++ driver) whose next ``failures`` requests of one kind
    (``"claim"``: a single statement whose CQL holds ``fragment``; ``"batch"``: a
    batch) fail the way the driver reports a request with no answer (a client-side
    timeout, ``LoopRequestFailed``), after being sent (``land=True``) or without being
    sent. Everything else goes to ``real``."""

    def __init__(self, real, *, kind: str, land: bool, failures: int = 1,
                 fragment: str = "response_claims (tenant_id") -> None:
        self._real, self.kind, self._land = real, kind, land
        self._failures, self._fragment = failures, fragment
        self.tripped = False

    def _fails(self) -> bool:
        if self._failures <= 0:
            return False
        self._failures -= 1
        self.tripped = True
        return True

    @staticmethod
    def _timeout() -> Exception:
        from acsylla import errors  # noqa: PLC0415 - the C++ driver's, only here

        from services.cassandra_loop import LoopRequestFailed  # noqa: PLC0415
        return LoopRequestFailed(errors.CassErrorLibRequestTimedOut("injected timeout"))

    async def execute(self, statement, values, **kwargs):
        if self.kind == "claim" and self._fragment in query_of(statement) and self._fails():
            if self._land:
                await self._real.execute(statement, values, **kwargs)
            raise self._timeout()
        return await self._real.execute(statement, values, **kwargs)

    async def execute_batch(self, parts, **kwargs):
        if self.kind == "batch" and self._fails():
            if self._land:
                await self._real.execute_batch(parts, **kwargs)
            raise self._timeout()
        return await self._real.execute_batch(parts, **kwargs)

    async def close(self) -> None:
        await self._real.close()
