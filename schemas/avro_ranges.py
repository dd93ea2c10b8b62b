"""int/long ranges: what fastavro lets through and Avro's readers refuse.

fastavro reads an Avro ``int`` as a long varint (up to 10 bytes, wrapping beyond), so
a body may carry an ``int`` field far beyond 32 bits. The check is derived once per
record from its reader schema (the shape of every decoded dict) and visits only the
int/long fields; a check returns None, or where the first bad value is and what it is.

A ``timestamp-millis`` field (an instant) must lie within years 1 to 9999, the range a
datetime holds (docs/gateway-protocol.md section 6). The serde reads it as the long it
is (``writer_schema.timestamps_as_longs``): fastavro built a datetime of it, refusing one
outside that range, and the model turned it back into the same int; this check is what
refuses it now, whatever the writer declared (a writer's plain ``long`` was let through
at any value). A writer's ``timestamp-micros`` is still read as a datetime (fastavro
refused one outside the range while building it): such a value is not checked here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from schemas import avsc

_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_DATETIME_TYPES = frozenset({"timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                             "local-timestamp-micros", "date", "time-millis", "time-micros"})
# The first and last millisecond a datetime holds: 0001-01-01T00:00:00.000Z and
# 9999-12-31T23:59:59.999Z, in epoch milliseconds.
INSTANT_RANGE = (-62_135_596_800_000, 253_402_300_799_999)
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class _Scalar:
    """An int or long value (its range): checked inline by its record or array."""

    low: int
    high: int


@dataclass(frozen=True)
class _Instant(_Scalar):
    """A ``timestamp-millis``: epoch milliseconds within ``INSTANT_RANGE``, or a
    datetime (from a writer's ``timestamp-micros``: fastavro built it, so it is one)."""


@cache
def range_check(record: str) -> _Check:
    """The range check of a top-level record (derived from its schema once per process).

    Raises NotImplementedError for a schema shape it does not handle (a union of more
    than null and one other type holding ints), so a new schema cannot slip past it.
    """
    check = _compile(avsc.inlined(record), {}, avsc.NAMESPACE)
    return check if callable(check) else nothing_to_check


def nothing_to_check(_: Any) -> None:
    return None


def _compile(schema: Any, names: dict[str, Any], namespace: str) -> _Scalar | _Check | None:
    """A ``_Scalar`` for an int/long, a check for a type holding some, else None."""
    if isinstance(schema, str):
        if schema in _RANGES:
            return _Scalar(*_RANGES[schema])
        if schema in _PRIMITIVES:
            return None
        return names.get(schema if "." in schema else f"{namespace}.{schema}")  # defined above
    if isinstance(schema, list):
        branches = [c for c in (_compile(b, names, namespace) for b in schema) if c is not None]
        if len(branches) > 1:
            raise NotImplementedError(f"range check of the union {schema}")
        return branches[0] if branches else None  # null is skipped where the value is read
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _compile(kind, names, namespace)
    if kind in _RANGES:
        logical = schema.get("logicalType")
        if kind == "long" and logical == "timestamp-millis":
            return _Instant(*INSTANT_RANGE)
        # other date/time types: fastavro hands them back as date/time objects, built
        # only from values it can represent (else OverflowError or ValueError:
        # CORRUPT_PAYLOAD); ratchet's readers have none
        return None if logical in _DATETIME_TYPES else _Scalar(*_RANGES[kind])
    if kind == "record":
        full = avsc.full_name_of({"namespace": namespace, **schema})
        scalars: list[tuple[str, int, int]] = []
        instants: list[tuple[str, int, int]] = []
        nested: list[_Nested] = []
        names[full] = check = _record_check(scalars, instants, nested)  # a recursive use finds it
        inner_namespace = full.rpartition(".")[0]
        for field in schema["fields"]:
            found = _compile(field["type"], names, inner_namespace)
            if isinstance(found, _Instant):
                instants.append((field["name"], found.low, found.high))
            elif isinstance(found, _Scalar):
                scalars.append((field["name"], found.low, found.high))
            elif found is not None:
                nested.append(_nested(field["name"], found))
        if not scalars and not instants and not nested:
            names[full] = None
            return None
        # complete now (a recursive use above got it before: no inlining there)
        check.scalars, check.instants, check.nested = (  # type: ignore[attr-defined]
            scalars, instants, nested)
        return check
    if kind in ("array", "map"):
        inner = _compile(schema["items" if kind == "array" else "values"], names, namespace)
        if inner is None:
            return None
        if isinstance(inner, _Instant):  # none in ratchet's schemas: not derived, refused
            raise NotImplementedError(f"range check of an {kind} of timestamps")
        return _array_check(inner) if kind == "array" else _map_check(inner)
    if kind in ("enum", "fixed"):
        names[avsc.full_name_of({"namespace": namespace, **schema})] = None
    return None


def _outside(value: Any, high: int) -> str:
    kind, bits = ("int", 32) if high == _RANGES["int"][1] else ("long", 64)
    return f" = {value!r}: outside the {bits}-bit range of an Avro {kind}"


def _instant_outside(name: str, value: int, low: int, high: int) -> str:
    return (f".{name} = {value!r}: outside years 1 to 9999 (epoch milliseconds "
            f"{low} to {high})")


_Fields = list[tuple[str, int, int]]
# A field holding ints deeper down: its name, then either its check (``inner``) or,
# inlined, the fields of a record of ints and instants alone (``scalars``, ``instants``)
# or of an array of records of ints alone (``items``). A call a nested value less: a
# TurnCompleted has six such fields (its fingerprint, proof, artifact, receipt, items
# and subturns), ~6.7 calls a promoted turn of the check's ~11.
_Nested = tuple[str, "_Check | None", "_Fields | None", "_Fields | None", "_Fields | None"]


def _nested(name: str, found: _Scalar | _Check) -> _Nested:
    scalars = getattr(found, "scalars", None)
    instants = getattr(found, "instants", None)
    if getattr(found, "nested", None) == []:  # a complete record check without nesting
        return (name, None, scalars, instants, None)
    items = getattr(found, "fields", None)  # ``flat``: an array of records of ints
    if items is not None:
        return (name, None, None, None, items)
    return (name, found, None, None, None)  # type: ignore[return-value]


def _record_check(scalars: _Fields, instants: _Fields, nested: list[_Nested]) -> _Check:
    def check(data: dict[str, Any]) -> str | None:
        for name, low, high in scalars:
            value = data[name]
            if value is not None and not low <= value <= high:
                return f".{name}{_outside(value, high)}"
        for name, low, high in instants:
            value = data[name]
            if value.__class__ is int and not low <= value <= high:
                return _instant_outside(name, value, low, high)
        # what ``inner(value)`` would answer, the record's or array's loops written here
        for name, inner, inner_scalars, inner_instants, items in nested:
            value = data[name]
            if value is None:
                continue
            if inner is not None:
                bad = inner(value)
                if bad is not None:
                    return f".{name}{bad}"
            elif items is not None:
                for i, item in enumerate(value):
                    if item is not None:
                        for field, low, high in items:
                            number = item[field]
                            if number is not None and not low <= number <= high:
                                return f".{name}[{i}].{field}{_outside(number, high)}"
            else:
                for field, low, high in inner_scalars:  # type: ignore[union-attr]
                    number = value[field]
                    if number is not None and not low <= number <= high:
                        return f".{name}.{field}{_outside(number, high)}"
                for field, low, high in inner_instants:  # type: ignore[union-attr]
                    number = value[field]
                    if number.__class__ is int and not low <= number <= high:
                        return f".{name}{_instant_outside(field, number, low, high)}"
        return None

    return check


def _array_check(inner: _Scalar | _Check) -> _Check:
    if isinstance(inner, _Scalar):
        low, high = inner.low, inner.high

        def scalars(values: list[Any]) -> str | None:
            for i, value in enumerate(values):
                if value is not None and not low <= value <= high:
                    return f"[{i}]{_outside(value, high)}"
            return None

        return scalars

    fields = getattr(inner, "scalars", None)
    if fields and not inner.nested and not inner.instants:  # type: ignore[attr-defined]
        # records of ints alone (an Item's format_version): their fields inline

        def flat(values: list[Any]) -> str | None:
            for i, value in enumerate(values):
                if value is not None:
                    for name, low, high in fields:
                        field = value[name]
                        if field is not None and not low <= field <= high:
                            return f"[{i}].{name}{_outside(field, high)}"
            return None

        flat.fields = fields  # type: ignore[attr-defined]  # a record inlines it
        return flat

    def records(values: list[Any]) -> str | None:
        for i, value in enumerate(values):
            if value is not None:
                bad = inner(value)
                if bad is not None:
                    return f"[{i}]{bad}"
        return None

    return records


def _map_check(inner: _Scalar | _Check) -> _Check:
    check_values = _array_check(inner)

    def check(values: dict[str, Any]) -> str | None:
        for key, value in values.items():
            bad = check_values([value])
            if bad is not None:
                return f"[{key!r}]{bad.removeprefix('[0]')}"
        return None

    return check
