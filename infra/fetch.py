"""Download the servers from Maven Central into ``<home>/dist`` with Maven itself.

Each server is a set of Maven coordinates. A tiny generated pom lists them and
``mvn dependency:copy-dependencies`` copies every jar (transitively) into one folder;
a marker file written last makes the download idempotent and crash-safe.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from infra.jdk import java17_home


class FetchError(RuntimeError):
    """Maven could not download a server."""


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>ratchet.infra</groupId>
  <artifactId>fetch-{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""

_DEP = """    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"""


def _mvn(args: list[str], cwd: Path, log: Path) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise FetchError("Maven (mvn) is not on PATH: install maven (apt-get install maven)")
    env = dict(os.environ, JAVA_HOME=str(java17_home()))
    with log.open("w") as out:
        # --strict-checksums: Maven's default policy only warns when a download's
        # checksum differs from the repository's, and keeps the file.
        rc = subprocess.run([mvn, "-B", "-q", "--strict-checksums", *args], cwd=cwd, env=env,
                            stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise FetchError(f"mvn {' '.join(args)} failed with exit code {rc} (log {log}):\n{tail}")


def fetch_jars(dest: Path, coordinates: list[str]) -> Path:
    """Copy ``group:artifact:version`` coordinates and their dependencies into ``dest``."""
    marker = dest / ".complete"
    if marker.exists():
        return dest
    work = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    deps = "\n".join(_DEP.format(g=g, a=a, v=v) for g, a, v in (c.split(":") for c in coordinates))
    (work / "pom.xml").write_text(_POM.format(name=dest.name, deps=deps))
    _mvn(["dependency:copy-dependencies", "-DincludeScope=runtime",
          f"-DoutputDirectory={work / 'lib'}"], work, work / "mvn.log")
    shutil.rmtree(dest, ignore_errors=True)
    work.rename(dest)
    marker.write_text("\n".join(coordinates) + "\n")
    return dest


def _local_repo(work: Path) -> Path:
    """Maven's local repository: ~/.m2/repository unless settings.xml says otherwise."""
    default = Path.home() / ".m2" / "repository"
    settings_xml = Path.home() / ".m2" / "settings.xml"
    if not settings_xml.exists() and "maven.repo.local" not in os.environ.get("MAVEN_OPTS", ""):
        return default
    out = work / "local-repo.txt"
    _mvn(["help:evaluate", "-Dexpression=settings.localRepository", f"-Doutput={out}"], work,
         work / "mvn-help.log")
    return Path(out.read_text().strip())


def fetch_zip(dest: Path, coordinate: str) -> Path:
    """Download one ``group:artifact:version:zip:classifier`` archive and unpack it in ``dest``."""
    marker = dest / ".complete"
    if marker.exists():
        return dest
    work = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    g, a, v, ext, classifier = coordinate.split(":")
    # dependency:copy would read the artifact's parent pom, which Apicurio does not publish;
    # dependency:get without transitive resolution only needs the archive itself.
    _mvn(["dependency:get", f"-Dartifact={g}:{a}:{v}:{ext}:{classifier}", "-Dtransitive=false"],
         work, work / "mvn.log")
    archive = _local_repo(work) / g.replace(".", "/") / a / v / f"{a}-{v}-{classifier}.{ext}"
    if not archive.is_file():
        raise FetchError(f"mvn reported success but {archive} does not exist")
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(work / "app")  # checks each member's CRC as it goes
    except (zipfile.BadZipFile, EOFError) as exc:
        # Maven would find it in its repository and never download it again: every
        # later run failed the same way (an operator's review, session 43).
        archive.unlink(missing_ok=True)
        raise FetchError(f"{archive} is damaged ({type(exc).__name__}: {exc}); removed "
                         "it, so the next run downloads it again") from None
    shutil.rmtree(dest, ignore_errors=True)
    work.rename(dest)
    marker.write_text(coordinate + "\n")
    return dest
