"""The Kubernetes manifests in deploy/k8s load, hang together and match the settings.

No cluster needed: the manifests are parsed with PyYAML and checked for what breaks a
rollout silently (a typo in a RATCHET_* name, a probe on a port the container does
not expose, more worker replicas than partitions, missing resource limits).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

from ratchet.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


class _RecordingEnv(Mapping[str, str]):
    """An empty environment that records every name ``Settings.from_env`` reads."""

    def __init__(self) -> None:
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        raise KeyError(key)

    def get(self, key, default=None):  # noqa: ANN001 - Mapping signature
        self.read.add(key)
        return default

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _settings_names() -> set[str]:
    env = _RecordingEnv()
    Settings.from_env(env)
    return {name for name in env.read if name.startswith("RATCHET_")}


def _docs() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _kind(kind: str) -> list[dict]:
    return [d for d in _docs() if d["kind"] == kind]


def _deployment(name: str) -> dict:
    (dep,) = [d for d in _kind("Deployment") if d["metadata"]["name"] == name]
    return dep


def _configmap() -> dict[str, str]:
    (cm,) = _kind("ConfigMap")
    return cm["data"]


def _containers(dep: dict) -> list[dict]:
    return dep["spec"]["template"]["spec"]["containers"]


def test_every_manifest_parses_and_kustomization_lists_them_all() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    for doc in _docs():
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()


def test_settings_recorder_sees_the_documented_names() -> None:
    names = _settings_names()
    for documented in (
        "RATCHET_KAFKA_BOOTSTRAP",
        "RATCHET_SCHEMA_REGISTRY_URL",
        "RATCHET_CASSANDRA_HOSTS",
        "RATCHET_KEYSPACE",
        "RATCHET_TOPIC_PREFIX",
    ):
        assert documented in names


def test_configmap_names_are_read_by_settings() -> None:
    unknown = set(_configmap()) - _settings_names()
    assert not unknown, f"ConfigMap keys ratchet.settings never reads: {sorted(unknown)}"


def test_configmap_values_are_accepted_by_settings() -> None:
    settings = Settings.from_env(_configmap())
    assert settings.partitions >= 1
    assert settings.api_host == "0.0.0.0"  # reachable from the Service, not loopback


@pytest.mark.parametrize("name", ["ratchet-worker", "ratchet-api"])
def test_containers_take_settings_from_the_configmap(name: str) -> None:
    known = _settings_names()
    for container in _containers(_deployment(name)):
        refs = [e["configMapRef"]["name"] for e in container.get("envFrom", [])]
        assert refs == ["ratchet-config"]
        for env in container.get("env", []):
            if env["name"].startswith("RATCHET_"):
                assert env["name"] in known, env["name"]


def test_api_probes_target_its_declared_port():
    for container in _containers(_deployment("ratchet-api")):
        ports = {p["name"] for p in container["ports"]} | {
            p["containerPort"] for p in container["ports"]
        }
        for probe in ("livenessProbe", "readinessProbe"):
            spec = container[probe]["httpGet"]
            assert spec["port"] in ports, f"{probe} on undeclared port {spec['port']}"
            assert spec["path"].startswith("/healthz")
            assert container[probe]["timeoutSeconds"] < container[probe]["periodSeconds"]


@pytest.mark.parametrize("name", ["ratchet-api", "ratchet-worker"])
def test_a_start_through_silent_cassandra_hosts_is_not_killed(name: str) -> None:
    """A first connect gives each contact point that accepts and never answers
    ``CONNECT_TIMEOUT_S`` (20 s), one after the other: with the configmap's hosts all
    silent but the last, the API's liveness probe (~35 s) killed the pod before it
    served, and again after each restart (session 53). A startup probe, the liveness
    check itself, holds liveness off for all of them and a margin for Kafka and the
    registry."""
    from services.cassandra_cluster import CONNECT_TIMEOUT_S

    (container,) = _containers(_deployment(name))
    startup, live = container["startupProbe"], container["livenessProbe"]
    check = {k: v for k, v in live.items() if k in ("httpGet", "exec")}
    assert {k: v for k, v in startup.items() if k in ("httpGet", "exec")} == check
    hosts = _configmap()["RATCHET_CASSANDRA_HOSTS"].split(",")
    window = (startup.get("initialDelaySeconds", 0)
              + startup["periodSeconds"] * startup["failureThreshold"])
    assert window >= CONNECT_TIMEOUT_S * len(hosts) + 30, (window, len(hosts))
    assert startup["timeoutSeconds"] < startup["periodSeconds"]


def test_worker_probes_read_the_health_files_the_worker_writes(tmp_path):
    """The worker has no HTTP port: it writes health files (streams/health.py) under
    RATCHET_HOME. The exec probes must read the same directory, and actually work."""
    import os
    import subprocess
    import sys

    from streams.health import Health, health_path

    (container,) = _containers(_deployment("ratchet-worker"))
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert env["RATCHET_HOME"] in mounts
    probes = {
        name: container[name]["exec"]["command"] for name in ("livenessProbe", "readinessProbe")
    }
    for command in probes.values():
        # The container's RATCHET_HOME, the one the worker writes to.
        assert command[:2] == ["python", "-c"] and "os.environ['RATCHET_HOME']" in command[2]

    def run(probe: str) -> int:
        probe_env = {**os.environ, "RATCHET_HOME": str(tmp_path)}
        return subprocess.run([sys.executable, "-c", probes[probe][2]], env=probe_env,
                              check=False).returncode

    assert run("livenessProbe") == 1 and run("readinessProbe") == 1  # no worker yet
    health = Health(health_path(tmp_path))
    health.write()
    assert run("livenessProbe") == 0 and run("readinessProbe") == 0
    health.retrying("ratchet.gateway-events[0]", "store down")
    assert run("livenessProbe") == 0 and run("readinessProbe") == 1  # degraded: not ready
    for probe in probes:
        assert container[probe]["timeoutSeconds"] < container[probe]["periodSeconds"]


@pytest.mark.parametrize("name", ["ratchet-worker", "ratchet-api"])
def test_resources_have_requests_within_limits(name: str) -> None:
    for container in _containers(_deployment(name)):
        res = container["resources"]
        for key in ("cpu", "memory"):
            assert _quantity(res["requests"][key]) <= _quantity(res["limits"][key])


def test_worker_replicas_do_not_exceed_partitions() -> None:
    replicas = _deployment("ratchet-worker")["spec"]["replicas"]
    partitions = Settings.from_env(_configmap()).partitions
    assert 1 <= replicas <= partitions


def test_deployments_run_their_ratchet_command() -> None:
    # The image's entrypoint is `ratchet` (tests/unit/test_image_definition.py).
    assert _containers(_deployment("ratchet-worker"))[0]["args"] == ["worker"]
    assert _containers(_deployment("ratchet-api"))[0]["args"] == ["api"]
    (job,) = _kind("Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][0] == "migrate"


def test_service_selects_the_api_pods_on_a_named_port() -> None:
    (svc,) = _kind("Service")
    api = _deployment("ratchet-api")
    assert svc["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    port_names = {p["name"] for c in _containers(api) for p in c["ports"]}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= port_names


def test_api_grace_period_outlasts_the_pause_and_the_wait_cap() -> None:
    """Terminating: the preStop pause (the Service stops sending first), then uvicorn's
    graceful shutdown, which outlasts the longest ``wait_ms`` request, all within the
    pod's grace period (else the kubelet kills waiting requests)."""
    from services.api.app import WAIT_MS_CAP
    from services.api.server import GRACEFUL_SHUTDOWN_S

    spec = _deployment("ratchet-api")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause_s = float(command[1])
    assert 2 <= pause_s <= 10
    assert GRACEFUL_SHUTDOWN_S * 1000 > WAIT_MS_CAP
    assert spec["terminationGracePeriodSeconds"] >= pause_s + GRACEFUL_SHUTDOWN_S + 1


@pytest.mark.parametrize("name", ["ratchet-api", "ratchet-worker"])
def test_a_disruption_budget_lets_one_pod_go_at_a_time(name: str) -> None:
    """A node drain evicts one pod of each Deployment at a time (one worker: one
    rebalance at a time) and never blocks for good (at least one may go)."""
    dep = _deployment(name)
    (pdb,) = [p for p in _kind("PodDisruptionBudget")
              if p["spec"]["selector"] == dep["spec"]["selector"]]
    replicas = dep["spec"]["replicas"]
    spec = pdb["spec"]
    allowed = (replicas - spec["minAvailable"] if "minAvailable" in spec
               else spec["maxUnavailable"])
    assert allowed == 1
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()


def test_api_memory_holds_its_history_cache_and_its_large_bodies() -> None:
    """The API's RSS is ~112 MiB before its verified-history cache fills (measured from
    the image, docs/operations.md); the cache may then grow to its configured bytes, and
    the large request bodies it handles at once (RATCHET_API_BODY_BUDGET_BYTES) cost
    ~2.5 times their bytes at their peak: eight 33 MB completions at once peaked at
    279 MB with the 64 MiB budget, 524 MB without one (session 25)."""
    settings = Settings.from_env(_configmap())
    idle = 112 * 2**20
    (container,) = _containers(_deployment("ratchet-api"))
    assert _quantity(container["resources"]["requests"]["memory"]) >= \
        idle + settings.api_history_cache_bytes
    assert _quantity(container["resources"]["limits"]["memory"]) >= \
        idle + settings.api_history_cache_bytes + 2.5 * settings.api_body_budget_bytes


def test_worker_memory_holds_a_backlog_of_the_largest_turns() -> None:
    """Measured (`ratchet bench memory --mib 9 --turns 100`, docs/decisions.md "Worker
    memory"): 568-595 MB peak with the lanes' default byte bound, 1 284-1 473 MB without it. The
    limit must hold the first, with its configured bound; 512 MiB did not."""
    lane_bytes = Settings.from_env(_configmap()).lane_max_bytes
    assert lane_bytes <= 16 * 2**20  # the bound the figure was measured with
    (container,) = _containers(_deployment("ratchet-worker"))
    assert _quantity(container["resources"]["limits"]["memory"]) >= 595e6 * 1.2


def test_worker_grace_period_covers_its_sigterm_drain() -> None:
    """On SIGTERM the worker gives the event in flight in each lane ``shutdown_grace_s``
    to finish (streams/app.py), then commits and leaves the group. The pod must allow
    that, with a margin for the commit and the leave, and not much more: a longer grace
    only delays a rollout (Recreate) when a worker hangs."""
    import inspect

    from streams.app import create_app

    drain_s = inspect.signature(create_app).parameters["shutdown_grace_s"].default
    grace_s = _deployment("ratchet-worker")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert drain_s + 5 <= grace_s <= drain_s + 15


def test_kustomize_pins_the_image_to_the_package_version() -> None:
    import tomllib

    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    version = tomllib.loads((K8S.parents[1] / "pyproject.toml").read_text())["project"]["version"]
    (image,) = kustomization["images"]
    assert image["newTag"] == version
    images = {c["image"] for d in _kind("Deployment") + _kind("Job")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {image["name"]}


_UNITS = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


def _quantity(value: str | int) -> float:
    text = str(value)
    for suffix, factor in _UNITS.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def test_the_migrate_job_can_be_replaced_for_the_next_release() -> None:
    """A Job's spec.template cannot change: the next release's `kubectl apply -k` (a new
    image tag) was refused for the migrate Job while the Deployments rolled on (found by
    an outside review of the deployment, session 25). The upgrade steps delete it first,
    and a finished Job removes itself."""
    (job,) = _kind("Job")
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    upgrading = (K8S.parents[1] / "docs" / "operations.md").read_text().split("## Upgrading", 1)[1]
    steps = upgrading.split("```bash", 1)[1].split("```", 1)[0]
    assert steps.index("kubectl -n ratchet delete job ratchet-migrate") \
        < steps.index("kubectl apply -k deploy/k8s") \
        < steps.index("wait --for=condition=complete job/ratchet-migrate")


# Kubernetes' back-off between a Job's retries: 10 s, doubling (capped at 6 min).
_JOB_BACKOFF_S = 10
# What one attempt of the migrate Job needs beside its lease wait: connect and apply
# every migration on a fresh keyspace (12 s on the shared 2-core node, session 48).
_MIGRATE_RUN_BUDGET_S = 100


def test_the_migrate_job_is_bounded_and_its_bounds_agree() -> None:
    """The Job ran ``ratchet migrate`` without ``--wait`` and without a deadline: behind a
    holder that renews its lease but never finishes (its main thread stuck) it waited for
    ever (session 47's review, left). Each attempt's wait is bounded now, outlasts a
    killed pod's lease (its TTL), every attempt ``backoffLimit`` allows fits in the
    deadline, the grace period covers the lease's release on SIGTERM, and the upgrade
    steps' ``kubectl wait`` outlasts the deadline (it sees the Job end either way)."""
    from infra.migrate import LEASE_TTL_S, RELEASE_TIMEOUT_S, RENEW_TIMEOUT_S

    (job,) = _kind("Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[0] == "migrate" and "--wait" in args, args
    wait_s = float(args[args.index("--wait") + 1])
    attempts = spec["backoffLimit"] + 1
    deadline = spec["activeDeadlineSeconds"]
    assert LEASE_TTL_S < wait_s < deadline <= 3600, (wait_s, deadline)
    assert attempts >= 2, "a transient failure (Cassandra restarting) is retried"
    backoffs = sum(_JOB_BACKOFF_S * 2 ** i for i in range(attempts - 1))
    assert attempts * (wait_s + _MIGRATE_RUN_BUDGET_S) + backoffs <= deadline, (
        attempts, wait_s, deadline)
    # SIGTERM mid-run first waits for the renewal thread (``_LeaseKeeper.__exit__`` joins
    # it: a renewal in flight takes up to RENEW_TIMEOUT_S), then releases: the 45 s of grace
    # were short of up to 60 s, the kill landing mid-release on a slow Cassandra (session 48's
    # review).
    assert pod["terminationGracePeriodSeconds"] > RENEW_TIMEOUT_S + RELEASE_TIMEOUT_S
    upgrading = (K8S.parents[1] / "docs" / "operations.md").read_text().split("## Upgrading", 1)[1]
    steps = upgrading.split("```bash", 1)[1].split("```", 1)[0]
    timeout = steps.split("wait --for=condition=complete job/ratchet-migrate --timeout=", 1)[1]
    minutes = int(timeout.split("m", 1)[0])
    assert minutes * 60 >= deadline, (minutes, deadline)
