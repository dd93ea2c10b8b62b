"""A bound on the bytes of a request body the API reads (``BodyLimit``).

Why its own: Starlette's ``max_body_size`` answers a body that declares a length above
the limit with its own plain-text 413, replacing whatever the app answers, so the API's
typed error body (``{"error": "INVALID_REQUEST", "detail": ...}``, docs/gateway-protocol.md
section 8) could not be given. Here the limit is enforced where the body is read: the
first ``receive`` of a body declaring more than the limit, or the one that brings a
chunked body past it, raises ``BodyTooLarge``, an ``HTTPException`` (413) that the app's
exception handlers answer like every other bad input. Nothing above the limit is held:
a declared length is refused before any of the body is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=f"request body exceeds {max_bytes} bytes "
                                                  "(RATCHET_API_MAX_BODY_BYTES)")


class BodyLimit:
    """ASGI middleware: a request whose body passes ``max_bytes`` fails where it is read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

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

        await self.app(scope, bounded_receive, send)


def _content_length(scope: Scope) -> int | None:
    """The declared body length, or None (absent; a malformed one never reaches the app:
    the server's parser refuses it)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None
