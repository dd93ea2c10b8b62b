"""Run the built image without a container runtime: unpack its OCI archive, then chroot.

What a runtime would do for ``docker run`` / a Kubernetes container, done by hand:

- the root filesystem is READ-ONLY; only the image's volumes (bound to host directories
  here, emptyDirs in deploy/k8s) and ``/tmp`` (a tmpfs; an emptyDir in deploy/k8s) are
  writable, so a write anywhere else fails here as it would there;
- ``/proc`` and ``/dev`` are mounted; the network namespace is the host's, so the
  servers on 127.0.0.1 are reachable;
- the process runs as the image's ``User``, in its ``WorkingDir``, with exactly its
  ``Env`` (plus the overrides given) and its ``Entrypoint`` followed by the arguments.

The mounts are made in a private mount namespace (``unshare --mount``), so none outlives
the process. ``unshare``, ``sh``, ``chroot`` and ``env`` each exec the next, so the pid
of the ``Popen`` is the pid of the entrypoint's first program: tini (since session 50),
which forwards signals to ``ratchet``, its one child (``child_pid``: the health file is
named after it). It is not PID 1 here (no pid namespace): ``-s`` makes it the child
subreaper, so it reaps orphans here too and prints no warning (session 50's review).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class OciImage:
    archive: Path
    root: Path
    manifest_digest: str
    config: dict  # the image config's "config" object: User, Env, Entrypoint, ...

    @classmethod
    def unpack(cls, archive: Path, dest: Path) -> OciImage:
        with tarfile.open(archive) as tar:
            index = json.load(tar.extractfile("index.json"))
            (entry,) = index["manifests"]
            manifest = json.load(tar.extractfile(_blob(entry["digest"])))
            image_config = json.load(tar.extractfile(_blob(manifest["config"]["digest"])))
            # One layer (deploy/build-image.sh commits one): no whiteouts to apply.
            (layer,) = manifest["layers"]
            root = dest / "rootfs"
            root.mkdir(parents=True)
            # System tar as root: owners, modes and device nodes exactly as in the layer.
            untar = subprocess.Popen(["tar", "--numeric-owner", "-xzf", "-", "-C", str(root)],
                                     stdin=subprocess.PIPE)
            with untar.stdin:
                shutil.copyfileobj(tar.extractfile(_blob(layer["digest"])), untar.stdin)
            if untar.wait() != 0:
                raise RuntimeError(f"unpacking the layer of {archive} failed")
        return cls(archive, root, entry["digest"], image_config["config"])

    @property
    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config["Env"])

    @property
    def volumes(self) -> list[str]:
        return sorted(self.config.get("Volumes") or {})

    def command(self, args: list[str], *, env: dict[str, str] | None = None,
                volumes: dict[str, Path], entrypoint: bool = True) -> list[str]:
        """argv that runs ``Entrypoint + args`` (or ``args`` alone, as Kubernetes runs
        an exec probe) in the image; ``volumes`` maps each image volume to a host dir."""
        assert set(volumes) == set(self.volumes), (sorted(volumes), self.volumes)
        root = shlex.quote(str(self.root))
        mounts = [
            f"mount --bind {root} {root}",
            f"mount -o remount,bind,ro {root}",
            f"mount -t proc proc {root}/proc",
            f"mount --rbind /dev {root}/dev",
            f"mount -t tmpfs -o mode=1777,size=64m tmpfs {root}/tmp",
            *(f"mount --bind {shlex.quote(str(host))} {root}{shlex.quote(path)}"
              for path, host in volumes.items()),
        ]
        full_env = {**self.env, **(env or {})}
        argv = [*(self.config["Entrypoint"] if entrypoint else []), *args]
        run = ["chroot", f"--userspec={self.config['User']}", str(self.root),
               "/usr/bin/env", "-i", "-C", self.config["WorkingDir"],
               *(f"{k}={v}" for k, v in full_env.items()), *argv]
        script = " && ".join([*mounts, "exec " + shlex.join(run)])
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", script]


def _blob(digest: str) -> str:
    algorithm, hex_digest = digest.split(":")
    return f"blobs/{algorithm}/{hex_digest}"


def child_pid(pid: int, timeout_s: float = 30.0) -> int:
    """The one child of ``pid`` (tini's: ``ratchet``), once it has started."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            (child,) = children
            return int(child)
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} started no child in {timeout_s:.0f}s")
