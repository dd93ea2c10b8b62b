"""Warm the history cache before a gateway asks (issue: rehydration at memory speed).

The decision notifier sees every ``CheckpointPromoted`` record. A gateway's next call
is usually the history of the response it just produced, so on each promotion whose
parent's history is cached here, the API reads that ONE new row, verifies it and its
lineage-digest link, and caches the extended history (``RehydrationService.prewarm``).

Bounded, and never in the notifier's way: records go into a queue of ``capacity``
(dropped when it is full: a missed warm-up costs the gateway one extension read, never
a wrong answer), and one daemon thread does the reads.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable

from services.api import metrics

log = logging.getLogger("ratchet.api.prewarm")

# (tenant_id, partition_key, response_id) -> True if the history is cached now.
Warm = Callable[[str, str, str], bool]


class Prewarmer:
    def __init__(self, warm: Warm, capacity: int = 1024) -> None:
        self._warm = warm
        self._queue: queue.Queue[tuple[str, str, str] | None] = queue.Queue(capacity)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="history-prewarm", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def promoted(self, record: object) -> None:
        """Called by the notifier with a decoded ``CheckpointPromoted``: never blocks."""
        try:
            self._queue.put_nowait(
                (record.tenant_id, record.partition_key, record.response_id)  # type: ignore[attr-defined]
            )
        except queue.Full:
            metrics.PREWARM.labels("dropped").inc()

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                metrics.PREWARM.labels("warmed" if self._warm(*job) else "skipped").inc()
            except Exception as exc:  # a store hiccup must not end warming
                metrics.PREWARM.labels("failed").inc()
                log.warning("prewarm failed", extra={"ctx": {"error": repr(exc)}})
