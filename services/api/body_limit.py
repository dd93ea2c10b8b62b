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
of the budget once its first bytes are there (the server stops reading its socket
meanwhile), and holds it until its answer is sent; shares are given in arrival order;
one larger than the whole budget runs alone. A chunked body of unknown length counts as
the largest allowed. A large body that stops arriving for ``BODY_READ_TIMEOUT_S`` is a
408, and its share returns to the budget.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


class BodyTooLarge(HTTPException):
    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=f"request body exceeds {max_bytes} bytes "
                                                  "(RATCHET_API_MAX_BODY_BYTES)")


# Bodies up to this size (every history read, every claim, most completions) never
# wait for the budget: 256 KiB each is what the server's connections may hold at once.
LARGE_BODY_BYTES = 256 * 1024
# Seconds a large body may go without a byte arriving while it holds its share.
BODY_READ_TIMEOUT_S = 10.0


class BodyStalled(HTTPException):
    def __init__(self) -> None:
        super().__init__(status_code=408, detail=f"request body stopped arriving for "
                                                 f"{BODY_READ_TIMEOUT_S:g} s")


class BodyBudget:
    """Bytes of large bodies in flight, at most ``limit`` (one larger body alone), given
    in arrival order: a large body is never passed over by a stream of smaller ones."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit = limit
        self.held = 0
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, nbytes: int) -> int:
        share = min(nbytes, self.limit)
        if not self._waiting and self.held + share <= self.limit:
            self.held += share
            return share
        entry = (share, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await entry[1]
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self.release(share)  # given, then cancelled before it could be used
            else:
                self._waiting.remove(entry)
                self._give()
            raise
        return share

    def release(self, share: int) -> None:
        self.held -= share
        self._give()

    def _give(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.limit:
            share, given = self._waiting.popleft()
            self.held += share
            given.set_result(None)


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

        budget, share = self.budget, 0

        async def budgeted_receive() -> dict:
            # The share is taken once the body's first bytes are there, and held until
            # the answer: a client that declares 32 MiB and sends nothing holds none
            # (found by a second review, session 25). One whose body stops arriving for
            # BODY_READ_TIMEOUT_S gets a 408 and its share returns.
            nonlocal share
            if not share:
                message = await bounded_receive()
                share = await budget.acquire(expected)
                return message
            try:
                return await asyncio.wait_for(bounded_receive(), BODY_READ_TIMEOUT_S)
            except TimeoutError:
                raise BodyStalled() from None

        try:
            await self.app(scope, budgeted_receive, send)
        finally:
            if share:
                budget.release(share)


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
