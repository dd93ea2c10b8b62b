"""``ratchet migrate`` stopped twice: the second stop while the first's line is written.

No server: the stand-in ``cli_migrate`` raises the first stop; the process's stderr
sends the second the moment the line is written to it (a user pressing Ctrl-C again, a
Job's SIGTERM after a Ctrl-C). The real-process stops against Cassandra are in
``tests/integration/test_migrate_stops.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from streams.testing import ROOT

_TWICE = """
import os, signal, sys
import infra.migrate as m
from ratchet.stops import Terminated

class Again:  # the second stop lands as the first's line is written
    def __init__(self, stream):
        self.stream, self.sent = stream, False
    def write(self, text):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIG{second})
        return self.stream.write(text)
    def flush(self):
        self.stream.flush()

def stopped(*_args, **_kwargs):
    sys.stderr = Again(sys.stderr)
    raise {first}

m.cli_migrate = stopped
from ratchet.cli import main
main(["migrate"])
"""


@pytest.mark.parametrize("first,second,code", [("KeyboardInterrupt", "INT", 130),
                                               ("Terminated", "TERM", 143)])
def test_a_second_stop_while_the_line_is_written_is_no_traceback(first, second, code):
    """Before: the second Ctrl-C raised in ``print`` under the first's handling, and
    Python printed both tracebacks (exit 130 became a death by SIGINT)."""
    script = _TWICE.format(first=first, second=second)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("ratchet migrate: "), lines


def test_a_stop_while_a_record_was_sent_says_it_may_be_written():
    """The record's ``INSERT`` sent (its answer lost or the stop landing on it): the
    migration is recorded or not, and the line says which way each goes."""
    from ratchet.cli import _migrate_holds
    from ratchet.stops import MigrateProgress

    progress = MigrateProgress()
    progress.phase, progress.recorded = "applying", ["001_core.cql"]
    progress.under_way, progress.recording = "002_ledger.cql", True
    assert _migrate_holds(progress) == (
        "001_core.cql applied and recorded by this run (they stay); 002_ledger.cql was "
        "applied and being recorded: if its record was not written it is re-run whole; "
        "`ratchet migrate --status` says what is left, `ratchet migrate` finishes")
