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
            assert "9/9 scenarios as expected" in done.stdout
            assert "stopping the worker this demo started" in done.stdout
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {demo_settings.keyspace}", timeout=60)
        delete_topics_with_prefix(demo_settings.kafka_bootstrap, [demo_settings.topic_prefix])
