"""What fastavro reads leniently in an Avro body, checked against the spec.

fastavro (1.13) reads an enum symbol and a union branch by indexing a Python list with
the index it read, so a NEGATIVE index wraps: the status byte of a ``failed`` turn
damaged to index -6 was read as ``completed`` and promoted ``certified`` (found by an
adversarial review; Java's Avro refuses the same bytes). It also reads any boolean
byte but 0 as true, where the spec allows only 0 and 1 (Java reads 2 as false: two
readers, two meanings). Fail closed: such a body is ``CORRUPT_PAYLOAD``.

When it runs: with the C module (``ratchet/_speedups.c``, ``avro_conforms``) on every
body, in C, over a *plan*: the writer schema compiled once per schema id by ``plan_of``
into a flat int32 program (a few microseconds for a 20-item turn). The C walk only
ever answers "conforms" or "not sure"; on "not sure" this Python walk decides and says
why, so the C walk can never pass a body this one refuses (``tests/unit/test_speedups.py``
holds both to that). Without the C module, only on a body that is not the plain
encoding of what fastavro read (``schemas.avro`` re-encodes the decoded record with
the writer schema and compares the bytes: ~0.1 ms for a 20-item turn, against ~0.26 ms
for this walk in Python), or one read with schema resolution. Every damaged index or
boolean changes the bytes; so do valid variants a writer may use (arrays in several
blocks, a block's byte size, non-minimal varints), which this walk accepts.

Also here: ``unsafe_shape`` (writer schemas whose bodies could cost without bound) and
``damage_before_the_end`` (a body fastavro found too short, told apart from damage).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any

_MAX_VARINT_BYTES = 10
# An Avro int (and what Java reads as one: an enum or union index, a string's or bytes'
# length) takes at most 5 bytes: Java refuses a 6th ("Invalid int encoding"), fastavro
# reads on to 10. A review found a 6-byte attempt read here and refused by Java.
_MAX_INT_BYTES = 5
# Avro's "error" is a record by another name (fastavro and Java parse and read it as
# one): every check here treats both alike (an "error" once slipped past them all).
RECORD_KINDS = ("record", "error")


class _Body:
    """A cursor over the body's bytes; ``most_elements``: how many array items and map
    entries the body may hold in all (None: any number)."""

    def __init__(self, data: bytes | memoryview, most_elements: int | None = None) -> None:
        self.data = data
        self.at = 0
        self.elements = 0
        self.most_elements = most_elements

    def element(self) -> None:
        """Count one array item or map entry (before it is read)."""
        self.elements += 1
        if self.most_elements is not None and self.elements > self.most_elements:
            raise _Refused(f"more than {self.most_elements} array items and map entries "
                           f"(the {self.elements}th at byte {self.at})", too_many=True)

    def varint(self, most: int = _MAX_VARINT_BYTES) -> int:
        """A zigzag varint of at most ``most`` bytes (Avro's long: 10, its int: 5)."""
        shift = value = 0
        for _ in range(most):
            byte = self.take(1)[0]
            if shift == 63 and byte & 0x7E:
                # Java refuses it too; fastavro read it and the range check refused it
                # after the body was built (``schemas.avro``): refused here, first.
                raise _Refused(f"a varint beyond 64 bits at byte {self.at}")
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise _Refused(f"a varint longer than {most} bytes at byte {self.at}")

    def take(self, n: int) -> bytes | memoryview:
        if n < 0:
            raise _Refused(f"a negative length {n} at byte {self.at}")
        if self.at + n > len(self.data):
            raise _Refused(f"{n} bytes wanted at byte {self.at} of {len(self.data)}",
                           ran_out=True)
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk


class _Refused(Exception):
    """Where and why the body breaks the spec; ``ran_out``: only that it ends early;
    ``too_many``: it holds more array items and map entries than it may."""

    def __init__(self, message: str, *, ran_out: bool = False, too_many: bool = False) -> None:
        super().__init__(message)
        self.ran_out = ran_out
        self.too_many = too_many


@dataclass(frozen=True)
class Refusal:
    """Why a body is refused (``refusal_of``): ``detail`` says where and why;
    ``ran_out``: it only ends early (fastavro would say TRUNCATED); ``too_many``: it
    holds more array items and map entries than allowed (what it holds up to there
    keeps to the spec)."""

    detail: str
    ran_out: bool = False
    too_many: bool = False


def damage_before_the_end(body: bytes | memoryview, schema: Any) -> str | None:
    """For a body fastavro found too short: what the walk finds wrong before the body
    runs out (e.g. a negative length, which fastavro reads as a short read), else None
    (the body only ends early: ``TRUNCATED``)."""
    try:
        _walk(_Body(body), schema, _names(schema), "")
    except _Refused as refused:
        return None if refused.ran_out else str(refused)
    return None


def _names(schema: Any) -> dict[str, Any]:
    """Every named type, also one defined in a union branch a body did not take."""
    return dict(schema.get("__named_schemas", {})) if isinstance(schema, dict) else {}


def strict_violation(body: bytes | memoryview, schema: Any) -> str | None:
    """None if ``body`` (one record of the fastavro-parsed ``schema``, nothing after
    it) keeps to the spec where fastavro is lenient, else what it breaks and where."""
    refusal = refusal_of(body, schema)
    return None if refusal is None else refusal.detail


def refusal_of(body: bytes | memoryview, schema: Any, *,
               most_elements: int | None = None) -> Refusal | None:
    """``strict_violation`` that also says how the body fails, and refuses one holding
    more than ``most_elements`` array items and map entries in all (the walk stops
    there; what each item costs is bounded by ``unsafe_shape``: 4 schema nodes a byte)."""
    cursor = _Body(body, most_elements)
    try:
        _walk(cursor, schema, _names(schema), "")
    except _Refused as refused:
        return Refusal(str(refused), refused.ran_out, refused.too_many)
    if cursor.at != len(body):
        # fastavro may have ended elsewhere: it skips a block with a byte size by its
        # size; what it read after that is not what this walk read
        return Refusal(f"{len(body) - cursor.at} bytes after the record as the spec reads it")
    return None


def _walk(body: _Body, schema: Any, names: dict[str, Any], path: str) -> None:
    if isinstance(schema, str):
        if schema in names:
            _walk(body, names[schema], names, path)
        else:
            _primitive(body, schema, path)
        return
    if isinstance(schema, list):  # a union
        index = body.varint(_MAX_INT_BYTES)
        if not 0 <= index < len(schema):
            raise _Refused(f"union index {index} outside 0..{len(schema) - 1} at {path or '/'}")
        _walk(body, schema[index], names, path)
        return
    kind = schema["type"]
    if isinstance(kind, (dict, list)):  # {"type": {...}}: the type is nested once more
        _walk(body, kind, names, path)
    elif kind in RECORD_KINDS:
        for field in schema["fields"]:
            _walk(body, field["type"], names, f"{path}/{field['name']}")
    elif kind == "enum":
        index = body.varint(_MAX_INT_BYTES)
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
        size = None
        if count < 0:  # a block with its byte size: read the items all the same
            count = -count
            size = body.varint()
        start = body.at
        for _ in range(count):
            body.element()
            item()
        if size is not None and body.at - start != size:
            # a reader that skips the block by its size (fastavro, for a field ratchet
            # does not read) would go on elsewhere than one that reads its items: a
            # review put a failed turn after the items and a "completed" one at the size
            raise _Refused(f"a block's byte size {size} but its items took "
                           f"{body.at - start} at byte {start}")


def _primitive(body: _Body, kind: str, path: str) -> None:
    if kind == "null":
        return
    if kind == "boolean":
        byte = body.take(1)[0]
        if byte not in (0, 1):
            raise _Refused(f"boolean byte {byte} (0 or 1) at {path or '/'}")
    elif kind == "int":
        body.varint(_MAX_INT_BYTES)
    elif kind == "long":
        body.varint()
    elif kind == "float":
        body.take(4)
    elif kind == "double":
        body.take(8)
    elif kind in ("bytes", "string"):
        body.take(body.varint(_MAX_INT_BYTES))
    else:
        raise _Refused(f"a type this check does not know: {kind!r} at {path or '/'}")


# --- what fastavro cannot read safely -----------------------------------------------------
# Two writer-schema shapes let a short body cost without bound, so the worker refuses
# them before reading any body (found in session 34, by the twins' random schemas):
# - Recursion. fastavro reads by recursion in C, one level per level of the schema the
#   body nests. A recursive schema (a linked list: ``Node`` with a field of
#   ``["null", "Node"]``) nests as deep as the body says: 100 000 bytes of 0x02
#   overflowed the C stack and the worker died of SIGSEGV, again on the same record
#   after every restart. A schema nested deeper than MAX_SCHEMA_DEPTH is refused too.
# - An array whose items may take no bytes (``null``, a record of nulls, a zero-size
#   ``fixed``). Its count is then bounded by nothing in the body: 2**62 nulls in 10 bytes
#   kept fastavro's loop (and the worker's lane) busy for good. With every item taking
#   a byte or more, a count cannot outrun the body. (A map's entries carry a key.)
# ratchet's own schemas nest 4 levels at most (TurnCompleted), recurse nowhere and have
# no such array.
MAX_SCHEMA_DEPTH = 32
# - An array (or map) whose items are wide for the bytes they take: a record of 1 000
#   null fields and a boolean is one byte a value, so 131 072 of them (within the item
#   bound, 128 KiB) made every reader walk 131 M schema nodes (26 s in the Python walk;
#   fastavro reads it too, ~20-100 ns a node; an outside review, session 35). Items may
#   take at most MAX_NODES_PER_BYTE nodes per byte, whatever values they hold (each
#   union branch, each optional field measured as it may be written); ratchet's own
#   take 2 at most (an Item: 10 nodes in 7 bytes, a Subturn 5 in 3), an array of
#   records of optional fields 3 (a record of one: 3 nodes in 1 byte).
MAX_NODES_PER_BYTE = 4


def unsafe_shape(schema: Any) -> str | None:
    """Why fastavro must not read bodies of the fastavro-parsed ``schema``, else None: a
    named type that contains itself, nesting deeper than ``MAX_SCHEMA_DEPTH`` levels (a
    reference to a named type counts as deep as its definition), an array whose items
    may be written in no bytes, or an array or map whose items may take more than
    ``MAX_NODES_PER_BYTE`` schema nodes per byte they take (some value of them)."""
    names = _names(schema)
    # a named type's (depth, fewest bytes, most excess): the excess of a value is the
    # schema nodes reading it walks less MAX_NODES_PER_BYTE per byte it takes (its
    # arrays' and maps' items aside: each is checked where it is), the most over every
    # value of the type. Items whose most excess is above 0 may take more nodes a byte.
    measured: dict[str, tuple[int, int, int]] = {}
    open_names: list[str] = []  # the named types being measured, outermost first
    rate = MAX_NODES_PER_BYTE

    def measure(schema: Any) -> tuple[int, int, int]:
        """(levels it nests, the fewest bytes a value of it takes, its most excess)."""
        if isinstance(schema, str):
            if schema in names:
                if schema in open_names:
                    loop = " -> ".join(open_names[open_names.index(schema):])
                    raise _Refused(f"the writer schema's {schema} contains itself "
                                   f"(through {loop})")
                return measured[schema] if schema in measured else measure(names[schema])
            if schema not in _PRIMITIVE_NODES:
                raise _Refused(f"the writer schema names a type this check does not know: "
                               f"{schema!r}")
            fewest = _FEWEST_BYTES.get(schema, 1)
            return 0, fewest, 1 - rate * fewest
        if isinstance(schema, list):  # a union: its index (a byte or more), then the branch
            branches = [measure(branch) for branch in schema]
            found = (1 + max((d for d, _, _ in branches), default=0),
                     1 + min((b for _, b, _ in branches), default=0),
                     1 - rate + max((x for _, _, x in branches), default=0))
        elif isinstance(schema["type"], (dict, list)):
            return measure(schema["type"])
        elif schema["type"] in RECORD_KINDS:
            open_names.append(schema["name"])
            fields = [measure(field["type"]) for field in schema["fields"]]
            open_names.pop()
            found = (1 + max((d for d, _, _ in fields), default=0),
                     sum(b for _, b, _ in fields), 1 + sum(x for _, _, x in fields))
            measured[schema["name"]] = found
        elif schema["type"] in ("array", "map"):
            is_map = schema["type"] == "map"
            items_depth, items_bytes, items_excess = measure(
                schema["values"] if is_map else schema["items"])
            if items_bytes == 0 and not is_map:
                raise _Refused("the writer schema has an array whose items may take no "
                               "bytes: its count is bounded by nothing in the body")
            if is_map:  # an entry's key: a string of a byte or more
                items_excess += 1 - rate
            if items_excess > 0:
                raise _Refused(
                    f"the writer schema has an {schema['type']} whose items may take more "
                    f"than {rate} schema nodes a byte: reading a body would cost without "
                    "bound by its size")
            found = (1 + items_depth, 1, 1 - rate)  # the array itself: a count byte
        elif schema["type"] == "fixed":
            return 0, schema["size"], 1 - rate * schema["size"]
        elif schema["type"] == "enum" or schema["type"] in _PRIMITIVE_NODES:
            fewest = _FEWEST_BYTES.get(schema["type"], 1)  # maybe with a logical type
            return 0, fewest, 1 - rate * fewest
        else:  # fail closed: a kind this check does not know is not measured as small
            raise _Refused(f"the writer schema has a type this check does not know: "
                           f"{schema['type']!r}")
        if found[0] > MAX_SCHEMA_DEPTH:
            raise _Refused(f"the writer schema nests {found[0]} levels or more "
                           f"(at most {MAX_SCHEMA_DEPTH})")
        return found

    try:
        measure(schema)
    except _Refused as refused:
        return str(refused)
    return None


# The fewest bytes a value of each type takes (Avro binary encoding); 1 for the rest (a
# varint, a length, an enum index).
_FEWEST_BYTES = {"null": 0, "float": 4, "double": 8}


# --- the plan the C walk runs ------------------------------------------------------------
# One node per schema node, in a flat int32 array: [kind, ...]. A reference to another
# node is its index in the array, so a recursive named type is a loop, not a copy.
#   NULL, BOOLEAN, VARINT (long), INT, FLOAT, DOUBLE, SIZED (bytes, string): [kind]
#   FIXED [kind, size]   ENUM [kind, symbols]   ARRAY [kind, items]   MAP [kind, values]
#   UNION [kind, n, branch...]   RECORD [kind, n, field type...]
#   REFUSE [kind]: what the C walk does not take (a type this check does not know, a size
#   beyond int32): it answers "not sure" and the Python walk decides.
(PLAN_NULL, PLAN_BOOLEAN, PLAN_VARINT, PLAN_FLOAT, PLAN_DOUBLE, PLAN_SIZED, PLAN_FIXED,
 PLAN_ENUM, PLAN_UNION, PLAN_RECORD, PLAN_ARRAY, PLAN_MAP, PLAN_REFUSE, PLAN_INT) = range(14)

_PRIMITIVE_NODES = {
    "null": PLAN_NULL, "boolean": PLAN_BOOLEAN, "int": PLAN_INT, "long": PLAN_VARINT,
    "float": PLAN_FLOAT, "double": PLAN_DOUBLE, "bytes": PLAN_SIZED, "string": PLAN_SIZED,
}
_INT32_MAX = 2**31 - 1


def plan_of(schema: Any) -> bytes:
    """The fastavro-parsed ``schema`` as the C walk's plan (native int32s; node 0 is
    the schema itself). Built once per writer schema id."""
    names = _names(schema)
    plan = array("i")
    compiled: dict[str, int] = {}  # a named type's node, once started (recursion)

    def emit(*cells: int) -> int:
        at = len(plan)
        plan.extend(cells)
        return at

    def node(schema: Any) -> int:
        if isinstance(schema, str):
            if schema in names:
                return compiled[schema] if schema in compiled else node(names[schema])
            return emit(_PRIMITIVE_NODES.get(schema, PLAN_REFUSE))
        if isinstance(schema, list):
            at = emit(PLAN_UNION, len(schema), *[0] * len(schema))
            for i, branch in enumerate(schema):
                plan[at + 2 + i] = node(branch)
            return at
        kind = schema["type"]
        if isinstance(kind, (dict, list)):
            return node(kind)
        name = schema.get("name")
        if kind in (*RECORD_KINDS, "enum", "fixed") and name in compiled:
            return compiled[name]
        if kind in RECORD_KINDS:
            fields = schema["fields"]
            at = emit(PLAN_RECORD, len(fields), *[0] * len(fields))
            compiled[name] = at
            for i, field in enumerate(fields):
                plan[at + 2 + i] = node(field["type"])
            return at
        if kind == "enum":
            at = emit(PLAN_ENUM, len(schema["symbols"]))
        elif kind == "fixed":
            size = schema["size"]
            # A size beyond int32 is one no body can hold (the topic takes 16 MiB): the
            # C walk runs out there, as the Python walk does (it was REFUSE: "not sure",
            # and the Python walk then walked the whole long body, 30 s; a review).
            at = emit(PLAN_FIXED, min(size, _INT32_MAX)) if size >= 0 else emit(PLAN_REFUSE)
        elif kind in ("array", "map"):
            at = emit(PLAN_ARRAY if kind == "array" else PLAN_MAP, 0)
            plan[at + 1] = node(schema["items" if kind == "array" else "values"])
            return at
        else:
            return emit(_PRIMITIVE_NODES.get(kind, PLAN_REFUSE))
        compiled[name] = at
        return at

    node(schema)
    return plan.tobytes()
