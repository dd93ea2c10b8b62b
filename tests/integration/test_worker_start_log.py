"""The worker's start lines reach its log: the group it joins, the history codec in use
(docs/operations.md, ``RATCHET_SPEEDUPS``: "the worker's start log line names the one in
use") and the topics it created. They were logged before Faust set up logging, and
Python dropped them (found by an outside review of the deployment, session 25); and no
warning of the Cassandra driver's about its configuration (session 45). A real
worker on real Kafka, Cassandra and registry, with topics of its own."""

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


def test_the_worker_logs_its_start_lines(settings, tmp_path):
    prefix = f"ratchet-start-{uuid.uuid4().hex[:8]}."
    group = f"ratchet-start-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
           "RATCHET_TOPIC_PREFIX": prefix, "RATCHET_PARTITIONS": "1",
           "RATCHET_HOME": str(tmp_path / "home"), "RATCHET_CONSUMER_GROUP": group,
           "RATCHET_WORKER_METRICS_PORT": str(free_port())}
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "worker"], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and "history codec" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-2000:]
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(60)
        delete_topics_with_prefix(settings.kafka_bootstrap, [prefix, f"{group}-"])
    text = log_path.read_text()
    assert f"joining group {group} on {prefix}gateway-events; history codec: " in text, \
        text[-2000:]
    assert f"created topic {prefix}gateway-events (1 partitions)" in text
    assert text.count("history codec") == 1  # replayed once, not twice
    # cassandra-driver's "no load_balancing_policy" warning, logged at every start before
    # session 45: the cluster now names the policy the driver chose itself.
    assert "load_balancing_policy" not in text, text[-2000:]
