"""Warm the history cache before a gateway asks (issue: rehydration at memory speed).

The decision notifier sees every ``CheckpointPromoted`` record. A gateway's next call
is usually the history of the response it just produced, so on each promotion whose
parent's history is cached here, the API reads that ONE new row, verifies it and its
lineage-digest link, and caches the extended history (``RehydrationService.prewarm``).

Where: on the event loop that serves the requests, through the same awaited reads
(the C++ driver, services/cassandra_loop.py), not in a thread of its own: no blocking
driver call, no thread hand-off per record (docs/decisions.md, "Service").

Bounded, and never in the notifier's way: the notifier thread only schedules a
warm-up on the loop (``call_soon_threadsafe`` never blocks); at most ``capacity``
run at once and the rest are dropped (a missed warm-up costs the gateway one
extension read, never a wrong answer). A promotion that woke a waiting request is not
warmed here (``DecisionNotifier``): that request reads the same row itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from services.api import metrics

log = logging.getLogger("ratchet.api.prewarm")

# (tenant_id, partition_key, response_id) -> True if the history is cached now.
Warm = Callable[[str, str, str], Awaitable[bool]]


class Prewarmer:
    def __init__(self, warm: Warm, capacity: int = 64) -> None:
        self._warm = warm
        self._capacity = capacity
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: set[asyncio.Task[None]] = set()  # touched on the loop only

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The serving loop (at start-up): warm-ups run there. Before it, none run."""
        self._loop = loop

    def promoted(self, record: object) -> None:
        """Called by the notifier thread with a decoded ``CheckpointPromoted``: never
        blocks."""
        job = (record.tenant_id, record.partition_key, record.response_id)  # type: ignore[attr-defined]
        loop = self._loop
        if loop is None:
            metrics.PREWARM.labels("dropped").inc()
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the process is stopping
            loop.call_soon_threadsafe(self._start, job)

    def _start(self, job: tuple[str, str, str]) -> None:
        if len(self._running) >= self._capacity:
            metrics.PREWARM.labels("dropped").inc()
            return
        task = asyncio.ensure_future(self._run(job))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, job: tuple[str, str, str]) -> None:
        try:
            warmed = await self._warm(*job)
        except Exception as exc:  # a store hiccup must not end warming
            metrics.PREWARM.labels("failed").inc()
            log.warning("prewarm failed", extra={"ctx": {"error": repr(exc)}})
        else:
            metrics.PREWARM.labels("warmed" if warmed else "skipped").inc()
