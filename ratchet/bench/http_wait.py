"""Produce -> HTTP ``certified`` with ``wait_ms``: a gateway's read-your-writes for its
next turn, timed during ``ratchet bench processor``'s latency phase (issue 15).

A real ``ratchet api`` child process (uvicorn, loopback TCP) reads the keyspace the
bench's worker writes and follows the bench's decision topics. Right after each turn of
the latency phase is produced, ``HttpWaits.wait_for`` sends a GET of that response's
history with ``wait_ms``; the figure is the time from the produce to the 200
``certified`` answer. Any other answer fails the run: a figure is only of answers a
gateway could use.

The client is one httpx ``AsyncClient`` on an event loop in a thread of its own, at
most ``MAX_IN_FLIGHT`` requests open (a request over the bound waits for a slot, and
that wait is in its figure: ``queued`` says whether it happened). Its overhead is
measured apart by ``overhead``: the same client's sequential GETs of responses already
promoted (the API answers from its cache, nothing to wait for), beside a blocking
client's.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlencode

import httpx

from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.samples import TENANT, make_fingerprint
from ratchet.settings import Settings

MAX_IN_FLIGHT = 64  # open requests; at half load about rate x p99 are open at once
WAIT_MS = 10_000  # the contract's largest wait_ms: a slow promotion is measured, not a 409
ASYNC_CLIENT = "async client (httpx, the waits' client)"
BLOCKING_CLIENT = "blocking client (http.client)"


@dataclass(frozen=True)
class WaitFigures:
    """Produce -> certified answer, per turn, and what the API and client did meanwhile."""

    latencies_ms: list[float]
    waited: int  # requests the API parked until the promotion record woke them
    queued: int  # requests that waited for a client slot (MAX_IN_FLIGHT open)


class HttpWaits:
    """A ``ratchet api`` beside the worker, and the client that waits on it."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        from services.demo.processes import free_port, start_api, wait_api_ready

        api_settings = replace(settings, api_host="127.0.0.1", api_port=free_port())
        self.port = api_settings.api_port
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api = start_api(api_settings, log_dir)
        self.query = urlencode({"tenant_id": TENANT,
                                "fingerprint_hash": fingerprint_hash(make_fingerprint())})
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-http",
                                       daemon=True)
        self._pending: list[tuple[str, float, asyncio.Future]] = []
        self.answered: list[str] = []  # response ids answered certified, in send order
        self._queued = 0
        try:
            wait_api_ready(self.api, self.base_url, require_notifier=True)
            self.thread.start()
            self.client, self.slots = self._call(self._open())
        except BaseException:
            self.close()
            raise

    async def _open(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        limits = httpx.Limits(max_connections=MAX_IN_FLIGHT,
                              max_keepalive_connections=MAX_IN_FLIGHT)
        client = httpx.AsyncClient(base_url=self.base_url, limits=limits,
                                   timeout=WAIT_MS / 1000 + 10)
        return client, asyncio.Semaphore(MAX_IN_FLIGHT)

    def _call(self, coro, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def _path(self, response_id: str) -> str:
        return f"/v1/responses/{response_id}/history?{self.query}&wait_ms={WAIT_MS}"

    async def _get_certified(self, response_id: str) -> float:
        """GET with ``wait_ms``; the monotonic time of the certified answer."""
        self._queued += self.slots.locked()
        async with self.slots:
            answer = await self.client.get(self._path(response_id))
        answered = time.monotonic()
        body = answer.json()
        if answer.status_code != 200 or body.get("outcome") != "certified":
            raise RuntimeError(f"{response_id}: HTTP {answer.status_code} {str(body)[:300]}")
        return answered

    def wait_for(self, response_id: str, produced_at: float) -> None:
        """Send the GET now (call right after producing the turn; ``produced_at`` is the
        ``time.monotonic()`` of the produce)."""
        future = asyncio.run_coroutine_threadsafe(self._get_certified(response_id), self.loop)
        self._pending.append((response_id, produced_at, future))

    def results(self, timeout_s: float) -> WaitFigures:
        """Every answer (raises on a missing or non-certified one), and the API's count
        of requests that waited for a promotion."""
        deadline = time.monotonic() + timeout_s
        latencies = []
        for response_id, produced, future in self._pending:
            latencies.append((future.result(max(0.1, deadline - time.monotonic()))
                              - produced) * 1000)
            self.answered.append(response_id)
        self._pending = []
        return WaitFigures(latencies, self._woken(), self._queued)

    def overhead(self, response_ids: list[str]) -> dict[str, list[float]]:
        """ms per GET (with ``wait_ms``) of responses already promoted, sequential: by
        this client, and interleaved with it by a blocking keep-alive ``http.client``
        (the client of ``ratchet bench api``), so the async client's own cost shows."""
        async def timed(response_id: str) -> float:
            start = time.monotonic()
            await self._get_certified(response_id)
            return (time.monotonic() - start) * 1000

        times: dict[str, list[float]] = {ASYNC_CLIENT: [], BLOCKING_CLIENT: []}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            for response_id in response_ids:
                times[ASYNC_CLIENT].append(self._call(timed(response_id)))
                start = time.monotonic()
                conn.request("GET", self._path(response_id))
                answer = conn.getresponse()
                body = answer.read()
                times[BLOCKING_CLIENT].append((time.monotonic() - start) * 1000)
                if answer.status != 200 or not body.startswith(b'{"outcome":"certified"'):
                    raise RuntimeError(f"{response_id}: HTTP {answer.status} {body[:300]!r}")
        finally:
            conn.close()
        return times

    def _woken(self) -> int:
        """``ratchet_api_waits_total{result="woken_promoted"}`` from the API's /metrics."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        found = re.search(r'^ratchet_api_waits_total\{result="woken_promoted"\} (\S+)$',
                          text, re.M)
        return int(float(found.group(1))) if found else 0

    def close(self) -> None:
        if self.thread.is_alive():
            if hasattr(self, "client"):
                self._call(self.client.aclose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
        self.api.stop()
