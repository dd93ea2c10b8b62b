"""docs/architecture.md's map, held to the tree: a newcomer finds every module there, and
every path it names exists. Sessions 45 and 46 split three facades into parts and the map
named none of eleven new modules (streams/parking.py, services/api/flights.py, ...):
nothing checked it. A module that is added, moved or removed fails here until the map
says so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
PACKAGES = ("ratchet", "streams", "services", "schemas", "infra")


def _is_marker(path: Path) -> bool:
    """A package's ``__init__.py`` that defines nothing (empty, a docstring, a version)
    is no module of its own to look for."""
    if path.name != "__init__.py":
        return False
    tree = ast.parse(path.read_text(), str(path))
    return not any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                   for node in ast.walk(tree))


def modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in (".py", ".c") or "__pycache__" in path.parts:
                continue
            if not _is_marker(path):
                found.append(path.relative_to(ROOT).as_posix())
    return found


def named_paths(text: str) -> set[str]:
    """Every ``path`` in backticks that is a path of the repository (a folder of it first)."""
    tops = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    return {m for m in re.findall(r"`([\w./-]+)`", text) if m.split("/")[0] in tops and "/" in m}


def the_map(text: str) -> str:
    """The section "The map, module by module", up to the next section: the flows above
    it name modules too, but a module must have its own line here."""
    return text.split("\n## The map, module by module\n", 1)[1].split("\n## ", 1)[0]


def unnamed(text: str) -> list[str]:
    named = named_paths(the_map(text))
    return [module for module in modules() if module not in named]


def test_every_module_is_on_the_map():
    assert unnamed(MAP.read_text()) == []


def test_every_path_on_the_map_exists():
    assert sorted(p for p in named_paths(MAP.read_text()) if not (ROOT / p).exists()) == []


def test_a_module_left_off_the_map_is_found():
    """The check sees a missing line: the map without streams/parking.py's line names
    it, though the turn's flow above the map still mentions the module."""
    text = MAP.read_text()
    line = next(x for x in text.splitlines() if x.lstrip().startswith("- `streams/parking.py`"))
    without = text.replace(line + "\n", "")
    assert "`streams/parking.py`" in without.split("\n## The map", 1)[0]
    assert unnamed(without) == ["streams/parking.py"]
    assert "streams/processor.py" in modules() and "streams/__init__.py" not in modules()
