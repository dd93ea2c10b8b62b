"""The gateway producer with the real confluent-kafka client, in a process of its own:
for the producer's tests whose failure is an abort (confluent-kafka asserts and ends
the process) or a hang, which must not take the test run with them.

A script starts with ``PRELUDE`` (the imports it shares, a serde that needs no
registry, ``unreachable(config)``: a producer whose broker never answers, so nothing
is delivered and every outcome is a timeout or a purge, and ``outcome(call, ok)``:
what a call was told), prints one line per thing it was told, and ``run_script``
returns those lines once the process exited 0. Shared by
``test_gateway_producer_signals.py`` and ``test_gateway_producer_close_race.py`` (each
had its own copy before session 47), and the review tests that came since."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.processes import as_from_a_terminal

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = '''
import sys
import threading
import time

from ratchet.samples import make_turn
from ratchet.settings import Settings
from services.gateway.errors import DeliveryError, GatewayError
from services.gateway.producer import GatewayProducer


class Serde:
    def encode(self, event, topic):
        return b"\\0" * 100


def unreachable(config):
    return GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=Serde(),
                           config={"log_level": 0, **config})


def outcome(call, ok):
    """What ``call()`` was told: ``ok`` if it returned, else the event ids its
    ``DeliveryError`` names."""
    try:
        call()
        return ok
    except DeliveryError as exc:
        return [eid for eid, _ in exc.failures]
'''


def run_script(script: str, *args: str, timeout_s: float) -> list[str]:
    """``PRELUDE`` + ``script`` run with ``args`` by this Python, from the checkout's
    root and with this environment (``PYTHONPATH`` too): its output's lines. A
    non-zero exit (an abort, an uncaught error) fails the test with its output; a
    hang past ``timeout_s`` fails it as ``TimeoutExpired``."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + script, *args],
                          capture_output=True, text=True, timeout=timeout_s,
                          cwd=str(ROOT), env={**os.environ},
                          # The scripts' Ctrl-C (``interrupt_main``, SIGINT) must reach
                          # them: a background run (CI's) ignores SIGINT, children too,
                          # and ``interrupt_main`` then does nothing (session 49).
                          preexec_fn=as_from_a_terminal)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    return done.stdout.splitlines()
