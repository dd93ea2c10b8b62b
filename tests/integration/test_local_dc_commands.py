"""Every command that opens Cassandra says the worker's and the API's one line for a
``RATCHET_CASSANDRA_LOCAL_DC`` the cluster lacks, and exits as they do (1; chaos 3, its
"could not start"). Migrate and smoke ran regardless (their round-robin clusters ignore
the setting; smoke then failed to drop its keyspace), the benches said the driver's
``NoHostAvailable`` as "cannot reach Cassandra" (session 52's decisions, "Left";
session 53). Real Cassandra: the shared single node's datacenter is ``datacenter1``."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from streams.testing import ROOT, free_port
from tests.processes import CLI, blank_free, cli_env

pytestmark = pytest.mark.integration

WRONG = "nodc"


@pytest.mark.parametrize("args,code", [
    (["migrate"], 1),
    (["migrate", "--status"], 3),
    (["smoke"], 1),
    (["demo"], 1),
    (["chaos", "--turns", "1", "--faults", "none"], 3),
    (["bench", "store"], 1),
    (["bench", "api"], 1),
])
def test_a_local_datacenter_the_cluster_lacks_is_the_workers_line(own, cassandra_session,
                                                                   tmp_path, args, code):
    env = cli_env(own, RATCHET_CASSANDRA_LOCAL_DC=WRONG, RATCHET_HOME=str(tmp_path / "home"),
                  RATCHET_TOPIC_PREFIX=f"ldc-{uuid.uuid4().hex[:8]}.",
                  RATCHET_API_PORT=str(free_port()), RATCHET_WORKER_METRICS_PORT="0")
    extra = ["--out", str(tmp_path / "out")] if args[0] == "chaos" else []
    done = subprocess.run([*CLI, *args, *extra], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    lines = blank_free(done.stderr)
    assert done.returncode == code, (done.stdout[-2000:], lines)
    assert len(lines) == 1, lines
    command = args[0]
    assert lines[0].startswith(
        f"ratchet {command}: cannot start: RATCHET_CASSANDRA_LOCAL_DC={WRONG!r}: no node "
        "of the cluster at "), lines
    assert lines[0].endswith("(its datacenters: datacenter1)"), lines
    assert done.stdout.strip() == "", done.stdout[-2000:]  # nothing begun before the line
    # Nothing made: migrate made the keyspace and applied every migration.
    assert cassandra_session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (own.keyspace,)).one() is None


def test_a_local_datacenter_of_the_cluster_is_no_line(own):
    """The check refuses only a name the cluster lacks: the datacenter there is runs."""
    env = cli_env(own, RATCHET_CASSANDRA_LOCAL_DC="datacenter1")
    done = subprocess.run([*CLI, "migrate"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "schema up to date" in done.stdout


def test_unreachable_cassandra_with_a_local_datacenter_is_still_cannot_reach(own):
    """Cassandra unreachable is no evidence of a wrong name: the command's own line."""
    env = cli_env(own, RATCHET_CASSANDRA_LOCAL_DC=WRONG,
                  RATCHET_CASSANDRA_PORT=str(free_port()))
    done = subprocess.run([*CLI, "migrate"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert "cannot reach Cassandra" in done.stderr and WRONG not in done.stderr, done.stderr
