"""The Node.js gateway example (examples/node-gateway/, written from the docs alone in
session 44) against the real stack: its recipes reproduce docs/vectors/ (digests,
canonical JSON, keys, the registered schemas and Avro bodies), and its smoke run gets
every documented outcome it provokes from a real worker and API. Kept in CI so the
docs, the vectors and the example cannot drift apart unnoticed.

Needs Node 20.15+ and the example's packages (``npm ci`` in examples/node-gateway,
which ``.ci/run`` does): missing, the test fails and says so (never skips)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "node-gateway"


def _node() -> str:
    node = shutil.which("node")
    assert node is not None, "Node 20.15+ is required for the Node gateway example"
    version = subprocess.run([node, "--version"], capture_output=True, text=True,
                             check=True).stdout.strip().lstrip("v")
    assert tuple(int(p) for p in version.split(".")[:2]) >= (20, 15), (
        f"Node {version}: the example needs 20.15+ (zlib.crc32)")
    assert (EXAMPLE / "node_modules").is_dir(), (
        "the example's packages are not installed: npm ci --prefix examples/node-gateway")
    return node


def _run(script: str, stack) -> str:
    settings = stack.settings
    env = {**os.environ,
           "RATCHET_TOPIC_PREFIX": settings.topic_prefix,
           "RATCHET_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
           "RATCHET_SCHEMA_REGISTRY_URL": settings.schema_registry_url,
           "RATCHET_API_HOST": "127.0.0.1",
           "RATCHET_API_PORT": str(settings.api_port)}
    done = subprocess.run([_node(), script], cwd=EXAMPLE, env=env, capture_output=True,
                          text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"node {script} exited {done.returncode}:\n{out[-4000:]}"
    return out


def test_the_node_example_reproduces_every_vector(e2e_stack):
    out = _run("vectors.js", e2e_stack)
    assert "0 mismatched" in out, out[-2000:]


def test_the_node_example_gets_every_documented_outcome_it_provokes(e2e_stack):
    out = _run("smoke.js", e2e_stack)
    assert " 0 failed" in out, out[-2000:]
