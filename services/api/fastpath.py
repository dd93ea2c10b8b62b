"""The two history GETs answered without FastAPI's per-request machinery.

Why: FastAPI resolves a route's parameters by introspecting their annotations on every
request; for the history routes that is ~0.2 ms of CPU (in-process ASGI: 207 us per
request against 7 us for the same answer from plain ASGI), about half of what the API
spends on a cache hit (docs/decisions.md, "Service"). A gateway calls these on every
continuation turn.

How it stays the same API: ``HistoryFastPath`` wraps the FastAPI app and answers a
request itself only when every parameter passes the SAME constraints the routes
declare (``services/api/app.py``: path and query patterns, ``wait_ms`` range) in the
plainest spelling (each parameter at most once, ``wait_ms`` as decimal digits). It then
calls the same service method and sends the same ``Response``; the service's errors go
through the same handlers. Anything else (an invalid, repeated or unusual parameter,
another route) goes to FastAPI untouched, which answers it (422, 404, ...) as before.
``tests/unit/test_api_fastpath.py`` sends the same requests to both and compares status,
headers and body.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from ratchet.metric_children import child
from services.api import metrics
from services.api.app import (
    ID_PATTERN,
    SHA256_PATTERN,
    error_response,
    history_response,
    use_cache,
)
from services.api.service import WAIT_MS_CAP, Answer, RehydrationService

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]

# fullmatch: "$" would also match before a final newline, which the routes' (Rust) regex
# refuses.
_ID = re.compile(ID_PATTERN)
_SHA256 = re.compile(SHA256_PATTERN)
_ROUTE = re.compile(r"^/v1/(responses|conversations)/([^/]+)/history$")
_DIGITS = re.compile(r"^[0-9]{1,6}$")
_RESPONSE_PARAMS = frozenset({"tenant_id", "fingerprint_hash", "wait_ms", "partition_key"})
_CONVERSATION_PARAMS = frozenset({"tenant_id", "fingerprint_hash"})


class HistoryFastPath:
    """ASGI: the history GETs with plainly valid parameters; all else to ``app``."""

    def __init__(self, app: ASGIApp, service: RehydrationService) -> None:
        self.app = app
        self._service = service

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        call = self._plain_history_call(scope) if scope["type"] == "http" else None
        if call is None:
            await self.app(scope, receive, send)
            return
        try:
            answer = await call()
        except Exception as exc:  # the service's errors, answered by the app's handlers
            response = error_response(exc)
        else:
            response = history_response(answer)
        await response(scope, receive, send)

    def _plain_history_call(self, scope: Scope) -> Callable[[], Awaitable[Answer]] | None:
        """The service call of a history GET whose parameters all pass the routes'
        constraints in their plainest spelling, else None (FastAPI decides)."""
        if scope["method"] != "GET" or scope.get("root_path"):
            return None
        route = _ROUTE.fullmatch(scope["path"])
        if route is None or not _ID.fullmatch(route[2]):
            return None
        kind, path_id = route[1], route[2]
        query = _single_values(scope["query_string"])
        known = _RESPONSE_PARAMS if kind == "responses" else _CONVERSATION_PARAMS
        if query is None or not known.issuperset(query):
            return None  # a repeated parameter, or one the route does not take
        tenant_id, fingerprint = query.get("tenant_id"), query.get("fingerprint_hash")
        if tenant_id is None or not _ID.fullmatch(tenant_id):
            return None
        if fingerprint is None or not _SHA256.fullmatch(fingerprint):
            return None
        cache_control = _single_header(scope["headers"], b"cache-control")
        if cache_control is False:
            return None
        cached = use_cache(cache_control)
        if kind == "conversations":
            return lambda: self._service.conversation_history(
                tenant_id, path_id, fingerprint, use_cache=cached)
        wait = query.get("wait_ms", "0")
        if not _DIGITS.fullmatch(wait) or int(wait) > WAIT_MS_CAP:
            return None
        partition_key = query.get("partition_key")
        if partition_key is not None and not _ID.fullmatch(partition_key):
            return None

        async def response_history() -> Answer:
            with child(metrics.REQUEST_SECONDS, "response").time():
                return await self._service.response_history(
                    tenant_id, path_id, fingerprint, int(wait), use_cache=cached,
                    partition_key=partition_key)

        return response_history


def _single_values(query_string: bytes) -> dict[str, str] | None:
    """The query's parameters, or None if one is repeated (FastAPI's choice then)."""
    try:
        pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    except ValueError:
        return None
    values = dict(pairs)
    return values if len(values) == len(pairs) else None


def _single_header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None | bool:
    """The header's value, None if absent, False if repeated (FastAPI's choice then)."""
    found = [value for key, value in headers if key.lower() == name]
    if len(found) > 1:
        return False
    return found[0].decode("latin-1") if found else None
