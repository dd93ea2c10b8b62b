"""Canonical JSON: the one byte encoding every digest in ratchet is computed over.

Sorted keys, no whitespace, explicit nulls, UTF-8 (not ASCII-escaped), no NaN/Infinity.
Two producers that mean the same JSON value get the same bytes, so the same digest,
whatever key order or formatting their inputs had.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

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
