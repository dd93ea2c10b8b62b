"""`ratchet chaos` at CI size: 2,000+ turns through worker kills, a zombie worker and
Kafka, Cassandra and registry restarts, checked by the independent oracle.

It RESTARTS the servers of ``RATCHET_HOME`` (CI runs tests one at a time on servers of
its own). Outside CI it runs only when asked (``RATCHET_CHAOS=1``), so a developer's
suite never restarts servers that others share; in CI a missing service fails it.
"""

from __future__ import annotations

import os

import pytest

from ratchet.chaos.runner import ChaosConfig, run
from tests.services import in_ci

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def chaos_settings(request):
    if not in_ci() and os.environ.get("RATCHET_CHAOS") != "1":
        pytest.skip("restarts the servers of RATCHET_HOME: runs in CI, or with RATCHET_CHAOS=1")
    return request.getfixturevalue("settings")


@pytest.mark.timeout(900)
def test_chaos_ci_run_has_no_violation(chaos_settings, tmp_path):
    from infra import launcher

    cfg = ChaosConfig(seed=int(os.environ.get("RATCHET_CHAOS_SEED", "1")), turns=2000, rate=10,
                      producers=2, workers=2, faults="ci", fault_gap_s=6, out=tmp_path)
    report = run(chaos_settings, cfg)

    done = {}
    for f in report["faults"]:
        done[f["name"]] = done.get(f["name"], 0) + f["ok"]
    assert report["events"]["sent_turns"] >= 2000
    assert done.get("worker_kill", 0) >= 3 and done.get("zombie", 0) >= 1, report["faults"]
    assert done.get("kafka_restart", 0) >= 1 and done.get("cassandra_restart", 0) >= 1, \
        report["faults"]
    assert not report["faults_failed"], report["faults"]
    if not report["passed"]:
        _print_log_tails(tmp_path)  # the run's logs go with pytest's tmp dir: show them now
    assert report["passed"], report["violations"]
    assert report["duration_s"] <= 600, f"took {report['duration_s']:.0f}s"
    assert all(s.healthy for s in launcher.status(chaos_settings).values())


@pytest.mark.timeout(900)
def test_chaos_with_partitions_parked_again_and_again_has_no_violation(chaos_settings,
                                                                      tmp_path):
    """The same faults with the workers' lanes bounded to 32 KiB of records in all (a
    lane's share ~4 turns): every backlog a fault leaves parks partitions and resumes
    them with a seek (streams/parking.py), through worker kills, rebalances and Kafka
    restarts. A local run of this shape logged 338 parkings and 327 resumptions."""
    from dataclasses import replace

    cfg = ChaosConfig(seed=int(os.environ.get("RATCHET_CHAOS_SEED", "2")), turns=2000,
                      rate=40, producers=2, workers=2, faults="ci", fault_gap_s=6,
                      out=tmp_path, log_level="INFO")
    report = run(replace(chaos_settings, lane_max_bytes=32 * 1024), cfg)
    parks = sum(log.read_text(errors="replace").count("lane full, parked at offset")
                for log in tmp_path.glob("*/logs/worker-*.log"))
    if not report["passed"]:
        _print_log_tails(tmp_path)
    assert report["passed"], report["violations"]
    assert not report["faults_failed"], report["faults"]
    assert parks >= 10, f"only {parks} parkings: the run did not test the parking"


def _print_log_tails(out, lines: int = 60) -> None:
    """The last lines of every worker and API log of the run (pytest prints them with
    the failure), so a failed CI run can be read after its temporary files are gone."""
    for log in sorted(out.glob("*/logs/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"---- last {len(tail)} lines of {log.name}")
        print("\n".join(tail))
