"""Read deploy/Dockerfile and deploy/build-image.sh well enough to compare what they state.

Not a general Dockerfile parser: it handles what deploy/Dockerfile uses (continuation
lines, comments, ``KEY=VALUE`` lists, JSON arrays) and fails loudly on anything else, so a
change to the Dockerfile's form breaks the test instead of being misread.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
BUILD_SCRIPT = REPO / "deploy" / "build-image.sh"
LOCK = REPO / "deploy" / "requirements.lock"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def one(self, keyword: str) -> str:
        (args,) = self.all(keyword)
        return args

    def env(self) -> dict[str, str]:
        return _pairs(self.all("ENV"))

    def labels(self) -> dict[str, str]:
        return _pairs(self.all("LABEL"))

    def exec_form(self, keyword: str) -> list[str]:
        value = json.loads(self.one(keyword))
        assert isinstance(value, list), f"{keyword} must use the JSON (exec) form"
        return value


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_args(self, stage: Stage) -> dict[str, str]:
        return _pairs(stage.all("ARG"))


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, args = line.strip().partition(" ")
            out.append((keyword.upper(), " ".join(args.split())))
    return out


def _pairs(values: list[str]) -> dict[str, str]:
    """``KEY=VALUE KEY2="V 2"`` lists (ENV, LABEL, ARG) -> dict; a bare ARG maps to ''."""
    out = {}
    for value in values:
        for word in shlex.split(value):
            key, sep, val = word.partition("=")
            out[key] = val if sep else ""
    return out


def parse_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, args in _instructions(path.read_text()):
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"unexpected FROM {args!r}"
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], words[0])
            stages.append(Stage(base=base, name=name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            global_args.update(_pairs([args]))
        else:
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(global_args=global_args, stages=stages)


def script_constants(path: Path = BUILD_SCRIPT) -> dict[str, str]:
    """The ``NAME=value`` assignments at the top level of the build script."""
    out = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Z_]+)=(\S+|\"[^\"]*\")(\s+#.*)?$", line)
        if match:
            out[match.group(1)] = match.group(2).strip('"')
    return out
