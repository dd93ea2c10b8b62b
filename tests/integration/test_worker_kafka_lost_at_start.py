"""Kafka lost while ``ratchet worker`` starts: one line and exit 1, not a traceback.

A chaos run's Kafka restart that lands in a worker's start: the worker made its topics
(``ensure_topics``, librdkafka's admin client), then Faust's clients (aiokafka) found no
Kafka. Faust printed aiokafka's ``KafkaConnectionError`` with its traceback (30 lines of
``mode``'s services), exit 1. docs/operations.md promises the start's failures to reach
a server as one line, ``ratchet worker: cannot start: ...``, exit 1 (its supervisor
starts it again). Session 53.

The shared Kafka is not restarted here: the worker's bootstrap is a proxy in front of it
that lets librdkafka's connections through (client id ``rdkafka``) and closes Faust's
(aiokafka's client id ``faust-<version>``), as a broker gone between the two steps would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import struct
import subprocess
import threading

import pytest

from streams.testing import ROOT
from tests.processes import CLI, blank_free, cli_env, reap

pytestmark = pytest.mark.integration


class GoneForFaust:
    """A TCP proxy in front of Kafka: a connection whose first request names the client
    ``rdkafka`` is piped to Kafka; any other is closed after that request, unanswered,
    or with ``hold`` kept open and never answered (a Kafka that accepts and is silent)."""

    def __init__(self, bootstrap: str, *, hold: bool = False) -> None:
        self._hold = hold
        host, port = bootstrap.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = [self._listener]
        self.closed: list[str] = []  # the client ids of the connections closed (or held)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            self._sockets.append(client)
            threading.Thread(target=self._route, args=(client,), daemon=True).start()

    def _route(self, client: socket.socket) -> None:
        # A request: int32 size, int16 api key, int16 version, int32 correlation id,
        # then the client id (int16 length, its bytes).
        head = client.recv(14, socket.MSG_WAITALL)
        if len(head) < 14:
            client.close()
            return
        (length,) = struct.unpack(">h", head[12:14])
        client_id = client.recv(length, socket.MSG_WAITALL) if length > 0 else b""
        if not client_id.startswith(b"rdkafka"):
            self.closed.append(client_id.decode(errors="replace"))
            if not self._hold:
                client.close()
            return
        server = socket.create_connection(self._target)
        self._sockets.append(server)
        server.sendall(head + client_id)
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                chunk = src.recv(65536)
                if not chunk:
                    break
                dst.sendall(chunk)
            except OSError:
                break
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for s in self._sockets:
            s.close()


@pytest.fixture
def own(own_migrated):
    return own_migrated("kafkalost")


@pytest.mark.parametrize("log_level", ["INFO", "WARNING"])
def test_kafka_gone_as_faust_starts_is_one_line_and_exit_1(own, log_level):
    proxy = GoneForFaust(own.kafka_bootstrap)
    s = dataclasses.replace(own, kafka_bootstrap=f"127.0.0.1:{proxy.port}")
    proc = subprocess.Popen([*CLI, "worker"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=cli_env(s, RATCHET_WORKER_METRICS_PORT="0",
                                        RATCHET_LOG_LEVEL=log_level,
                                        RATCHET_CONSUMER_GROUP=f"{own.topic_prefix}group"))
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        reap(proc)
        proxy.close()
    lines = blank_free(out + err)
    assert proxy.closed, ("Faust's client never came: the start failed earlier", lines)
    assert not any("Traceback" in line for line in lines), err[-4000:]
    assert proc.returncode == 1, (proc.returncode, lines[-10:])
    assert lines[-1] == (
        f"ratchet worker: cannot start: Kafka at {s.kafka_bootstrap}: lost while Faust's "
        f"clients connected (KafkaConnectionError: Unable to bootstrap): a broker "
        f"restarting or away, or silent (no answer within "
        f"RATCHET_KAFKA_REQUEST_TIMEOUT_S=30 s)"), lines
    # Faust stopped what it had started: no crash of its own after the line.
    assert not any("We experienced a crash" in line for line in lines), lines
    assert not (own.home / "health").exists() or not list((own.home / "health").iterdir())


def test_kafka_silent_to_faust_ends_the_start_within_the_request_timeout(own):
    """A Kafka that accepts Faust's connection and never answers held the start for
    Faust's ``producer_request_timeout`` (1200 s; still waiting after 150 s in session
    53). RATCHET_KAFKA_REQUEST_TIMEOUT_S bounds it: one line, exit 1, well before 60 s."""
    proxy = GoneForFaust(own.kafka_bootstrap, hold=True)
    s = dataclasses.replace(own, kafka_bootstrap=f"127.0.0.1:{proxy.port}")
    proc = subprocess.Popen([*CLI, "worker"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=cli_env(s, RATCHET_WORKER_METRICS_PORT="0",
                                        RATCHET_KAFKA_REQUEST_TIMEOUT_S="5",
                                        RATCHET_CONSUMER_GROUP=f"{own.topic_prefix}group"))
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        reap(proc)
        proxy.close()
    lines = blank_free(out + err)
    assert proxy.closed, ("Faust's client never came: the start failed earlier", lines)
    assert not any("Traceback" in line for line in lines), err[-4000:]
    assert proc.returncode == 1, (proc.returncode, lines[-10:])
    assert lines[-1].startswith(
        f"ratchet worker: cannot start: Kafka at {s.kafka_bootstrap}: "), lines
    assert "no answer within RATCHET_KAFKA_REQUEST_TIMEOUT_S=5 s" in lines[-1], lines
    assert not any("We experienced a crash" in line for line in lines), lines
    assert not (own.home / "health").exists() or not list((own.home / "health").iterdir())
