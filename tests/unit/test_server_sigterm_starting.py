"""SIGTERM while ``ratchet api`` or ``ratchet worker`` still connects (session 48).

It was Python's default death: exit 143, no line, nothing closed; Ctrl-C there was
one line and exit 0 (session 47). How a supervisor stops a pod that is still starting
(Cassandra slow or away: a rollout, a drain). No server is needed: "still connecting"
is a socket that accepts and never answers. The stops once they serve are in
``tests/integration/test_server_sigterm.py``.
"""

from __future__ import annotations

import dataclasses
import signal

import pytest

from ratchet.settings import Settings
from streams.testing import free_port
from tests.processes import signal_while_connecting


@pytest.fixture
def away(tmp_path):
    """Settings whose Kafka and registry are ports where nothing listens."""
    return dataclasses.replace(
        Settings.from_env({}), home=tmp_path, kafka_bootstrap=f"127.0.0.1:{free_port()}",
        schema_registry_url=f"http://127.0.0.1:{free_port()}/apis/ccompat/v7")


@pytest.mark.parametrize("command,so", [("api", "nothing was served"),
                                        ("worker", "nothing was processed")])
def test_sigterm_while_a_server_command_connects_exits_0_in_one_line(away, command, so):
    code, lines = signal_while_connecting(away, [command], signal.SIGTERM,
                                          RATCHET_API_PORT=str(free_port()),
                                          RATCHET_WORKER_METRICS_PORT="0")
    assert code == 0, (code, lines)
    assert lines == [f"ratchet {command}: terminated while starting (SIGTERM): stopped, "
                     f"{so}"], lines
