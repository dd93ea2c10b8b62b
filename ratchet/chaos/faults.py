"""The processes a chaos run starts (workers, API) and the faults it injects.

Only processes started here are signalled, by pid. Servers are restarted with the
``ratchet infra restart`` command (their pid must change, or the fault failed) and
Cassandra is paused with SIGSTOP/SIGCONT of the pid ``ratchet infra`` recorded.

Faults run one after another on a thread, ``gap_s`` apart, in a seeded order; each
records its start, end, whether it really happened, and what it did.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from infra.launcher import StateFile
from ratchet.settings import Settings

ZOMBIE_S = 25.0  # > the worker's group session timeout (10 s): its partitions move away
CASSANDRA_PAUSE_S = 15.0  # > the driver's request timeout: LWTs end with unknown outcomes

PROFILES = {
    # Each fault at least once; worker kills three times (restarted each time).
    "ci": ["worker_kill", "zombie", "kafka_restart", "worker_kill", "cassandra_pause",
           "api_restart", "cassandra_restart", "worker_kill", "registry_restart"],
    "long": ["worker_kill", "zombie", "kafka_restart", "worker_kill", "cassandra_pause",
             "api_restart", "cassandra_restart", "worker_kill", "registry_restart"],
    "none": [],
}


@dataclass
class FaultRecord:
    name: str
    start_s: float  # seconds since the run started
    end_s: float = 0.0
    ok: bool = False
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Child:
    """One ``ratchet <command>`` process of the run."""

    name: str
    command: str
    env: dict[str, str]
    log: Path
    cwd: Path
    proc: subprocess.Popen | None = None

    def start(self) -> Child:
        self.cwd.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", self.command],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.cwd, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float = 30.0) -> None:
        if not self.alive():
            return
        self.signal(signal.SIGCONT)  # a frozen process cannot handle SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@dataclass
class Cluster:
    """The run's workers (sharing one consumer group) and its API."""

    settings: Settings
    env: dict[str, str]
    out: Path
    n_workers: int
    workers: list[Child] = field(default_factory=list)
    api: Child | None = None
    # Held while a process is replaced, so ``revive`` never races a fault.
    lock: threading.Lock = field(default_factory=threading.Lock)
    exits: list[str] = field(default_factory=list)  # processes that died on their own

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.api_host}:{self.settings.api_port}"

    def start(self) -> None:
        for n in range(self.n_workers):
            self.workers.append(self._worker(n).start())
        self.api = Child("api", "api", self.env, self.out / "logs" / "api.log",
                         self.out / "api").start()

    def _worker(self, n: int) -> Child:
        return Child(f"worker-{n}", "worker", self.env, self.out / "logs" / f"worker-{n}.log",
                     self.out / f"worker-{n}")

    def wait_api(self, timeout_s: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=3).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return False

    def revive(self, at_s: float) -> None:
        """Restart any worker or API that died on its own (reported, never hidden).

        A worker started while Cassandra is down exits at once (fail fast at start):
        a supervisor restarts it, and so do we.
        """
        with self.lock:
            for n, w in enumerate(self.workers):
                if not w.alive():
                    self.exits.append(f"{at_s:.0f}s {w.name} exited {w.proc.returncode}")
                    self.workers[n] = self._worker(n).start()
            if self.api and not self.api.alive():
                self.exits.append(f"{at_s:.0f}s api exited {self.api.proc.returncode}")
                self.api.start()

    def stop(self) -> None:
        for child in (*self.workers, self.api):
            if child is not None:
                child.stop()


class FaultInjector(threading.Thread):
    def __init__(self, cluster: Cluster, plan: list[str], seed: int, t0: float,
                 gap_s: float, start_after_s: float, say, repeat_while=None) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.cluster, self.plan, self.t0, self.gap_s = cluster, plan, t0, gap_s
        self.start_after_s, self.say = start_after_s, say
        self.rng = random.Random(f"faults:{seed}")
        self.records: list[FaultRecord] = []
        self.repeat_while = repeat_while  # long runs: go round the plan while this is true
        self.stop = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> None:
        self.stop.wait(self.start_after_s)
        rounds = 0
        while not self.stop.is_set():
            for name in self.plan:
                if self.stop.is_set():
                    return
                rec = FaultRecord(name, self.now())
                self.say(f"fault: {name} ...")
                try:
                    rec.ok, rec.detail = getattr(self, name)()
                except Exception as exc:  # a fault that could not be injected is reported
                    rec.ok, rec.detail = False, f"{type(exc).__name__}: {exc}"
                rec.end_s = self.now()
                self.records.append(rec)
                self.say(f"fault: {name} {'done' if rec.ok else 'FAILED'} in "
                         f"{rec.end_s - rec.start_s:.1f}s: {rec.detail}")
                self.stop.wait(self.gap_s)
            rounds += 1
            if not self.repeat_while or not self.repeat_while():
                return

    # --- the faults: each returns (happened, what it did) -------------------------------

    def _alive_worker(self) -> tuple[int, Child] | None:
        self.cluster.revive(self.now())
        alive = [(n, w) for n, w in enumerate(self.cluster.workers) if w.alive()]
        return self.rng.choice(alive) if alive else None

    def worker_kill(self) -> tuple[bool, str]:
        picked = self._alive_worker()
        if picked is None:
            return False, "no worker was running"
        n, w = picked
        with self.cluster.lock:
            pid = w.proc.pid
            w.signal(signal.SIGKILL)
            w.proc.wait(10)
            fresh = self.cluster._worker(n).start()
            self.cluster.workers[n] = fresh
        return True, f"SIGKILL {w.name} (pid {pid}), restarted as pid {fresh.proc.pid}"

    def zombie(self) -> tuple[bool, str]:
        picked = self._alive_worker()
        if picked is None:
            return False, "no worker was running"
        n, w = picked
        w.signal(signal.SIGSTOP)
        self.stop.wait(ZOMBIE_S)
        w.signal(signal.SIGCONT)
        return w.alive(), f"SIGSTOP {w.name} (pid {w.proc.pid}) for {ZOMBIE_S:.0f}s, then SIGCONT"

    def _restart(self, server: str) -> tuple[bool, str]:
        before = StateFile(self.cluster.settings.home).get(server)
        done = subprocess.run([sys.executable, "-m", "ratchet.cli", "infra", "restart", server],
                              env=self.cluster.env, capture_output=True, text=True, timeout=400)
        after = StateFile(self.cluster.settings.home).get(server)
        moved = before is not None and after is not None and after.pid != before.pid
        detail = (f"pid {before.pid if before else None} -> {after.pid if after else None}, "
                  f"exit {done.returncode}")
        if not moved:
            detail += f" (not restarted: {(done.stdout + done.stderr).strip()[-300:]})"
        return moved and done.returncode == 0, detail

    def kafka_restart(self) -> tuple[bool, str]:
        return self._restart("kafka")

    def cassandra_restart(self) -> tuple[bool, str]:
        return self._restart("cassandra")

    def registry_restart(self) -> tuple[bool, str]:
        return self._restart("registry")

    def cassandra_pause(self) -> tuple[bool, str]:
        entry = StateFile(self.cluster.settings.home).get("cassandra")
        if entry is None:
            return False, "no Cassandra started by `ratchet infra` under this RATCHET_HOME"
        os.kill(entry.pid, signal.SIGSTOP)
        try:
            time.sleep(CASSANDRA_PAUSE_S)
        finally:
            os.kill(entry.pid, signal.SIGCONT)
        return True, f"SIGSTOP Cassandra (pid {entry.pid}) for {CASSANDRA_PAUSE_S:.0f}s"

    def api_restart(self) -> tuple[bool, str]:
        api = self.cluster.api
        pid = api.proc.pid if api and api.alive() else None
        if pid is None:
            return False, "api was not running"
        with self.cluster.lock:
            api.signal(signal.SIGKILL)  # waiting wait_ms requests see their connection drop
            api.proc.wait(10)
            api.start()
        ready = self.cluster.wait_api()
        return ready, f"SIGKILL api (pid {pid}) while wait_ms requests waited, restarted " \
                      f"as pid {api.proc.pid} ({'ready' if ready else 'NOT ready'})"
