"""docs/architecture.md "Where things live": layers import only downward. The table said
so and nothing checked it (an outside audit of the docs, session 40, found two layers
importing more than it said). Each rule names a layer and what it may import of ours;
a new import across a layer fails here and is either moved or written into the table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("schemas", "ratchet", "services", "streams", "infra")

# layer (a package or module path) -> the modules of ours it may import (prefixes).
MAY_IMPORT = {
    "schemas": ("schemas", "ratchet.speedups"),
    "ratchet/domain": ("ratchet.domain", "schemas", "ratchet.speedups"),
    "ratchet/speedups.py": ("ratchet._speedups", "ratchet.settings"),
    "ratchet/settings.py": (),
    "ratchet/lru.py": (),
    "services/store": ("services.store", "ratchet.domain", "ratchet.lru", "ratchet.settings",
                       "ratchet.speedups", "schemas", "services.cassandra_cluster",
                       "services.cassandra_loop"),
    "services/ledger": ("services.ledger", "ratchet.domain", "schemas",
                        "services.cassandra_cluster", "services.cassandra_loop"),
    # The library gateways embed: no store, ledger, worker or API of ours.
    "services/gateway": ("services.gateway", "ratchet.domain", "ratchet.settings", "schemas"),
}

# Entry points nothing below them imports.
ENTRY_POINTS = ("ratchet.cli", "ratchet.bench", "ratchet.chaos", "services.demo")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            # ``from ratchet import speedups``: the module is ratchet.speedups.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in OURS}


def _files(layer: str) -> list[Path]:
    path = ROOT / layer
    return [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))


def _allowed(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _crossings(layer: str, prefixes: tuple[str, ...]) -> list[str]:
    bad = []
    for path in _files(layer):
        for name in sorted(_imports(path)):
            # ``from ratchet import speedups`` also yields the bare package ``ratchet``.
            if name in OURS:
                continue
            if not _allowed(name, prefixes):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_a_layer_imports_only_what_the_table_allows(layer):
    assert _files(layer), f"{layer} names no file"
    assert _crossings(layer, MAY_IMPORT[layer]) == []


def test_no_layer_below_the_entry_points_imports_them():
    bad = []
    for top in ("schemas", "ratchet/domain", "services/store", "services/ledger",
                "services/gateway", "services/api", "streams", "infra"):
        for path in _files(top):
            bad.extend(f"{path.relative_to(ROOT)} imports {name}"
                       for name in sorted(_imports(path)) if _allowed(name, ENTRY_POINTS))
    assert bad == []


def test_a_crossing_is_found():
    """The walk sees ``from X import Y`` as the module X.Y: the rule for ``schemas`` is
    broken by a file that imports the store."""
    assert _allowed("services.store.base", ("services.store",))
    assert not _allowed("services.storefront", ("services.store",))
    imports = _imports(ROOT / "ratchet" / "domain" / "history.py")
    assert "ratchet.speedups" in imports
    assert _crossings("ratchet/domain", ("ratchet.domain", "schemas")) != []
