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


def _run(command: str, settings, *args: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
            "RATCHET_WORKER_METRICS_PORT": "0", "RATCHET_API_PORT": str(free_port()), **env}
    return subprocess.run([sys.executable, "-m", "ratchet.cli", command, *args], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["worker", "api"])
def test_a_keyspace_not_migrated_is_one_line_naming_migrate(settings, command):
    prefix = f"startup-{uuid.uuid4().hex[:8]}."
    keyspace = f"missing_{uuid.uuid4().hex[:8]}"
    done = _run(command, settings, RATCHET_KEYSPACE=keyspace, RATCHET_TOPIC_PREFIX=prefix)
    assert done.returncode == 1, done.stderr[-2000:]
    # ONE line (docs/operations.md): the API printed the driver's log lines first, one
    # with a traceback (an operator's review, session 38).
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    last = lines[0]
    assert last.startswith(f"ratchet {command}: cannot start: ") and keyspace in last \
        and "ratchet migrate" in last
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


@pytest.mark.parametrize("command", ["worker", "api"])
def test_a_local_datacenter_the_cluster_lacks_is_one_line_naming_it(settings, command):
    """A RATCHET_CASSANDRA_LOCAL_DC no node is in (a typo, 'dc-1' for 'dc1') is said as
    such, with the datacenters there are, on a migrated keyspace: it used to be "has no
    keyspace ... (or it is unreachable): run `ratchet migrate` first", sending the
    operator to migrate a keyspace that was there (session 52's review, rrevv)."""
    done = _run(command, settings, RATCHET_CASSANDRA_LOCAL_DC="nodc",
                RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ratchet {command}: cannot start: ")
    assert "RATCHET_CASSANDRA_LOCAL_DC='nodc'" in lines[0] and "migrate" not in lines[0]
    assert "datacenter1" in lines[0]  # the shared test cluster's one datacenter


@pytest.mark.parametrize("command", ["worker", "api"])
def test_cassandra_that_does_not_answer_is_one_line(settings, command):
    done = _run(command, settings, RATCHET_CASSANDRA_PORT=str(free_port()),
                RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    assert done.returncode == 1, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"ratchet {command}: cannot start: cannot reach Cassandra")


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


# --- An operator's start-up mistakes, each one line (found by an outside review of the
# operator's commands, session 26; each test failed before its fix) ---------------------

def _one_line(done: subprocess.CompletedProcess, prefix: str) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert _no_bare_traceback(done.stderr), done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(prefix), lines[-3:]
    return lines[-1]


@pytest.mark.parametrize("command,prefix", [
    ("worker", "ratchet worker: cannot start: "),
    ("api", "ratchet api: cannot start: "),
    ("migrate", "ratchet migrate: cannot reach Cassandra"),
])
def test_a_cassandra_host_that_does_not_resolve_is_one_line(settings, command, prefix):
    """A misspelt or not yet published DNS name (a headless service before its pods are
    ready) ended in the driver's ``UnresolvableContactPoints`` traceback."""
    done = _run(command, settings, RATCHET_CASSANDRA_HOSTS="cassandra.nonexistent.invalid",
                RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    assert "RATCHET_CASSANDRA_HOSTS" in _one_line(done, prefix)


def test_a_registry_url_without_its_api_path_is_one_line(settings):
    """The registry answers, with HTTP 404: the URL lacks ``/apis/ccompat/v7``, the
    commonest mistake (docs/operations.md gives the form). It ended in a ~50-line
    ``SchemaRegistryError`` traceback."""
    url = settings.schema_registry_url.split("/apis/")[0]
    done = _run("worker", settings, RATCHET_SCHEMA_REGISTRY_URL=url,
                RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    line = _one_line(done, "ratchet worker: cannot start: ")
    assert "404" in line and "ccompat" in line


def test_a_keyspace_created_but_never_migrated_is_one_line_naming_migrate(
        settings, cassandra_cluster):
    """A keyspace made by hand (a DBA sets its replication) has no schema_migrations
    table: ``InvalidRequest`` in a 35-line traceback instead of the documented line."""
    keyspace = f"bare_{uuid.uuid4().hex[:8]}"
    session = cassandra_cluster.connect()
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
    try:
        for command in ("worker", "api"):
            done = _run(command, settings, RATCHET_KEYSPACE=keyspace,
                        RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
            line = _one_line(done, f"ratchet {command}: cannot start: ")
            assert keyspace in line and "ratchet migrate" in line
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        session.shutdown()


def test_an_unusable_home_is_one_line_before_any_topic(settings, tmp_path):
    """RATCHET_HOME under a file (an unmounted volume, a read-only root): three
    tracebacks, after the topics were created."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    prefix = f"startup-{uuid.uuid4().hex[:8]}."
    done = _run("worker", settings, RATCHET_HOME=str(blocker / "home"),
                RATCHET_TOPIC_PREFIX=prefix)
    assert "RATCHET_HOME" in _one_line(done, "ratchet worker: cannot start: ")
    topics = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(
        timeout=30).topics
    assert not [t for t in topics if t.startswith(prefix)]


def test_an_api_port_in_use_is_one_line_and_never_said_listening(settings):
    """uvicorn logged "rehydration API listening", then failed to bind and exited 3."""
    import socket

    holder = socket.create_server(("127.0.0.1", 0))
    try:
        done = _run("api", settings, RATCHET_API_PORT=str(holder.getsockname()[1]))
    finally:
        holder.close()
    assert "RATCHET_API_PORT" in _one_line(done, "ratchet api: cannot start: cannot listen")
    assert "rehydration API listening" not in done.stderr


def _wait_healthy(proc: subprocess.Popen, port: int, timeout_s: float = 120) -> None:
    """Until the API on ``port`` answers /healthz 200; fails if it exits or is not
    serving within ``timeout_s``. It returned silently at its deadline: on a loaded
    machine the signal then reached an API still starting, whose stop is exit 0 too,
    and the test passed without a serving API (session 49)."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"the API exited ({proc.returncode}) before serving"
        assert time.monotonic() < deadline, f"the API did not serve within {timeout_s} s"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_the_api_exits_0_on_sigterm_and_ctrl_c(settings, signame, tmp_path):
    """docs/operations.md: a SIGTERM lets in-flight requests finish and the process
    exit. uvicorn re-raised the signal after its shutdown with the default handler: the
    process died with 143 before closing its clients. Ctrl-C (SIGINT, the default
    handler as on a terminal) then ended in click's ``Aborted!`` and exit 1, while the
    worker exits 0 on either (session 46)."""
    import signal

    port = free_port()
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
           "RATCHET_API_PORT": str(port)}
    log = tmp_path / "api.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ratchet.cli", "api"], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=sink,
            # As a terminal's shell starts it (a background job's would ignore SIGINT).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_healthy(proc, port)
        proc.send_signal(getattr(signal, signame))
        assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
        assert "Aborted!" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("level", ["INFO", "WARNING"])
def test_the_api_logs_at_ratchet_log_level(settings, level):
    """RATCHET_LOG_LEVEL is the API's level too (docs/operations.md): it logged at INFO
    whatever the setting, a line per history request included (an outside review of
    the docs, session 40)."""
    import json
    import signal

    import httpx

    port = free_port()
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
           "RATCHET_API_PORT": str(port), "RATCHET_LOG_LEVEL": level}
    proc = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "api"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(proc, port)
        # A request: the API logs one line for each at INFO.
        httpx.get(f"http://127.0.0.1:{port}/v1/responses/resp_nowhere/history", timeout=10)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    levels = {json.loads(line)["level"] for line in stderr.splitlines()
              if line.startswith("{")}
    if level == "INFO":
        assert "info" in levels, stderr[-2000:]
    else:
        assert levels <= {"warning", "error", "critical"}, stderr[-2000:]


def test_a_worker_without_kafka_says_so_in_a_few_lines(settings):
    """librdkafka printed each failed connection attempt: ~580 lines before the one."""
    done = _run("worker", settings, RATCHET_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",
                RATCHET_TOPIC_PREFIX=f"startup-{uuid.uuid4().hex[:8]}.")
    _one_line(done, "ratchet worker: cannot start: Kafka")
    assert len([line for line in done.stderr.splitlines() if line.strip()]) <= 5, \
        done.stderr[:2000]


def test_migrate_says_when_the_keyspace_has_another_replication(settings):
    """A keyspace made earlier (the default rf 1) is left as it is: migrate said
    "schema up to date" and production ran on rf 1 unnoticed."""
    done = _run("migrate", settings,
                RATCHET_REPLICATION="{'class': 'SimpleStrategy', 'replication_factor': 3}")
    assert done.returncode == 0, done.stderr[-2000:]
    warning = next(line for line in done.stdout.splitlines() if "replication" in line)
    assert warning.startswith("warning: ") and "ALTER KEYSPACE" in warning


def test_migrate_refuses_a_column_of_another_type(settings, cassandra_cluster, tmp_path):
    """``ADD IF NOT EXISTS`` succeeds over a column of another type, so the type check
    never ran: the migration was recorded and a worker dead-lettered every turn."""
    import dataclasses
    import shutil

    from infra.migrate import MIGRATIONS_DIR, apply_migrations

    keyspace = f"typed_{uuid.uuid4().hex[:8]}"
    partial = tmp_path / "migrations"
    partial.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.cql")):
        if int(path.name[:3]) <= 11:
            shutil.copy(path, partial / path.name)
    apply_migrations(cassandra_cluster, dataclasses.replace(settings, keyspace=keyspace),
                     partial)
    session = cassandra_cluster.connect()
    try:
        session.execute(f"ALTER TABLE {keyspace}.turns ADD accepted_attempt text", timeout=60)
        done = _run("migrate", settings, RATCHET_KEYSPACE=keyspace)
        assert done.returncode == 1, done.stdout[-2000:]
        assert "turns.accepted_attempt is text, the migration wants int" in done.stderr
        assert "012_" in done.stderr
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        session.shutdown()


@pytest.mark.parametrize("away", [
    {"RATCHET_CASSANDRA_PORT": "free"},
    {"RATCHET_CASSANDRA_HOSTS": "no-such-host.invalid"},
])
def test_migrate_status_that_cannot_reach_cassandra_exits_3(settings, away):
    """``--status`` exited 1 for "migrations pending" and "cannot reach Cassandra" alike,
    stderr telling them apart: a script reading 1 as "run migrate" ran it against a
    Cassandra that was away (session 53). 3 now, its one line on stderr; 0 and 1 keep
    their meaning (up to date; not up to date)."""
    env = {k: str(free_port()) if v == "free" else v for k, v in away.items()}
    done = _run("migrate", settings, "--status", **env)
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ratchet migrate: cannot reach Cassandra"), \
        lines
    assert done.stdout == "", done.stdout


def test_migrate_without_status_that_cannot_reach_cassandra_still_exits_1(settings):
    """Only ``--status`` has the code of its own: a run's failure is 1, whatever it is
    (the migrate Job retries on any)."""
    done = _run("migrate", settings, RATCHET_CASSANDRA_PORT=str(free_port()))
    assert done.returncode == 1 and "cannot reach Cassandra" in done.stderr, done.stderr


def test_migrate_tells_a_refusal_from_an_unreachable_cassandra(settings):
    """Cassandra answered and refused (a system keyspace): migrate said "cannot reach
    Cassandra ... is `ratchet infra up` running?"."""
    done = _run("migrate", settings, RATCHET_KEYSPACE="system")
    assert done.returncode == 1
    assert "refused" in done.stderr and "cannot reach" not in done.stderr, done.stderr


def test_migrate_does_not_warn_for_a_replication_factor_stored_per_datacenter(
        settings, cassandra_cluster):
    """Cassandra stores NetworkTopologyStrategy's ``replication_factor`` per datacenter
    (the form of deploy/k8s/configmap.yaml): the replication check warned on every run
    that an ALTER and a full repair were needed (an outside review of session 26's fixes)."""
    keyspace = f"nts_{uuid.uuid4().hex[:8]}"
    nts = "{'class': 'NetworkTopologyStrategy', 'replication_factor': 1}"
    try:
        for _ in range(2):  # the first creates the keyspace, the second finds it
            done = _run("migrate", settings, RATCHET_KEYSPACE=keyspace,
                        RATCHET_REPLICATION=nts)
            assert done.returncode == 0, done.stderr[-2000:]
            assert "replication" not in done.stdout, done.stdout
    finally:
        session = cassandra_cluster.connect()
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)
        session.shutdown()


@pytest.mark.parametrize("replication,datacenter", [
    ("{'class': 'SimpleStrategy', 'replication_factor': 3}", "the cluster"),
    # (A datacenter that does not exist is refused by Cassandra 5: one line, exit 1.)
    ("{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}", "datacenter datacenter1"),
])
def test_migrate_warns_of_more_replicas_than_nodes(settings, unique_name, cassandra_session,
                                                    replication, datacenter):
    """A replication the cluster cannot hold (a production RATCHET_REPLICATION on one
    node) was "schema up to date", exit 0, and the worker and
    the API then failed every LOCAL_QUORUM read and write (Unavailable): Cassandra's own
    warning at CREATE KEYSPACE is not shown (an operator's review, session 46). Still
    exit 0 (nodes may be added next), with a warning, at each run and in --status."""
    ks = unique_name("repl")
    try:
        for args in ([], [], ["--status"]):
            done = _run("migrate", settings, *args, RATCHET_KEYSPACE=ks,
                        RATCHET_REPLICATION=replication)
            assert done.returncode == 0, done.stderr[-2000:]
            warnings = [line for line in done.stdout.splitlines()
                        if line.startswith("warning: ") and "node" in line]
            assert len(warnings) == 1, (args, done.stdout)
            assert f"{datacenter}, which has " in warnings[0] and "QUORUM" in warnings[0]
            assert "RATCHET_REPLICATION" in warnings[0], warnings[0]
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


def test_migrate_does_not_warn_when_the_nodes_hold_the_replicas(settings, unique_name,
                                                                 cassandra_session):
    ks = unique_name("repl")
    try:
        done = _run("migrate", settings, RATCHET_KEYSPACE=ks,
                    RATCHET_REPLICATION="{'class': 'NetworkTopologyStrategy', 'datacenter1': 1}")
        assert done.returncode == 0 and "warning" not in done.stdout, done.stdout
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


def _chaos(settings, out, **env) -> subprocess.CompletedProcess:
    return _run("chaos", settings, "--turns", "1", "--faults", "none", "--out", str(out),
                RATCHET_HOME=str(out / "home"), **env)


def test_chaos_without_cassandra_is_one_line_and_exit_3(settings, tmp_path):
    """`ratchet chaos` whose servers cannot be reached ended in a traceback of its
    migrate subprocess (CalledProcessError) and exit 1, the code of a violation (an
    operator's review, session 46). Now one line and exit 3: the run never started."""
    done = _chaos(settings, tmp_path, RATCHET_CASSANDRA_PORT=str(free_port()))
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ratchet chaos: cannot start: "), lines
    assert "cannot reach Cassandra" in lines[0], lines


def test_chaos_without_the_registry_is_one_line_and_leaves_no_keyspace(
        settings, tmp_path, cassandra_session):
    """The run's keyspace is made (migrate) before the registry is asked: the failure
    drops it again, and starts no server (no fault was injected: nothing to heal)."""
    done = _chaos(settings, tmp_path,
                  RATCHET_SCHEMA_REGISTRY_URL=f"http://127.0.0.1:{free_port()}/apis/ccompat/v7")
    assert done.returncode == 3, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "schema registry" in lines[0], lines
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name != "home"]
    assert cassandra_session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (f"chaos_{run_dir.name}",)).one() is None
    assert not (tmp_path / "home" / "state.json").exists()  # no server started


def test_chaos_whose_migrate_stopped_after_making_the_keyspace_drops_it(
        settings, tmp_path, cassandra_session, monkeypatch):
    """A migrate refused half way (another migrator holding the lease, a statement
    refused) leaves the keyspace it made: the run left it behind (session 46's review,
    left; session 47). The stand-in migrate makes the run's keyspace as the real one
    does first (``IF NOT EXISTS``: the run has made it, since session 48), then fails as
    a lease it cannot take makes it fail."""
    from ratchet.chaos import runner

    made: list[str] = []

    def migrate_refused(args, env, **_kwargs):
        ks = env["RATCHET_KEYSPACE"]
        cassandra_session.execute(f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = "
                                  f"{settings.replication}", timeout=60)
        made.append(ks)
        return subprocess.CompletedProcess(args, 1, None, (
            f"ratchet migrate failed: another migrator holds {ks}.schema_migrations_lease "
            "(owner other) after 0s of waiting"))

    monkeypatch.setattr(runner.subprocess, "run", migrate_refused)
    with pytest.raises(runner.ChaosSetupFailed, match="another migrator holds"):
        runner.run(settings, runner.ChaosConfig(turns=1, faults="none", out=tmp_path))
    (ks,) = made
    assert cassandra_session.execute(
        "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
        (ks,)).one() is None


def test_smoke_without_kafka_says_so_in_a_few_lines(settings):
    """librdkafka logged each failed connection of the smoke's clients, ~190 lines on
    stderr in its 10 s, before the one line saying Kafka is not there (the worker's
    were quieted in session 26; an operator's review, session 46)."""
    done = _run("smoke", settings, RATCHET_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}")
    assert done.returncode == 1, done.stdout[-2000:]
    assert "ratchet smoke FAILED: KafkaException" in done.stdout, done.stdout[-2000:]
    assert len(done.stderr.splitlines()) <= 3, done.stderr[-3000:]


@pytest.mark.parametrize("args,away,says", [
    (["store"], "RATCHET_CASSANDRA_PORT", "cannot reach Cassandra"),
    # Its clean-up's own error (the cluster shut down) came last, the cause before it.
    (["api"], "RATCHET_CASSANDRA_PORT", "cannot reach Cassandra"),
    (["processor", "--turns", "10"], "RATCHET_KAFKA_BOOTSTRAP", "Kafka at 127.0.0.1:"),
])
def test_a_bench_without_its_servers_is_one_line(settings, args, away, says):
    """A bench whose servers cannot be reached ended in a driver's traceback (two for
    `bench api`) (an operator's review, session 46)."""
    port = str(free_port())
    done = _run("bench", settings, *args,
                **{away: port if away == "RATCHET_CASSANDRA_PORT" else f"127.0.0.1:{port}"})
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # The last line (the processor bench writes its progress lines before it).
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, lines
    assert lines[-1].startswith(f"ratchet bench {args[0]}: cannot run: "), lines
    assert says in lines[-1], lines


def test_chaos_refuses_a_keyspace_it_did_not_make(settings, tmp_path, cassandra_session,
                                                  monkeypatch):
    """The run trusted its tag: a keyspace of its name made before it (a tag's collision,
    by hand) was used, and dropped once its migrate failed (session 47's review, left).
    Now the run makes its keyspace itself and refuses one that exists: nothing used,
    nothing dropped, migrate never run."""
    from ratchet.chaos import runner

    drawn = uuid.uuid4()
    monkeypatch.setattr(runner.uuid, "uuid4", lambda: drawn)  # the run's tag, known
    ks = f"chaos_1x{drawn.hex[:6]}"
    cassandra_session.execute(f"CREATE KEYSPACE {ks} WITH replication = {settings.replication}",
                              timeout=60)
    cassandra_session.execute(f"CREATE TABLE {ks}.not_the_runs (k int PRIMARY KEY)", timeout=60)
    migrations: list[str] = []

    def migrate_refused(args, env, **_kwargs):
        migrations.append(env["RATCHET_KEYSPACE"])
        return subprocess.CompletedProcess(args, 1, None, "ratchet migrate failed: refused")

    monkeypatch.setattr(runner.subprocess, "run", migrate_refused)
    try:
        with pytest.raises(runner.ChaosSetupFailed, match=f"keyspace {ks} exists already"):
            runner.run(settings, runner.ChaosConfig(seed=1, turns=1, faults="none",
                                                    out=tmp_path))
        assert migrations == []
        assert cassandra_session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s",
            (ks,)).one() == ("not_the_runs",)
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)
