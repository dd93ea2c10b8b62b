"""Worker health: ``ok`` or ``degraded`` (persistence retrying), visible from outside.

Each worker process writes a small JSON file ``<home>/health/worker-<pid>.json`` when
its state changes and every few seconds as a heartbeat. The rehydration API (or an
operator, or a test) calls :func:`read_health` to fold every live worker's file into
one answer. A file is a deliberately boring interface: no port to allocate per
worker, works for several workers on one machine, and survives the worker being
too busy to answer HTTP.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HEARTBEAT_S = 2.0
# A file whose heartbeat is older than this belongs to a dead or hung worker.
STALE_AFTER_S = 15.0


@dataclass
class HealthState:
    status: str = "ok"  # ok | degraded
    # partition label -> why it is retrying, e.g. {"ratchet.gateway-events[3]": "store: ..."}
    retrying: dict[str, str] = field(default_factory=dict)
    degraded_since: float | None = None
    pid: int = field(default_factory=os.getpid)
    heartbeat: float = field(default_factory=time.time)
    promoted: int = 0
    rejected: int = 0
    dead_lettered: int = 0


class Health:
    """Thread-safe health of one worker; optionally mirrored to a file."""

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._state = HealthState()
        self._path = path
        # Events of each lane still retrying: with a lane window above 1, several events
        # of one partition retry at once, and the lane recovers when the last one does.
        self._waiting: dict[str, int] = {}

    # -- transitions ------------------------------------------------------------------
    def retrying(self, lane: str, error: str, *, new: bool = True) -> None:
        """An event of ``lane`` failed on persistence; ``new``: its first failure (each
        event that starts retrying must end with one ``recovered``)."""
        with self._lock:
            first = not self._state.retrying
            self._state.retrying[lane] = error[:500]
            if new:
                self._waiting[lane] = self._waiting.get(lane, 0) + 1
            if first:
                self._state.status = "degraded"
                self._state.degraded_since = time.time()
        if first:
            self.write()

    def recovered(self, lane: str) -> None:
        """An event of ``lane`` that was retrying is done; the lane is healthy again
        when no other event of it still retries."""
        with self._lock:
            left = self._waiting.get(lane, 1) - 1
            if left > 0:
                self._waiting[lane] = left
                return
            self._waiting.pop(lane, None)
            if self._state.retrying.pop(lane, None) is None:
                return
            if not self._state.retrying:
                self._state.status = "ok"
                self._state.degraded_since = None
        self.write()

    def is_retrying(self, lane: str) -> bool:
        with self._lock:
            return lane in self._state.retrying

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            if outcome == "promoted":
                self._state.promoted += n
            elif outcome == "rejected":
                self._state.rejected += n
            elif outcome == "dead_lettered":
                self._state.dead_lettered += n

    # -- reading ----------------------------------------------------------------------
    @property
    def status(self) -> str:
        with self._lock:
            return self._state.status

    def snapshot(self) -> dict:
        with self._lock:
            self._state.heartbeat = time.time()
            data = asdict(self._state)
        data["retrying"] = dict(data["retrying"])
        return data

    def write(self) -> None:
        """Atomically replace the health file (no-op without a path)."""
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(json.dumps(self.snapshot()))
        os.replace(tmp, self._path)

    def remove(self) -> None:
        if self._path is not None:
            self._path.unlink(missing_ok=True)


def health_dir(home: Path) -> Path:
    return home / "health"


def health_path(home: Path, pid: int | None = None) -> Path:
    return health_dir(home) / f"worker-{pid or os.getpid()}.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_health(home: Path, now: float | None = None) -> dict:
    """Fold every live worker's health file into ``{"status", "workers"}``.

    ``status`` is ``degraded`` if any live worker is retrying persistence, ``ok`` if
    at least one live worker reports ok, and ``down`` when no live worker is found.
    """
    now = time.time() if now is None else now
    workers = []
    for path in sorted(health_dir(home).glob("worker-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if now - data.get("heartbeat", 0) > STALE_AFTER_S or not _alive(int(data["pid"])):
            continue
        workers.append(data)
    if not workers:
        return {"status": "down", "workers": []}
    degraded = any(w["status"] == "degraded" for w in workers)
    return {"status": "degraded" if degraded else "ok", "workers": workers}
