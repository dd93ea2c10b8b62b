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
import time
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


# The watchdog's own limit lowered: no recovery in the process, the first stall it
# finds gives up. Everything else is ``ratchet worker`` as an operator runs it.
GIVE_UP_AT_THE_FIRST_STALL = """
import sys
from streams import app as A

A.FetchGuard.__init__.__kwdefaults__["max_recoveries"] = 0
from ratchet.cli import main

sys.argv = ["ratchet", "worker"]
main()
"""


def test_a_partition_the_watchdog_cannot_recover_stops_ratchet_worker_with_75(
        settings, tmp_path):
    """The whole path, not a stand-in for the watchdog's verdict: a partition taken out
    of the fetch set (the test hook) owes a record that is never fetched; the watchdog
    sees the stall, gives up (its limit lowered to no recovery), and ``ratchet worker``
    exits 75 after the operator's lines: the stall, then the worker stopping itself."""
    from dataclasses import replace

    from ratchet.samples import make_turn
    from streams.testing import Rig, isolated_settings, worker_env

    rig = Rig(isolated_settings(settings, "wd", partitions=1, home=tmp_path / "home"))
    env = worker_env(replace(rig.settings, worker_metrics_port=free_port()), rig.group)
    env.update(RATCHET_TEST_STARVE_PARTITION="0", RATCHET_FETCH_STALL_S="1")
    log_path = tmp_path / "worker.log"
    conv = f"conv_{uuid.uuid4().hex[:10]}"

    def turn(head: int):
        return make_turn(conversation_id=conv, expected_head_seq=head,
                         response_id=f"resp_{uuid.uuid4().hex[:12]}",
                         idempotency_key=f"idem_{uuid.uuid4().hex[:12]}",
                         now_ms=int(time.time() * 1000))

    with log_path.open("ab") as log:
        worker = subprocess.Popen([sys.executable, "-c", GIVE_UP_AT_THE_FIRST_STALL],
                                  cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        first = turn(0)
        rig.send(first)
        # Dispatched, so the test hook has taken its partition out of the fetch set.
        assert rig.collector.outcome(first.response_id, timeout_s=90).seq == 1
        rig.send(turn(1))  # owed, never fetched
        code = worker.wait(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        rig.close()
    log = log_path.read_text(errors="replace")
    tail = log[-3000:]
    assert "fetch watchdog: partition 0 owes records" in log, tail
    assert ("fetch watchdog: partitions [0] not fetched despite recovery; stopping the "
            "worker (exit 75) so that it is restarted") in log, tail
    assert code == 75, f"exit code {code}\n{tail}"
