"""Every Cassandra server error answer, and every lost connection, is an outage to
retry, in the ledger as in the store, never an "unexpected error" that dead-letters the
record.

Found by the chaos run (2026-12-02): a Cassandra shutting down answered a cancellation's
batch with ``OverloadedErrorMessage`` ("Server is shutting down"). That class is not a
``cassandra.RequestExecutionException`` (the driver's protocol module has its own), the
ledger's guard did not catch it, and the ``TurnCancelled`` was dead-lettered: its
request was then promoted. The store's guard already caught every ``ErrorMessage``.

Found by the CI chaos run (2026-12-03, session 14): during a Cassandra restart the
driver raised ``ConnectionShutdown`` ("Connection reset by peer") for a request already
sent, a ``ConnectionException``, which is not a ``DriverException`` either. Neither guard
caught it: two workers dead-lettered a record each (a ``TurnCompleted`` whose rejection
was being recorded, and an event of a tool loop whose later turn was then rejected
``MISSING_TOOL_EFFECT``).
"""

from __future__ import annotations

import pytest
from cassandra.connection import ConnectionException, ConnectionShutdown
from cassandra.protocol import (
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
    ServerError,
    UnavailableErrorMessage,
)

from services.ledger.base import LedgerUnavailable
from services.ledger.cassandra import _guard as ledger_guard
from services.store.base import StoreUnavailable
from services.store.cassandra import _guard as store_guard

SERVER_ANSWERS = [OverloadedErrorMessage, IsBootstrappingErrorMessage, ServerError,
                  UnavailableErrorMessage]
# What the driver raises when the connection goes away under a request it sent.
LOST_CONNECTIONS = [ConnectionShutdown, ConnectionException]


def _server_answer(cls):
    return cls(cls.error_code, "Server is shutting down", {})


def _lost_connection(cls):
    return cls("[Errno 104] Connection reset by peer")


OUTAGES = ([pytest.param(_server_answer(c), id=c.__name__) for c in SERVER_ANSWERS]
           + [pytest.param(_lost_connection(c), id=c.__name__) for c in LOST_CONNECTIONS])


def _raising(exc):
    def call():
        raise exc
    return call


@pytest.mark.parametrize("exc", OUTAGES)
def test_the_ledger_retries_an_outage(exc):
    with pytest.raises(LedgerUnavailable) as raised:
        ledger_guard(_raising(exc))
    assert raised.value.retryable
    assert raised.value.__cause__ is exc


@pytest.mark.parametrize("exc", OUTAGES)
def test_the_store_retries_an_outage(exc):
    with pytest.raises(StoreUnavailable) as raised:
        store_guard("promote", _raising(exc))
    assert raised.value.retryable
    assert raised.value.__cause__ is exc


def test_a_bug_is_still_not_an_outage():
    """The guards widen to the driver's failures only: a bug in ratchet's own code
    still reaches the processor as itself (and dead-letters its record there)."""
    def buggy():
        raise KeyError("a column ratchet forgot")
    with pytest.raises(KeyError):
        ledger_guard(buggy)
    with pytest.raises(KeyError):
        store_guard("promote", buggy)
