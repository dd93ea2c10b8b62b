"""``ratchet`` commands as processes of their own, for the tests that stop them with a
signal (Ctrl-C, SIGTERM) and read how they ended.

Shared since session 49 by the tests of stops (``test_server_sigterm*.py``,
``test_operator_leftovers.py``, ``test_migrate_*.py``, ``test_smoke_cleanup.py``): each
had its own copy of these steps (session 48).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ratchet.settings import Settings
from streams.testing import ROOT

CLI = [sys.executable, "-m", "ratchet.cli"]


def cli_env(settings: Settings, **extra: str) -> dict[str, str]:
    """This environment with ``settings``, this checkout on ``PYTHONPATH``, and ``extra``
    last (it wins)."""
    return {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT), **extra}


def as_from_a_terminal() -> None:
    """A child's ``preexec_fn``: SIGINT handled as a terminal's shell starts a command
    (a background job's would ignore it, and Ctrl-C would not reach it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it is still running (a test that failed before it ended), and
    wait for it: no process outlives its test."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def blank_free(text: str) -> list[str]:
    """``text``'s lines that are not blank."""
    return [line for line in text.splitlines() if line.strip()]


class SilentServer:
    """A listening socket that accepts and never answers: a server a client is "still
    connecting" to (its handshake never done)."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._socket.getsockname()[1]
        self._accepted: list[socket.socket] = []

    def accept(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for a client's connection (``TimeoutError`` after):
        once it returns, the client is connecting."""
        self._socket.settimeout(timeout_s)
        connection, _ = self._socket.accept()
        self._accepted.append(connection)

    def close(self) -> None:
        self._socket.close()
        for connection in self._accepted:
            connection.close()


@contextmanager
def silent_server() -> Iterator[SilentServer]:
    """A ``SilentServer``, closed (with what it accepted) at the block's end."""
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def signal_while_connecting(settings: Settings, args: list[str], sig: signal.Signals,
                            **env: str) -> tuple[int, list[str]]:
    """``ratchet <args>`` with its Cassandra a ``SilentServer``, sent ``sig`` once the
    driver connects: its exit code and non-blank stderr lines."""
    with silent_server() as cassandra:
        proc = subprocess.Popen(
            [*CLI, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, preexec_fn=as_from_a_terminal,
            env=cli_env(settings, RATCHET_CASSANDRA_PORT=str(cassandra.port), **env))
        try:
            cassandra.accept(timeout_s=60)  # the driver is connecting now
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        finally:
            reap(proc)
    return proc.returncode, blank_free(stderr)


def stop_when_said(args: list[str], env: dict[str, str], said: str, sig: signal.Signals,
                   timeout_s: float) -> tuple[int, str, str]:
    """Start ``args``, send ``sig`` once a line of its stdout holds ``said``, and wait at
    most ``timeout_s`` for its end: its exit code, the rest of its stdout, its stderr."""
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_from_a_terminal)
    try:
        for line in proc.stdout:
            if said in line:
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        reap(proc)
    return proc.returncode, out, err
