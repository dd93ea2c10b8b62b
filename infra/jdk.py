"""Find a Java 17 runtime.

Cassandra 5.0 runs on Java 11 or 17 only (JDK 21+ is refused, 24+ fails at start),
so every server is launched with an explicit Java 17 instead of whatever ``java``
happens to be first on ``PATH``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path


class JavaNotFound(RuntimeError):
    """No Java 17 runtime was found."""


def _major(java_home: Path) -> int | None:
    release = java_home / "release"
    if release.is_file():
        m = re.search(r'JAVA_VERSION="(\d+)', release.read_text(errors="replace"))
        if m:
            return int(m.group(1))
    java = java_home / "bin" / "java"
    if not java.exists():
        return None
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)', out)
    return int(m.group(1)) if m else None


@lru_cache(maxsize=1)
def java17_home() -> Path:
    """Return JAVA_HOME of a Java 17: ``$JAVA_HOME`` if it is 17, else /usr/lib/jvm/*17*."""
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/jvm/*17*"))]
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent.parent)
    for home in candidates:
        if (home / "bin" / "java").exists() and _major(home) == 17:
            return home.resolve()
    raise JavaNotFound(
        "Java 17 is required (Cassandra 5.0 refuses 21+): install openjdk-17-jdk-headless "
        "or point JAVA_HOME at a Java 17. Looked at: " + ", ".join(map(str, candidates))
    )


def java17() -> str:
    return str(java17_home() / "bin" / "java")
