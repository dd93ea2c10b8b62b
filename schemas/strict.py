"""What fastavro reads leniently in an Avro body, checked against the spec.

fastavro (1.13) reads an enum symbol and a union branch by indexing a Python list with
the index it read, so a NEGATIVE index wraps: the status byte of a ``failed`` turn
damaged to index -6 was read as ``completed`` and promoted ``certified`` (found by an
adversarial review; Java's Avro refuses the same bytes). It also reads any boolean
byte but 0 as true, where the spec allows only 0 and 1 (Java reads 2 as false: two
readers, two meanings). Fail closed: such a body is ``CORRUPT_PAYLOAD``.

When it runs: only on a body that is not the plain encoding of what fastavro read
(``schemas.avro`` re-encodes the decoded record with the writer schema and compares
the bytes: ~0.1 ms for a 20-item turn, against ~0.26 ms for this walk in Python).
Every damaged index or boolean changes the bytes; so do valid variants a writer may
use (arrays in several blocks, a block's byte size, non-minimal varints), which this
walk accepts. A body read with schema resolution is always walked.
"""

from __future__ import annotations

from typing import Any

_MAX_VARINT_BYTES = 10


class _Body:
    """A cursor over the body's bytes."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.at = 0

    def varint(self) -> int:
        """A zigzag varint (Avro's int and long)."""
        shift = value = 0
        for _ in range(_MAX_VARINT_BYTES):
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise _Refused(f"a varint longer than {_MAX_VARINT_BYTES} bytes at byte {self.at}")

    def take(self, n: int) -> bytes | memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise _Refused(f"{n} bytes wanted at byte {self.at} of {len(self.data)}")
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk


class _Refused(Exception):
    """Where and why the body breaks the spec."""


def strict_violation(body: bytes | memoryview, schema: Any) -> str | None:
    """None if ``body`` (one record of the fastavro-parsed ``schema``, nothing after
    it) keeps to the spec where fastavro is lenient, else what it breaks and where."""
    cursor = _Body(body)
    # Every named type, also one defined in a union branch this body did not take.
    names = dict(schema.get("__named_schemas", {})) if isinstance(schema, dict) else {}
    try:
        _walk(cursor, schema, names, "")
    except _Refused as refused:
        return str(refused)
    return None


def _walk(body: _Body, schema: Any, names: dict[str, Any], path: str) -> None:
    if isinstance(schema, str):
        if schema in names:
            _walk(body, names[schema], names, path)
        else:
            _primitive(body, schema, path)
        return
    if isinstance(schema, list):  # a union
        index = body.varint()
        if not 0 <= index < len(schema):
            raise _Refused(f"union index {index} outside 0..{len(schema) - 1} at {path or '/'}")
        _walk(body, schema[index], names, path)
        return
    kind = schema["type"]
    if isinstance(kind, (dict, list)):  # {"type": {...}}: the type is nested once more
        _walk(body, kind, names, path)
    elif kind == "record":
        for field in schema["fields"]:
            _walk(body, field["type"], names, f"{path}/{field['name']}")
    elif kind == "enum":
        index = body.varint()
        if not 0 <= index < len(schema["symbols"]):
            raise _Refused(f"enum index {index} outside 0..{len(schema['symbols']) - 1} "
                           f"at {path or '/'}")
    elif kind == "array":
        _blocks(body, lambda: _walk(body, schema["items"], names, f"{path}[]"))
    elif kind == "map":
        def entry() -> None:
            _primitive(body, "string", f"{path}{{}}")
            _walk(body, schema["values"], names, f"{path}{{}}")
        _blocks(body, entry)
    elif kind == "fixed":
        body.take(schema["size"])
    else:  # a primitive, maybe with a logical type
        _primitive(body, kind, path)


def _blocks(body: _Body, item: Any) -> None:
    while True:
        count = body.varint()
        if count == 0:
            return
        if count < 0:  # a block with its byte size: read the items all the same
            count = -count
            body.varint()
        for _ in range(count):
            item()


def _primitive(body: _Body, kind: str, path: str) -> None:
    if kind == "null":
        return
    if kind == "boolean":
        byte = body.take(1)[0]
        if byte not in (0, 1):
            raise _Refused(f"boolean byte {byte} (0 or 1) at {path or '/'}")
    elif kind in ("int", "long"):
        body.varint()
    elif kind == "float":
        body.take(4)
    elif kind == "double":
        body.take(8)
    elif kind in ("bytes", "string"):
        body.take(body.varint())
    else:
        raise _Refused(f"a type this check does not know: {kind!r} at {path or '/'}")
