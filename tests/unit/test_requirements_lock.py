"""deploy/requirements.lock, the one lock both image builds install, covers pyproject.toml.

The builds install it with ``--require-hashes``, which makes pip refuse a dependency the
lock lacks; this test says so earlier, and without a network: every runtime dependency
of pyproject.toml (with its extras, and what those pull in) is pinned, at a version its
specifier accepts, with hashes, and no test extra slipped in.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.image.dockerfile import LOCK, REPO

# The image's platform: markers are evaluated for it, not for the test's machine.
IMAGE_ENV = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
             "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython"}


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: tuple[str, ...]


def _pins() -> dict[str, Pin]:
    text = re.sub(r"\\\n", " ", LOCK.read_text())
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        spec, *options = line.split(" --hash=")
        req = Requirement(spec)
        (specifier,) = req.specifier
        assert specifier.operator == "==", f"not pinned: {line[:80]}"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{name} pinned twice"
        pins[name] = Pin(specifier.version, tuple(o.strip() for o in options))
    return pins


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _applies(req: Requirement, extras: frozenset[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**IMAGE_ENV, "extra": e}) for e in extras | {""})


def _check(req: Requirement, pins: dict[str, Pin]) -> str | None:
    pin = pins.get(canonicalize_name(req.name))
    if pin is None:
        return f"{req} is not in the lock"
    if not req.specifier.contains(pin.version, prereleases=True):
        return f"{req} does not accept the locked {pin.version}"
    return None


def test_every_line_is_pinned_with_sha256_hashes() -> None:
    pins = _pins()
    assert len(pins) > 20
    for name, pin in pins.items():
        assert pin.hashes, f"{name} has no hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes), name


def test_every_runtime_dependency_of_pyproject_is_locked() -> None:
    pins = _pins()
    problems = [p for dep in _project()["dependencies"] if (p := _check(Requirement(dep), pins))]
    assert not problems, "regenerate the lock (docs/decisions.md):\n" + "\n".join(problems)


def test_what_the_dependencies_pull_in_is_locked_too() -> None:
    """The closure, from the installed packages' metadata where the installed version is
    the locked one (their requirements are then the locked release's). A package
    installed at another version is not walked: pip's --require-hashes in the builds
    still refuses anything missing."""
    pins = _pins()
    todo = [Requirement(dep) for dep in _project()["dependencies"]]
    seen: set[tuple[str, frozenset[str]]] = set()
    problems, walked = [], 0
    while todo:
        req = todo.pop()
        name, extras = canonicalize_name(req.name), frozenset(req.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        if problem := _check(req, pins):
            problems.append(problem)
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version != pins[name].version:
            continue
        walked += 1
        todo += [r for r in map(Requirement, dist.requires or []) if _applies(r, extras)]
    assert not problems, "\n".join(problems)
    assert walked  # at least the packages installed at their locked versions were walked


def test_no_test_extra_is_in_the_lock() -> None:
    test_only = {canonicalize_name(Requirement(r).name)
                 for r in _project()["optional-dependencies"]["test"]}
    assert not test_only & set(_pins())
    header = LOCK.read_text().splitlines()[:3]
    assert any("--generate-hashes" in line and "pyproject.toml" in line for line in header)
    assert not any("--extra" in line or "--all-extras" in line for line in header)
