"""The built image runs what deploy/k8s runs, without a container runtime (tests/image/rootfs.py).

Against the real local Kafka, Cassandra and registry, isolated in a keyspace, a topic
prefix and a consumer group of its own: `ratchet migrate`, `ratchet worker` and
`ratchet api` from the image (read-only root, the image's user, env and entrypoint),
the manifests' own probes, one turn produced by the gateway library and read back
certified over HTTP, then SIGTERM and the drain times the manifests allow.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import yaml

from tests.image.dockerfile import LOCK, REPO, parse_dockerfile
from tests.image.rootfs import OciImage, child_pid

pytestmark = pytest.mark.integration

K8S = REPO / "deploy" / "k8s"
SITE_PACKAGES = "opt/ratchet/venv/lib/python3.11/site-packages"


def _manifest(name: str) -> dict:
    return yaml.safe_load((K8S / f"{name}.yaml").read_text())


def _container(name: str) -> dict:
    return _manifest(name)["spec"]["template"]["spec"]["containers"][0]


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", LOCK.read_text(), re.M)
    return {_canonical(name): version for name, version in pins}


def _installed(image: OciImage) -> dict[str, str]:
    out = {}
    for meta in (image.root / SITE_PACKAGES).glob("*.dist-info/METADATA"):
        fields = dict(re.findall(r"^(Name|Version): (.+)$", meta.read_text(errors="replace"),
                                 re.M))
        out[_canonical(fields["Name"])] = fields["Version"]
    return out


def test_image_config_is_the_dockerfiles(image: OciImage) -> None:
    final = parse_dockerfile().final
    config = image.config
    assert config["Entrypoint"] == final.exec_form("ENTRYPOINT")
    assert config["Cmd"] == final.exec_form("CMD")
    assert config["User"] == final.one("USER")
    assert config["WorkingDir"] == final.one("WORKDIR")
    assert image.volumes == final.exec_form("VOLUME")
    assert image.env == final.env()
    assert set(config["ExposedPorts"]) == set(final.one("EXPOSE").split())
    version = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)[1]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == version
    assert set(final.labels()) <= set(labels)
    assert labels["org.opencontainers.image.revision"] != "unknown"


def test_image_holds_the_locked_packages_and_no_build_tools(image: OciImage) -> None:
    installed = _installed(image)
    version = image.config["Labels"]["org.opencontainers.image.version"]
    assert installed == {**_locked(), "ratchet": version}  # no pip, setuptools, test extras
    for tool in ("gcc", "cc", "make", "ld", "as", "pip", "pip3", "python3.11-config"):
        hits = [d for d in ("usr/bin", "usr/local/bin", "opt/ratchet/venv/bin")
                if (image.root / d / tool).exists()]
        assert not hits, f"{tool} in the image: {hits}"
    assert not (image.root / "usr/share/python-wheels").exists()  # ensurepip's pip wheels
    # ratchet's C module was compiled (ratchet/speedups.py), its build tools are gone
    assert list((image.root / SITE_PACKAGES / "ratchet").glob("_speedups.cpython-311-*.so"))
    assert not (image.root / "etc/resolv.conf").exists()  # the runtime provides it


def _free_port() -> int:
    from services.demo.processes import free_port

    return free_port()


def _wait(what: str, check, proc: subprocess.Popen, log: Path, timeout_s: float = 90.0):
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: exited with {proc.returncode}\n{_tail(log)}")
        try:
            if result := check():
                return result
        except (OSError, ValueError, httpx.HTTPError) as exc:
            last = exc
        time.sleep(0.3)
    pytest.fail(f"{what}: not ready after {timeout_s:.0f}s ({last!r})\n{_tail(log)}")


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)[1]) / 1024


def _stop(proc: subprocess.Popen, grace_s: float) -> tuple[int, float]:
    """SIGTERM, as Kubernetes sends; (exit code, seconds to exit). SIGKILL past the grace."""
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        pytest.fail(f"still running {grace_s}s after SIGTERM (the manifests' grace period)")
    return code, time.monotonic() - started


def test_migrate_worker_api_promote_a_turn_and_read_it_back(
    image: OciImage, settings, cassandra_session, tmp_path
) -> None:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from schemas.avro import EventSerde, register_schemas
    from services.api.app import WAIT_MS_CAP
    from services.demo.simulator import SimulatedGateway, assistant, uid, user
    from services.gateway.client import Certified, RehydrationClient
    from services.gateway.events import TurnIdentity
    from services.gateway.producer import GatewayProducer
    from streams.topics import delete_topics_with_prefix

    run = uuid.uuid4().hex[:8]
    group = f"ratchet-image-{run}"
    smoke = replace(settings, keyspace=f"ratchet_image_{run}", topic_prefix=f"{group}.",
                    partitions=2, api_host="127.0.0.1", api_port=_free_port(),
                    worker_metrics_port=_free_port())
    env = smoke.to_env()
    del env["RATCHET_HOME"]  # the image's own, on its volume
    env["RATCHET_CONSUMER_GROUP"] = group
    (home,) = image.volumes
    volume = tmp_path / "volume"
    volume.mkdir()
    uid_, gid = (int(x) for x in image.config["User"].split(":"))
    os.chown(volume, uid_, gid)
    volumes = {home: volume}
    procs: list[subprocess.Popen] = []
    figures: dict[str, float] = {}

    def start(command: str) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{command}.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(image.command([command], env=env, volumes=volumes),
                                    stdout=sink, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc, log

    def probe(container: dict, name: str) -> int:
        """The manifest's exec probe, run in the image as Kubernetes runs it."""
        command = container[name]["exec"]["command"]
        return subprocess.run(image.command(command, env=env, volumes=volumes,
                                            entrypoint=False),
                              timeout=container[name]["timeoutSeconds"]).returncode

    worker_spec, api_spec = _container("worker-deployment"), _container("api-deployment")
    migrate_args = _manifest("migrate-job")["spec"]["template"]["spec"]["containers"][0]["args"]
    try:
        started = time.monotonic()
        migrate = subprocess.run(image.command(migrate_args, env=env, volumes=volumes),
                                 capture_output=True, text=True, timeout=300)
        assert migrate.returncode == 0, migrate.stdout + migrate.stderr
        figures["migrate_s"] = time.monotonic() - started

        assert probe(worker_spec, "livenessProbe") == 1  # no worker yet: "down"
        worker, worker_log = start(worker_spec["args"][0])
        health_file = volume / "health" / f"worker-{child_pid(worker.pid)}.json"  # tini's child
        _wait("worker", lambda: json.loads(health_file.read_text())["status"] == "ok",
              worker, worker_log)
        assert probe(worker_spec, "livenessProbe") == 0
        assert probe(worker_spec, "readinessProbe") == 0
        assert (volume / "faust").is_dir()  # Faust's data dir is on the volume too

        api, api_log = start(api_spec["args"][0])
        base_url = f"http://127.0.0.1:{smoke.api_port}"
        health_path = api_spec["readinessProbe"]["httpGet"]["path"]
        _wait("api", lambda: (r := httpx.get(base_url + health_path, timeout=2)).status_code
              == 200 and r.json().get("notifier"), api, api_log)
        live = httpx.get(base_url + api_spec["livenessProbe"]["httpGet"]["path"], timeout=2)
        assert live.status_code == 200

        registry = SchemaRegistryClient({"url": smoke.schema_registry_url})
        register_schemas(registry)
        with (GatewayProducer(smoke, EventSerde(registry)) as producer,
              RehydrationClient(base_url, timeout_s=15) as client):
            gw = SimulatedGateway(producer, client)
            turn = gw.turn(TurnIdentity.conversation(gw.tenant_id, uid("conv"), uid("resp"), 0),
                           [user("Is the image alive?")], [assistant("It is.")])
            gw.publish(turn)
            outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS_CAP)
        assert isinstance(outcome, Certified), outcome
        assert outcome.head_seq == 1
        assert [i.content.encode() for i in outcome.items] == [i.content for i in turn.items]

        for port in (smoke.api_port, smoke.worker_metrics_port):
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            assert metrics.status_code == 200 and "ratchet_" in metrics.text
        figures["worker_rss_mib"] = _rss_mib(child_pid(worker.pid))  # ratchet, not tini
        figures["api_rss_mib"] = _rss_mib(child_pid(api.pid))

        # Kubernetes runs the API's preStop hook before SIGTERM: it must exist in the
        # image and leave the API serving (the Service stops sending meanwhile).
        hook = api_spec["lifecycle"]["preStop"]["exec"]["command"]
        hook_started = time.monotonic()
        assert subprocess.run(image.command(hook, env=env, volumes=volumes, entrypoint=False),
                              timeout=30).returncode == 0
        figures["api_pre_stop_s"] = time.monotonic() - hook_started
        assert httpx.get(base_url + health_path, timeout=2).status_code == 200

        for name, proc, spec in (("api", api, "api-deployment"),
                                 ("worker", worker, "worker-deployment")):
            grace = _manifest(spec)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            code, took = _stop(proc, grace)
            figures[f"{name}_stop_s"] = took
            if name == "api":
                # uvicorn drains, then re-raises the SIGTERM it caught: its death by the
                # signal, which tini (the Popen's process) passes on as exit status 143.
                assert code in (0, 128 + signal.SIGTERM), _tail(api_log)
                assert "Application shutdown complete" in api_log.read_text()
            else:
                assert code == 0, f"worker exited {code} on SIGTERM\n{_tail(worker_log)}"
        assert not list((volume / "health").glob("worker-*.json"))  # removed on the way out
        # tini is not PID 1 here, as under `docker run --init`: its `-s` keeps its
        # three-line warning (not JSON) out of every log (session 50's review).
        for said in (migrate.stdout + migrate.stderr, api_log.read_text(),
                     worker_log.read_text()):
            assert "[WARN  tini" not in said
        figures["total_s"] = time.monotonic() - started
        print(f"\nimage smoke test figures: {json.dumps(figures)}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {smoke.keyspace}", timeout=60)
        delete_topics_with_prefix(settings.kafka_bootstrap, [smoke.topic_prefix, f"{group}-"])
