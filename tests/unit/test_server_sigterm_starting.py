"""SIGTERM while ``ratchet api`` or ``ratchet worker`` still connects (session 48).

It was Python's default death: exit 143, no line, nothing closed; Ctrl-C there was
one line and exit 0 (session 47). How a supervisor stops a pod that is still starting
(Cassandra slow or away: a rollout, a drain). No server is needed: "still connecting"
is a socket that accepts and never answers. The stops once they serve are in
``tests/integration/test_server_sigterm.py``.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys

import pytest

from ratchet.settings import Settings
from streams.testing import ROOT, free_port
from tests.processes import as_from_a_terminal, cli_env, signal_while_connecting


@pytest.fixture
def away(tmp_path):
    """Settings whose Kafka and registry are ports where nothing listens."""
    return dataclasses.replace(
        Settings.from_env({}), home=tmp_path, kafka_bootstrap=f"127.0.0.1:{free_port()}",
        schema_registry_url=f"http://127.0.0.1:{free_port()}/apis/ccompat/v7")


@pytest.mark.parametrize("command,so", [("api", "nothing was served"),
                                        ("worker", "nothing was processed")])
def test_sigterm_while_a_server_command_connects_exits_0_in_one_line(away, command, so):
    code, lines = signal_while_connecting(away, [command], signal.SIGTERM,
                                          RATCHET_API_PORT=str(free_port()),
                                          RATCHET_WORKER_METRICS_PORT="0")
    assert code == 0, (code, lines)
    assert lines == [f"ratchet {command}: terminated while starting (SIGTERM): stopped, "
                     f"{so}"], lines


# SIGTERM sent to itself at a moment before the command's own handler (session 48's
# second review, left: the first ~0.1 s): as ``click`` is imported by ``ratchet.cli``
# (most of that time), or as the settings are read. Then the command as its entry
# point runs it; Cassandra away, so a command that gets past the stop fails instead.
_EARLY = """
import importlib.abc, os, signal, sys

class Stop(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "{module}":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.{signal})
        return None

sys.meta_path.insert(0, Stop())
if "{module}" != "click":
    import click  # the moment is later: click is imported before it
sys.argv = ["ratchet", "{command}"]
import runpy
runpy.run_module("ratchet.cli", run_name="__main__")
"""


@pytest.mark.parametrize("moment", ["click", "ratchet.settings"])
@pytest.mark.parametrize("command,so", [("api", "nothing was served"),
                                        ("worker", "nothing was processed")])
@pytest.mark.parametrize("sig,how", [("SIGTERM", "terminated while starting (SIGTERM)"),
                                     ("SIGINT", "interrupted while starting (Ctrl-C)")])
def test_sigterm_before_the_commands_handler_is_its_line_too(away, command, so, moment, sig,
                                                             how):
    """Before: SIGTERM Python's default death (returncode -15, no line); Ctrl-C a
    ``KeyboardInterrupt`` traceback out of the import (session 49's review). Ctrl-C at
    its default, as from a terminal."""
    env = cli_env(away, RATCHET_CASSANDRA_PORT=str(free_port()),
                  RATCHET_API_PORT=str(free_port()), RATCHET_WORKER_METRICS_PORT="0")
    done = subprocess.run([sys.executable, "-c",
                           _EARLY.format(module=moment, command=command, signal=sig)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          preexec_fn=as_from_a_terminal)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 0, (done.returncode, lines)
    assert lines == [f"ratchet {command}: {how}: stopped, {so}"], lines


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_sigterm_before_another_commands_start_is_still_the_default_death(away, command):
    """The commands without a SIGTERM handler of their own keep Python's default."""
    env = cli_env(away)
    done = subprocess.run([sys.executable, "-c",
                           _EARLY.format(module="click", command=command, signal="SIGTERM")],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_ctrl_c_before_another_commands_start_is_clicks_abort(away, command):
    """Their Ctrl-C once they run: click's ``Aborted!``, exit 1. Before the command it
    was a ``KeyboardInterrupt`` traceback out of the import (session 49's review)."""
    done = subprocess.run([sys.executable, "-c",
                           _EARLY.format(module="click", command=command, signal="SIGINT")],
                          env=cli_env(away), cwd=ROOT, capture_output=True, text=True,
                          timeout=60, preexec_fn=as_from_a_terminal)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert (done.returncode, lines) == (1, ["Aborted!"]), (done.returncode, lines)


def test_a_process_that_imports_the_cli_still_dies_of_sigterm(away):
    """A host that imports ``ratchet.cli`` and runs no command (pytest collecting a test
    of the CLI): its first statement kept every SIGTERM for a command that never came,
    and the process ran on (an outside review, session 49)."""
    host = ("import time\nimport ratchet.cli\nprint('imported', flush=True)\n"
            "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", host], env=cli_env(away), cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "imported\n", proc.poll()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = "still running 60 s after SIGTERM"
    finally:
        proc.kill()
        proc.wait()
    assert code == -signal.SIGTERM, code


def test_sigterm_before_the_console_scripts_command_is_its_line_too(away, tmp_path):
    """The image's entrypoint is the ``ratchet`` console script, which imports the CLI
    (its ``__name__`` is not ``__main__`` there): the early SIGTERM is kept for it too."""
    script = tmp_path / "ratchet"  # as pip writes it, with the stop as click is imported
    script.write_text(_EARLY.split("sys.argv = ")[0].replace("{module}", "click")
                      .replace("{signal}", "SIGTERM")
                      + "sys.argv = ['ratchet', 'api']\nfrom ratchet.cli import main\n"
                        "sys.exit(main())\n")
    env = cli_env(away, RATCHET_CASSANDRA_PORT=str(free_port()),
                  RATCHET_API_PORT=str(free_port()))
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 0, (done.returncode, lines)
    assert lines == ["ratchet api: terminated while starting (SIGTERM): stopped, "
                     "nothing was served"], lines
