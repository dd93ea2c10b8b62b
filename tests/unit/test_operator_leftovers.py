"""The operator's leftovers of session 46 (session 47): each failed before its fix.

No server is needed: "Cassandra away" is a port where nothing listens, "Cassandra
still connecting" a socket that accepts and never answers.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys

import pytest

from ratchet.settings import Settings
from streams.testing import ROOT, free_port
from tests.processes import signal_while_connecting


@pytest.fixture
def away(tmp_path):
    """Settings whose Cassandra, Kafka and registry are ports where nothing listens."""
    return dataclasses.replace(
        Settings.from_env({}), home=tmp_path, cassandra_port=free_port(),
        kafka_bootstrap=f"127.0.0.1:{free_port()}",
        schema_registry_url=f"http://127.0.0.1:{free_port()}/apis/ccompat/v7")


def test_bench_api_without_cassandra_raises_only_the_failure_to_reach_it(away):
    """Its clean-up connected the cluster again, which the failed connect had shut
    down: ``DriverException('Cluster is already shut down')`` came out, the real cause
    only chained under it."""
    from cassandra.cluster import NoHostAvailable

    from ratchet.bench import api

    with pytest.raises(NoHostAvailable) as caught:
        api.run(away, reads=1, turns=1, waits=1)
    assert caught.value.__context__ is None, repr(caught.value.__context__)


@pytest.mark.parametrize("command,so", [("api", "nothing was served"),
                                        ("worker", "nothing was processed")])
def test_ctrl_c_while_a_server_command_connects_exits_0_in_one_line(away, command, so):
    """Ctrl-C while ``ratchet api`` or ``ratchet worker`` still connected to Cassandra
    (unreachable or slow) ended in click's ``Aborted!`` and exit 1; once they serve,
    Ctrl-C is exit 0."""
    code, lines = signal_while_connecting(away, [command], signal.SIGINT,
                                          RATCHET_API_PORT=str(free_port()),
                                          RATCHET_WORKER_METRICS_PORT="0")
    assert code == 0, lines
    assert lines == [f"ratchet {command}: interrupted while starting (Ctrl-C): stopped, "
                     f"{so}"], lines


def test_chaos_whose_migrate_failed_says_which_keyspace_may_be_left(away, tmp_path, capsys,
                                                                  monkeypatch):
    """A chaos run whose migrate stopped cleaned nothing up and said nothing of its
    keyspace, which migrate may have made before it stopped. With Cassandra away it
    cannot be dropped: the run names it and the statement to drop it
    (``tests/integration/test_startup_errors.py`` has it dropped). Since session 48 the
    run makes its keyspace before migrate: a stand-in says it did, Cassandra went away."""
    from ratchet.chaos import runner
    from ratchet.chaos.runner import ChaosConfig, ChaosSetupFailed, run

    monkeypatch.setattr(runner, "_make_keyspace", lambda *_args: None)
    with pytest.raises(ChaosSetupFailed, match="cannot reach Cassandra"):
        run(away, ChaosConfig(turns=1, faults="none", out=tmp_path / "out"))
    (run_dir,) = (tmp_path / "out").iterdir()
    out = capsys.readouterr().out
    ks = f"chaos_{run_dir.name}"
    assert f"keyspace {ks} may be left" in out, out
    assert f"DROP KEYSPACE IF EXISTS {ks};" in out, out


@pytest.mark.parametrize("args,says", [
    (["--wait", "-1"], "-1.0 is not in the range x>=0"),
    (["--status", "--wait", "5"], "--status takes none"),
])
def test_migrate_refuses_a_wait_it_cannot_use(args, says):
    """``--wait`` bounds the wait for another migrator's lease (session 47); it is a
    usage error (exit 2) where it cannot apply, before any connection."""
    from click.testing import CliRunner

    from ratchet.cli import main

    done = CliRunner().invoke(main, ["migrate", *args])
    assert done.exit_code == 2 and says in done.output, done.output


@pytest.mark.parametrize("args,said", [
    ([], "no migration was applied (stopped before taking the lease)"),
    (["--status"], "changed nothing"),
])
def test_ctrl_c_during_migrate_says_what_holds_and_exits_130(away, args, said):
    """Ctrl-C while ``ratchet migrate`` connected was click's ``Aborted!`` and exit 1,
    read as a failed migration; it is one line saying what holds, and exit 130. What
    holds there: no migration was applied (it said "what it applied stays applied":
    session 48's review; session 49)."""
    code, lines = signal_while_connecting(away, ["migrate", *args], signal.SIGINT)
    assert code == 130, lines
    assert len(lines) == 1 and lines[0].startswith(
        "ratchet migrate: interrupted (Ctrl-C): stopped; ") and said in lines[0], lines


def test_chaos_stopped_by_ctrl_c_during_its_migrate_drops_its_keyspace(away, tmp_path,
                                                                      monkeypatch):
    """Ctrl-C while the run's ``ratchet migrate`` runs (the child stops too, exit 130,
    perhaps having made the keyspace): the ``KeyboardInterrupt`` left ``run`` before the
    drop that a failed migrate gets, so the keyspace stayed, unnamed (session 47's
    clean-up covered a migrate that exits non-zero only)."""
    from ratchet.chaos import runner

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    dropped: list[str] = []
    monkeypatch.setattr(runner, "_make_keyspace", lambda *_args: None)  # made (session 48)
    monkeypatch.setattr(runner.subprocess, "run", interrupted)
    monkeypatch.setattr(runner, "_drop_keyspace", lambda s: dropped.append(s.keyspace))
    with pytest.raises(KeyboardInterrupt):
        runner.run(away, runner.ChaosConfig(turns=1, faults="none", out=tmp_path / "out"))
    (run_dir,) = (tmp_path / "out").iterdir()
    assert dropped == [f"chaos_{run_dir.name}"]


# The moment of the driver's start a Ctrl-C can land in: its event loop's thread made
# but not started (``LibevLoop.maybe_start``), then the command's own interrupted path.
_INTERRUPTED_AT_THE_LOOP_START = """
import sys, threading
from cassandra.io import libevreactor
import {module} as target

libevreactor.LibevConnection.initialize_reactor()
libevreactor._global_loop._thread = threading.Thread(target=lambda: None)

def interrupted(*_args, **_kwargs):
    raise KeyboardInterrupt

target.{function} = interrupted
from ratchet.cli import main
main(["{command}"])
"""


@pytest.mark.parametrize("command,module,function,code", [
    ("migrate", "infra.migrate", "cli_migrate", 130),
    ("api", "services.api.server", "cli_api", 0),
    ("worker", "streams.worker", "cli_worker", 0),
])
def test_ctrl_c_as_the_driver_starts_its_loop_is_still_one_line(away, command, module,
                                                                function, code):
    """Ctrl-C between the driver's making its event loop's thread and starting it: the
    command said its one line, then the driver's exit hook joined the thread and printed
    a traceback, ``RuntimeError: cannot join thread before it is started`` (1 of 25
    Ctrl-Cs of ``migrate`` while it connected, two at once on this machine)."""
    script = _INTERRUPTED_AT_THE_LOOP_START.format(module=module, function=function,
                                                   command=command)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, **away.to_env(), "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr[-2000:]
    assert len(lines) == 1 and "interrupted" in lines[0], lines
