"""Start, stop and check the local Kafka, Cassandra and schema registry (``ratchet infra``).

Public API (also used by fault-injection tests):

- ``up(settings, names=NAMES)``: download once, start what is not running, wait until
  every server passes a real round trip. Idempotent. Raises ``ServerStartError``.
- ``down(settings, purge=False, names=NAMES)``: stop exactly the processes ``up`` started.
- ``start_server(settings, name)`` / ``stop_server(settings, name)``: one server, for
  fault injection (``ratchet infra restart NAME`` does stop + start).
- ``status(settings)``: ``{name: ServerStatus}``.

Layout under ``settings.home`` (default ~/.cache/ratchet): ``dist/`` downloaded jars
(kept by ``down --purge``), ``conf/``, ``data/``, ``logs/<name>.log`` (stdout and
stderr of the java process), ``state.json`` (pids).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from infra import timer_slack
from infra.procs import (
    Running,
    StateFile,
    StateFileError,
    is_alive,
    pid_listens_on,
    proc_start_time,
    terminate,
)
from infra.servers import NAMES, Server, Unhealthy, server
from infra.servers.base import Port

__all__ = [
    "NAMES", "InfraError", "PortUnusable", "ServerStartError", "ServerStatus", "StateFile",
    "Unhealthy",
    "cli_down", "cli_restart", "cli_status", "cli_up", "down", "pid_listens_on", "server",
    "server_status", "start_server", "status", "stop_server", "up",
]
from ratchet.settings import MAX_PORT, Settings

Say = Callable[[str], None]


class InfraError(RuntimeError):
    """A server could not be fetched, started or stopped."""


class ServerStartError(InfraError):
    """One server did not come up; the message names it, its exit code, log and last lines."""

    def __init__(self, name: str, reason: str, log: str | None,
                 exit_code: int | None = None) -> None:
        """``log`` None: nothing was started, and the log's last lines are an earlier
        start's (an operator's review, session 43: a port taken by a stranger showed a
        healthy start of the day before)."""
        self.name, self.reason, self.log, self.exit_code = name, reason, log, exit_code
        super().__init__(
            f"{name} failed to start: {reason}"
            + (f" (exit code {exit_code})" if exit_code is not None else "")
            + (f"\n  log: {log}\n  last lines:\n{_tail(log)}" if log is not None else "")
        )


class PortUnusable(InfraError):
    """A port a server would be launched on is not a port, is another launched
    server's too, or cannot be listened on: nothing was fetched or started. The message
    names each port, what it is for and the setting that moves it."""


@dataclass(frozen=True)
class ServerStatus:
    name: str
    pid: int | None  # our process, if one is running
    healthy: bool
    detail: str
    # Something answers on the server's port (ours or not): then it is never "not
    # running", which read as "`up` will start it" while `up` refused the taken port.
    served: bool = False

    def line(self) -> str:
        state = ("healthy" if self.healthy else
                 "UNHEALTHY" if self.pid or self.served else "not running")
        pid = f"pid {self.pid}" if self.pid else "no pid"
        return f"{self.name:<10} {state:<12} {pid:<10} {self.detail}"


def _tail(path: str, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "    (no log)"
    return "\n".join("    " + line for line in text)


class _Clock:
    """Progress lines prefixed with the seconds since the command started."""

    def __init__(self, out: Say) -> None:
        self.t0 = time.monotonic()
        self.out = out
        self.lock = threading.Lock()

    def __call__(self, msg: str) -> None:
        with self.lock:
            self.out(f"[{time.monotonic() - self.t0:6.1f}s] {msg}")


def _print(msg: str) -> None:
    print(msg, flush=True)


PROGRESS_EVERY_S = 15.0


@contextlib.contextmanager
def _ticking(say: Say, what: str) -> Iterator[None]:
    """Say ``what`` with the seconds so far every ``PROGRESS_EVERY_S`` while the block
    runs: a first download (Maven, ~50 s here, minutes on a slow link) said nothing
    between its first and its last line (an operator's review, session 43)."""
    done = threading.Event()
    started = time.monotonic()

    def tick() -> None:
        while not done.wait(PROGRESS_EVERY_S):
            say(f"{what} after {time.monotonic() - started:.0f}s")

    ticker = threading.Thread(target=tick, name="progress", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


# ---------------------------------------------------------------------------- start


def _launch(srv: Server, state: StateFile) -> Running:
    srv.log_path.parent.mkdir(parents=True, exist_ok=True)
    with srv.log_path.open("ab") as log:
        log.write(f"\n==== ratchet infra: starting {srv.name} at {time.ctime()} ====\n".encode())
        log.flush()
        command, slack_ns = srv.command(), srv.timer_slack_ns()
        if slack_ns:
            command = timer_slack.wrapped(slack_ns, command)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, cwd=srv.data_dir,
                                start_new_session=True)
    start_time = None
    for _ in range(50):
        start_time = proc_start_time(proc.pid)
        if start_time is not None:
            break
        time.sleep(0.01)
    entry = Running(srv.name, proc.pid, start_time or -1, str(srv.log_path), time.time(),
                    srv.client_port())
    with state.locked() as entries:
        entries[srv.name] = entry
    srv._popen = proc  # noqa: SLF001 - keeps the exit code reachable while we wait
    # Reap the child whenever it ends, so a long-lived caller (a pytest session that
    # restarted a server) leaves no zombie behind. The thread dies with a CLI process.
    threading.Thread(target=proc.wait, name=f"reap-{srv.name}", daemon=True).start()
    return entry


def port_mismatch(srv: Server, entry: Running, home: Path) -> str | None:
    """Why ``entry`` is not the server the settings name (None: it is). A home's state
    names its processes; the settings name ports: when they disagree, acting on the
    pid would stop or report a server the operator did not point at."""
    if entry.port and entry.port != srv.client_port():
        return (f"the {srv.name} of RATCHET_HOME={home} (pid {entry.pid}) serves port "
                f"{entry.port}, the settings name {srv.client_port()}: set the ports of "
                f"those servers, or the RATCHET_HOME of these")
    return None


def _port_words(srv: Server) -> str:
    """``port N`` of a server on 127.0.0.1; ``host:N`` of a node of ``ratchet infra
    cluster``, each on its own alias with the same port (session 53's outside review:
    every node's line said "port 19042")."""
    if srv.host == "127.0.0.1":
        return f"port {srv.client_port()}"
    return f"{srv.host}:{srv.client_port()}"


def _wait_healthy(srv: Server, entry: Running, timeout_s: float, say: Say | None = None,
                  stop_on_timeout: bool = True) -> None:
    """Wait for a real round trip; ``say`` the last check every 15 s. On timeout the
    process is stopped only if ``stop_on_timeout`` (one this call launched)."""
    deadline = time.monotonic() + timeout_s
    started = time.monotonic()
    next_word = started + 15
    last = "no check ran yet"
    proc: subprocess.Popen | None = getattr(srv, "_popen", None)
    while True:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(srv.name, "the process exited", entry.log, proc.returncode)
        if proc is None and not is_alive(entry):
            raise ServerStartError(srv.name, "the process exited", entry.log)
        if srv.port_open() and pid_listens_on(entry.pid, srv.client_port()) is False:
            last = f"{_port_words(srv)} is open, but not by pid {entry.pid}"
        elif srv.port_open():
            try:
                srv.check(timeout_s=10)
                return
            except Unhealthy as exc:
                last = str(exc)
        else:
            last = f"{_port_words(srv)} not open yet"
        if time.monotonic() > deadline:
            if not stop_on_timeout:
                raise ServerStartError(
                    srv.name, f"not healthy after {timeout_s:.0f}s (last check: {last}); left "
                    f"running (pid {entry.pid}): `ratchet infra restart {srv.name}` restarts it",
                    entry.log)
            terminate(entry, grace_s=10)
            raise ServerStartError(
                srv.name, f"not healthy after {timeout_s:.0f}s (last check: {last}); stopped it",
                entry.log)
        if say is not None and time.monotonic() >= next_word:
            say(f"{srv.name}: still waiting after {time.monotonic() - started:.0f}s of "
                f"{timeout_s:.0f}s ({last})")
            next_word += 15
        time.sleep(1)


def _ensure_started(srv: Server, state: StateFile, say: Say) -> None:
    """Leave a healthy server alone, otherwise start it and wait for a real round trip."""
    entry = state.get(srv.name)
    if entry is not None:
        mismatch = port_mismatch(srv, entry, state.path.parent)
        if mismatch:
            raise ServerStartError(srv.name, mismatch, None)
        try:
            srv.check(timeout_s=5)
            say(f"{srv.name}: already running (pid {entry.pid}), healthy")
            return
        except Unhealthy:
            # Started by an earlier `up`: maybe still starting, maybe busy. Never stopped
            # here (a long pause is not a dead server); `infra restart` is the operator's.
            say(f"{srv.name}: pid {entry.pid} is running but not healthy yet, waiting")
            _wait_healthy(srv, entry, srv.start_timeout_s, say, stop_on_timeout=False)
            say(f"{srv.name}: ready (pid {entry.pid})")
            return
    if srv.port_open():
        try:
            srv.check(timeout_s=5)
        except Unhealthy as exc:
            raise ServerStartError(
                srv.name, f"port {srv.client_port()} is taken by a process that is not a healthy "
                f"{srv.name} ({exc}); nothing was started", None) from None
        say(f"{srv.name}: served on port {srv.client_port()} by a process ratchet did not "
            "start; leaving it alone")
        return
    problem = srv.cannot_launch()
    if problem:
        raise ServerStartError(srv.name, f"{problem}; nothing was started", None)
    if not srv.is_fetched():
        say(f"{srv.name}: downloading {srv.name} {srv.version} with Maven (first run only)...")
        t = time.monotonic()
        with _ticking(say, f"{srv.name}: still downloading (Maven's log: "
                      f"{srv.dist_dir}.tmp/mvn.log)"):
            srv.fetch()
        say(f"{srv.name}: downloaded in {time.monotonic() - t:.1f}s")
    if srv.port_open():  # someone may have started one while we were downloading
        return _ensure_started(srv, state, say)
    srv.prepare()
    t = time.monotonic()
    entry = _launch(srv, state)
    say(f"{srv.name}: starting {srv.name} {srv.version} (pid {entry.pid}, log {entry.log})...")
    _wait_healthy(srv, entry, srv.start_timeout_s, say)
    say(f"{srv.name}: ready in {time.monotonic() - t:.1f}s")


def up(settings: Settings, names: Iterable[str] = NAMES, out: Say = _print) -> None:
    """Start every named server in parallel; raise ``InfraError`` listing each failure
    (``PortUnusable`` before anything is fetched or started)."""
    say = _Clock(out)
    state = StateFile(settings.home)
    servers = [server(settings, n) for n in names]
    with _up_lock(settings):
        # The servers it will launch: not those running or served already, nor those
        # it refuses to launch whatever their ports (``cannot_launch``, said below).
        check_ports([s for s in servers if state.get(s.name) is None and not s.port_open()
                     and s.cannot_launch() is None])
        _up(servers, state, say)
    say("all servers ready:")
    for srv in servers:
        out("  " + srv.endpoint())


def check_ports(to_launch: list[Server]) -> None:
    """Raise ``PortUnusable`` unless every port of the servers about to be launched is
    a port, theirs alone, and free on 127.0.0.1. Kafka's controller port (its client
    port + 1) was never checked: 65536 from a client port of 65535, or a port another
    server or process holds, and Kafka exited at start (its log said why) while the
    others were started beside it (an operator's review, session 43, left; session 44)."""
    problems: list[str] = []
    taken: dict[tuple[str, int], Port] = {}
    for srv in to_launch:
        for port in srv.ports():
            if not 1 <= port.number <= MAX_PORT:
                problems.append(f"{port.role} would be {port.number}, not a port (1-{MAX_PORT}): "
                                f"change {port.setting}")
                continue
            first = taken.setdefault((port.host, port.number), port)
            if first is not port:
                problems.append(f"port {port.number} would be both {first.role} and "
                                f"{port.role}: change {port.setting}"
                                + (f" or {first.setting}" if first.setting != port.setting else ""))
                continue
            why = _cannot_listen(port.number, port.host)
            if why:
                where = port.number if port.host == "127.0.0.1" else f"{port.host}:{port.number}"
                problems.append(f"{port.role} {where} {why}: change {port.setting}")
    if problems:
        raise PortUnusable("cannot launch the servers on these ports; nothing was started:\n  "
                           + "\n  ".join(problems))


def _cannot_listen(port: int, host: str = "127.0.0.1") -> str | None:
    """Why a server could not listen on ``host``:``port`` (None: it could). Bound with
    ``SO_REUSEADDR`` as the servers do, so a port in TIME_WAIT after a stop is free."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "is in use by another process (`ss -ltnp` names it)"
            if exc.errno == errno.EACCES:
                return "needs privileges this user lacks (a port below 1024)"
            return f"cannot be listened on ({exc.strerror or exc})"
    return None


@contextlib.contextmanager
def _up_lock(settings: Settings, home: Path | None = None) -> Iterator[None]:
    """One ``up`` at a time per home: a second caller waits, then finds the servers healthy."""
    home = settings.home if home is None else home
    home.mkdir(parents=True, exist_ok=True)
    with (home / "up.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _up(servers: list[Server], state: StateFile, say: Say) -> None:
    errors: dict[str, BaseException] = {}

    def run(srv: Server) -> None:
        try:
            _ensure_started(srv, state, say)
        except BaseException as exc:  # reported below, per server
            errors[srv.name] = exc

    threads = [threading.Thread(target=run, args=(s,), name=f"up-{s.name}") for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise InfraError("\n".join(str(e) for e in errors.values()))


def start_server(settings: Settings, name: str, out: Say = _print) -> None:
    """Start one server (no-op when it is already healthy); returns when it works."""
    up(settings, [name], out=out)


# ----------------------------------------------------------------------------- stop


STOP_GRACE_S = 30.0


def stop_server(settings: Settings, name: str, out: Say = _print) -> str:
    """Stop the process ``up`` started for ``name`` (SIGTERM, then SIGKILL after 30 s).
    One that outlives SIGKILL stays recorded ("still running"): it was forgotten, and
    ``down`` exited 0 with it running (an operator's review, session 43); so does one
    whose stop was interrupted (Ctrl-C in the grace) while it runs."""
    return stop(server(settings, name), StateFile(settings.home), out)  # validates the name


def stop(srv: Server, state: StateFile, out: Say = _print) -> str:
    """``stop_server`` of ``srv`` as recorded in ``state`` (a cluster node's too)."""
    name = srv.name
    with state.locked() as entries:
        entry = entries.get(name)
        mismatch = entry and is_alive(entry) and port_mismatch(srv, entry, state.path.parent)
        if mismatch:
            out(f"{name}: {mismatch}; not stopping it")
            return "refused"
        entries.pop(name, None)
    if entry is None:
        out(f"{name}: not started by ratchet, nothing to stop")
        return "not running"
    how = "interrupted"
    try:
        how = terminate(entry, grace_s=STOP_GRACE_S)
    finally:
        # Still running (it outlived SIGKILL, or the wait was interrupted: Ctrl-C in
        # the grace, an error): recorded again, never forgotten while it runs.
        if how == "still running" or (how == "interrupted" and is_alive(entry)):
            with state.locked() as entries:
                entries.setdefault(name, entry)
    out(f"{name}: {how} (pid {entry.pid})")
    return how


def _mismatches(settings: Settings, names: list[str]) -> dict[str, str]:
    """Of ``names``, the live servers of the home whose ports differ from the
    settings', with why (``port_mismatch``)."""
    entries = StateFile(settings.home).read()
    found = {}
    for name in names:
        entry = entries.get(name)
        mismatch = (entry and is_alive(entry)
                    and port_mismatch(server(settings, name), entry, settings.home))
        if mismatch:
            found[name] = mismatch
    return found


def down(settings: Settings, purge: bool = False, names: Iterable[str] = NAMES,
         out: Say = _print) -> dict[str, str]:
    """Stop the named servers in parallel; returns how each ended (``stop_server``).

    A server the settings do not name (``port_mismatch``) is "refused", and then
    nothing is stopped (the others are "not stopped") or purged: the settings point at
    another set of servers than the home's, and the home's servers whose ports happen
    to agree belong to that other set too (an outside review, session 40: they were
    stopped while the mismatched one was refused)."""
    names = list(names)
    refused = _mismatches(settings, names)
    if refused:
        for name in names:
            out(f"{name}: {refused[name]}; not stopping it" if name in refused else
                f"{name}: not stopped (the settings name other servers, above)")
        return {name: "refused" if name in refused else "not stopped" for name in names}
    how: dict[str, str] = {}

    def stop_one(name: str) -> None:
        how[name] = stop_server(settings, name, out)

    threads = [threading.Thread(target=stop_one, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if "refused" in how.values():
        return how
    if purge:
        for sub in ("data", "logs", "conf"):
            shutil.rmtree(settings.home / sub, ignore_errors=True)
        out(f"purged data, logs and conf under {settings.home} (downloads kept in dist/)")
    return how


# ---------------------------------------------------------------------------- status


def server_status(settings: Settings, name: str) -> ServerStatus:
    return status_of(server(settings, name), StateFile(settings.home))


def status_of(srv: Server, state: StateFile) -> ServerStatus:
    """``server_status`` of ``srv`` as recorded in ``state`` (a cluster node's too)."""
    name = srv.name
    entry = state.get(name)
    pid = entry.pid if entry else None
    mismatch = entry and port_mismatch(srv, entry, state.path.parent)
    if mismatch:
        return ServerStatus(name, pid, False, mismatch)
    port_open = srv.port_open()
    port = _port_words(srv)
    if entry is None and not port_open:
        return ServerStatus(name, None, False, f"nothing listens on {port}")
    if entry is not None and port_open and pid_listens_on(entry.pid, srv.client_port()) is False:
        # Another process answers on the port: ours is not serving (as _wait_healthy).
        return ServerStatus(name, pid, False, f"{port} is open, but not by pid {entry.pid}: "
                            "another process serves it")
    try:
        srv.check(timeout_s=5)
    except Unhealthy as exc:
        if pid is None and port_open:
            # Not "not running": `up` refuses a port taken so (an operator's review,
            # session 44).
            return ServerStatus(name, None, False, f"{port} is open, "
                                f"but not a healthy {name} (a process ratchet did not "
                                f"start; `up` will not start one there): {exc}", served=True)
        return ServerStatus(name, pid, False, str(exc), served=port_open)
    where = srv.endpoint().split()[1]
    detail = where if pid else f"{where} (a process ratchet did not start)"
    return ServerStatus(name, pid, True, detail, served=True)


def status(settings: Settings) -> dict[str, ServerStatus]:
    return {n: server_status(settings, n) for n in NAMES}


# ------------------------------------------------------------------------------- cli


def _failed(command: str, settings: Settings, exc: BaseException) -> int:
    """The operator's lines for a command that could not run (exit 1), no traceback:
    a home that is a file or not writable raised ``OSError`` from ``mkdir`` or a read
    (an operator's review, session 43)."""
    why = str(exc)
    if isinstance(exc, OSError):
        why = (f"{exc.strerror or exc}: {exc.filename or settings.home} (RATCHET_HOME="
               f"{settings.home} must be a directory this user can write)")
    print(f"ratchet infra {command} failed:\n{why}", file=sys.stderr, flush=True)
    return 1


def cli_up(settings: Settings) -> int:
    try:
        up(settings)
    except (InfraError, StateFileError, OSError) as exc:
        return _failed("up", settings, exc)
    return 0


def cli_down(settings: Settings, purge: bool = False, names: Iterable[str] = NAMES) -> int:
    """Stop the named servers (all by default); exit 1 when one of them is refused or
    still runs. A server not named is neither stopped nor judged: `.ci/run` stops only
    the servers it started, and leaves those it found serving (a developer's exported
    ``RATCHET_HOME``)."""
    try:
        return _cli_down(settings, purge, list(names) or list(NAMES))
    except (StateFileError, OSError) as exc:
        return _failed("down", settings, exc)


def _cli_down(settings: Settings, purge: bool, names: list[str]) -> int:
    how = down(settings, purge=purge, names=names)
    if "refused" in how.values():
        print("ratchet infra down: refused to stop servers the settings do not name (above)",
              file=sys.stderr)
        return 1
    left = {n: e.pid for n, e in StateFile(settings.home).read().items()
            if n in names and is_alive(e)}
    if left:
        print(f"still running: {left}", file=sys.stderr)
        return 1
    return 0


def cli_status(settings: Settings) -> int:
    try:
        report = status(settings)
    except (StateFileError, OSError) as exc:
        return _failed("status", settings, exc)
    for s in report.values():
        print(s.line())
    return 0 if all(s.healthy for s in report.values()) else 1


def cli_restart(settings: Settings, name: str) -> int:
    try:
        if stop_server(settings, name) in ("refused", "still running"):
            return 1
        start_server(settings, name)
    except (InfraError, StateFileError, OSError) as exc:
        return _failed(f"restart {name}", settings, exc)
    return 0
