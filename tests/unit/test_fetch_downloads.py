"""``infra/fetch.py`` with a stand-in ``mvn`` on PATH (no network): what Maven is asked
to verify, and what a damaged archive leaves behind. (An operator's review of the
launcher, session 43.)"""

from __future__ import annotations

import os
import stat
import zipfile

import pytest

from infra import fetch

# A stand-in for mvn: records its arguments, then does what the goal would.
FAKE_MVN = r"""#!/bin/sh
echo "$@" >> "$FAKE_MVN_ARGS"
for arg in "$@"; do
  case "$arg" in
    -DoutputDirectory=*) out="${arg#-DoutputDirectory=}"; mkdir -p "$out"; echo jar > "$out/a-1.jar" ;;
  esac
done
exit 0
"""


@pytest.fixture
def fake_mvn(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(mvn.stat().st_mode | stat.S_IEXEC)
    args = tmp_path / "mvn-args"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MVN_ARGS", str(args))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # Maven's local repository
    monkeypatch.delenv("MAVEN_OPTS", raising=False)
    return args


def test_maven_fails_on_a_checksum_mismatch_instead_of_warning(tmp_path, fake_mvn):
    """Maven's default checksum policy is "warn": a download whose checksum does not
    match Central's was kept and run. ``--strict-checksums`` makes it a failure."""
    fetch.fetch_jars(tmp_path / "dist" / "kafka-1", ["g:a:1"])
    _archive(tmp_path).write_bytes(_zip_bytes(tmp_path))
    fetch.fetch_zip(tmp_path / "dist" / "registry-1", "g:app:1:zip:all")
    calls = fake_mvn.read_text().splitlines()
    assert len(calls) == 2
    assert all("--strict-checksums" in call.split() for call in calls), calls


def test_a_damaged_archive_is_a_fetch_error_removed_from_the_local_repository(
        tmp_path, fake_mvn):
    """A damaged archive in ~/.m2 (a download cut short, or kept by the "warn" policy)
    failed each later run the same way, with zipfile's "File is not a zip file" and no
    name: Maven finds it there and never downloads it again. It is now a FetchError
    naming it, and it is removed so that the next run downloads it again."""
    archive = _archive(tmp_path)
    archive.write_bytes(_zip_bytes(tmp_path)[:40])
    dest = tmp_path / "dist" / "registry-1"
    with pytest.raises(fetch.FetchError, match=str(archive)):
        fetch.fetch_zip(dest, "g:app:1:zip:all")
    assert not archive.exists()
    assert not (dest / ".complete").exists()


def _archive(tmp_path):
    path = tmp_path / "user" / ".m2" / "repository" / "g" / "app" / "1" / "app-1-all.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _zip_bytes(tmp_path) -> bytes:
    path = tmp_path / "built.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("app/runner.jar", b"x" * 1000)
    return path.read_bytes()
