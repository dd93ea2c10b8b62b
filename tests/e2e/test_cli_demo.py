"""`ratchet demo` end to end as a user runs it: exit code 0 and a full table.

Isolated from a developer's own demo data by a keyspace, a topic prefix and an API port
of its own (the servers are shared). Run twice to prove a second run works too.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import replace

from services.demo.processes import free_port, settings_env
from streams.topics import delete_topics_with_prefix


def test_demo_runs_twice_with_every_scenario_as_expected(settings, cassandra_session):
    run = uuid.uuid4().hex[:8]
    demo_settings = replace(
        settings,
        keyspace=f"demo_{run}",
        topic_prefix=f"demo{run}.",
        partitions=2,
        api_port=free_port(),
    )
    env = settings_env(demo_settings)
    try:
        for attempt in (1, 2):
            done = subprocess.run(
                [sys.executable, "-m", "ratchet.cli", "demo"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, f"run {attempt}:\n{done.stdout}\n{done.stderr}"
            assert "10/10 scenarios as expected" in done.stdout
            # claim before execute: the retried tool loop reused the recorded output
            ok, observed = _outcome(done.stdout, "tool loop retried mid-loop, claims")
            assert ok == "yes", observed
            assert observed.startswith("retry's claim COMPLETED, tool ran 1x "), observed
            assert "stopping the worker this demo started" in done.stdout
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {demo_settings.keyspace}", timeout=60)
        delete_topics_with_prefix(demo_settings.kafka_bootstrap, [demo_settings.topic_prefix])


def _outcome(stdout: str, scenario: str) -> tuple[str, str]:
    """The ``ok`` column and the observed text of ``scenario``'s row in the outcomes
    table (not the progress lines above it)."""
    table = stdout.split("== outcomes", 1)[1]
    for line in table.splitlines():
        if line.strip().startswith(scenario):
            ok, observed = line.strip()[len(scenario):].split(maxsplit=1)
            return ok, observed
    raise AssertionError(f"no row for {scenario!r} in:\n{table}")
