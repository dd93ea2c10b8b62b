"""Load the ``.avsc`` files (the source of truth) once, and hand out self-contained schemas.

Shared named types (``Item``, ``Fingerprint``, ...) live in their own file and are
referenced by FULL name (``"io.ratchet.Item"``) from the event records. The registry
gets each event schema *inlined*: every named type is defined at its first use and
referenced by name afterwards, which is what the Avro spec requires and what every
registry accepts. We chose inlining over registry schema references because
references make every consumer resolve a graph of subjects at read time (and
Apicurio's ccompat layer and confluent-kafka's Python client disagree on the details),
while an inlined schema is one self-describing document per schema id.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import fastavro

NAMESPACE = "io.ratchet"
SCHEMA_DIR = Path(__file__).resolve().parent
V1_DIR = SCHEMA_DIR / "v1"

# Records that travel on a topic on their own (one registry subject each).
TOP_LEVEL_RECORDS = (
    "TurnCompleted",
    "ToolEffect",
    "TurnCancelled",
    "CheckpointPromoted",
    "PromotionRejected",
    "EffectOrphaned",
    "DeadLetter",
)
# The three record types allowed on ``<prefix>gateway-events``.
GATEWAY_EVENT_RECORDS = ("TurnCompleted", "ToolEffect", "TurnCancelled")

_NAMED_KINDS = frozenset({"record", "enum", "fixed"})
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def full_name(name: str) -> str:
    """``"Item"`` -> ``"io.ratchet.Item"``; full names pass through."""
    return name if "." in name else f"{NAMESPACE}.{name}"


@cache
def definitions(directory: Path = SCHEMA_DIR) -> Mapping[str, dict[str, Any]]:
    """Every named type defined in ``directory``'s ``.avsc`` files, by full name.

    Types defined inside another type (e.g. the ``TurnStatus`` enum inside
    ``TurnCompleted``) are indexed too, so any of them can be inlined on demand.
    """
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.avsc")):
        _collect(json.loads(path.read_text(encoding="utf-8")), found)
    return found


def _collect(schema: Any, found: dict[str, dict[str, Any]]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _collect(branch, found)
    elif isinstance(schema, dict):
        if schema.get("type") in _NAMED_KINDS:
            found[full_name_of(schema)] = schema
        for field in schema.get("fields", ()):
            _collect(field["type"], found)
        for key in ("items", "values"):
            if key in schema:
                _collect(schema[key], found)
        if isinstance(schema.get("type"), dict | list):
            _collect(schema["type"], found)


def full_name_of(named: Mapping[str, Any]) -> str:
    name = named["name"]
    if "." in name:
        return name
    return f"{named.get('namespace', NAMESPACE)}.{name}"


@cache
def inlined(name: str, directory: Path = SCHEMA_DIR) -> dict[str, Any]:
    """A self-contained schema for ``name``: each named type defined once, at first use.

    Callers must not mutate the result (it is cached); use ``json.dumps`` or copy it.
    """
    known = definitions(directory)
    return _inline(known[full_name(name)], known, set())


def _inline(schema: Any, known: Mapping[str, dict[str, Any]], defined: set[str]) -> Any:
    if isinstance(schema, str):
        if schema in _PRIMITIVES or schema not in known:
            return schema
        if schema in defined:
            return schema
        return _inline(known[schema], known, defined)
    if isinstance(schema, list):
        return [_inline(branch, known, defined) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    out = copy.copy(schema)
    if schema.get("type") in _NAMED_KINDS:
        defined.add(full_name_of(schema))
    if "fields" in schema:
        out["fields"] = [
            {**field, "type": _inline(field["type"], known, defined)} for field in schema["fields"]
        ]
    for key in ("items", "values"):
        if key in schema:
            out[key] = _inline(schema[key], known, defined)
    if isinstance(schema.get("type"), dict | list | str) and schema.get("type") not in _NAMED_KINDS:
        kind = schema["type"]
        if not (isinstance(kind, str) and kind in _PRIMITIVES | {"array", "map"}):
            out["type"] = _inline(kind, known, defined)
    return out


@cache
def schema_text(name: str, directory: Path = SCHEMA_DIR) -> str:
    """The inlined schema as the JSON text we register (stable: same text, same id)."""
    return json.dumps(inlined(name, directory), separators=(",", ":"))


@cache
def parsed(name: str, directory: Path = SCHEMA_DIR) -> Any:
    """The fastavro-parsed schema of ``name``, parsed once per process."""
    return fastavro.parse_schema(copy.deepcopy(inlined(name, directory)))
