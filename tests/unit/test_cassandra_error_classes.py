"""Every Cassandra server error answer is an outage to retry, in the ledger as in the
store, never an "unexpected error" that dead-letters the record.

Found by the chaos run (2026-12-02): a Cassandra shutting down answered a cancellation's
batch with ``OverloadedErrorMessage`` ("Server is shutting down"). That class is not a
``cassandra.RequestExecutionException`` (the driver's protocol module has its own), the
ledger's guard did not catch it, and the ``TurnCancelled`` was dead-lettered: its
request was then promoted. The store's guard already caught every ``ErrorMessage``.
"""

from __future__ import annotations

import pytest
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


def _raise(cls):
    def call():
        raise cls(cls.error_code, "Server is shutting down", {})
    return call


@pytest.mark.parametrize("cls", SERVER_ANSWERS, ids=lambda c: c.__name__)
def test_the_ledger_retries_a_server_error_answer(cls):
    with pytest.raises(LedgerUnavailable) as raised:
        ledger_guard(_raise(cls))
    assert raised.value.retryable
    assert isinstance(raised.value.__cause__, cls)


@pytest.mark.parametrize("cls", SERVER_ANSWERS, ids=lambda c: c.__name__)
def test_the_store_retries_a_server_error_answer(cls):
    with pytest.raises(StoreUnavailable) as raised:
        store_guard("promote", _raise(cls))
    assert raised.value.retryable
