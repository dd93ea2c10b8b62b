"""Every error the API answers has its typed body, also those made before a route runs
(docs/gateway-protocol.md section 8: "unknown path or method: same shape"), through a
real server as ``ratchet api`` runs it. (Found by an outside review of the HTTP surface,
2026-12-04: a trailing slash got Starlette's 307 with an empty body and a Location built
from the client's Host header; a method the HTTP parser does not know got uvicorn's
plain-text 400.)"""

from __future__ import annotations

import json

import pytest

from tests.unit.real_api import exchange, served_api


@pytest.fixture(scope="module")
def port():
    with served_api() as serving:
        yield serving


@pytest.mark.parametrize("path", [b"/v1/responses/r1/status/?tenant_id=t", b"/healthz/"])
def test_a_trailing_slash_is_an_unknown_path(port, path):
    status, head, body = exchange(port, b"GET " + path + b" HTTP/1.1\r\n"
                                  b"Host: evil.example\r\nConnection: close\r\n\r\n")
    assert status == 404, head
    assert b"location:" not in head.lower()
    assert json.loads(body)["error"] == "INVALID_REQUEST"


@pytest.mark.parametrize("method", [b"FOO", b"BREW"])
def test_a_request_the_parser_refuses_is_a_typed_400(port, method):
    status, head, body = exchange(port, method + b" /healthz HTTP/1.1\r\nHost: x\r\n"
                                  b"Connection: close\r\n\r\n")
    assert status == 400, head
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body) == {"error": "INVALID_REQUEST", "retryable": False,
                                "detail": "Invalid HTTP request received."}


def test_the_paths_without_a_slash_still_answer(port):
    status, _, body = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                               b"Connection: close\r\n\r\n")
    assert status == 200 and json.loads(body)["status"] == "ok"
