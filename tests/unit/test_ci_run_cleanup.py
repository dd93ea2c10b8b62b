"""`.ci/run` stops only the servers it started (session 43), even when it fails before
it has asked which servers already serve.

A copy of the script runs in a temporary directory where every command it calls is a
stand-in (``PATH`` holds the stand-ins first: Python, pip, npm, ruff, apt-get, the tools it
looks for, and ``ratchet``, which records its arguments and calls the servers named
in ``CI_SERVING`` healthy): nothing is installed, started or stopped. Lint fails (``ruff check`` exits
1), the run's own failure before any server starts: the servers an exported
``RATCHET_HOME`` already served must be left running (before the fix, the run stopped
all three: ``ratchet infra down kafka cassandra registry``)."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RATCHET = """#!/bin/bash
echo "$*" >> "$CI_STUB_LOG"
if [ "$1 $2" = "infra status" ]; then
  for server in $CI_SERVING; do printf '%s healthy\\n' "$server"; done
fi
exit 0
"""

PYTHON = f"""#!/bin/bash
# The venv is made of stand-ins; anything else is the real interpreter.
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  printf 'PATH="%s/bin:$PATH"\\nexport PATH\\n' "$PWD/$3" > "$3/bin/activate"
  cp "$CI_STUBS/ratchet" "$3/bin/ratchet"
  exit 0
fi
exec {sys.executable} "$@"
"""


def _stub(directory: Path, name: str, text: str) -> None:
    path = directory / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run(tmp_path: Path, serving: str, lint_fails: bool) -> tuple[int, list[str], str]:
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "run", clone / ".ci" / "run")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _stub(stubs, "ratchet", RATCHET)
    for name in ("python3.13", "python3.12", "python3.11", "python3"):
        _stub(stubs, name, PYTHON)
    for name in ("pip", "npm", "apt-get", "mvn", "gcc", "debootstrap", "buildah", "pytest"):
        _stub(stubs, name, "#!/bin/bash\nexit 0\n")
    _stub(stubs, "ruff", f"#!/bin/bash\nexit {int(lint_fails)}\n")
    log = tmp_path / "ratchet-calls.log"
    log.touch()
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "RATCHET_HOME": str(tmp_path / "home-already-serving"),
        "CI_STUBS": str(stubs),
        "CI_STUB_LOG": str(log),
        "CI_SERVING": serving,
    }
    done = subprocess.run(["bash", str(clone / ".ci" / "run")], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=120)
    downs = [call for call in log.read_text().splitlines() if call.startswith("infra down")]
    return done.returncode, downs, done.stdout + done.stderr


def test_a_run_failing_before_it_asked_what_serves_stops_no_server(tmp_path):
    rc, downs, out = _run(tmp_path, "kafka cassandra registry", lint_fails=True)
    assert rc == 1, out  # the lint failure
    assert downs == [], f"servers this run never started were stopped: {downs}\n{out}"


def test_a_run_stops_the_servers_it_started_and_only_those(tmp_path):
    rc, downs, out = _run(tmp_path, "kafka", lint_fails=False)
    assert rc == 0, out
    assert downs == ["infra down cassandra registry"], out
