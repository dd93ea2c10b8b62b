"""When the fetch watchdog gives up, the worker exits 75 (EX_TEMPFAIL), as
docs/processor.md says ("two recoveries without progress stop the worker with exit code
75 for its supervisor to restart"): it stops itself with a SIGTERM, which mode ends with
exit 0, so a supervisor that restarts only failed processes did not restart it. A real
worker (real Kafka, Cassandra, registry; topics of its own), its watchdog forced to give
up at its first check. (Found by an outside review of the worker's stream layer,
2026-12-04.)
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from streams.testing import free_port
from streams.topics import delete_topics_with_prefix

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import sys
from streams import app as A

async def check(self):
    self._give_up([0])  # what check() does after max_recoveries attempts in a row

A.FetchGuard.check = check
from ratchet.settings import Settings
from streams.worker import run_worker
sys.exit(run_worker(Settings.from_env(), loglevel="WARNING"))
"""


def test_the_watchdog_giving_up_exits_75(settings, tmp_path):
    prefix = f"ratchet-wd-{uuid.uuid4().hex[:8]}."
    group = f"ratchet-wd-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **settings.to_env()}
    env.update(PYTHONPATH=str(ROOT), RATCHET_TOPIC_PREFIX=prefix, RATCHET_PARTITIONS="1",
               RATCHET_HOME=str(tmp_path / "home"), RATCHET_FETCH_STALL_S="1",
               RATCHET_WORKER_METRICS_PORT=str(free_port()), RATCHET_CONSUMER_GROUP=group)
    try:
        done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=str(ROOT), env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        delete_topics_with_prefix(settings.kafka_bootstrap, [prefix, f"{group}-"])
    log = (done.stdout + done.stderr)[-1500:]
    assert "stopping the worker (exit 75)" in log, log
    assert done.returncode == 75, f"exit code {done.returncode}\n{log}"
