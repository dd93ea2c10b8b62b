"""Canonical JSON: the one byte encoding every digest in ratchet is computed over.

Sorted keys, no whitespace, explicit nulls, UTF-8 (not ASCII-escaped), no NaN/Infinity.
Two producers that mean the same JSON value get the same bytes, so the same digest,
whatever key order or formatting their inputs had.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import orjson
from pydantic_core import from_json


def canonical_json(value: Any) -> bytes:
    """``value`` (JSON-compatible) as canonical JSON bytes."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_json_text(value: Any) -> str:
    return canonical_json(value).decode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_digest(value: Any) -> str:
    """sha256 hex of ``canonical_json(value)``."""
    return sha256_hex(canonical_json(value))


def parse_json(data: bytes) -> Any:
    """Parse JSON bytes; raises ``ValueError`` (also for NaN/Infinity, never canonical).

    pydantic's Rust parser (already a dependency through pydantic): about 3x faster
    than ``json.loads`` on small items, and validation parses every item of every turn.
    """
    return from_json(data, allow_inf_nan=False)



def duplicate_key(data: bytes, value: Any) -> str | None:
    """A key that occurs twice in one JSON object of ``data`` (at any depth), or None.

    ``value`` is ``parse_json(data)``. Parsers disagree on duplicate keys (the last one
    wins here, the first in others), so two readers of such bytes may see two different
    items: they are refused, never interpreted. Canonical form is NOT required (number
    formatting differs between canonicalisers); only duplicate keys are looked for.

    Cheap in the common case: bytes equal to the sorted-key re-encoding of their parsed
    value hold no duplicate key (a parsed object has none, so neither has its encoding),
    and canonical content re-encodes to itself (~0.3 us for a small item). Other bytes
    are read once more by the standard parser, which hands over every object's pairs
    (~4 us per item). Raises ``ValueError`` if that parser cannot read them.
    """
    try:
        if orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == data:
            return None
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer above 64 bits
        pass
    repeated: list[str] = []

    def checked_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) != len(pairs) and not repeated:
            repeated.append(_first_repeated(key for key, _ in pairs))
        return obj

    try:
        json.loads(data.decode("utf-8"), object_pairs_hook=checked_object)
    except RecursionError as exc:
        raise ValueError("JSON nested too deeply") from exc
    return repeated[0] if repeated else None


def _first_repeated(keys: Iterable[str]) -> str:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no repeated key")
