"""The rehydration client maps every HTTP answer to a typed outcome or a typed error."""

from __future__ import annotations

import httpx
import pytest

from services.gateway.client import Certified, Failure, Fallback, RehydrationClient
from services.gateway.errors import (
    ClientClosed,
    InvalidRehydrationRequest,
    RehydrationServerError,
    RehydrationUnavailable,
)

ITEM = {
    "item_id": "m1",
    "type": "message",
    "role": "user",
    "call_id": None,
    "content": '{"id":"m1","type":"message"}',
    "content_digest": "d",
    "format_version": 1,
}
CHECKPOINT = {
    "seq": 3,
    "fingerprint_hash": "f" * 64,
    "expires_at": None,
    "token_artifact": {},
    "router_receipt": None,
    "boundary_proof": None,
    "added_later": 1,
}


def client_for(status: int, body: object) -> RehydrationClient:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["tenant_id"] == "t"
        return httpx.Response(status, json=body)

    return RehydrationClient("http://api", transport=httpx.MockTransport(handler))


def history(client: RehydrationClient):
    return client.response_history("t", "resp_1", "f" * 64, wait_ms=100)


def test_certified():
    body = {
        "outcome": "certified",
        "reason": None,
        "head_seq": 3,
        "response_id": "resp_1",
        "items": [ITEM],
        "checkpoint": CHECKPOINT,
    }
    outcome = history(client_for(200, body))
    assert isinstance(outcome, Certified) and outcome.checkpoint.seq == 3
    assert outcome.items[0].parsed() == {"id": "m1", "type": "message"}


def test_fallback_carries_items():
    body = {
        "outcome": "fallback",
        "reason": "FINGERPRINT_MISMATCH",
        "head_seq": 3,
        "response_id": "resp_1",
        "items": [ITEM],
        "checkpoint": None,
    }
    outcome = history(client_for(200, body))
    assert isinstance(outcome, Fallback) and outcome.reason == "FINGERPRINT_MISMATCH"
    assert len(outcome.items) == 1


@pytest.mark.parametrize(
    "status,reason",
    [(404, "NOT_FOUND"), (409, "NOT_PROMOTED"), (410, "EXPIRED"), (500, "CORRUPT_HISTORY")],
)
def test_failures_are_outcomes(status, reason):
    outcome = history(client_for(status, {"outcome": "failure", "reason": reason}))
    assert outcome == Failure(reason, status)


def test_unavailable_and_invalid_are_typed_errors():
    with pytest.raises(RehydrationUnavailable) as err:
        history(client_for(503, {"error": "UNAVAILABLE"}))
    assert err.value.retryable
    with pytest.raises(InvalidRehydrationRequest) as bad:
        history(client_for(422, {"error": "INVALID_REQUEST", "detail": []}))
    assert bad.value.status == 422 and not bad.value.retryable


@pytest.mark.parametrize("status,body", [
    (500, {"error": "INTERNAL", "detail": "TypeError", "retryable": False}),
    (500, {"error": "CORRUPT_HISTORY", "detail": None, "retryable": False}),
])
def test_a_server_error_said_not_retryable_is_not_unavailable(status, body):
    """A bug's answer (500 ``INTERNAL``, ``"retryable": false``) was raised as
    ``RehydrationUnavailable`` ("retry later"), and a gateway retrying those retried it
    for ever (the chaos review, session 40)."""
    with pytest.raises(RehydrationServerError) as err:
        history(client_for(status, body))
    assert not err.value.retryable and not isinstance(err.value, RehydrationUnavailable)
    assert (err.value.status, err.value.error) == (status, body["error"])
    # /status answers the same way
    with pytest.raises(RehydrationServerError):
        client_for(status, body).status("t", "resp_1")


@pytest.mark.parametrize("status,body", [
    (503, {"error": "UNAVAILABLE", "retryable": True}),
    (502, "<html>bad gateway</html>"),  # a proxy's page: not known to be lasting
    (500, {"error": "INTERNAL"}),  # no word on retrying
])
def test_other_server_errors_stay_unavailable(status, body):
    with pytest.raises(RehydrationUnavailable):
        history(client_for(status, body))


def test_transport_failure_is_unavailable():
    def boom(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    client = RehydrationClient("http://api", transport=httpx.MockTransport(boom))
    with pytest.raises(RehydrationUnavailable):
        history(client)


def test_the_partition_hint_is_sent_only_when_given():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(dict(request.url.params))
        return httpx.Response(404, json={"outcome": "failure", "reason": "NOT_FOUND"})

    client = RehydrationClient("http://api", transport=httpx.MockTransport(handler))
    client.response_history("t", "resp_1", "f" * 64)
    client.response_history("t", "resp_1", "f" * 64, partition_key="conv_1")
    assert "partition_key" not in seen[0] and seen[1]["partition_key"] == "conv_1"


# A request racing a ``close`` in another thread (an outside review of session 44's
# fixes, session 45): a request after ``close`` is ``ClientClosed``; one whose
# ``close`` came from another thread between its check and its send raised httpx's
# ``RuntimeError``.
def test_a_close_in_another_thread_racing_a_request_is_client_closed():
    """The rehydration client's ``close`` in another thread landing between its request's
    closed check and the send: httpx's ``RuntimeError`` ("the client has been closed")
    escaped untyped, where a request after ``close`` is ``ClientClosed``."""

    class ClosedRightAfterTheCheck(httpx.Client):
        @property
        def is_closed(self) -> bool:
            closed = super().is_closed
            if not closed:
                self.close()  # the other thread's close, just now
            return closed

    client = RehydrationClient("http://rehydration.invalid")
    client._http.close()
    client._http = ClosedRightAfterTheCheck(
        base_url="http://rehydration.invalid",
        transport=httpx.MockTransport(lambda request: httpx.Response(500)))
    with pytest.raises(ClientClosed):
        client.status("t1", "resp_1")
