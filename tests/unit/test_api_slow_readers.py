"""services/api/slow_readers.py: an answer is sent in slices, so a client that does not
read holds little of the API's memory, and a client that takes none of its answer for
the stall limit is cut off, while one that reads slowly gets all of it. The last three
run a real uvicorn server on uvloop with the API's protocol, raw sockets as clients."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.background import BackgroundTask
from starlette.responses import Response

from services.api import metrics, slow_readers
from services.api.h2c import UpgradeTolerantHttpToolsProtocol
from services.api.slow_readers import (
    SLICE_BYTES,
    PartsResponse,
    StallGuard,
    slices,
    with_stall_guard,
)
from tests.unit.real_api import running_server

ANSWER = b"0123456789abcdef" * (24 * 1024)  # 384 KiB
PARTS = (b'{"items":', ANSWER * 16, b"}")  # 6 MiB, the middle part as a cache holds it
TOTAL = sum(len(part) for part in PARTS)


@pytest.mark.parametrize("seed", range(40))
def test_slices_rebuild_the_body_in_pieces_of_the_size(seed):
    rng = random.Random(seed)
    parts = tuple(bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 5, 40, 300))))
                  for _ in range(rng.randrange(0, 6)))
    size = rng.choice((1, 3, 16, 64, 1000))
    pieces = list(slices(parts, size))
    assert b"".join(pieces) == b"".join(parts)
    assert all(len(piece) == size for piece in pieces[:-1])
    assert all(0 < len(piece) <= size for piece in pieces)


def test_a_part_that_fits_a_slice_is_sent_as_is_not_copied():
    part = b"x" * 1000
    assert next(slices((part,), 1000)) is part
    assert list(slices((), 1000)) == []


async def _messages(response: Response) -> list[dict]:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await response({"type": "http", "method": "GET"}, None, send)
    return sent


@pytest.mark.parametrize("parts", [(b"{}",), (b'{"a":', b"1", b"}"), PARTS])
def test_the_wire_carries_what_one_plain_response_of_the_joined_body_carries(parts):
    whole = b"".join(parts)
    plain = asyncio.run(_messages(Response(whole, 200, media_type="application/json")))
    sliced = asyncio.run(_messages(PartsResponse(parts, 200)))
    assert sliced[0] == plain[0]  # status and headers, in order
    assert b"".join(m["body"] for m in sliced[1:]) == whole
    assert all(m["more_body"] for m in sliced[1:-1]) and not sliced[-1].get("more_body")
    assert len([m for m in sliced[1:] if m["body"]]) == max(1, -(-len(whole) // SLICE_BYTES))


# --- through a real server ------------------------------------------------------------

class CountingGuard(StallGuard):
    """The guard, counting its looks at a paused transport."""

    looks = 0

    def _look(self) -> None:
        CountingGuard.looks += 1
        super()._look()


class Handed:
    """What the app handed to uvicorn, and whether the answer's task ended."""

    def __init__(self) -> None:
        self.bytes = 0
        self.slices = 0  # body messages with bytes
        self.ended = threading.Event()
        self.server: uvicorn.Server | None = None


@contextlib.contextmanager
def served(stall_s: float, parts: tuple[bytes, ...] = PARTS,
           shutdown_stall_s: float = 5.0) -> Iterator[tuple[int, Handed]]:
    handed = Handed()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return

        async def counting(message: dict) -> None:
            await send(message)
            handed.bytes += len(message.get("body", b""))
            handed.slices += bool(message.get("body"))

        try:
            await PartsResponse(parts, 200)(scope, receive, counting)
        finally:
            handed.ended.set()

    protocol = type("Guarded", (CountingGuard, UpgradeTolerantHttpToolsProtocol),
                    {"stall_s": stall_s, "shutdown_stall_s": shutdown_stall_s})
    with running_server(app, protocol) as (port, server):
        handed.server = server
        yield port, handed


def _ask(port: int, window: int = 4096) -> socket.socket:
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)  # before connect
    client.connect(("127.0.0.1", port))
    client.sendall(b"GET /history HTTP/1.1\r\nHost: api\r\n\r\n")
    return client


def _read_all(client: socket.socket, pause_s: float = 0.0, chunk: int = 65536) -> bytes:
    received = b""
    client.settimeout(10)
    while True:
        data = client.recv(chunk)
        if not data:
            return received
        received += data
        head, _, body = received.partition(b"\r\n\r\n")
        if body and len(body) == TOTAL:
            return received
        time.sleep(pause_s)


def test_a_client_that_does_not_read_is_handed_only_what_the_socket_takes():
    """The rest stays in the answer's parts: uvicorn waits for the transport to drain
    before each slice (one message of 6 MiB was handed to the transport whole)."""
    with served(stall_s=0) as (port, handed):
        client = _ask(port)
        try:
            time.sleep(1.0)
            assert not handed.ended.is_set()
            # the kernel's buffers of both ends, one slice and the transport's mark
            assert handed.bytes < TOTAL / 2, handed.bytes
        finally:
            client.close()
        assert handed.ended.wait(10)  # the task ends with the connection


def test_a_client_that_takes_nothing_for_the_stall_limit_is_cut_off():
    before = metrics.STALLED_ANSWERS._value.get()
    with served(stall_s=0.5) as (port, handed):
        client = _ask(port)
        try:
            assert handed.ended.wait(10), "the answer's task still waits for the client"
            assert metrics.STALLED_ANSWERS._value.get() == before + 1
            # a reset, at once: not the kernel's queue (MBs) followed by an ordinary end
            # of stream minutes later (a plain abort left the socket orphaned holding
            # it; an outside review, session 37)
            with pytest.raises(ConnectionResetError):
                _read_all(client)
        finally:
            client.close()


def test_a_client_that_reads_slowly_gets_the_whole_answer():
    """Reading at most 64 KiB every 20 ms (~3 s for the answer) through a 64 KiB
    window: the transport is paused for longer than the stall limit, and every look
    finds that the client took some of what waited. (The transport's own buffer did not
    show it: the kernel takes more only once a third of its queue has gone; the first
    guard, looking at the buffer alone, cut this client off after 2.8 of 6 MB.)"""
    before = metrics.STALLED_ANSWERS._value.get()
    CountingGuard.looks = 0
    with served(stall_s=0.2) as (port, handed):
        client = _ask(port, window=65536)
        try:
            received = _read_all(client, pause_s=0.02)
        finally:
            client.close()
        assert received.partition(b"\r\n\r\n")[2] == b"".join(PARTS)
        assert CountingGuard.looks >= 1, "the transport never stayed paused: nothing checked"
        assert metrics.STALLED_ANSWERS._value.get() == before
        assert handed.ended.wait(10)


def test_a_client_that_half_closes_after_its_request_gets_the_whole_answer():
    """``shutdown(SHUT_WR)`` after the request (an HTTP/1.0-style client): the end of
    its stream used to close the transport mid-answer, at the slice being written."""
    with served(stall_s=30) as (port, handed):
        client = _ask(port, window=65536)
        client.shutdown(socket.SHUT_WR)
        try:
            received = _read_all(client, pause_s=0.001)
            assert client.recv(1) == b""  # then the connection closes
        finally:
            client.close()
        assert received.partition(b"\r\n\r\n")[2] == b"".join(PARTS)


def test_a_stalled_answer_has_cut_no_slice_beyond_those_handed_to_the_transport():
    """The next slice is cut only once the transport has drained: a client that stops
    reading holds one slice of the answer's copy, not the one written plus the next."""
    cut = []

    def counted(parts, size):
        for piece in slices(parts, size):
            cut.append(len(piece))
            yield piece

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slow_readers, "slices", counted)
        with served(stall_s=0) as (port, handed):
            client = _ask(port)
            try:
                time.sleep(1.0)  # the answer is stalled well before
                cut_then, handed_then = len(cut), handed.slices
            finally:
                client.close()
    assert 0 < handed_then < len(list(slices(PARTS, SLICE_BYTES)))
    assert cut_then == handed_then


def test_at_shutdown_an_answer_no_one_reads_is_reset_not_cancelled_at_the_grace(caplog):
    """uvicorn cancels what is still running when its grace ends and logs each as an
    ERROR with a traceback; from the shutdown on, a client that takes nothing for the
    shutdown limit is reset instead (a WARNING), and the server stops then."""
    before = metrics.STALLED_ANSWERS._value.get()
    with served(stall_s=30, shutdown_stall_s=0.3) as (port, handed):
        client = _ask(port)
        try:
            time.sleep(0.5)  # the answer is stalled
            handed.server.should_exit = True
            assert handed.ended.wait(10), "the answer's task still waits for the client"
            with pytest.raises(ConnectionResetError):
                _read_all(client)
        finally:
            client.close()
    assert metrics.STALLED_ANSWERS._value.get() == before + 1
    assert not [r for r in caplog.records if "Exception in ASGI" in r.getMessage()]


def test_the_server_these_tests_run_is_on_uvloop_as_the_api():
    loops = []

    async def app(scope, receive, send) -> None:
        if scope["type"] == "http":
            loops.append(type(asyncio.get_running_loop()).__module__)
            await PartsResponse((b"{}",), 200)(scope, receive, send)

    with running_server(app, UpgradeTolerantHttpToolsProtocol) as (port, _):
        _ask(port).recv(4096)
    assert loops == ["uvloop"]


def test_pipelined_answers_end_quietly_when_their_client_is_cut_off(caplog):
    """uvicorn marked only the last request parsed as disconnected: the answer being
    written, an earlier one's, wrote on into the closed transport and failed with an
    ERROR traceback (an outside review, session 37)."""
    before = metrics.STALLED_ANSWERS._value.get()
    with served(stall_s=0.3) as (port, handed):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /a HTTP/1.1\r\nHost: api\r\n\r\n" * 2)  # never read
        try:
            assert handed.ended.wait(10)
            time.sleep(0.3)
        finally:
            client.close()
    assert metrics.STALLED_ANSWERS._value.get() == before + 1
    assert not [r for r in caplog.records if "Exception in ASGI" in r.getMessage()]


def test_the_guard_is_mixed_into_the_protocol_with_its_limit():
    guarded = with_stall_guard(UpgradeTolerantHttpToolsProtocol, 7)
    assert guarded.__mro__[1:3] == (StallGuard, UpgradeTolerantHttpToolsProtocol)
    assert guarded.stall_s == 7


@pytest.mark.parametrize("parts", [(b"{}",), PARTS])
def test_a_background_task_attached_to_the_response_runs_after_it(parts):
    """FastAPI attaches a route's background tasks to the Response it returns."""
    ran = []
    response = PartsResponse(parts, 200)
    response.background = BackgroundTask(ran.append, "done")
    sent = asyncio.run(_messages(response))
    assert ran == ["done"] and not sent[-1].get("more_body")
