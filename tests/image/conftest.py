"""The container image, built once per session by deploy/build-image.sh and unpacked.

Building needs root (debootstrap, chroot, buildah; the script installs the Debian tools
when they are missing) and Debian's and PyPI's package registries. Without root the
tests FAIL when ``CI`` is true and are skipped otherwise, like the service fixtures.
``RATCHET_IMAGE_ARCHIVE=<path to ratchet-<version>.oci.tar>`` smoke-tests an archive
already built instead of building one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.image.dockerfile import BUILD_SCRIPT, REPO
from tests.image.rootfs import OciImage
from tests.services import in_ci

# The build (cold: debootstrap + downloads, about 5 minutes on 2 busy cores) runs inside
# the first test's timeout.
BUILD_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/image/" in str(item.fspath):
            item.add_marker(pytest.mark.image)
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 600))


def _missing_prerequisites() -> list[str]:
    missing = []
    if not sys.platform.startswith("linux"):
        missing.append("Linux")
    if os.geteuid() != 0:
        missing.append("root")
    missing += [tool for tool in ("unshare", "chroot", "mount", "tar", "bash")
                if shutil.which(tool) is None]
    if shutil.which("debootstrap") is None and shutil.which("apt-get") is None:
        missing.append("debootstrap (or apt-get to install it)")
    return missing


@pytest.fixture(scope="session")
def image_archive(tmp_path_factory) -> Path:
    if prebuilt := os.environ.get("RATCHET_IMAGE_ARCHIVE"):
        return Path(prebuilt)
    if missing := _missing_prerequisites():
        msg = f"building the image needs {', '.join(missing)}"
        if in_ci():
            pytest.fail(msg, pytrace=False)
        pytest.skip(f"{msg} (set CI=true to make this a failure)")
    out = tmp_path_factory.mktemp("image")
    log = out / "build.log"
    started = time.monotonic()
    with log.open("wb") as sink:
        proc = subprocess.run(["bash", str(BUILD_SCRIPT), str(out)], cwd=REPO, stdout=sink,
                              stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT_S, check=False)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    assert proc.returncode == 0, f"deploy/build-image.sh failed ({proc.returncode}):\n{tail}"
    print(f"\nimage built in {time.monotonic() - started:.0f}s:\n{tail}")
    (archive,) = out.glob("ratchet-*.oci.tar")
    return archive


@pytest.fixture(scope="session")
def image(image_archive, tmp_path_factory) -> OciImage:
    return OciImage.unpack(image_archive, tmp_path_factory.mktemp("image-root"))
