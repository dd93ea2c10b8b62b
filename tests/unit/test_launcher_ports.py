"""``ratchet infra status|down|restart`` act on the pids a home's state file names; the
settings name ports. When the two disagree (a second set of servers under another
RATCHET_HOME, with the home or the ports left out) the launcher must refuse, not stop
or report the servers of the wrong set. (Found by an outside review of the operator's
commands, 2026-12-04: `infra down` with the ports of one set and the home of another
stopped the other set's healthy servers.)"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

import pytest

from infra import launcher
from infra.procs import Running, StateFile, is_alive, proc_start_time
from ratchet.settings import Settings


def record_stand_in(home, name: str, port: int) -> subprocess.Popen:
    """A stand-in process recorded in ``home``'s state as its ``name`` on ``port``."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            start_new_session=True)
    for _ in range(100):
        start = proc_start_time(proc.pid)
        if start is not None:
            break
        time.sleep(0.01)
    with StateFile(home).locked() as entries:
        entries[name] = Running(name, proc.pid, start, str(home / f"{name}.log"),
                                time.time(), port)
    return proc


@pytest.fixture
def recorded_registry(tmp_path):
    """A stand-in process recorded in a home's state as its registry on port 18081."""
    proc = record_stand_in(tmp_path, "registry", 18081)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def recorded_kafka(tmp_path):
    """A stand-in recorded as the home's Kafka on the default port (the settings')."""
    proc = record_stand_in(tmp_path, "kafka", launcher.server(Settings(), "kafka").client_port())
    yield proc
    proc.kill()
    proc.wait()


def _settings(home, port: int) -> Settings:
    return replace(Settings(), home=home,
                   schema_registry_url=f"http://127.0.0.1:{port}/apis/ccompat/v7")


def test_down_with_the_ports_of_another_set_stops_nothing(tmp_path, recorded_registry):
    said = []
    how = launcher.down(_settings(tmp_path, 28081), names=["registry"], out=said.append)
    assert how == {"registry": "refused"}
    assert is_alive(StateFile(tmp_path).get("registry"))
    assert recorded_registry.poll() is None
    assert "serves port 18081, the settings name 28081" in said[0]
    assert launcher.cli_down(_settings(tmp_path, 28081)) == 1


def test_down_refusing_one_server_stops_none_of_the_others(tmp_path, recorded_registry,
                                                           recorded_kafka):
    """The home's Kafka serves the port the settings name, its registry another: the
    settings point at another set, so the Kafka whose port agrees is not stopped either
    (an outside review, session 40: it was, while the registry was refused)."""
    said = []
    how = launcher.down(_settings(tmp_path, 28081), names=["registry", "kafka"],
                        out=said.append, purge=True)
    assert how == {"registry": "refused", "kafka": "not stopped"}
    assert recorded_kafka.poll() is None and recorded_registry.poll() is None
    assert set(StateFile(tmp_path).read()) == {"registry", "kafka"}
    assert any("kafka: not stopped" in line for line in said)
    assert not any("purged" in line for line in said)


def test_status_with_the_ports_of_another_set_names_the_mismatch(tmp_path, recorded_registry):
    status = launcher.server_status(_settings(tmp_path, 28081), "registry")
    assert not status.healthy and status.pid == recorded_registry.pid
    assert "serves port 18081" in status.detail


def test_down_with_the_same_ports_stops_the_recorded_process(tmp_path, recorded_registry):
    how = launcher.down(_settings(tmp_path, 18081), names=["registry"], out=lambda _m: None)
    assert how["registry"] in ("stopped", "killed")
    recorded_registry.wait(timeout=10)


def test_an_entry_from_before_ports_were_kept_is_still_read(tmp_path):
    """State files written by older versions have no port: read, never refused."""
    (tmp_path / "state.json").write_text(
        '{"kafka": {"name": "kafka", "pid": 1, "start_time": 1, "log": "x", '
        '"started_at": 0}}')
    entry = StateFile(tmp_path).read()["kafka"]
    assert entry.port == 0
    srv = launcher.server(replace(Settings(), home=tmp_path), "kafka")
    assert launcher.port_mismatch(srv, entry, tmp_path) is None


def test_down_of_named_servers_stops_only_those_and_judges_only_those(
        tmp_path, recorded_registry, recorded_kafka):
    """`ratchet infra down kafka` stops the home's Kafka and leaves its registry, and
    exits 0 though the registry runs on: `.ci/run` stops only the servers it started
    (a developer's exported RATCHET_HOME keeps the servers it found serving)."""
    settings = _settings(tmp_path, 18081)
    assert launcher.cli_down(settings, names=["kafka"]) == 0
    recorded_kafka.wait(timeout=10)
    assert recorded_registry.poll() is None
    assert set(StateFile(tmp_path).read()) == {"registry"}


def test_the_cli_passes_the_named_servers_to_down(monkeypatch):
    from click.testing import CliRunner

    from ratchet import cli

    seen = {}
    monkeypatch.setattr(launcher, "cli_down",
                        lambda settings, purge, names: seen.setdefault("names", names) and 0)
    result = CliRunner().invoke(cli.main, ["infra", "down", "kafka", "registry"])
    assert seen["names"] == ("kafka", "registry"), result.output
    result = CliRunner().invoke(cli.main, ["infra", "down", "zookeeper"])
    assert result.exit_code == 2 and "zookeeper" in result.output
