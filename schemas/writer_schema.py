"""What a writer schema registered by a gateway may be, and how ratchet reads it.

A gateway registers its own writer schemas (Avro in any client library); ratchet reads
their bodies with fastavro against its own reader schemas. This module holds the
judgments about a writer schema that fastavro does not make: which ratchet record it
is (``record_name_of``), fields it leaves out that a reader would silently default
(``left_out``), logical types fastavro would apply where ratchet's field has none
(``foreign_logical_type``), whether its arrays are ratchet's (``arrays_as_ratchets``),
and the schema text normalised for reading (``uuids_as_strings``, ``timestamps_as_longs``,
``without_docs``).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from schemas import avsc
from schemas.strict import RECORD_KINDS

# The records gateways write and ratchet reads. Their subjects are FULL_TRANSITIVE: the
# registry refuses a version that any earlier one cannot read, so no client can register
# a writer schema ratchet's readers cannot read (under BACKWARD a gateway could register
# `attempt` as long, or drop a field that has no default: every gateway that then took
# `versions/latest` wrote records that were dead-lettered, found by a gateway built in
# Java from the docs), nor one that the workers of the previous version cannot read during
# a rolling upgrade. Ratchet's own changes to them add fields with defaults (since v1:
# `TurnCompleted.gateway_id`), which passes both ways.
GATEWAY_RECORDS = frozenset({"TurnCompleted", "ToolEffect", "TurnCancelled"})


def record_name_of(schema: Any) -> str:
    """The ratchet record a registered schema is (``TurnCompleted``), or a name no
    ratchet record has: ``UNEXPECTED_RECORD_TYPE``. Only an Avro record named in
    ratchet's namespace is one of ours (docs/gateway-protocol.md section 2): a record
    named ``TurnCompleted`` without a namespace was taken for ``io.ratchet.TurnCompleted``,
    and a Protobuf or JSON schema was an ``UNKNOWN`` dead letter with a JSON error (an
    outside review, session 26)."""
    kind = getattr(schema, "schema_type", None) or "AVRO"
    if kind.upper() != "AVRO":
        return f"a {kind} schema, not Avro"
    try:
        parsed = json.loads(schema.schema_str)
    except ValueError:
        return "an Avro schema that is not JSON"
    except RecursionError:  # JSON nested deeper than Python's parser recurses
        return "an Avro schema nested too deep to parse"
    if not isinstance(parsed, dict) or "name" not in parsed:
        return "an Avro schema that is not a named record"
    # A top-level schema without a namespace is in Avro's null namespace (not ours:
    # ``avsc.full_name_of`` defaults to ours, for the nested types of our own files).
    name, namespace = str(parsed["name"]), parsed.get("namespace")
    if "." not in name and namespace:
        name = f"{namespace}.{name}"
    prefix = avsc.NAMESPACE + "."
    return name.removeprefix(prefix) if name.startswith(prefix) else f"{name} (not {prefix}*)"


def uuids_as_strings(schema: Any) -> Any:
    """A writer schema with ``"logicalType": "uuid"`` dropped from its strings. The
    annotation changes no byte (the value is the UUID's text), but fastavro reads it as
    a ``uuid.UUID``, which no ratchet field takes: a Java gateway annotating
    ``event_id`` so had every event dead-lettered ``INVALID_EVENT`` (a review, session
    33). Read as the string it is, the field's own rules judge it."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and schema.get("logicalType") == "uuid":
            return {k: v for k, v in schema.items() if k != "logicalType"}
        return {k: uuids_as_strings(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [uuids_as_strings(v) for v in schema]
    return schema


def timestamps_as_longs(schema: Any) -> Any:
    """A writer schema with ``"logicalType": "timestamp-millis"`` dropped from its longs,
    so that fastavro reads each as the epoch milliseconds it is: the int the model keeps
    (``schemas.models.EpochMillis``). Read as the logical type says, fastavro built a
    datetime of it (refusing one outside years 1-9999) and the model's validator turned
    it back into the same int: 6 datetimes a turn, about half of the model's validation
    (docs/decisions.md, "The decoded turn's validation"). The range a datetime holds is
    checked on the int instead (``avro_ranges.INSTANT_RANGE``). Applied only after the
    writer's own logical types were judged (``foreign_logical_type``), on the schema
    fastavro reads bodies with."""
    if isinstance(schema, dict):
        if schema.get("type") == "long" and schema.get("logicalType") == "timestamp-millis":
            return {k: v for k, v in schema.items() if k != "logicalType"}
        return {k: timestamps_as_longs(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [timestamps_as_longs(v) for v in schema]
    return schema


def without_docs(schema: Any) -> Any:
    """A schema's JSON without its ``doc`` attributes, which never change decoding."""
    if isinstance(schema, dict):
        return {k: without_docs(v) for k, v in schema.items() if k != "doc"}
    if isinstance(schema, list):
        return [without_docs(v) for v in schema]
    return schema


def arrays_as_ratchets(writer: Any) -> bool:
    """Whether every array and map field of ratchet's ``TurnCompleted`` (the fields the
    identity read skips) has the very same type in the writer schema, names' namespaces
    and docs aside. A writer with another type there (``tool_effect_ids`` of longs, an
    ``input_items`` that is no array) cannot be read as ratchet's, but skipping the field
    hides it (found by a review)."""
    names = writer.get("__named_schemas", {}) if isinstance(writer, dict) else {}
    for path, wanted in _ratchet_arrays():
        node: Any = writer
        for name in path:
            node = _record_of_node(node, names)
            fields = {} if node is None else {f["name"]: f["type"] for f in node["fields"]}
            if name not in fields:
                return False
            node = fields[name]
        if _shape(node, names) != wanted:
            return False
    return True


@cache
def _ratchet_arrays() -> tuple[tuple[tuple[str, ...], Any], ...]:
    """(path, shape) of every array and map field of ratchet's ``TurnCompleted``."""
    reader = avsc.parsed("TurnCompleted")
    names = reader.get("__named_schemas", {})
    found: list[tuple[tuple[str, ...], Any]] = []

    def visit(node: Any, path: tuple[str, ...]) -> None:
        record = _record_of_node(node, names)
        if record is None:
            return
        for field in record["fields"]:
            kind = field["type"]
            if isinstance(kind, dict) and kind.get("type") in ("array", "map"):
                found.append(((*path, field["name"]), _shape(kind, names)))
            else:
                visit(kind, (*path, field["name"]))

    visit(reader, ())
    return tuple(found)


def _record_of_node(node: Any, names: dict[str, Any]) -> dict[str, Any] | None:
    """The record a schema node is (a named reference resolved), else None."""
    if isinstance(node, str):
        node = names.get(node)
    if isinstance(node, dict) and isinstance(node.get("type"), dict | list):
        return _record_of_node(node["type"], names)
    if isinstance(node, dict) and node.get("type") in RECORD_KINDS:
        return node
    return None


def _shape(node: Any, names: dict[str, Any]) -> Any:
    """A schema node as a comparable value: references resolved, short names, record
    fields in name order, no docs, defaults or aliases (the schemas compared recurse
    nowhere: ``unsafe_shape``)."""
    if isinstance(node, str):
        return _shape(names[node], names) if node in names else node
    if isinstance(node, list):
        return [_shape(branch, names) for branch in node]
    kind = node["type"]
    if isinstance(kind, dict | list):
        return _shape(kind, names)
    short = str(node.get("name", "")).rsplit(".", 1)[-1]
    if kind in RECORD_KINDS:  # fields by name: a reader resolves them by name, not place
        return ["record", short, sorted((f["name"], _shape(f["type"], names))
                                        for f in node["fields"])]
    if kind == "enum":
        return ["enum", short, list(node["symbols"])]
    if kind == "fixed":
        return ["fixed", short, node["size"], node.get("logicalType")]
    if kind == "array":
        return ["array", _shape(node["items"], names)]
    if kind == "map":
        return ["map", _shape(node["values"], names)]
    return [kind, node.get("logicalType")]


def left_out(record: str, writer: Any) -> str | None:
    """For a record gateways write: the first field of ratchet's v1 schema (any of its
    records, matched by name without namespace) that ``writer`` does not have, said as
    a refusal; else None. Schema resolution reads such a field as the reader's default:
    a writer that renamed ``tool_effect_ids`` (with an alias, which the reader ignores)
    had its effects read as ``[]`` and the turn promoted, where ratchet's own schema
    gave ``MISSING_TOOL_EFFECT`` (found by a review). Fields added since v1 may be
    missing: a v1 writer does not have them."""
    if record not in GATEWAY_RECORDS:
        return None
    written = _record_fields(writer)
    for name, fields in _record_fields(avsc.inlined(record, avsc.V1_DIR)).items():
        if name in written:
            missing = sorted(fields - written[name])
            if missing:
                return (f"the writer schema's {name} has no field {missing[0]!r}, which "
                        f"ratchet's {name} reads: it would be read as its default")
    return None


def foreign_logical_type(writer: Any, reader: Any) -> str | None:
    """The first logical type the fastavro-parsed ``writer`` puts on a field that
    ratchet's ``reader`` reads without it, said as a refusal; else None.

    fastavro reads a value as its WRITER's logical type says, where Java's Avro applies
    the reader's: ``date`` on ``attempt`` came back a date (a TypeError in the range
    check: an ``UNKNOWN`` dead letter), and ``decimal`` on ``Item.content`` made an
    integer of the content, quadratic in its size (900 KB: 92 s holding the GIL) (a
    review, session 34). Allowed: the reader's own logical type, and
    ``timestamp-micros`` where the reader has ``timestamp-millis``: read as the same
    instant (docs/gateway-protocol.md section 2), where Java would read the number as
    milliseconds. A writer's ``uuid`` on a string was dropped before
    (``uuids_as_strings``); fields ratchet does not read are skipped, not read."""
    reader_records = {name.rsplit(".", 1)[-1]: schema
                      for name, schema in reader.get("__named_schemas", {}).items()
                      if schema.get("type") in RECORD_KINDS}
    for name, record in writer.get("__named_schemas", {}).items():
        short = name.rsplit(".", 1)[-1]
        if record.get("type") not in RECORD_KINDS or short not in reader_records:
            continue
        reader_fields = {f["name"]: f["type"] for f in reader_records[short]["fields"]}
        for field in record["fields"]:
            if field["name"] not in reader_fields:
                continue
            allowed = _logical_types(reader_fields[field["name"]])
            if "timestamp-millis" in allowed:
                allowed = allowed | {"timestamp-micros"}
            foreign = sorted(_logical_types(field["type"]) - allowed)
            if foreign:
                return (f"the writer schema's {short}.{field['name']} has logicalType "
                        f"{foreign[0]!r}, which ratchet's does not: fastavro would read it "
                        f"as that type, not as ratchet's")
    return None


def _logical_types(schema: Any) -> set[str]:
    """The logical types in a field's type, not inside a named record it defines (that
    record's own fields are compared on their own)."""
    if isinstance(schema, list):
        return set().union(*(_logical_types(branch) for branch in schema))
    if not isinstance(schema, dict):
        return set()
    kind = schema["type"]
    if isinstance(kind, (dict, list)):
        return _logical_types(kind)
    found = {schema["logicalType"]} if "logicalType" in schema else set()
    if kind == "array":
        found |= _logical_types(schema["items"])
    elif kind == "map":
        found |= _logical_types(schema["values"])
    return found


def _record_fields(schema: Any, found: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Field names of the records defined in ``schema``, by name without namespace: of
    two records with one name (in two namespaces), the names both have. A review hid a
    renamed ``tool_effect_ids`` behind a decoy ``other.TurnCompleted`` with every field:
    the decoy, defined last, stood for both."""
    found = {} if found is None else found
    if isinstance(schema, list):
        for branch in schema:
            _record_fields(branch, found)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in RECORD_KINDS:
            short = schema["name"].rsplit(".", 1)[-1]
            fields = {f["name"] for f in schema["fields"]}
            found[short] = found[short] & fields if short in found else fields
            for field in schema["fields"]:
                _record_fields(field["type"], found)
        elif kind == "array":
            _record_fields(schema["items"], found)
        elif kind == "map":
            _record_fields(schema["values"], found)
        elif isinstance(kind, (dict, list)):
            _record_fields(kind, found)
    return found
