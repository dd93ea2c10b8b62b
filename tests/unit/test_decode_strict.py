"""Bodies fastavro reads leniently are ``CORRUPT_PAYLOAD`` (``schemas/strict.py``).

An adversarial review found a ``failed`` turn whose status byte was damaged to the
enum index -6 promoted ``certified``: fastavro indexes a Python list with the index it
reads, so a negative one wraps (a union branch too), and it reads every boolean byte
but 0 as true. Valid variants of the encoding (arrays in several blocks, a block with
its byte size) still decode.

Each damaged body is written with a twin of the schema whose damaged field is an
``int`` (or a record of an ``int`` and the branch's value): its zigzag varint is the
byte sequence an enum index, a union index or a boolean byte would be.

Every test runs twice: with the C walk (``avro_conforms`` in ``ratchet/_speedups.c``,
the Python walk deciding what it refuses) and with the Python twins alone (the
re-encoding, then the Python walk).
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema

from ratchet import speedups
from ratchet.samples import make_tool_loop_turn, make_turn, new_id
from schemas import avro_bodies, avsc
from schemas.models import CheckpointPromoted, DeadLetter, DeadLetterReason, TurnStatus
from schemas.strict import MAX_SCHEMA_DEPTH, plan_of, strict_violation, unsafe_shape
from tests.unit.registry_mock import TOPIC, client, serde  # noqa: F401 - fixtures
from tests.unit.test_decode_hardening import Pipeline, decode_error, registered_id

C = speedups.load()


@pytest.fixture(autouse=True, params=["C", "Python"])
def twin(request, monkeypatch):
    """Which strict walk the decode runs (``schemas.avro_bodies.lenient_read``)."""
    if request.param == "C" and C is None:
        if os.environ.get("CI"):
            pytest.fail("ratchet._speedups is not built (needs gcc, Python and OpenSSL headers)")
        pytest.skip("ratchet._speedups is not built here")
    monkeypatch.setattr(avro_bodies, "SPEEDUPS", C if request.param == "C" else None)
    return request.param


def _violation(body: bytes, schema: Any) -> str | None:
    """``strict_violation``, and the C walk agreeing with it when built."""
    found = strict_violation(body, schema)
    if C is not None:
        assert C.avro_conforms(plan_of(schema), body) is (found is None)
    return found


def _schema() -> dict[str, Any]:
    return json.loads(avsc.schema_text("TurnCompleted"))


def _field(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The field at ``path`` (``a/b``: field b of the record field a)."""
    record = schema
    *parents, name = path.split("/")
    for parent in parents:
        record = next(f for f in record["fields"] if f["name"] == parent)["type"]
    return next(f for f in record["fields"] if f["name"] == name)


def _set(record: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, name = path.split("/")
    target = record
    for parent in parents:
        target = target[parent]
    target[name] = value
    return record


def _body(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def _damaged(turn, path: str, twin_type: Any, twin_value: Any) -> bytes:
    """``turn`` framed with ratchet's id, the field at ``path`` written as ``twin_type``."""
    schema = _schema()
    field = _field(schema, path)
    field["type"] = twin_type
    field.pop("default", None)
    return _body(schema, _set(turn.to_avro(), path, twin_value))


def _framed(serde, turn, body: bytes) -> bytes:  # noqa: F811
    return b"\x00" + struct.pack(">I", registered_id(serde, turn)) + body


@pytest.mark.parametrize("index", [-1, -5, -6])  # -7 and below: fastavro's IndexError
def test_a_negative_enum_index_is_corrupt_not_another_status(serde, index):  # noqa: F811
    turn = make_turn(status=TurnStatus.FAILED, conversation_id=new_id("conv"))
    value = _framed(serde, turn, _damaged(turn, "status", "int", index))
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert f"enum index {index} outside 0..5 at /status" in error.message


def test_the_reviewers_failed_turn_is_dead_lettered_never_promoted(serde):  # noqa: F811
    """Index -6 read as symbol 0 (``completed``): the turn was promoted certified."""
    turn = make_turn(status=TurnStatus.FAILED, conversation_id=new_id("conv"))
    value = _framed(serde, turn, _damaged(turn, "status", "int", -6))
    published = Pipeline(serde).published(value, key=turn.partition_key.encode())
    assert [type(m) for m in published] == [DeadLetter]
    assert published[0].reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert not any(isinstance(m, CheckpointPromoted) for m in published)


def test_a_negative_union_index_is_corrupt_not_the_last_branch(serde):  # noqa: F811
    turn = make_turn(conversation_id=new_id("conv"))
    twin = {"type": "record", "name": "Branch", "fields": [
        {"name": "index", "type": "int"}, {"name": "value", "type": "string"}]}
    value = _framed(serde, turn, _damaged(turn, "gateway_id", twin,
                                          {"index": -1, "value": "gw-1"}))
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert "union index -1 outside 0..1 at /gateway_id" in error.message


def _int_written_as(byte: int) -> int:
    """The int whose zigzag varint is the single byte ``byte`` (below 0x80)."""
    return byte // 2 if byte % 2 == 0 else -(byte + 1) // 2


@pytest.mark.parametrize("byte", [2, 3, 0x7F])
def test_a_boolean_byte_other_than_0_or_1_is_corrupt(serde, byte):  # noqa: F811
    turn = make_turn(conversation_id=new_id("conv"))
    value = _framed(serde, turn, _damaged(turn, "effective_config/truncated", "int",
                                          _int_written_as(byte)))
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert f"boolean byte {byte} (0 or 1) at /effective_config/truncated" in error.message


def _blocks_twin(turn, *, with_size: bool) -> bytes:
    """``turn``'s body with ``output_items`` written in blocks: one item each, or one
    block of all with its byte size (valid Avro fastavro's writer does not produce)."""
    schema = _schema()
    items = turn.to_avro()["output_items"]
    assert len(items) >= 2
    if with_size:
        size = len(_body({"type": "array", "items": _item_schema()}, items)) - 2
        fields = [{"name": "count", "type": "long"}, {"name": "size", "type": "long"}]
        values = {"count": -len(items), "size": size}
    else:
        fields, values = [], {}
    for i in range(len(items)):
        if not with_size:
            fields.append({"name": f"count{i}", "type": "long"})
            values[f"count{i}"] = 1
        fields.append({"name": f"item{i}", "type": "io.ratchet.Item"})
        values[f"item{i}"] = items[i]
    fields.append({"name": "end", "type": "long"})
    values["end"] = 0
    _field(schema, "output_items")["type"] = {"type": "record", "name": "Blocks",
                                             "fields": fields}
    return _body(schema, _set(turn.to_avro(), "output_items", values))


def _item_schema() -> dict[str, Any]:
    """``Item`` as the TurnCompleted schema defines it (inline, at its first use)."""
    return _field(_schema(), "input_items")["type"]["items"]


@pytest.mark.parametrize("with_size", [False, True], ids=["blocks-of-one", "byte-size"])
def test_arrays_in_blocks_still_decode(serde, with_size):  # noqa: F811
    turn, _ = make_tool_loop_turn()
    value = _framed(serde, turn, _blocks_twin(turn, with_size=with_size))
    assert value != serde.encode(turn, TOPIC)  # not the plain encoding: walked
    assert serde.decode_gateway_event(value, TOPIC, 0, 1) == turn


def test_non_minimal_varints_are_valid():
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"}, {"name": "e", "type": {
            "type": "enum", "name": "E", "symbols": ["a", "b"]}}]})
    assert _violation(bytes([0x80, 0x00, 0x82, 0x00]), schema) is None  # 0, then 1
    assert _violation(bytes([0x00, 0x04]), schema) == "enum index 2 outside 0..1 at /e"


def test_a_named_type_first_defined_in_a_branch_not_taken_is_still_known():
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "first", "type": ["null", {"type": "enum", "name": "E",
                                            "symbols": ["a", "b"]}]},
        {"name": "second", "type": "E"}]})
    assert _violation(bytes([0x00, 0x02]), schema) is None  # null, then "b"
    assert "enum index -1" in _violation(bytes([0x00, 0x01]), schema)


def test_a_writer_schema_fastavro_cannot_parse_is_a_schema_mismatch(client, serde):  # noqa: F811
    """The registry accepted it (an optional decimal whose scale exceeds its precision);
    it was dead-lettered ``UNKNOWN`` with a traceback in the worker's log."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema = _schema()
    schema["fields"].append({"name": "price", "default": None, "type": [
        "null", {"type": "bytes", "logicalType": "decimal", "precision": 2, "scale": 5}]})
    schema_id = client.register_schema("unparseable-turn",
                                       Schema(json.dumps(schema), "AVRO"))
    value = b"\x00" + struct.pack(">I", schema_id) + serde.encode(turn, TOPIC)[5:] + b"\x00"
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "SchemaParseException" in error.message


@pytest.mark.parametrize("renamed,to", [("tool_effect_ids", "effect_ids"),
                                        ("expires_at", "expiry_at")])
def test_a_writer_that_renamed_a_field_is_refused_not_read_as_its_default(
        client, serde, renamed, to):  # noqa: F811
    """A review registered ``tool_effect_ids`` renamed (with an alias: resolution uses
    the reader's aliases, not the writer's): the turn's effects were read as ``[]`` and
    it was promoted, where ratchet's schema said ``MISSING_TOOL_EFFECT``."""
    turn, _ = make_tool_loop_turn()
    schema = _schema()
    field = _field(schema, renamed)
    field["name"], field["aliases"] = to, [renamed]
    schema_id = client.register_schema(f"renamed-{to}", Schema(json.dumps(schema), "AVRO"))
    record = turn.to_avro()
    record[to] = record.pop(renamed)
    error = decode_error(serde, b"\x00" + struct.pack(">I", schema_id) + _body(schema, record))
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert f"TurnCompleted has no field {renamed!r}" in error.message


def test_a_nested_record_missing_a_field_with_a_default_is_refused(client, serde):  # noqa: F811
    """``tool_choice`` has a default: resolution would read it as null, not as sent."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema = _schema()
    config = _field(schema, "effective_config")["type"]
    config["fields"] = [f for f in config["fields"] if f["name"] != "tool_choice"]
    schema_id = client.register_schema("no-tool-choice", Schema(json.dumps(schema), "AVRO"))
    record = turn.to_avro()
    del record["effective_config"]["tool_choice"]
    error = decode_error(serde, b"\x00" + struct.pack(">I", schema_id) + _body(schema, record))
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "EffectiveConfig has no field 'tool_choice'" in error.message


def test_a_v1_writer_without_the_fields_added_since_is_read(client, serde):  # noqa: F811
    turn = make_turn(conversation_id=new_id("conv"))
    v1 = json.loads(avsc.schema_text("TurnCompleted", avsc.V1_DIR))
    schema_id = client.register_schema("v1-turn", Schema(json.dumps(v1), "AVRO"))
    record = turn.to_avro()
    del record["gateway_id"]
    decoded = serde.decode_gateway_event(
        b"\x00" + struct.pack(">I", schema_id) + _body(v1, record), TOPIC, 0, 1)
    assert decoded == turn


# --- writer schemas fastavro cannot read safely (schemas/strict.py, unsafe_shape) -----------

def _with_extension(client, subject: str, extension: Any) -> int:  # noqa: F811
    """The id of ratchet's TurnCompleted with one more optional field of ``extension``
    (FULL_TRANSITIVE-compatible: an added field with a default)."""
    schema = _schema()
    schema["fields"].append({"name": "ext", "type": ["null", extension], "default": None})
    return client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))


LINKED = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}


def test_a_writer_schema_that_recurses_is_a_schema_mismatch(client, serde):  # noqa: F811
    """A linked list as an optional field: fastavro reads it by recursion in C as deep
    as the body nests, and 100 000 levels killed the worker (SIGSEGV, again after every
    restart). Refused before any body is read, however short."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema_id = _with_extension(client, "linked-turn", LINKED)
    body = serde.encode(turn, TOPIC)[5:] + b"\x02" + b"\x02" * 3 + b"\x00"
    error = decode_error(serde, b"\x00" + struct.pack(">I", schema_id) + body)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "io.ratchet.Node contains itself" in error.message


NULLS = {"type": "array", "items": "null"}
# Avro's "error" is a record by another name: it once slipped past every check.
ERROR_LINKED = {"type": "error", "name": "Node", "fields": [{"name": "next",
                                                             "type": ["null", "Node"]}]}
ERROR_NULLS = {"type": "array", "items": {"type": "error", "name": "Nothing", "fields": []}}
# The body after ratchet's fields: the extension's union branch 1, then the bomb.
BOMBS = {
    "nested-100000-deep": (LINKED, "b'\\x02' * 100_000 + b'\\x00'"),
    # an array of 2**62 - 1 nulls (zigzag varint of the count, then the closing 0)
    "2**62-nulls": (NULLS, "bytes([0xFE] + [0xFF] * 7 + [0x7F, 0x00])"),
    "error-nested-100000-deep": (ERROR_LINKED, "b'\\x02' * 100_000 + b'\\x00'"),
    "2**62-empty-errors": (ERROR_NULLS, "bytes([0xFE] + [0xFF] * 7 + [0x7F, 0x00])"),
}


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_a_body_that_costs_without_bound_is_dead_lettered_in_time(tmp_path, bomb):
    """Each bomb in a process of its own, with a deadline: before, the nested body was a
    SIGSEGV (the worker died on it after every restart) and the nulls an endless loop
    (the partition stopped; so would every worker that took it over)."""
    extension, tail = BOMBS[bomb]
    script = tmp_path / "bomb.py"
    script.write_text(f'''
import json, struct
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from ratchet.samples import make_turn
from schemas import avsc
from schemas.avro import EventSerde, register_schemas
from schemas.errors import DecodeError
client = SchemaRegistryClient.new_client({{"url": "mock://bomb"}})
register_schemas(client, compatibility=False)
serde = EventSerde(client, auto_register=True)
schema = json.loads(avsc.schema_text("TurnCompleted"))
schema["fields"].append({{"name": "ext", "type": ["null", {extension!r}], "default": None}})
schema_id = client.register_schema("bomb", Schema(json.dumps(schema), "AVRO"))
body = serde.encode(make_turn(), "t")[5:] + b"\\x02" + {tail}
try:
    serde.decode_gateway_event(b"\\x00" + struct.pack(">I", schema_id) + body, "t", 0, 1)
except DecodeError as error:
    print(error.reason.value, error.message)
''')
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("SCHEMA_MISMATCH"), done.stdout


@pytest.mark.parametrize("items", ["null", {"type": "record", "name": "Empty", "fields": []},
                                   {"type": "record", "name": "Nulls", "fields": [
                                       {"name": "a", "type": "null"}]},
                                   {"type": "fixed", "name": "Zero", "size": 0}])
def test_an_array_whose_items_may_take_no_bytes_is_a_schema_mismatch(client, serde, items):  # noqa: F811
    turn = make_turn(conversation_id=new_id("conv"))
    schema_id = _with_extension(client, f"zero-width-{json.dumps(items)}",
                                {"type": "array", "items": items})
    value = b"\x00" + struct.pack(">I", schema_id) + serde.encode(turn, TOPIC)[5:] + b"\x00"
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "an array whose items may take no bytes" in error.message


def test_arrays_and_maps_whose_items_take_a_byte_are_read():
    """Each of these items takes a byte or more (a union's index, an enum's, a map's
    closing count): the count is bounded by the body."""
    for items in (["null", "long"], {"type": "map", "values": "null"}, "boolean",
                  {"type": "array", "items": "long"}, {"type": "fixed", "name": "F", "size": 1},
                  {"type": "enum", "name": "E", "symbols": ["a"]}, "float"):
        schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
            {"name": "a", "type": {"type": "array", "items": items}}]})
        assert unsafe_shape(schema) is None, items


def _nested_arrays(levels: int, innermost: Any = "long") -> Any:
    nested: Any = innermost
    for _ in range(levels):
        nested = {"type": "array", "items": nested}
    return nested


@pytest.mark.parametrize("levels,refused", [(MAX_SCHEMA_DEPTH - 2, False),
                                            (MAX_SCHEMA_DEPTH - 1, True), (900, True)])
def test_a_writer_schema_nested_too_deep_is_a_schema_mismatch(client, serde, levels, refused):  # noqa: F811
    """The extension's arrays sit two levels down (the record, the field's union), so
    ``levels`` arrays nest ``levels + 2``. 900 levels is past what Python's parsers
    recurse to (it was an ``UNKNOWN`` dead letter with a RecursionError's traceback)."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema_id = _with_extension(client, f"nested-{levels}", _nested_arrays(levels))
    value = b"\x00" + struct.pack(">I", schema_id) + serde.encode(turn, TOPIC)[5:] + b"\x00"
    if not refused:
        assert serde.decode_gateway_event(value, TOPIC, 0, 1) == turn
        return
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert (f"nests {MAX_SCHEMA_DEPTH + 1} levels" if levels < 900
            else "RecursionError") in error.message


def test_a_named_type_counts_its_definitions_depth_where_referenced():
    """A reference nests as deep as its type's definition: arrays of a deep named type
    cannot stack depth past the bound unseen."""
    deep = {"type": "record", "name": "A", "fields": [{"name": "a", "type": _nested_arrays(20)}]}

    def root(again: Any) -> Any:  # A is 21 levels; the root adds 1
        return fastavro.parse_schema({"type": "record", "name": "R", "fields": [
            {"name": "first", "type": deep}, {"name": "again", "type": again}]})

    assert unsafe_shape(root("A")) is None
    assert unsafe_shape(root(_nested_arrays(10, "A"))) is None  # 1 + 10 + 21 = 32
    assert f"nests {MAX_SCHEMA_DEPTH + 1} levels" in unsafe_shape(root(_nested_arrays(11, "A")))


def test_ratchets_own_schemas_are_safe_to_read():
    for record in sorted(avsc.TOP_LEVEL_RECORDS):
        assert unsafe_shape(avsc.parsed(record)) is None, record


def test_a_writers_uuid_annotation_on_a_string_is_read_as_the_string(client, serde):  # noqa: F811
    """``event_id`` annotated ``logicalType: uuid`` (Java's Avro writes the UUID's text):
    fastavro read a ``uuid.UUID`` and every such event was ``INVALID_EVENT``."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema = _schema()
    _field(schema, "event_id")["type"] = {"type": "string", "logicalType": "uuid"}
    schema_id = client.register_schema("uuid-turn", Schema(json.dumps(schema), "AVRO"))
    value = b"\x00" + struct.pack(">I", schema_id) + _body(schema, turn.to_avro())
    assert serde.decode_gateway_event(value, TOPIC, 0, 1) == turn


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return bytes(out + bytes([low]))
        out.append(low | 0x80)


def test_a_block_byte_size_that_lies_is_corrupt_not_a_promoted_failed_turn(client, serde):  # noqa: F811
    """A review: an extra leading array field (so the body is read by resolution, and
    fastavro SKIPS it by its block's byte size) whose size points past a valid failed
    turn B to a copy A with status index -6. fastavro read A ("completed"); both strict
    walks read the array's item, then B, and passed without looking at the rest."""
    schema = _schema()
    schema["fields"].insert(0, {"name": "pad", "type": {"type": "array", "items": "string"},
                                "default": []})
    schema_id = client.register_schema("lying-size", Schema(json.dumps(schema), "AVRO"))
    turn = make_turn(status=TurnStatus.FAILED, conversation_id=new_id("conv"))
    valid = _body(_schema(), turn.to_avro())
    completed = _damaged(turn, "status", "int", -6)
    walked = b"\x00" + b"\x00" + valid  # the item "", the blocks' end, the failed turn
    body = _zigzag(-1) + _zigzag(len(walked)) + walked + b"\x00" + completed
    error = decode_error(serde, b"\x00" + struct.pack(">I", schema_id) + body)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert f"a block's byte size {len(walked)} but its items took 1" in error.message


def test_the_walks_refuse_bytes_after_the_record():
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "n", "type": "long"}]})
    assert _violation(b"\x02", schema) is None
    assert _violation(b"\x02\x00", schema) == "1 bytes after the record as the spec reads it"


def test_a_decoy_record_cannot_stand_for_the_real_one_in_the_field_check(client, serde):  # noqa: F811
    """A review renamed ``tool_effect_ids`` (refused) and added a record
    ``other.TurnCompleted`` with every field: keyed by short name, the decoy stood for
    the real record and the turn was read with no effects."""
    turn, _ = make_tool_loop_turn()
    schema = _schema()
    field = _field(schema, "tool_effect_ids")
    field["name"], field["aliases"] = "effects", ["tool_effect_ids"]
    decoy = {"type": "record", "name": "TurnCompleted", "namespace": "other",
             "fields": [{"name": f["name"], "type": "null", "default": None}
                        for f in _schema()["fields"]]}
    schema["fields"].append({"name": "decoy", "type": ["null", decoy], "default": None})
    schema_id = client.register_schema("decoy", Schema(json.dumps(schema), "AVRO"))
    record = turn.to_avro()
    record["effects"] = record.pop("tool_effect_ids")
    record["decoy"] = None
    error = decode_error(serde, b"\x00" + struct.pack(">I", schema_id) + _body(schema, record))
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "TurnCompleted has no field 'tool_effect_ids'" in error.message


@pytest.mark.parametrize("path,logical", [
    ("attempt", {"type": "int", "logicalType": "date"}),
    ("expected_head_seq", ["null", {"type": "long", "logicalType": "timestamp-millis"}]),
    ("response_id", {"type": "string", "logicalType": "not-a-known-one"}),
])
def test_a_writer_logical_type_ratchets_field_does_not_have_is_a_schema_mismatch(
        client, serde, path, logical):  # noqa: F811
    """fastavro reads a value as the WRITER's logical type says: ``date`` on ``attempt``
    came back a date (a TypeError in the range check: ``UNKNOWN``). Refused before any
    body is read, the body never looked at."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema = _schema()
    _field(schema, path)["type"] = logical
    schema_id = client.register_schema(f"logical-{path}", Schema(json.dumps(schema), "AVRO"))
    value = b"\x00" + struct.pack(">I", schema_id) + serde.encode(turn, TOPIC)[5:]
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert f"TurnCompleted.{path} has logicalType" in error.message


def test_a_decimal_on_item_content_is_refused_before_its_quadratic_read(client, serde):  # noqa: F811
    """``decimal`` on ``Item.content``: fastavro made an integer of the content, 92 s for
    900 KB holding the GIL (a review). Refused before the body is read."""
    turn = make_turn(conversation_id=new_id("conv"))
    schema = _schema()
    _item_schema_of(schema)["fields"] = [
        f | {"type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}}
        if f["name"] == "content" else f for f in _item_schema_of(schema)["fields"]]
    schema_id = client.register_schema("decimal-content", Schema(json.dumps(schema), "AVRO"))
    value = b"\x00" + struct.pack(">I", schema_id) + serde.encode(turn, TOPIC)[5:]
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "Item.content has logicalType 'decimal'" in error.message


def _item_schema_of(schema: dict[str, Any]) -> dict[str, Any]:
    return _field(schema, "input_items")["type"]["items"]


def test_a_named_reference_written_as_a_type_object_is_a_schema_mismatch(client, serde):  # noqa: F811
    """``{"type": "io.ratchet.TurnStatus"}``: fastavro's parser raised UnknownType (a
    ValueError), an ``UNKNOWN`` dead letter with a traceback."""
    schema = _schema()
    schema["fields"].append({"name": "again", "default": None,
                             "type": ["null", {"type": "io.ratchet.TurnStatus"}]})
    schema_id = client.register_schema("type-object", Schema(json.dumps(schema), "AVRO"))
    turn = make_turn(conversation_id=new_id("conv"))
    value = b"\x00" + struct.pack(">I", schema_id) + serde.encode(turn, TOPIC)[5:] + b"\x00"
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "UnknownType" in error.message


@pytest.mark.parametrize("written,refused", [
    (b"\x82\x80\x80\x80\x00", False),       # 1 in 5 bytes: the most an int takes
    (b"\x82\x80\x80\x80\x80\x00", True),    # 1 in 6 bytes: Java refuses it
])
def test_an_int_varint_longer_than_5_bytes_is_corrupt(serde, written, refused):  # noqa: F811
    """A review: ``attempt`` written in 6 bytes was read (fastavro reads an int as a long
    varint), where Java's Avro refuses it ("Invalid int encoding")."""
    turn = make_turn(conversation_id=new_id("conv"))
    body = _damaged(turn, "attempt", {"type": "fixed", "name": "Raw", "size": len(written)},
                    written)
    value = _framed(serde, turn, body)
    if not refused:
        assert serde.decode_gateway_event(value, TOPIC, 0, 1) == turn
        return
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert "a varint longer than 5 bytes" in error.message


def test_an_enum_index_in_6_bytes_is_refused_by_both_walks():
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["a", "b"]}},
        {"name": "n", "type": "long"}]})
    assert _violation(b"\x82\x80\x80\x80\x00" + b"\x80" * 9 + b"\x00", schema) is None
    assert "longer than 5 bytes" in _violation(b"\x82\x80\x80\x80\x80\x00\x00", schema)


def test_a_negative_length_is_corrupt_and_a_short_body_truncated(serde):  # noqa: F811
    """fastavro reads a negative string length as a short read (EOFError "Expected -5
    bytes"): it was TRUNCATED, though nothing is missing (a review)."""
    turn = make_turn(conversation_id=new_id("conv"))
    value = serde.encode(turn, TOPIC)
    negative = value[:5] + bytes([0x09]) + value[6:]  # event_id's length: zigzag -5
    error = decode_error(serde, negative)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert "a negative length -5 at byte 1" in error.message  # after its varint
    assert decode_error(serde, value[:-7]).reason is DeadLetterReason.TRUNCATED
