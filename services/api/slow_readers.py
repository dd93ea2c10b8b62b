"""Answers to clients that read them slowly, or not at all.

Why: uvicorn hands each body message to the transport whole, and the transport keeps
what the socket does not take until the client reads it or leaves. A history answer
was one message: 40 clients that asked for an 8 MB Conversation and did not read held
+305 MiB of a real ``ratchet api``, each its own copy of the answer, for as long as
they kept the connection open (docs/decisions.md, "Clients that do not read").

Two parts, both needed:

- ``PartsResponse`` sends an answer in slices of at most ``SLICE_BYTES``, each cut only
  once uvicorn has seen the transport drain below its low-water mark, so a client that
  stops reading holds about one slice; the rest stays in the answer's parts, and the
  large one (the items' JSON) is the cached history's own bytes, shared with the cache
  rather than copied. An answer of one slice or less is one message, as before.
- ``StallGuard`` (a mixin of the HTTP protocol) ends what the slices only bound: while
  the transport is paused for writing, it looks every ``stall_s`` seconds at how many
  bytes the client has not taken (the transport's buffer and the socket's send queue).
  If none went since the last look, the connection is reset: the bytes are freed at
  once, the kernel's queue too, the client learns it at once, and the answer's task
  ends (uvicorn's send returns on a lost connection). Progress is what reaches the
  client's TCP window, which its kernel reopens in steps (about a segment: 64 KiB on
  loopback, ~1.5 KiB on Ethernet; or a sixteenth of its receive buffer): a client
  reading slower than one step per limit may be cut off while it reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import socket
import struct
import sys
import termios
from collections.abc import Iterator
from typing import Any

from starlette.responses import Response

from services.api import metrics
from services.api.answer_budget import Pin, Reservation

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
                 slice_bytes: int = SLICE_BYTES, *, held: Reservation | Pin | None = None
                 ) -> None:
        """``held``: the answer budget's reservation of this answer's own bytes, or its
        pin of the cache's bytes it writes, released once it is written
        (answer_budget.py)."""
        self.status_code = status_code
        self._held = held
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
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            if self._length <= self._slice_bytes:  # most answers: one message, as before
                await send({"type": "http.response.body", "body": b"".join(self._parts)})
            else:
                await self._send_slices(send)
        finally:
            if self._held is not None:
                self._held.release()
        if self.background is not None:
            await self.background()

    async def _send_slices(self, send: Any) -> None:
        left = self._length
        pieces = slices(self._parts, self._slice_bytes)
        while left > 0:
            # An empty message first: uvicorn waits there until the transport has
            # drained, so the next slice is cut only once it can be written (a stalled
            # client holds one slice, not the one written and the next one cut).
            await send({"type": "http.response.body", "body": b"", "more_body": True})
            piece = next(pieces)
            left -= len(piece)
            await send({"type": "http.response.body", "body": piece, "more_body": left > 0})


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
    # From the server's shutdown on: the limit, below uvicorn's 12 s grace
    # (services/api/server.py), so an answer no one reads is reset, not cancelled when
    # the grace ends (uvicorn logs each cancelled answer as an ERROR with a traceback).
    shutdown_stall_s: float = 5.0
    _stall_timer: Any = None
    _stall_buffered = 0  # the buffer's size at the last look

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._stall_timer is None and self.stall_s > 0:
            self._look_later()

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        self._stop_looking()

    _running: Any = None  # the request whose answer is being written

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_looking()
        super().connection_lost(exc)  # type: ignore[misc]
        # uvicorn marks only the LAST request parsed as disconnected; with pipelined
        # requests the answer being written is an earlier one's, whose next write then
        # raised on the closed transport (an ERROR with a traceback on uvloop). Every
        # request of the connection is told, so each answer's send returns at once.
        for cycle, _ in (self._running, None), *self.pipeline:  # type: ignore[attr-defined]
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def shutdown(self) -> None:
        """The server stops: answers still being written keep going (uvicorn's grace),
        but one whose client takes nothing is reset after ``shutdown_stall_s``."""
        limit = min(self.stall_s or self.shutdown_stall_s, self.shutdown_stall_s)
        if limit != self.stall_s:
            self.stall_s = limit  # this connection's own limit from now on
            if self._stall_timer is not None:
                self._stop_looking()
                self._look_later()
        super().shutdown()  # type: ignore[misc]

    def eof_received(self) -> bool | None:
        """A client that half-closes after its request (``shutdown(SHUT_WR)``) still
        gets the whole answer, then the connection closes. uvicorn's protocol lets the
        transport close at the end of the stream, which ended a sliced answer at the
        slice being written (its whole answer was buffered when it was one message).
        During a request's body, or between requests, the end closes as before."""
        cycle = self.cycle  # type: ignore[attr-defined]
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            cycle.keep_alive = False
            return True  # keep the transport open for writing
        return super().eof_received()  # type: ignore[misc]

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
        _reset(transport)


def _reset(transport: Any) -> None:
    """Abort with a TCP reset: a zero linger makes the kernel drop its send queue (up to
    a few MB the client has not taken) and send RST. A plain abort frees only the
    transport's buffer; the kernel then keeps the queue and a FIN behind it for minutes
    (an orphaned socket in FIN-WAIT-1, measured 330-345 s) and the client, still
    reading it, sees an ordinary end of stream."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
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
