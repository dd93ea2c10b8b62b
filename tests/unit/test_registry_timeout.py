"""A registry that accepts connections but never answers must not hang a process: every
registry request times out and becomes ``RegistryUnavailable`` (retried where a record
is at stake, a start-up failure at start). confluent-kafka's client waits for ever by
default; ``ratchet worker`` printed nothing for 300 s and ``ratchet smoke`` hung.
(Found by an outside review of the operator's commands, 2026-12-04.)"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from schemas import avro
from schemas.errors import RegistryUnavailable


@pytest.fixture
def silent_registry():
    """A TCP port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_registering_against_a_silent_registry_fails_within_the_timeout(silent_registry,
                                                                         monkeypatch):
    monkeypatch.setattr(avro, "REGISTRY_TIMEOUT_S", 1)
    client = avro.registry_client(silent_registry)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable):
        avro.register_schemas(client)
    assert time.monotonic() - started < 30  # one timeout per try, never for ever


def test_every_process_builds_its_registry_client_with_the_timeout():
    """No ratchet module builds its own client without it."""
    import pathlib

    root = pathlib.Path(avro.__file__).resolve().parents[1]
    offenders = [str(p.relative_to(root)) for folder in ("schemas", "services", "streams",
                                                         "infra", "ratchet")
                 for p in (root / folder).rglob("*.py")
                 if "SchemaRegistryClient(" in p.read_text() and p.name != "avro.py"]
    assert offenders == []
    assert avro.registry_client("http://x:1")._rest_client.timeout == avro.REGISTRY_TIMEOUT_S
