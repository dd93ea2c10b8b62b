"""uvicorn's httptools protocol, serving an HTTP/1.1 request that offers an upgrade
(``Upgrade: h2c``) as the plain request it also is, body included.

Why: Java's ``java.net.http.HttpClient`` (HTTP/2 by default) sends every request to an
``http://`` URL as HTTP/1.1 with ``Connection: Upgrade, HTTP2-Settings``, ``Upgrade:
h2c`` and ``HTTP2-Settings``; so do curl's ``--http2``, Spring's ``RestClient`` and
Ktor. A server may ignore the offer and answer in HTTP/1.1 (RFC 9110, section 7.8).
uvicorn (up to 0.55.0 at least, Kludex/uvicorn#2722, open) does ignore it, but
httptools' parser treats the offer as a protocol switch: it tells llhttp to skip the
body, reports the message complete with no body (the ASGI app is started with an empty
one: a POST answers 422 "Field required") and leaves the body bytes unparsed; the next
bytes on the connection are then parsed as a new request (400).

The fix here: when the parser reports an upgrade uvicorn will not perform (anything but
a WebSocket it has a library for), the request is not started from that parse. The
head is written again without the upgrade offer (no ``Upgrade`` or ``HTTP2-Settings``
header, no ``upgrade`` / ``http2-settings`` token in ``Connection``) and fed, with the
bytes that followed it, to a fresh parser that then keeps the connection: the request,
its body (``Content-Length`` or chunked, in one packet or many) and any later request
on the connection go through uvicorn's ordinary path. The response stays HTTP/1.1.
It relies on uvicorn's ``HttpToolsProtocol`` internals (``parser``, ``headers``,
``url``, the parser callbacks); ``tests/unit/test_api_h2c.py`` runs it through a real
uvicorn server, so an upgrade of uvicorn that changes them fails there. Drop this
module once uvicorn delivers the body itself.

Not h11 (uvicorn's other parser, which has no such bug): it costs ~1 ms more per
request (docs/decisions.md, "Service"). A request without an upgrade offer costs one
extra C call (``should_upgrade``) in ``on_headers_complete``.
"""

from __future__ import annotations

import contextlib

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from services.api.models import ErrorBody

# Headers that belong to the upgrade offer, and Connection tokens that name them.
_OFFER_HEADERS = frozenset({b"upgrade", b"http2-settings"})


# The most bytes a request's head (its request line and headers) may take: above it,
# 431 and the connection closed. uvicorn's httptools protocol sets no bound, and the
# parser glues each fragment of a long line or header onto the ones before (``url +=``,
# a header value's ``+=``): 64 MiB sent in 16 KiB writes cost 4.65 s of CPU on the
# event loop, 128 MiB 18 s and +115 MB (an outside review, session 36). Counted are
# the reads that fall wholly inside one head (the parser gives no offsets: a read that
# also holds the end of a request before it, or pipelined requests, is not counted), so
# a head is refused at most two reads (2 x 256 KiB) beyond the bound; every head the
# API's clients send is under 8 KiB.
MAX_HEAD_BYTES = 64 * 1024


class UpgradeTolerantHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` that serves a request offering an upgrade it will not
    perform as a plain HTTP/1.1 request (module docstring), and refuses a request head
    above ``MAX_HEAD_BYTES``."""

    _replaying = False  # the current head offered an upgrade: it is replayed, not served
    _replay_line = b""  # its request line, as the replay writes it
    _in_message = False  # a request began and is not complete yet
    _in_head = False  # ... and its headers are not complete yet
    _began = False  # a request began during the read being parsed
    _head_bytes = 0  # the bytes of the reads that fell wholly inside its head
    _framing = 0  # the bytes of its later reads that were not body (chunk framing, trailers)
    _body_total = 0  # its body bytes so far
    _read_body = 0  # body bytes of the read being parsed

    def on_message_begin(self) -> None:
        self._in_message, self._in_head, self._began = True, True, True
        self._head_bytes = self._framing = self._body_total = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        if (self.parser.should_upgrade() and self.parser.get_method() != b"CONNECT"
                and not self._should_upgrade()):
            # An upgrade offered, as llhttp reads it (an ``upgrade`` token in ANY
            # Connection header: uvicorn's ``_get_upgrade`` reads the last one only, so
            # asking it would let an offer split over two Connection lines through with
            # its body skipped and then parsed as a request of its own). Not a CONNECT,
            # which llhttp also reports as an upgrade and the replay could not change.
            # Served by the replay in data_received, never from this parse (whose body
            # httptools skips).
            self._replaying = True
            self._replay_line = b"%s %s HTTP/%s" % (
                self.parser.get_method(), self.url,
                self.parser.get_http_version().encode("ascii"))
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._read_body += len(body)
        self._body_total += len(body)
        if not self._replaying:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        if not self._replaying:
            super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        # A loop, not a recursion, over the replays: one read may hold many pipelined
        # requests that each offer an upgrade.
        while True:
            self._unset_keepalive_if_required()
            self._began, self._read_body = False, 0
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            except httptools.HttpParserUpgrade as upgrade:
                if not self._replaying:  # uvicorn's own handling: a WebSocket, or CONNECT
                    if self._should_upgrade():
                        self.handle_websocket_upgrade()
                    else:
                        self._unsupported_upgrade_warning()
                    return
                offset = upgrade.args[0] if upgrade.args else len(data)
                data = self._replay(bytes(data[offset:]))
                continue
            else:
                if self._in_message and not self._began and self._beyond_head_bound(data):
                    self._in_message = self._in_head = False
                    self._refuse(431, f"the request head is above {MAX_HEAD_BYTES} bytes "
                                      "(its line and headers, or a chunked body's framing "
                                      "and trailers beyond its body's size)")
            return

    def _beyond_head_bound(self, data: bytes) -> bool:
        """A read inside a request that began in an earlier one: its head, or what is
        not body after it (chunk framing, trailers: the parser glues a trailer's
        fragments like a header's), past the bound (the framing's: the body's size more)."""
        if self._in_head:
            self._head_bytes += len(data)
            return self._head_bytes > MAX_HEAD_BYTES
        self._framing += len(data) - self._read_body
        return self._framing > MAX_HEAD_BYTES + self._body_total

    def send_400_response(self, msg: str) -> None:
        """A request the parser refuses (an unknown method, a malformed line or header)
        answered with the API's typed bad-input body, not uvicorn's plain text; the
        connection is closed, as uvicorn does (the parser cannot go on)."""
        self._refuse(400, msg)

    def _refuse(self, status: int, msg: str) -> None:
        """The typed bad-input body with ``status``, and the connection closed."""
        body = ErrorBody(error="INVALID_REQUEST", detail=msg).model_dump_json().encode()
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"content-type: application/json\r\n",
                        b"content-length: %d\r\n" % len(body),
                        b"connection: close\r\n\r\n", body])
        self.transport.write(b"".join(content))
        self.transport.close()

    def _replay(self, rest: bytes) -> bytes:
        """A fresh parser that keeps the connection from now on, and what to feed it:
        the head without the upgrade offer, then ``rest`` (the body and anything after
        it)."""
        self._replaying = False
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # httptools < 0.6.3 has none
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        return _head_without_offer(self._replay_line, self.headers) + rest


def _head_without_offer(request_line: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request head as HTTP/1.1 text, without the upgrade offer."""
    lines = [request_line]
    for name, value in headers:
        if name in _OFFER_HEADERS:
            continue
        if name == b"connection":
            tokens = [t.strip() for t in value.split(b",")]
            value = b", ".join(t for t in tokens if t and t.lower() not in _OFFER_HEADERS)
            if not value:
                continue
        lines.append(name + b": " + value)
    return b"\r\n".join(lines) + b"\r\n\r\n"


__all__ = ["UpgradeTolerantHttpToolsProtocol"]
