"""Process bookkeeping: the pid state file and stopping exactly our processes.

The state file (``<home>/state.json``) maps a server name to the pid and kernel start
time of the java process ``infra up`` launched. The start time guards against pid
reuse: a recorded pid whose start time differs is someone else's process and is
never signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Running:
    """One launched server process as recorded in the state file."""

    name: str
    pid: int
    start_time: int  # field 22 of /proc/<pid>/stat: clock ticks since boot
    log: str
    started_at: float  # wall clock, for humans
    # The client port it was started to serve (0: a state file from before it was kept).
    # The settings of a later ``status``, ``down`` or ``restart`` must name the same one.
    port: int = 0


class StateFileError(RuntimeError):
    """``state.json`` exists but cannot be read: which processes ``up`` started is unknown."""


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid``, or None when no such process exists (or it is a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def is_alive(entry: Running) -> bool:
    return proc_start_time(entry.pid) == entry.start_time


class StateFile:
    """The launched processes, guarded by an exclusive lock while read-modified-written."""

    def __init__(self, home: Path) -> None:
        self.path = home / "state.json"
        self.lock_path = home / "state.lock"

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict[str, Running]]:
        """Yield the current entries; changes made to the dict are written back."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = self.read()
            yield entries
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({k: asdict(v) for k, v in entries.items()}, indent=2))
            tmp.replace(self.path)

    def read(self) -> dict[str, Running]:
        """The recorded processes ({} when there is no file yet). A file that cannot be
        read is a ``StateFileError``: read as {}, it made ``down`` stop nothing and exit
        0 with every server left running, and ``up`` take its own servers for someone
        else's (an operator's review, session 43)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            raw = json.loads(text)
            return {name: Running(**value) for name, value in raw.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise StateFileError(
                f"{self.path} cannot be read ({type(exc).__name__}: {exc}); it names the "
                f"processes `ratchet infra up` started, so nothing is started or stopped "
                f"while it is damaged: stop this home's servers by hand (`pgrep -af "
                f"{shlex.quote(str(self.path.parent))}`), then delete it") from None

    def get(self, name: str) -> Running | None:
        entry = self.read().get(name)
        return entry if entry and is_alive(entry) else None


KILL_WAIT_S = 10.0


def terminate(entry: Running, grace_s: float = 30.0) -> str:
    """SIGTERM the process group of ``entry``, wait up to ``grace_s``, then SIGKILL.

    Returns how it ended: ``"not running"``, ``"stopped"``, ``"killed"``, or
    ``"still running"`` when it outlived SIGKILL by ``KILL_WAIT_S`` (a process stuck in
    the kernel, e.g. on a dead disk): it was "killed" while it ran on.
    """
    if not is_alive(entry):
        return "not running"
    _signal_group(entry.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap(entry.pid)
        if not is_alive(entry):
            return "stopped"
        time.sleep(0.2)
    _signal_group(entry.pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        _reap(entry.pid)
        if not is_alive(entry):
            return "killed"
        time.sleep(0.1)
    return "killed" if not is_alive(entry) else "still running"


def _reap(pid: int) -> None:
    """Collect the exit status when the server is our own child (e.g. restarted by a test)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # Servers are started as session (and group) leaders, so the group id is the pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def pid_listens_on(pid: int, port: int) -> bool | None:
    """Whether ``pid`` itself holds a listening TCP socket on ``port``.

    None when that cannot be told (no /proc). Used so that a server started by someone
    else on the same port is never mistaken for the one we just launched.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f[9])
    if not Path("/proc/net/tcp").exists():
        return None
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False
