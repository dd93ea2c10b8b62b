"""What ``ratchet infra`` does with a home it cannot use: a damaged ``state.json``, a
RATCHET_HOME that is not a directory. Each is exit 1 with a line naming the file or
the variable, never a traceback, and never a guess about which processes are ours.
Then what it says of its processes: ``status`` of one that does not serve its port, a
process that outlives SIGKILL, a long download. (An operator's review of the launcher,
session 43.)"""

from __future__ import annotations

import socket
from dataclasses import replace

import pytest

from infra import launcher
from infra.procs import StateFile, StateFileError
from infra.servers.base import Server, Unhealthy
from ratchet.settings import Settings
from tests.unit.test_launcher_ports import record_stand_in

# Ports nothing serves here: no check may reach a real server.
PORTS = dict(kafka_bootstrap="127.0.0.1:18627", cassandra_port=18628,
             schema_registry_url="http://127.0.0.1:18629/apis/ccompat/v7")


def _settings(home) -> Settings:
    return replace(Settings(), home=home, **PORTS)


@pytest.fixture
def recorded_kafka(tmp_path):
    """A stand-in process recorded in the home's state as its Kafka."""
    proc = record_stand_in(tmp_path, "kafka", 18627)
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("damage", ["{truncated", '{"kafka": {"pid": 1}}', "[1, 2]"])
def test_a_damaged_state_file_stops_down_with_exit_1_and_leaves_the_server(
        tmp_path, recorded_kafka, capsys, damage):
    """Read as "no processes", a damaged state file made ``down`` say "nothing to
    stop" and exit 0 with the server still running."""
    (tmp_path / "state.json").write_text(damage)
    with pytest.raises(StateFileError, match="state.json"):
        StateFile(tmp_path).read()
    assert launcher.cli_down(_settings(tmp_path)) == 1
    assert "state.json cannot be read" in capsys.readouterr().err
    assert recorded_kafka.poll() is None  # nothing was signalled on a guess
    assert launcher.cli_status(_settings(tmp_path)) == 1
    assert "state.json cannot be read" in capsys.readouterr().err
    assert launcher.cli_up(_settings(tmp_path)) == 1
    assert "state.json cannot be read" in capsys.readouterr().err
    assert (tmp_path / "state.json").read_text() == damage  # left for the operator


@pytest.mark.parametrize("command", ["up", "down", "status", "restart"])
def test_a_home_that_is_not_a_directory_is_exit_1_naming_ratchet_home(tmp_path, capsys,
                                                                      command):
    (tmp_path / "afile").write_text("")
    settings = _settings(tmp_path / "afile" / "home")
    run = {"up": launcher.cli_up, "down": launcher.cli_down, "status": launcher.cli_status,
           "restart": lambda s: launcher.cli_restart(s, "registry")}[command]
    assert run(settings) == 1
    err = capsys.readouterr().err
    assert f"ratchet infra {command}" in err and f"RATCHET_HOME={settings.home}" in err
    assert "Traceback" not in err


def test_status_does_not_call_a_recorded_process_healthy_when_another_serves_its_port(
        tmp_path, recorded_kafka, monkeypatch):
    """The home's Kafka (alive, recorded) does not listen on its port (hung, or bound
    elsewhere); another process does and answers the health check. ``status`` said
    "healthy" beside the recorded pid, exit 0, for a server that was not serving (an
    operator's review, session 43). ``up`` already tells the two apart."""
    from infra.servers.kafka import Kafka

    listener = socket.create_server(("127.0.0.1", 18627))  # "another process": not the pid
    monkeypatch.setattr(Kafka, "check", lambda self, timeout_s=10.0: None)  # it answers
    try:
        report = launcher.server_status(_settings(tmp_path), "kafka")
    finally:
        listener.close()
    assert report.pid == recorded_kafka.pid
    assert not report.healthy
    assert f"not by pid {recorded_kafka.pid}" in report.detail


class _Fake(Server):
    """A server that is never fetched or started here: its check always fails."""

    name, version = "fake", "1"

    def fetch(self):
        raise AssertionError("not expected to download")

    def prepare(self):
        raise RuntimeError("stop before the launch")

    def command(self):
        return []

    def client_port(self):
        return 18629

    def check(self, timeout_s=10.0):
        raise Unhealthy("it does not answer")

    def endpoint(self):
        return "fake"


def test_a_port_taken_by_a_stranger_does_not_show_an_earlier_starts_log(tmp_path):
    """Nothing is started when the port is taken, yet the error showed the log's last
    lines: an earlier, healthy start of the server, which sent the operator looking
    at the wrong thing (an operator's review, session 43)."""
    srv = _Fake(_settings(tmp_path))
    srv.log_path.parent.mkdir(parents=True)
    srv.log_path.write_text("an earlier start: fake is ready\n")
    listener = socket.create_server(("127.0.0.1", 18629))
    try:
        with pytest.raises(launcher.ServerStartError) as failed:
            launcher._ensure_started(srv, StateFile(tmp_path), lambda _line: None)
    finally:
        listener.close()
    assert "port 18629 is taken by a process that is not a healthy fake" in str(failed.value)
    assert "an earlier start" not in str(failed.value)


def test_a_long_download_says_it_is_still_downloading(tmp_path, monkeypatch):
    """A first ``up`` downloads with Maven (~50 s here, minutes on a slow link) and said
    nothing between "downloading" and "downloaded" (an operator's review, session 43)."""
    import threading

    said: list[str] = []
    ticked = threading.Event()

    def say(line: str) -> None:
        said.append(line)
        if "still downloading" in line:
            ticked.set()

    class Slow(_Fake):
        name = "slow"

        def fetch(self):  # "downloads" until progress was said (10 s at most)
            ticked.wait(10)

        def prepare(self):
            raise RuntimeError("stop after the download")

    monkeypatch.setattr(launcher, "PROGRESS_EVERY_S", 0.05)
    with pytest.raises(RuntimeError, match="stop after the download"):
        launcher._ensure_started(Slow(_settings(tmp_path)), StateFile(tmp_path), say)
    assert any(line.startswith("slow: still downloading") and "mvn.log" in line
               for line in said), said


def test_a_process_that_outlives_sigkill_stays_recorded_and_down_exits_1(
        tmp_path, recorded_kafka, monkeypatch, capsys):
    """A process stuck in the kernel (a dead disk) outlives SIGKILL. ``stop_server``
    dropped it from the state and said "killed", so ``down`` exited 0 with it running
    and no later command knew it (an operator's review, session 43). Simulated: the
    signals are not delivered."""
    from infra import procs

    monkeypatch.setattr(procs, "_signal_group", lambda pid, sig: None)
    monkeypatch.setattr(procs, "KILL_WAIT_S", 0.2)
    monkeypatch.setattr(launcher, "STOP_GRACE_S", 0.2)
    assert launcher.cli_down(_settings(tmp_path)) == 1
    assert f"kafka: still running (pid {recorded_kafka.pid})" in capsys.readouterr().out
    assert StateFile(tmp_path).get("kafka").pid == recorded_kafka.pid


@pytest.mark.parametrize("url,port", [
    ("http://127.0.0.1/apis/ccompat/v7", 80),
    ("https://127.0.0.1/apis/ccompat/v7", 443),
])
def test_the_launched_registry_serves_the_port_its_clients_use(tmp_path, url, port):
    """A URL without a port is 80 for the clients; the launcher started the registry on
    8081 and waited 90 s for a check on 80 (an operator's review, session 43)."""
    srv = launcher.server(replace(_settings(tmp_path), schema_registry_url=url), "registry")
    assert srv.client_port() == port
    assert f"-Dquarkus.http.port={port}" in srv.command()


def test_the_registry_check_with_several_urls_asks_the_first(tmp_path):
    """RATCHET_SCHEMA_REGISTRY_URL may list several URLs; the launcher's check pasted the
    whole list before its path, so a healthy registry was never healthy (an operator's
    review, session 43). A stand-in registry answers the check's two calls."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from infra.servers.registry import HEALTH_SCHEMA

    class Registry(BaseHTTPRequestHandler):
        def _answer(self, body):
            data = json.dumps(body).encode()
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            ok = self.path == "/apis/ccompat/v7/subjects/_ratchet.healthcheck-value/versions"
            self._answer({"id": 7} if ok else {})

        def do_GET(self):  # noqa: N802
            ok = self.path == "/apis/ccompat/v7/schemas/ids/7"
            self._answer({"schema": json.dumps(HEALTH_SCHEMA)} if ok else {})

        def log_message(self, *args):
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 18629), Registry)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:18629/apis/ccompat/v7,http://127.0.0.1:18628/apis/ccompat/v7"
        launcher.server(replace(_settings(tmp_path), schema_registry_url=url), "registry").check(5)
    finally:
        http.shutdown()
        http.server_close()


def test_a_down_interrupted_while_its_server_runs_on_keeps_it_recorded(
        tmp_path, recorded_kafka, monkeypatch):
    """Ctrl-C during ``down``'s 30 s grace (or any error while stopping): the server was
    already dropped from the state, so it ran on and every later command said "not
    started by ratchet, nothing to stop" (found by an outside review of session 43's
    fixes, the cousin of the SIGKILL one above)."""

    def interrupted(entry, grace_s):
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "terminate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launcher.stop_server(_settings(tmp_path), "kafka", out=lambda _m: None)
    assert recorded_kafka.poll() is None
    assert StateFile(tmp_path).get("kafka").pid == recorded_kafka.pid


def test_an_https_registry_url_is_refused_before_anything_is_fetched_or_started(
        tmp_path, monkeypatch):
    """The launched registry serves plain HTTP: with an https URL ``up`` started it on
    443 and waited 90 s for a TLS round trip that could not pass (session 43)."""
    from infra.servers.registry import Registry

    settings = replace(_settings(tmp_path),
                       schema_registry_url="https://127.0.0.1:18629/apis/ccompat/v7")
    srv = Registry(settings)
    monkeypatch.setattr(srv, "fetch", lambda: pytest.fail("downloaded"))
    monkeypatch.setattr(srv, "prepare", lambda: pytest.fail("prepared to start"))
    with pytest.raises(launcher.ServerStartError, match="http://") as raised:
        launcher._ensure_started(srv, StateFile(tmp_path), lambda _line: None)
    assert "nothing was started" in str(raised.value) and "last lines" not in str(raised.value)
    assert StateFile(tmp_path).read() == {}


def test_status_of_a_port_a_stranger_holds_is_unhealthy_not_not_running(tmp_path, capsys):
    """No process of the home, and something listens on the registry's port that is not
    a registry: ``status`` said ``not running``, which reads as "``up`` will start it",
    while ``up`` refuses the taken port (an operator's review, session 44)."""
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        settings = replace(Settings(), home=tmp_path,
                           schema_registry_url=f"http://127.0.0.1:{port}/apis/ccompat/v7")
        line = launcher.server_status(settings, "registry").line()
    assert line.split()[1] == "UNHEALTHY", line
    assert f"port {port} is open, but not a healthy registry" in line
    assert "`up` will not start one there" in line


def test_status_of_a_server_nothing_serves_says_which_port_is_free(tmp_path):
    """``not running`` with an empty detail did not say which port was looked at (a
    setting pointing elsewhere than the operator thinks reads the same)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: nothing answers there
        settings = replace(Settings(), home=tmp_path,
                           schema_registry_url=f"http://127.0.0.1:{port}/apis/ccompat/v7")
        line = launcher.server_status(settings, "registry").line()
    assert line.split()[1:3] == ["not", "running"], line
    assert f"nothing listens on port {port}" in line
