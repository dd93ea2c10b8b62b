"""The launcher's timer-slack wrapper (infra/timer_slack.py): the value reaches the
command it starts, in the same process, and every thread that command creates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infra import timer_slack
from infra.servers import server
from ratchet.settings import Settings

pytestmark = pytest.mark.skipif(not Path("/proc/self/timerslack_ns").exists(),
                                reason="Linux only: /proc/<pid>/timerslack_ns")

# A child thread's slack, read by the thread itself: inherited at its creation.
_THREAD_SLACK = (
    "import threading, pathlib; out = []\n"
    "t = threading.Thread(target=lambda: out.append(pathlib.Path("
    "f'/proc/{threading.get_native_id()}/timerslack_ns').read_text().strip()))\n"
    "t.start(); t.join(); print(out[0])"
)


def test_the_command_and_its_threads_run_with_the_slack():
    done = subprocess.run(timer_slack.wrapped(345_000, [sys.executable, "-c", _THREAD_SLACK]),
                          capture_output=True, text=True, check=True, cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "345000"


def test_the_wrapper_execs_in_place_same_pid():
    """The launcher tracks the pid it started: the command must be that process."""
    proc = subprocess.Popen(timer_slack.wrapped(80_000, ["sh", "-c", "echo $$"]),
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and int(out) == proc.pid


def test_a_bad_call_is_refused_with_usage():
    done = subprocess.run([sys.executable, "-m", "infra.timer_slack", "fast", "true"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert done.returncode != 0 and "usage" in done.stderr


def test_only_cassandra_asks_for_a_slack_and_zero_turns_it_off():
    settings = Settings()
    assert server(settings, "cassandra").timer_slack_ns() == 200_000
    assert server(settings, "kafka").timer_slack_ns() == 0
    assert server(settings, "registry").timer_slack_ns() == 0
    off = Settings.from_env({"RATCHET_CASSANDRA_TIMER_SLACK_US": "0"})
    assert server(off, "cassandra").timer_slack_ns() == 0
