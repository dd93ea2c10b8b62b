"""Reading a body with its writer schema's checks: the element bound counted before
fastavro builds anything, the identity of a turn beyond that bound, and the strict walk
of what fastavro read leniently.

``schemas.avro`` decodes; this module holds what it asks of a body besides fastavro's
read. The walks themselves are ``schemas.strict`` (Python) and ``ratchet._speedups``
(C); ``SPEEDUPS`` is None when the C module is not built or is turned off.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from pydantic import ValidationError

from ratchet.speedups import SPEEDUPS
from schemas import avsc
from schemas.limits import MAX_EVENT_ELEMENTS
from schemas.models import MODELS_BY_RECORD
from schemas.strict import RECORD_KINDS, Refusal, refusal_of, strict_violation
from schemas.writer_schema import arrays_as_ratchets


@dataclass(frozen=True)
class BodyReader:
    """How to read bodies written with one schema id (built once per id)."""

    record: str  # record name without namespace, "?" if the schema is not a record
    writer_text: str
    # fastavro-parsed writer schema, its timestamp-millis read as longs
    # (``timestamps_as_longs``); None until the first body is read
    writer: Any = None
    reader: Any = None  # parsed reader schema, or None: writer == reader, no resolution
    in_range: Any = None  # the reader record's int/long range check (``range_check``)
    # A gateway record's writer that lacks a field ratchet's first schema has: what it
    # lacks (``left_out``), else None.
    left_out: str | None = None
    strict_plan: bytes = b""  # the writer schema as the C strict walk's plan (``plan_of``)
    # Why fastavro must not read bodies of this writer schema, else None: a shape whose
    # bodies could cost without bound (``unsafe_shape``), or a logical type ratchet's
    # field does not have (``foreign_logical_type``).
    unsafe: str | None = None


def counted(known: BodyReader, body: memoryview) -> Refusal | None:
    """The strict walk with at most ``MAX_EVENT_ELEMENTS`` array items and map entries.
    In C it answers every body of a writer schema ``unsafe_shape`` passed (it is not
    sure only of what such a schema cannot hold: a REFUSE node, nesting past its depth)
    and says where it stopped, so the Python twin never walks a long body again to word
    a refusal (a review: 26 s for 131 072 items of a writer's 1 000-field record). The
    Python walk runs only without the C module: its items are bounded, not the fields
    each one holds (docs/decisions.md, "Items per event")."""
    if SPEEDUPS is not None:
        code, at, _ = SPEEDUPS.avro_counted(known.strict_plan, body, MAX_EVENT_ELEMENTS)
        if code == _CONFORMS:
            return None
        if code == _TOO_MANY:
            return Refusal(f"more than {MAX_EVENT_ELEMENTS} array items and map entries",
                           too_many=True)
        if code == _DAMAGED:
            return Refusal(f"not valid Avro at byte {at} of {len(body)} (the C walk)")
        if code == _RAN_OUT:
            return Refusal(f"the body ends at byte {at} inside a value (the C walk)",
                           ran_out=True)
        # Not sure: a plan node it does not take, nesting past its depth; no writer
        # schema ``unsafe_shape`` passes has one. Refused rather than walked in Python
        # (a review: a long body walked there took 17-30 s).
        return Refusal(f"the C walk cannot check it (stopped at byte {at})")
    return refusal_of(body, known.writer, most_elements=MAX_EVENT_ELEMENTS)


# What ``avro_counted`` answers (0: not sure, the Python walk decides)
_CONFORMS, _TOO_MANY, _DAMAGED, _RAN_OUT = 1, 2, 3, 4
# The most schema nodes a turn beyond the element bound may take to read for its fields
# (fastavro skips its arrays value by value, ~20-100 ns a node, holding the GIL): ratchet's
# own schema with 16 M one-byte items is 16 M nodes (1.8 s); a writer's wide records in an
# array took 22.5 s (a review). More: a dead letter, not a rejection.
MAX_IDENTITY_NODES = 16 * 2**20


def identity_of(known: BodyReader, body: memoryview) -> Any:
    """A ``TurnCompleted`` beyond the element bound read WITHOUT its arrays and maps
    (fastavro skips a field the reader lacks, building nothing; they are empty in the
    model): what the processor needs to reject it ``UNSUPPORTED_FORMAT`` (its ids,
    request, attempt). None when that cannot be read safely, so it is a dead letter:
    without the C module (the Python walk over up to 16 M items would take minutes),
    when the whole body does not keep to the spec (fastavro reads damage leniently: a
    wrapped union index could change an id), when reading it would walk more than
    ``MAX_IDENTITY_NODES`` schema nodes, when the writer's arrays are not ratchet's
    (``arrays_as_ratchets``: such a writer's bodies within the bound are
    ``SCHEMA_MISMATCH``, so one beyond it must not record a rejection), or when the
    fields do not make a turn."""
    if SPEEDUPS is None or not arrays_as_ratchets(known.writer):
        return None
    code, _, nodes = SPEEDUPS.avro_counted(known.strict_plan, body, -1)
    if code != _CONFORMS or nodes > MAX_IDENTITY_NODES:
        return None
    reader, fill = _without_arrays_reader()
    try:
        data = schemaless_reader(io.BytesIO(body), known.writer, reader)
    except (SchemaResolutionError, EOFError, StopIteration, ValueError, TypeError,
            IndexError, KeyError, OverflowError):
        return None
    fill(data)
    if known.in_range(data) is not None:
        return None
    try:
        return MODELS_BY_RECORD["TurnCompleted"].from_avro(data)
    except ValidationError:
        return None


@cache
def _without_arrays_reader() -> tuple[Any, Callable[[dict[str, Any]], None]]:
    """ratchet's ``TurnCompleted`` reader schema without its array and map fields (at
    any depth), and the function that puts them back empty into a dict it read."""
    removed: list[tuple[tuple[str, ...], Any]] = []  # (record path, empty value)

    def strip(schema: Any, path: tuple[str, ...]) -> Any:
        if not isinstance(schema, dict) or schema.get("type") not in RECORD_KINDS:
            return schema
        fields = []
        for field in schema["fields"]:
            kind = field["type"]
            if isinstance(kind, dict) and kind.get("type") in ("array", "map"):
                removed.append(((*path, field["name"]), [] if kind["type"] == "array" else {}))
                continue
            fields.append({**field, "type": strip(kind, (*path, field["name"]))})
        return {**schema, "fields": fields}

    reader = parse_schema(copy.deepcopy(strip(avsc.inlined("TurnCompleted"), ())))

    def fill(data: dict[str, Any]) -> None:
        for path, empty in removed:
            at: Any = data
            for name in path[:-1]:
                at = at.get(name) if isinstance(at, dict) else None
            if isinstance(at, dict):
                at[path[-1]] = type(empty)()

    return reader, fill


def lenient_read(known: BodyReader, data: dict[str, Any], body: memoryview) -> str | None:
    """What in ``body`` fastavro read but the spec refuses (``schemas.strict``), else
    None. With the C module every body is walked in C (a few us); the Python walk
    decides only what the C walk is not sure of. Without it: a body that is the plain
    encoding of ``data`` has no such flaw (every one changes the bytes), so it is walked
    only when it is not, or was read by resolution."""
    if SPEEDUPS is not None:
        if SPEEDUPS.avro_conforms(known.strict_plan, body):
            return None
        return strict_violation(body, known.writer)
    if known.reader is None:
        plain = io.BytesIO()
        schemaless_writer(plain, known.writer, data)
        if plain.getbuffer() == body:
            return None
    return strict_violation(body, known.writer)
