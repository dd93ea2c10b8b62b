"""deploy/Dockerfile, deploy/build-image.sh and deploy/k8s describe ONE image.

Docker cannot run here, so the Dockerfile is checked by reading it: against the buildah
build (same lock, Python, Debian release, user, paths, env, entrypoint, ports, labels;
tests/image checks the built image's config against the Dockerfile too) and against the
manifests that run the image (user, volume, subcommands, ports, tag).
"""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import yaml

from ratchet.settings import Settings
from tests.image.dockerfile import BUILD_SCRIPT, REPO, parse_dockerfile, script_constants

K8S = REPO / "deploy" / "k8s"
DOCKERFILE = parse_dockerfile()
FINAL = DOCKERFILE.final
SCRIPT = script_constants()
SCRIPT_TEXT = BUILD_SCRIPT.read_text()
WORKLOADS = ["worker-deployment", "api-deployment", "migrate-job"]


def _pod(name: str) -> dict:
    return yaml.safe_load((K8S / f"{name}.yaml").read_text())["spec"]["template"]["spec"]


def _version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _script_values(flag: str) -> list[str]:
    """Values of one `buildah config` flag in the script, its variables substituted."""
    values = re.findall(rf"--{flag} (\"[^\"]*\"|'[^']*'|\S+)", SCRIPT_TEXT)
    subst = {**SCRIPT, "VERSION": _version()}
    return [re.sub(r"\$(\w+)", lambda m: subst.get(m.group(1), m.group(0)), v.strip("\"'"))
            for v in values]


def test_both_builds_install_the_one_lock_with_hashes_and_binary_wheels_only() -> None:
    (build,) = [s for s in DOCKERFILE.stages if s.name == "build"]
    runs = " ".join(build.all("RUN"))
    assert SCRIPT["LOCK"] == "deploy/requirements.lock"
    for text in (runs, SCRIPT_TEXT):
        assert "--require-hashes" in text and "--only-binary=:all:" in text
        assert re.search(r"--requirement \S*(requirements\.lock|\$LOCK)", text)
    # ratchet's own wheel goes in without dependencies: they are the locked ones.
    assert "--no-deps /build/dist/ratchet-*.whl" in runs
    assert "--no-deps /build/dist/ratchet-*.whl" in SCRIPT_TEXT


def test_ratchets_own_wheel_is_built_with_the_locked_hashed_backend() -> None:
    """Both builds made ratchet's wheel under pip's build isolation, which fetched the
    newest setuptools and wheel from the index with no hash, and ran them as root in
    the build (found by an outside review of the image, session 25). The backend is now
    pinned with hashes in deploy/build-requirements.lock, installed with
    --require-hashes, and the wheel built without isolation."""
    import tomllib

    from packaging.requirements import Requirement

    lock = (REPO / "deploy" / "build-requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n\s+--hash=sha256:[0-9a-f]{64}$",
                           lock, re.M))
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    for spec in requires:
        req = Requirement(spec)
        assert req.name in pins and req.specifier.contains(pins[req.name]), (spec, pins)
    (build,) = [s for s in DOCKERFILE.stages if s.name == "build"]
    runs = " ".join(build.all("RUN"))
    assert SCRIPT["BUILD_LOCK"] == "deploy/build-requirements.lock"
    for text, lock_ref in ((runs, "deploy/build-requirements.lock"),
                           (SCRIPT_TEXT, "/build/src/$BUILD_LOCK")):
        assert re.search(r"pip install [^&]*--require-hashes --only-binary=:all: \\?\s*"
                         rf"--requirement {re.escape(lock_ref)}", text), lock_ref
        wheel = re.search(r"pip wheel [^&]*", text).group(0)
        assert "--no-build-isolation" in wheel and "--no-deps" in wheel


def test_the_runtime_stage_installs_nothing_and_copies_only_the_venv_and_tini() -> None:
    assert len(DOCKERFILE.stages) == 2
    # Same Python in both stages: the venv's interpreter link stays valid.
    assert FINAL.base == DOCKERFILE.stages[0].base
    for run in FINAL.all("RUN"):
        assert not re.search(r"\b(pip|apt-get|apt|apk)\b", run), run
    assert FINAL.all("COPY") == [f"--from=build {SCRIPT['VENV']} {SCRIPT['VENV']}",
                                 "--from=build /usr/bin/tini /usr/bin/tini"]
    # Neither build keeps pip or setuptools in the venv.
    uninstall = "pip uninstall --yes pip setuptools"
    assert uninstall in " ".join(DOCKERFILE.stages[0].all("RUN"))
    assert "pip uninstall --quiet --yes pip setuptools" in SCRIPT_TEXT


def test_same_python_and_debian_release() -> None:
    base = DOCKERFILE.global_args["PYTHON_IMAGE"]
    assert base == f"python:3.11-slim-{SCRIPT['SUITE']}"
    assert "python3.11" in SCRIPT["BASE_PACKAGES"].split()


def test_same_user_paths_env_entrypoint_ports_and_labels() -> None:
    uid = SCRIPT["USER_ID"]
    assert FINAL.one("USER") == f"{uid}:{uid}" == _script_values("user")[0]
    assert f"--uid {uid}" in " ".join(FINAL.all("RUN"))
    assert FINAL.exec_form("VOLUME") == [SCRIPT["DATA"]] == _script_values("volume")
    assert FINAL.one("WORKDIR") == SCRIPT["DATA"] == _script_values("workingdir")[0]
    env = FINAL.env()
    assert env == dict(v.split("=", 1) for v in _script_values("env"))
    assert env["RATCHET_HOME"] == SCRIPT["DATA"]
    assert env["PATH"].split(":")[0] == f"{SCRIPT['VENV']}/bin"
    assert FINAL.exec_form("ENTRYPOINT") == json.loads(_script_values("entrypoint")[0])
    assert FINAL.exec_form("CMD") == json.loads(_script_values("cmd")[0])
    assert FINAL.one("EXPOSE").split() == _script_values("port")
    labels = dict(v.split("=", 1) for v in _script_values("label"))
    assert set(labels) == set(FINAL.labels())
    for key in ("version", "revision", "source"):
        assert f"org.opencontainers.image.{key}" in labels


def test_the_entrypoint_is_an_init_that_runs_ratchet_as_its_child() -> None:
    """``ratchet`` was the entrypoint, so PID 1 of its container: the kernel drops a
    signal to PID 1 whose disposition is the default, so a SIGTERM during the
    interpreter's start (before ratchet's first handler, ~0.1 s) was ignored and the pod
    killed at the end of its grace period (session 49, left). Debian's tini is PID 1 in
    both builds: it forwards the stop to ratchet (for which the default is death), passes
    its exit code on (migrate's 75, 130, 143) and reaps orphans."""
    assert FINAL.exec_form("ENTRYPOINT") == ["tini", "-s", "--", "ratchet"]
    assert json.loads(_script_values("entrypoint")[0]) == ["tini", "-s", "--", "ratchet"]
    # Debian's in both: installed in the Dockerfile's build stage and copied into the
    # runtime one (which installs nothing), and in the buildah base, not purged with the
    # build tools (autoremove keeps what was asked for by name).
    (build,) = [s for s in DOCKERFILE.stages if s.name == "build"]
    assert any(re.search(r"apt-get install [^&]*\btini\b", run) for run in build.all("RUN"))
    assert "--from=build /usr/bin/tini /usr/bin/tini" in FINAL.all("COPY")
    assert "tini" in SCRIPT["BASE_PACKAGES"].split()
    (purge,) = re.findall(r"apt-get purge[^\n]*\n[^\n]*", SCRIPT_TEXT)
    assert "tini" not in purge.split()


def test_tini_is_a_subreaper_where_it_is_not_pid_1() -> None:
    """Not PID 1 (``docker run --init``, a pod with ``shareProcessNamespace``, the image
    test's harness), tini without ``-s`` printed a three-line ``[WARN  tini ...]`` at
    every start, not JSON, into the API's JSON-lines log, and reaped no orphan; with it
    (as Debian's tini 0.19.0 shows: ``tini -- true`` warns, ``tini -s -- true`` does
    not) it registers as the child subreaper and says nothing; as PID 1 it changes
    nothing (session 50's review)."""
    for entrypoint in (FINAL.exec_form("ENTRYPOINT"),
                       json.loads(_script_values("entrypoint")[0])):
        assert entrypoint[0] == "tini" and "--" in entrypoint, entrypoint
        assert "-s" in entrypoint[1:entrypoint.index("--")], entrypoint


def test_version_label_defaults_to_the_package_version() -> None:
    # (kustomization.yaml's tag: tests/unit/test_k8s_manifests.py)
    assert DOCKERFILE.stage_args(FINAL)["VERSION"] == _version()


@pytest.mark.parametrize("name", WORKLOADS)
def test_pods_run_as_the_image_user_on_a_read_only_root(name: str) -> None:
    pod = _pod(name)
    uid = int(SCRIPT["USER_ID"])
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == security["runAsGroup"] == uid
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    # What the image writes must be a mounted volume: /tmp everywhere, RATCHET_HOME
    # (health files, Faust's data dir) for the worker, the one that writes there.
    volumes = {v["name"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts and set(mounts.values()) <= volumes
    if name == "worker-deployment":
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RATCHET_HOME"] == FINAL.env()["RATCHET_HOME"]
        assert env["RATCHET_HOME"] in mounts
        assert security["fsGroup"] == uid  # the emptyDir is writable by the user


@pytest.mark.parametrize("name", WORKLOADS)
def test_containers_run_ratchet_subcommands_through_the_entrypoint(name: str) -> None:
    from ratchet.cli import main

    (container,) = _pod(name)["containers"]
    assert "command" not in container  # keeps the image's `tini -s -- ratchet` entrypoint
    subcommand, *options = container["args"]
    assert subcommand in main.commands
    # Its options are the command's own (the migrate Job's `--wait`): parsed as the CLI does.
    main.commands[subcommand].make_context(subcommand, list(options))
    for probe in ("livenessProbe", "readinessProbe"):
        if "exec" in container.get(probe, {}):
            # Exec probes bypass the entrypoint: `python` must be the venv's, on PATH.
            assert container[probe]["exec"]["command"][0] == "python"
            assert FINAL.env()["PATH"].startswith(SCRIPT["VENV"] + "/bin:")


def test_container_ports_are_the_exposed_ports_and_the_settings_defaults() -> None:
    exposed = {int(p.split("/")[0]) for p in FINAL.one("EXPOSE").split()}
    defaults = Settings()
    api_ports = {p["containerPort"] for p in _pod("api-deployment")["containers"][0]["ports"]}
    worker_ports = {p["containerPort"] for p in _pod("worker-deployment")["containers"][0]["ports"]}
    assert api_ports == {defaults.api_port} and worker_ports == {defaults.worker_metrics_port}
    assert exposed == api_ports | worker_ports


def test_dockerignore_lets_in_what_the_wheel_and_the_lock_need() -> None:
    allowed = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    readme = pyproject["project"]["readme"]
    assert packages | {"pyproject.toml", readme, SCRIPT["LOCK"], SCRIPT["BUILD_LOCK"]} <= allowed
    assert "*" in (REPO / ".dockerignore").read_text().splitlines()  # everything else stays out
