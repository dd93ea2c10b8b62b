"""Canonical JSON: the one byte encoding every digest in ratchet is computed over.

Sorted keys, no whitespace, explicit nulls, UTF-8 (not ASCII-escaped), no NaN/Infinity.
Two producers that mean the same JSON value get the same bytes, so the same digest,
whatever key order or formatting their inputs had.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from typing import Any

import orjson
from pydantic_core import from_json

# The value types of a flat object orjson encodes exactly as ``json.dumps`` below does
# (exact types: a subclass, e.g. an enum, takes the reference path).
_FLAT = frozenset({str, int, bool, type(None)})


def canonical_json(value: Any) -> bytes:
    """``value`` (JSON-compatible) as canonical JSON bytes.

    A flat object (string keys; string, integer, boolean or null values: a token
    artifact, a router receipt, a boundary proof, twice per promoted turn) is encoded by
    orjson, ~0.3 against ~4.5 us: the same bytes (its escapes and key order agree with
    ``json.dumps`` on every code point, ``tests/unit/test_canonical_flat.py``). What
    orjson refuses (an integer beyond 64 bits, a key that is not a string, a lone
    surrogate) and everything else takes ``json.dumps``, which answers or raises as
    before."""
    if type(value) is dict:
        for inner in value.values():  # noqa: SIM110 - a loop: no generator per call
            if type(inner) not in _FLAT:
                break
        else:
            try:
                return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
            except orjson.JSONEncodeError:
                pass  # the reference path answers (or raises) as it always did
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_json_text(value: Any) -> str:
    return canonical_json(value).decode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_sha256_hex(text: str) -> bool:
    """Whether ``text`` is what ``sha256_hex`` writes: 64 lowercase hex digits."""
    return _SHA256_HEX.fullmatch(text) is not None


def canonical_digest(value: Any) -> str:
    """sha256 hex of ``canonical_json(value)``."""
    return sha256_hex(canonical_json(value))


def parse_json(data: bytes) -> Any:
    """Parse JSON bytes; raises ``ValueError`` for text that is not JSON, and for NaN,
    Infinity and a number beyond the range of a double (``1e400``): none has a
    canonical form, so no digest could be computed over a value holding one.

    pydantic's Rust parser (already a dependency through pydantic): about 3x faster
    than ``json.loads`` on small items, and validation parses every item of every turn.
    It reads a number beyond a double's range as infinity (``allow_inf_nan`` refuses
    only the literals ``NaN`` and ``Infinity``), so the value is checked, cheaply: text
    that is orjson's sorted-key encoding of its own value (canonical content, the common
    case) holds no such number, as orjson writes an infinity as ``null`` where the text
    has a number (~0.3 us for a small item, which ``duplicate_key`` then does not spend
    again on the same bytes: the shape check of an item costs ~0.1 us more in all); only
    other text is walked for an infinite float (~1 us more for a small item, which costs
    ``duplicate_key`` a second parse of ~4 us anyway).
    """
    global _self_encoded
    value = from_json(data, allow_inf_nan=False)
    try:  # inline, not _is_own_encoding: this runs for every item of every turn
        own = orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == data
    except TypeError:  # orjson.JSONEncodeError is one; e.g. an integer above 64 bits
        own = False
    if own:
        if type(data) is bytes:  # immutable: the finding stays true of this object
            _self_encoded = data
    elif not _finite(value):
        raise ValueError("a number is beyond the range of a double (e.g. 1e400): "
                         "it has no canonical JSON")
    return value


# The last bytes ``parse_json`` found to be the sorted-key encoding of their own value
# (so without a key twice in one object): the catalogue's shape check calls
# ``duplicate_key`` on the very bytes object it has just parsed. Held until the next such
# parse; a bytes object never changes, and a miss only costs the encoding again.
_self_encoded: bytes | None = None


def _is_own_encoding(data: bytes, value: Any) -> bool:
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == data
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer above 64 bits
        return False


_NESTED = (dict, list, float)


def _finite(value: Any) -> bool:
    """No float in ``value`` (a parsed JSON value, at most ~200 levels deep) is infinite."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return True
    for inner in value:  # noqa: SIM110 - a loop: no generator per container
        if type(inner) in _NESTED and not _finite(inner):
            return False
    return True


def duplicate_key(data: bytes, value: Any) -> str | None:
    """A key that occurs twice in one JSON object of ``data`` (at any depth), or None.

    ``value`` is ``parse_json(data)``. Parsers disagree on duplicate keys (the last one
    wins here, the first in others), so two readers of such bytes may see two different
    items: they are refused, never interpreted. Canonical form is NOT required (number
    formatting differs between canonicalisers); only duplicate keys are looked for.

    Cheap in the common case: bytes equal to the sorted-key re-encoding of their parsed
    value hold no duplicate key (a parsed object has none, so neither has its encoding),
    and canonical content re-encodes to itself (~0.3 us for a small item; nothing when
    ``parse_json`` has just found that of this very bytes object). Other bytes
    are read once more by the standard parser, which hands over every object's pairs
    (~4 us per item). Raises ``ValueError`` if that parser cannot read them.
    """
    if data is _self_encoded or _is_own_encoding(data, value):
        return None
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


# A JSON string as ``json_containers`` reads one: from a '"' to the next '"' that a
# backslash does not escape (a backslash escapes the byte after it), or to the end of
# the text when it is left open (also when the last byte is a lone backslash).
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)


def json_containers(data: bytes, most: int) -> int:
    """The ``[`` and ``{`` of ``data`` outside its JSON strings (the arrays and objects
    parsing it builds), counted up to ``most + 1``: a number above ``most`` only says
    "more". Twin of ``json_containers`` in ``ratchet/_speedups.c``. Text that is not
    JSON is counted all the same (the parser refuses it later)."""
    rough = data.count(b"[") + data.count(b"{")
    if rough == 0 or b'"' not in data:
        return min(rough, most + 1)
    count = 0
    at = 0
    for string in _JSON_STRING.finditer(data):
        count += data.count(b"[", at, string.start()) + data.count(b"{", at, string.start())
        if count > most:
            return most + 1
        at = string.end()
    count += data.count(b"[", at) + data.count(b"{", at)
    return min(count, most + 1)


def _first_repeated(keys: Iterable[str]) -> str:
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no repeated key")
