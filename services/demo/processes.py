"""Start, watch and stop the ``ratchet worker`` / ``ratchet api`` processes the demo and
the end-to-end tests need. Only processes started here are ever stopped here (by pid).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ratchet.settings import Settings


class ProcessFailed(RuntimeError):
    """A child process exited or never became ready; the message ends with its log tail."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment that makes a child process see ``settings``."""
    env = dict(os.environ)
    env.update(settings.to_env())
    env.update(extra)
    return env


@dataclass
class ChildProcess:
    """One ``ratchet <command>`` child with its output in ``log_path``."""

    name: str
    args: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> ChildProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ratchet.cli", *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal reaches us, we stop it
        )
        log.close()
        return self

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessFailed(
                f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (graceful: the worker commits, the API drains), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def start_worker(settings: Settings, log_dir: Path, group_id: str | None = None) -> ChildProcess:
    extra = {"RATCHET_CONSUMER_GROUP": group_id} if group_id else {}
    env = settings_env(settings, **extra)
    return ChildProcess("worker", ["worker"], env, log_dir / "worker.log").start()


def start_api(settings: Settings, log_dir: Path) -> ChildProcess:
    return ChildProcess("api", ["api"], settings_env(settings), log_dir / "api.log").start()


def wait_api_ready(
    api: ChildProcess, base_url: str, timeout_s: float = 60.0, require_notifier: bool = True
) -> None:
    """Until /healthz says the store answers AND (unless not required) the decision
    notifier is assigned."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        api.check_alive()
        try:
            body = httpx.get(f"{base_url}/healthz", timeout=2).json()
            if body.get("store") and (body.get("notifier") or not require_notifier):
                return
            last = str(body)
        except (httpx.HTTPError, ValueError) as exc:
            last = repr(exc)
        time.sleep(0.3)
    raise ProcessFailed(f"api not ready after {timeout_s:.0f}s ({last})\n{api.log_tail()}")


def wait_worker_ready(worker: ChildProcess, settings: Settings, timeout_s: float = 90.0) -> None:
    """Until the worker's health file says ok (it is written once the runtime is built)."""
    from streams.health import health_path

    deadline = time.monotonic() + timeout_s
    path = health_path(settings.home, worker.pid)
    while time.monotonic() < deadline:
        worker.check_alive()
        try:
            if json.loads(path.read_text()).get("status") == "ok":
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise ProcessFailed(f"worker not ready after {timeout_s:.0f}s\n{worker.log_tail()}")
