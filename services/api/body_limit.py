"""A bound on the bytes of a request body the API reads (``BodyLimit``).

Why its own: Starlette's ``max_body_size`` answers a body that declares a length above
the limit with its own plain-text 413, replacing whatever the app answers, so the API's
typed error body (``{"error": "INVALID_REQUEST", "detail": ...}``, docs/gateway-protocol.md
section 8) could not be given. Here the limit is enforced where the body is read: the
first ``receive`` of a body declaring more than the limit, or the one that brings a
chunked body past it, raises ``BodyTooLarge``, an ``HTTPException`` (413) that the app's
exception handlers answer like every other bad input. Nothing above the limit is held:
a declared length is refused before any of the body is read.

``BodyBudget`` bounds the bytes of the large bodies being read or handled at once. A
33 MB completion body costs the API ~70 MB at its peak (the bytes, their JSON, the
model); eight at once took it past its pod's memory limit (found by an outside review
of the deployment, session 25). A body above ``LARGE_BODY_BYTES`` waits for its share
of the budget before any of it is read (the server stops reading its socket meanwhile),
and holds it until its answer is sent; one larger than the whole budget runs alone. A
chunked body of unknown length counts as the largest allowed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=f"request body exceeds {max_bytes} bytes "
                                                  "(RATCHET_API_MAX_BODY_BYTES)")


# Bodies up to this size (every history read, every claim) never wait for the budget.
LARGE_BODY_BYTES = 1024 * 1024


class BodyBudget:
    """Bytes of large bodies in flight, at most ``limit`` (one larger body alone)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.held = 0
        self._changed: asyncio.Condition | None = None  # made on the server's loop

    async def acquire(self, nbytes: int) -> int:
        share = min(nbytes, self.limit)
        if self._changed is None:
            self._changed = asyncio.Condition()
        async with self._changed:
            await self._changed.wait_for(lambda: self.held + share <= self.limit)
            self.held += share
        return share

    async def release(self, share: int) -> None:
        assert self._changed is not None
        async with self._changed:
            self.held -= share
            self._changed.notify_all()


class BodyLimit:
    """ASGI middleware: a request whose body passes ``max_bytes`` fails where it is read;
    large bodies wait for their share of ``budget`` (None: no bound)."""

    def __init__(self, app: ASGIApp, max_bytes: int, budget: BodyBudget | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        seen = 0

        async def bounded_receive() -> dict:
            nonlocal seen
            if declared is not None and declared > self.max_bytes:
                raise BodyTooLarge(self.max_bytes)
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        expected = self.max_bytes if declared is None and _has_body(scope) else declared or 0
        if self.budget is None or expected <= LARGE_BODY_BYTES or expected > self.max_bytes:
            await self.app(scope, bounded_receive, send)
            return
        share = await self.budget.acquire(expected)
        try:
            await self.app(scope, bounded_receive, send)
        finally:
            await self.budget.release(share)


def _content_length(scope: Scope) -> int | None:
    """The declared body length, or None (absent; a malformed one never reaches the app:
    the server's parser refuses it)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _has_body(scope: Scope) -> bool:
    """A chunked body (no declared length) may come: ``transfer-encoding`` is sent."""
    return any(name == b"transfer-encoding" for name, _ in scope.get("headers", ()))
