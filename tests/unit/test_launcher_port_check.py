"""``ratchet infra up`` checks every port it would launch a server on before it fetches
or starts anything (``infra/launcher.py``'s ``check_ports``). Kafka's controller port is
derived (its client port + 1) and was never checked: from a client port of 65535 it was
65536, and Kafka exited at start, its log saying why, while the other servers were
started beside it (an operator's review, session 43, left). No server is started here: the
download and the launch are stand-ins that record being called."""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from infra import launcher
from infra.servers.base import Server
from ratchet.settings import Settings
from streams.testing import free_port


@pytest.fixture
def attempts(monkeypatch):
    """What ``up`` tried: a download, a prepare or a launch (none should happen)."""
    tried: list[str] = []

    def refuse(what):
        def stand_in(self, *args, **kwargs):
            tried.append(f"{what} {getattr(self, 'name', '')}".strip())
            raise RuntimeError(f"no {what} in this test")
        return stand_in

    for cls in {type(launcher.server(Settings(), n)) for n in launcher.NAMES}:
        monkeypatch.setattr(cls, "fetch", refuse("fetch"))
        monkeypatch.setattr(cls, "prepare", refuse("prepare"))
    monkeypatch.setattr(launcher, "_launch", lambda srv, state: refuse("launch")(srv))
    monkeypatch.setattr(Server, "is_fetched", lambda self: False)
    return tried


def _settings(home, *, kafka: int | None = None, cassandra: int | None = None,
              storage: int | None = None, registry: int | None = None) -> Settings:
    """Settings whose four ports are free ones unless named."""
    return replace(
        Settings(), home=home,
        kafka_bootstrap=f"127.0.0.1:{kafka or free_port()}",
        cassandra_port=cassandra or free_port(),
        cassandra_storage_port=storage or free_port(),
        schema_registry_url=f"http://127.0.0.1:{registry or free_port()}/apis/ccompat/v7")


def test_a_kafka_controller_port_above_65535_is_refused_before_anything_starts(
        tmp_path, attempts, capsys):
    settings = _settings(tmp_path, kafka=65535)
    with pytest.raises(launcher.InfraError) as err:
        launcher.up(settings, out=lambda _line: None)
    assert isinstance(err.value, getattr(launcher, "PortUnusable", ()))
    message = str(err.value)
    assert "kafka's controller port" in message and "65536" in message
    assert "RATCHET_KAFKA_BOOTSTRAP" in message
    assert "nothing was started" in message
    assert attempts == []  # no download, no launch, of any server

    assert launcher.cli_up(settings) == 1
    err_text = capsys.readouterr().err
    assert "65536" in err_text and "RATCHET_KAFKA_BOOTSTRAP" in err_text
    assert "Traceback" not in err_text
    assert attempts == []


def test_a_kafka_controller_port_another_process_listens_on_is_refused(tmp_path, attempts):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        taken = stranger.getsockname()[1]
        settings = _settings(tmp_path, kafka=taken - 1)
        with pytest.raises(launcher.InfraError) as err:
            launcher.up(settings, names=["kafka"], out=lambda _line: None)
    message = str(err.value)
    assert f"kafka's controller port (its client port + 1) {taken} is in use" in message
    assert "RATCHET_KAFKA_BOOTSTRAP" in message
    assert attempts == []


def test_a_cassandra_storage_port_another_process_listens_on_is_refused(tmp_path, attempts):
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        settings = _settings(tmp_path, storage=stranger.getsockname()[1])
        with pytest.raises(launcher.InfraError) as err:
            launcher.up(settings, out=lambda _line: None)
    assert "cassandra's storage (gossip) port" in str(err.value)
    assert "RATCHET_CASSANDRA_STORAGE_PORT" in str(err.value)
    assert attempts == []


def test_two_servers_that_would_share_a_port_are_refused(tmp_path, attempts):
    """Kafka's controller port is Cassandra's storage port: each port is free before
    the launch, and one of the two servers would fail to listen after it."""
    kafka = free_port()
    settings = _settings(tmp_path, kafka=kafka, storage=kafka + 1)
    with pytest.raises(launcher.InfraError) as err:
        launcher.up(settings, out=lambda _line: None)
    message = str(err.value)
    assert f"port {kafka + 1} would be both kafka's controller port" in message
    assert "RATCHET_CASSANDRA_STORAGE_PORT or RATCHET_KAFKA_BOOTSTRAP" in message
    assert attempts == []


def test_free_ports_pass_the_check_and_up_goes_on_to_fetch(tmp_path, attempts):
    """The check refuses only what cannot work: with free ports ``up`` goes on (here to
    the stand-in download, which fails)."""
    with pytest.raises(launcher.InfraError, match="no fetch in this test"):
        launcher.up(_settings(tmp_path), names=["kafka"], out=lambda _line: None)
    assert attempts == ["fetch kafka"]
