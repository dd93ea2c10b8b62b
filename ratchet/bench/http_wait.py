"""Produce -> HTTP ``certified`` with ``wait_ms``: a gateway's read-your-writes for its
next turn, timed during ``ratchet bench processor``'s latency phase (issue 15).

A real ``ratchet api`` child process (uvicorn, loopback TCP) reads the keyspace the
bench's worker writes and follows the bench's decision topics. Right after each turn of
the latency phase is produced, ``HttpWaits.wait_for`` sends a GET of that response's
history with ``wait_ms``; the figure is the time from the produce to the 200
``certified`` answer. Any other answer fails the run: a figure is only of answers a
gateway could use.

The client is one aiohttp ``ClientSession`` on an event loop in a thread of its own,
at most ``MAX_IN_FLIGHT`` requests open (a request over the bound waits for a slot, and
that wait is in its figure: ``queued`` says whether it happened). aiohttp, not httpx:
at 88 turns/s with 64 slots, httpx's ``AsyncClient`` took 0.37 cores of the bench
process and held its slots so long that 195 of 300 requests queued (produce -> send
p50 2.1 s: the client was the figure); aiohttp (installed with faust-streaming, which
the worker runs on) took 0.14 cores and 20 queued. Its
overhead is measured apart by ``overhead``: the same client's sequential GETs of
responses already promoted (the API answers from its cache, nothing to wait for),
interleaved with a blocking client's.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlencode

import aiohttp
import httpx

from ratchet.bench.measure import RunFailed
from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.samples import TENANT, make_fingerprint
from ratchet.settings import Settings

# Open requests. About rate x latency are open at once (a gateway waits once per turn
# too); above the bound a request would wait for a slot and the client would be the
# figure, so it is set well above 88 turns/s x 1 s.
MAX_IN_FLIGHT = 256
WAIT_MS = 10_000  # the contract's largest wait_ms: a slow promotion is measured, not a 409
ASYNC_CLIENT = "async client (aiohttp, the waits' client)"
BLOCKING_CLIENT = "blocking client (http.client)"


@dataclass(frozen=True)
class WaitFigures:
    """Produce -> certified answer, per turn, and what the API and client did meanwhile."""

    latencies_ms: list[float]
    waited: int  # requests the API parked until the promotion record woke them
    queued: int  # requests that waited for a client slot (MAX_IN_FLIGHT open)
    # CPU seconds over the latency run of the API process and of the bench process (the
    # client, the paced producer and the outcome consumer), and the run's seconds.
    cpu_s: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    # Of the servers' CPU in ``cpu_s``, what their JIT and their flushes and compactions
    # took (``CpuWindow.background_s``): a flush or a compaction inside the window shows
    # here, and it is what this line's tail is made of on a shared host
    # (docs/decisions.md, "The HTTP line's tail").
    background_s: dict[str, float] = field(default_factory=dict)


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
        self._partition_of: dict[str, str] = {}  # response id -> its partition key
        self.answered: list[str] = []  # response ids answered certified, in send order
        self._queued = 0
        self._woken_before = 0
        try:
            wait_api_ready(self.api, self.base_url, require_notifier=True)
            self.thread.start()
            self.session, self.slots = self._call(self._open())
        except BaseException:
            self.close()
            raise

    async def _open(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        session = aiohttp.ClientSession(
            self.base_url, connector=aiohttp.TCPConnector(limit=MAX_IN_FLIGHT),
            timeout=aiohttp.ClientTimeout(total=WAIT_MS / 1000 + 10))
        return session, asyncio.Semaphore(MAX_IN_FLIGHT)

    def _call(self, coro, timeout_s: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def _path(self, response_id: str, partition_key: str) -> str:
        return (f"/v1/responses/{response_id}/history?{self.query}&wait_ms={WAIT_MS}&"
                + urlencode({"partition_key": partition_key}))

    async def _get_certified(self, response_id: str, partition_key: str) -> float:
        """GET with ``wait_ms``; the monotonic time of the certified answer."""
        self._queued += self.slots.locked()
        async with self.slots, self.session.get(self._path(response_id,
                                                           partition_key)) as answer:
            body = await answer.read()
            answered = time.monotonic()
        _check_certified(response_id, answer.status, body)
        return answered

    def wait_for(self, response_id: str, partition_key: str, produced_at: float) -> None:
        """Send the GET now (call right after producing the turn; ``produced_at`` is the
        ``time.monotonic()`` of the produce). It names the response's partition, as the
        gateway library does (``RehydrationClient``, docs/service.md)."""
        self._partition_of[response_id] = partition_key
        future = asyncio.run_coroutine_threadsafe(
            self._get_certified(response_id, partition_key), self.loop)
        self._pending.append((response_id, produced_at, future))

    def results(self, timeout_s: float) -> WaitFigures:
        """Every answer since the last call (raises on a missing or non-certified one),
        and the API's count of requests that waited for a promotion meanwhile."""
        deadline = time.monotonic() + timeout_s
        latencies = []
        for response_id, produced, future in self._pending:
            latencies.append((future.result(max(0.1, deadline - time.monotonic()))
                              - produced) * 1000)
            self.answered.append(response_id)
        self._pending = []
        total = self._woken()
        woken, self._woken_before = total - self._woken_before, total
        queued, self._queued = self._queued, 0
        return WaitFigures(latencies, woken, queued)

    def overhead(self, response_ids: list[str]) -> dict[str, list[float]]:
        """ms per GET (with ``wait_ms``) of responses already promoted, sequential: by
        this client, and interleaved with it by a blocking keep-alive ``http.client``
        (the client of ``ratchet bench api``), so the async client's own cost shows."""
        async def timed(response_id: str) -> float:
            start = time.monotonic()
            await self._get_certified(response_id, self._partition_of[response_id])
            return (time.monotonic() - start) * 1000

        times: dict[str, list[float]] = {ASYNC_CLIENT: [], BLOCKING_CLIENT: []}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            for response_id in response_ids:
                times[ASYNC_CLIENT].append(self._call(timed(response_id)))
                start = time.monotonic()
                conn.request("GET", self._path(response_id, self._partition_of[response_id]))
                answer = conn.getresponse()
                body = answer.read()
                times[BLOCKING_CLIENT].append((time.monotonic() - start) * 1000)
                _check_certified(response_id, answer.status, body)
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
            if hasattr(self, "session"):
                self._call(self.session.close())
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
        self.api.stop()


def _check_certified(response_id: str, status: int, body: bytes) -> None:
    """Only a 200 ``certified`` answer is a sample: anything else fails the run (a 409
    "no decision within 10000 ms" on a starved machine: a worker more than the wait behind
    its paced turns, seen at a load of 12 on 2 cores, session 50)."""
    if status != 200 or json.loads(body).get("outcome") != "certified":
        raise RunFailed(f"the API answered {response_id} HTTP {status} where the latency run "
                        f"needs a certified history: {body[:300].decode(errors='replace')}")
