"""Answers to clients that read them slowly, or not at all.

Why: uvicorn hands each body message to the transport whole, and the transport keeps
what the socket does not take until the client reads it or leaves. A history answer
was one message: 40 clients that asked for an 8 MB Conversation and did not read held
+188 MiB of the API's memory, each its own copy of the answer, for as long as they
kept the connection open (measured in session 37; docs/decisions.md, "Clients that do
not read").

Two parts, both needed:

- ``PartsResponse`` sends an answer in slices of at most ``SLICE_BYTES``. uvicorn waits,
  before each message, until the transport has drained below its low-water mark, so a
  client that stops reading holds at most about one slice beyond that mark; the rest
  stays in the answer's parts, and the large one (the items' JSON) is the cached
  history's own bytes, shared with the cache rather than copied. An answer of one
  slice or less is one message, as before.
- ``StallGuard`` (a mixin of the HTTP protocol) ends what the slices only bound: while
  the transport is paused for writing, it looks every ``stall_s`` seconds at how many
  bytes wait in its buffer. A client that took none of them in that time has its
  connection aborted: the buffered bytes are freed at once (a plain close would keep
  them until sent) and the answer's task ends (uvicorn's send returns on a lost
  connection). A client that reads, however slowly the socket drains, is never cut off
  while the buffer shrinks between two looks.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sys
import termios
from collections.abc import Iterator
from typing import Any

from starlette.responses import Response

from services.api import metrics

# The largest body message of an answer. 256 KiB: an 8 MB answer is 32 writes; a client
# that stops reading holds about this much beyond the transport's high-water mark.
SLICE_BYTES = 256 * 1024

log = logging.getLogger("ratchet.api")


class PartsResponse(Response):
    """A JSON response whose body is the concatenation of ``parts``, sent in slices of
    at most ``slice_bytes`` (module docstring); the bytes on the wire, headers included,
    are those of ``Response(b"".join(parts), status_code, media_type=...)``."""

    media_type = "application/json"

    def __init__(self, parts: tuple[bytes, ...], status_code: int,
                 slice_bytes: int = SLICE_BYTES) -> None:
        self.status_code = status_code
        self.background = None
        self._parts = parts
        self._slice_bytes = slice_bytes
        # Response's own headers for this body, in its order (``init_headers`` would
        # join the parts to measure them).
        self._length = sum(len(part) for part in parts)
        self.raw_headers = [
            (b"content-length", str(self._length).encode("latin-1")),
            (b"content-type", self.media_type.encode("latin-1")),
        ]

    @property
    def body(self) -> bytes:  # type: ignore[override]
        """The whole body, joined: for callers that inspect a response, not for sending."""
        return b"".join(self._parts)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        if self._length <= self._slice_bytes:  # most answers: one message, as before
            await send({"type": "http.response.body", "body": b"".join(self._parts)})
            return
        pieces = slices(self._parts, self._slice_bytes)
        piece = next(pieces, b"")
        for following in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            piece = following
        await send({"type": "http.response.body", "body": piece})


def slices(parts: tuple[bytes, ...], size: int) -> Iterator[bytes]:
    """``b"".join(parts)`` cut into pieces of ``size`` bytes (the last one shorter);
    small parts are joined, so an answer of ``size`` bytes or less is one piece."""
    pending: list[bytes] = []
    pending_bytes = 0
    for part in parts:
        start = 0
        while start < len(part):
            room = size - pending_bytes
            # a part that fits whole is not copied (bytes slicing copies)
            piece = part if start == 0 and len(part) <= room else part[start:start + room]
            start += len(piece)
            pending.append(piece)
            pending_bytes += len(piece)
            if pending_bytes == size:
                yield b"".join(pending)
                pending, pending_bytes = [], 0
    if pending:
        yield b"".join(pending)


class StallGuard:
    """Mixin for uvicorn's HTTP protocol (before it in the bases): aborts a connection
    whose client took none of the bytes waiting in its write buffer for ``stall_s``
    seconds while writing was paused (module docstring). ``stall_s`` 0: never."""

    stall_s: float = 30.0
    _stall_timer: Any = None
    _stall_buffered = 0  # the buffer's size at the last look

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._stall_timer is None and self.stall_s > 0:
            self._look_later()

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self._stop_looking()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_looking()
        super().connection_lost(exc)  # type: ignore[misc]

    def _look_later(self) -> None:
        self._stall_buffered = _unsent(self.transport)  # type: ignore[attr-defined]
        self._stall_timer = self.loop.call_later(  # type: ignore[attr-defined]
            self.stall_s, self._look)

    def _stop_looking(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _look(self) -> None:
        self._stall_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        buffered = _unsent(transport)
        if buffered < self._stall_buffered:
            self._look_later()  # the client took some: look again later
            return
        metrics.STALLED_ANSWERS.inc()
        log.warning(
            "client took none of its answer for the stall limit: connection aborted",
            extra={"ctx": {"peer": _peer(transport), "buffered_bytes": buffered,
                           "stall_s": self.stall_s}},
        )
        transport.abort()


def _unsent(transport: Any) -> int:
    """Bytes written and not yet taken by the client: the transport's buffer and the
    socket's send queue (Linux ``SIOCOUTQ``: not yet acknowledged). The buffer alone
    is not a measure of progress: the kernel takes more of it only once a third or so
    of its queue has gone, which a slow client can take seconds to read."""
    unsent = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            unsent += int.from_bytes(queued, sys.byteorder, signed=True)
    return unsent


def _peer(transport: Any) -> str | None:
    peer = transport.get_extra_info("peername")
    return None if peer is None else f"{peer[0]}:{peer[1]}"


def with_stall_guard(protocol: type, stall_s: float) -> type:
    """``protocol`` with a ``StallGuard`` of ``stall_s`` seconds (uvicorn's ``http=``)."""
    return type(f"StallGuarded{protocol.__name__}", (StallGuard, protocol),
                {"stall_s": stall_s})
