"""A process that cannot start says why in one line on stderr and exits 1
(docs/operations.md: "fails fast (non-zero exit, the reason on stderr)"). A keyspace not
migrated yet used to end the worker and the API in a 30- to 40-line driver traceback
that never named `ratchet migrate`, after the worker had created its topics. Real
Kafka, Cassandra and registry. (Found by an outside review of the operator's commands,
2026-12-04.)"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from streams.testing import ROOT, free_port

pytestmark = pytest.mark.integration


def _run(command: str, settings, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
            "RATCHET_WORKER_METRICS_PORT": "0", "RATCHET_API_PORT": str(free_port()), **env}
    return subprocess.run([sys.executable, "-m", "ratchet.cli", command], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["worker", "api"])
def test_a_keyspace_not_migrated_is_one_line_naming_migrate(settings, command):
    prefix = f"startup-{uuid.uuid4().hex[:8]}."
    keyspace = f"missing_{uuid.uuid4().hex[:8]}"
    done = _run(command, settings, RATCHET_KEYSPACE=keyspace, RATCHET_TOPIC_PREFIX=prefix)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ratchet {command}: cannot start: ") and keyspace in last \
        and "ratchet migrate" in last
    assert _no_bare_traceback(done.stderr)
    topics = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(
        timeout=30).topics
    assert not [t for t in topics if t.startswith(prefix)]  # nothing made before it failed


@pytest.mark.parametrize("command", ["worker", "api"])
def test_a_keyspace_one_migration_behind_is_one_line_naming_migrate(
        settings, cassandra_cluster, command):
    """A keyspace migrated by an older version (its last migration missing) ended in a
    ~57-line traceback on the first statement naming a new column (found by an
    outside review of the deployment, session 25)."""
    import dataclasses

    from infra.migrate import apply_migrations, discover
    keyspace = f"behind_{uuid.uuid4().hex[:8]}"
    apply_migrations(cassandra_cluster, dataclasses.replace(settings, keyspace=keyspace))
    last_migration = discover()[-1]
    session = cassandra_cluster.connect()
    try:
        session.execute(f"DELETE FROM {keyspace}.schema_migrations WHERE version = %s",
                        (last_migration.version,))
        done = _run(command, settings, RATCHET_KEYSPACE=keyspace,
                    RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        session.shutdown()
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ratchet {command}: cannot start: ") and keyspace in last \
        and last_migration.path.name in last and "ratchet migrate" in last
    assert _no_bare_traceback(done.stderr)


def test_cassandra_that_does_not_answer_is_one_line(settings):
    done = _run("worker", settings, RATCHET_CASSANDRA_PORT=str(free_port()),
                RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "ratchet worker: cannot start: cannot reach Cassandra" in done.stderr
    assert _no_bare_traceback(done.stderr)


def _no_bare_traceback(stderr: str) -> bool:
    """No Python traceback printed as text (the API's JSON log lines may carry a
    driver's warning with its ``exc`` field: structured, one line each)."""
    import json

    bare = []
    for line in stderr.splitlines():
        try:
            json.loads(line)
        except ValueError:
            bare.append(line)
    return not any("Traceback" in line for line in bare)


def test_the_api_log_stays_json_lines_while_kafka_is_away(settings):
    """docs/operations.md: the API logs JSON lines. With Kafka unreachable (the API
    starts degraded: only wait_ms needs Kafka), librdkafka's own reconnect lines went to
    stderr as text, 322 of 334 lines in 20 s."""
    import json
    import signal
    import time

    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
           "RATCHET_API_PORT": str(free_port()),
           "RATCHET_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}"}
    proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "api"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines, kafka = [], []
    deadline = time.monotonic() + 90
    try:
        while len(kafka) < 3 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            record = json.loads(line)  # every line, or this fails naming it
            if record["logger"] == "ratchet.api.kafka":
                kafka.append(record)
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()  # the same buffered reader: no line cut in two
        proc.wait(timeout=30)
    for line in rest.splitlines():
        json.loads(line)
    assert len(kafka) == 3, lines[-5:]  # librdkafka did complain, through Python logging
