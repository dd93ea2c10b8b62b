"""A gateway event's timestamps read as the longs they are, with the same refusals.

Since session 47 the serde reads a writer's ``timestamp-millis`` as a plain long
(``writer_schema.timestamps_as_longs``): fastavro no longer builds a datetime the model
turns back into the same int. What the datetime refused (a value outside years 1 to
9999: ``OverflowError``, ``CORRUPT_PAYLOAD``) is refused by the range check
(``avro_ranges.INSTANT_RANGE``), whatever the writer declared: a writer schema that
declared its timestamps as plain ``long`` (which the registry takes: logical types do
not count for compatibility) had one outside that range decoded, contrary to
docs/gateway-protocol.md section 6 (a turn was then rejected ``CORRUPT``, a
cancellation recorded).

* every timestamp of the three gateway records, outside the range, as each of three
  writers declares it (ratchet's own schema, plain ``long``, ``timestamp-micros``): one
  ``CORRUPT_PAYLOAD`` dead letter; the first and last millisecond decode exactly;
* the model's other refusals through the same path: a logical type on a field ratchet's
  has none (judged as declared, before the timestamps are read as longs), types a writer
  may widen or narrow, an item outside the catalogue;
* a property test: for valid records, the old path (fastavro reading the declared
  logical types, then the model) and the serde build equal models, every timestamp an int.
"""

from __future__ import annotations

import copy
import io
import json
import uuid
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratchet.samples import make_tool_effect, make_turn, make_turn_cancelled, new_id
from schemas import avsc
from schemas.avro import EventSerde, register_schemas
from schemas.models import (
    MODELS_BY_RECORD,
    DeadLetter,
    DeadLetterReason,
    PromotionRejected,
    RejectionReason,
    RouterReceipt,
)
from tests.unit.registry_mock import TOPIC, client, serde  # noqa: F401 - fixtures
from tests.unit.test_decode_hardening import Pipeline, decode_error, framed

LOW, HIGH = -62_135_596_800_000, 253_402_300_799_999  # 0001-01-01 .. 9999-12-31T23:59:59.999Z

# Every timestamp of each gateway record, as a path into its Avro dict.
TIMESTAMPS = {
    "TurnCompleted": [("produced_at",), ("expires_at",), ("token_artifact", "expires_at"),
                      ("boundary_proof", "expires_at"), ("router_receipt", "expires_at")],
    "ToolEffect": [("produced_at",), ("executed_at",)],
    "TurnCancelled": [("produced_at",), ("cancelled_at",)],
}
WRITERS = ("own", "plain-long", "micros", "other-docs")


def _turn():
    return make_turn(conversation_id=new_id("conv"), router_receipt=RouterReceipt(
        receipt_id="rcpt_1", router_key_format="prefix-blocks-v1", covered_tokens=10,
        expires_at=1_750_000_000_000, issuer="router-1"), expires_at=1_760_000_000_000)


def _event(record: str):
    if record == "TurnCompleted":
        return _turn()
    if record == "ToolEffect":
        return make_tool_effect("call_1", idempotency_key=new_id("idem"),
                                conversation_id=new_id("conv"))
    return make_turn_cancelled(_turn())


def _retyped(schema: Any, logical: str | None) -> Any:
    """``schema`` with every timestamp-millis long declared as ``logical`` (None: a plain
    long). Written here, not taken from the code under test."""
    if isinstance(schema, dict):
        if schema.get("logicalType") == "timestamp-millis":
            out = {k: v for k, v in schema.items() if k != "logicalType"}
            return out if logical is None else out | {"logicalType": logical}
        return {k: _retyped(v, logical) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_retyped(v, logical) for v in schema]
    return schema


def _writer(record: str, kind: str) -> dict[str, Any]:
    own = json.loads(avsc.schema_text(record))
    if kind == "plain-long":
        return _retyped(own, None)
    if kind == "micros":
        return _retyped(own, "timestamp-micros")
    if kind == "other-docs":  # the same schema but for its docs: read without resolution
        return json.loads(json.dumps(own).replace('"doc": "', '"doc": "(gateway) '))
    return own


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    at = data
    for name in path[:-1]:
        at = at[name]
    at[path[-1]] = value
    return data


def _as_written(data: dict[str, Any], record: str, kind: str) -> dict[str, Any]:
    """The Avro dict a writer of ``kind`` writes for ratchet's ``data``: microseconds
    for ``micros`` (each timestamp's millisecond, plus ``extra_us``)."""
    if kind != "micros":
        return data
    for path in TIMESTAMPS[record]:
        at: Any = data
        for name in path[:-1]:
            at = at[name]
        if at is not None and at[path[-1]] is not None:
            data = _set(data, path, at[path[-1]] * 1000)
    return data


def _register(client: SchemaRegistryClient, schema: dict[str, Any]) -> int:  # noqa: F811
    return client.register_schema(f"w-{uuid.uuid4().hex}", Schema(json.dumps(schema), "AVRO"))


def _key(event) -> bytes:
    return event.partition_key.encode()


# --- 1. outside years 1-9999: one CORRUPT_PAYLOAD dead letter, whatever the writer ------


CASES = [(record, path, kind, side) for record, paths in TIMESTAMPS.items()
         for path in paths for kind in ("own", "plain-long", "micros")
         for side in ("before", "after")]


@pytest.mark.parametrize("record,path,kind,side", CASES,
                         ids=[f"{r}.{'.'.join(p)}-{k}-{s}" for r, p, k, s in CASES])
def test_a_timestamp_outside_years_1_to_9999_is_a_corrupt_payload_dead_letter(
        client, serde, record, path, kind, side):  # noqa: F811
    event = _event(record)
    millis = LOW - 1 if side == "before" else HIGH + 1
    data = _as_written(_set(event.to_avro(), path, millis), record, kind)
    schema = _writer(record, kind)
    value = framed(_register(client, schema), schema, data)
    published = Pipeline(serde).published(value, key=_key(event))
    assert [(type(m), getattr(m, "reason", None)) for m in published] == [
        (DeadLetter, DeadLetterReason.CORRUPT_PAYLOAD)], published


@pytest.mark.parametrize("record", list(TIMESTAMPS))
@pytest.mark.parametrize("kind", ["own", "plain-long"])
def test_the_largest_long_is_refused_too(client, serde, record, kind):  # noqa: F811
    """fastavro's datetime refused it with another error (a C int overflow)."""
    event = _event(record)
    schema = _writer(record, kind)
    data = _set(event.to_avro(), TIMESTAMPS[record][0], 2**63 - 1)
    error = decode_error(serde, framed(_register(client, schema), schema, data))
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert "outside years 1 to 9999" in error.message


@pytest.mark.parametrize("record", list(TIMESTAMPS))
@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.parametrize("millis", [LOW, HIGH, -1, 0])
def test_the_first_and_last_millisecond_decode_exactly(client, serde, record, kind, millis):  # noqa: F811
    event = _event(record)
    schema = _writer(record, kind)
    sid = _register(client, schema)
    for path in TIMESTAMPS[record]:
        data = _as_written(_set(event.to_avro(), path, millis), record, kind)
        decoded = serde.decode_gateway_event(framed(sid, schema, data), TOPIC, 0, 1)
        at: Any = decoded
        for name in path:
            at = getattr(at, name)
        assert at == millis and type(at) is int, path


# --- 2. the model's other refusals, through the same path ------------------------------


def test_timestamp_millis_on_a_field_ratchet_reads_as_a_number_is_still_refused(client, serde):  # noqa: F811
    """Logical types are judged as the writer declared them, before its timestamps are
    read as longs: ``token_count`` declared a timestamp stays ``SCHEMA_MISMATCH``."""
    schema = _writer("TurnCompleted", "own")
    artifact = schema["fields"][[f["name"] for f in schema["fields"]].index("token_artifact")]
    record = artifact["type"][1]
    for field in record["fields"]:
        if field["name"] == "token_count":
            field["type"] = {"type": "long", "logicalType": "timestamp-millis"}
    error = decode_error(serde, framed(_register(client, schema), schema, _turn().to_avro()))
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "TokenArtifact.token_count has logicalType 'timestamp-millis'" in error.message


def _field_type(schema: dict[str, Any], record: str, name: str, new: Any) -> dict[str, Any]:
    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "record" and node.get("name") == record:
                for field in node["fields"]:
                    if field["name"] == name:
                        field["type"] = new
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)
    visit(schema)
    return schema


def test_a_wider_or_narrower_writer_type_meets_the_same_answer(client, serde):  # noqa: F811
    turn = _turn()
    # Item.content written as a string: promoted to bytes, the same model
    schema = _field_type(_writer("TurnCompleted", "own"), "Item", "content", "string")
    data = turn.to_avro()
    for item in (*data["input_items"], *data["output_items"]):
        item["content"] = item["content"].decode()
    assert serde.decode_gateway_event(framed(_register(client, schema), schema, data),
                                      TOPIC, 0, 1) == turn
    # event_id written as bytes that are not UTF-8: not a string
    schema = _field_type(_writer("TurnCompleted", "own"), "TurnCompleted", "event_id", "bytes")
    value = framed(_register(client, schema), schema, turn.to_avro() | {"event_id": b"\xff\xfe"})
    assert decode_error(serde, value).reason is DeadLetterReason.CORRUPT_PAYLOAD
    # attempt written as a long: Avro does not narrow it to ratchet's int
    schema = _field_type(_writer("TurnCompleted", "own"), "TurnCompleted", "attempt", "long")
    value = framed(_register(client, schema), schema, turn.to_avro())
    assert decode_error(serde, value).reason is DeadLetterReason.SCHEMA_MISMATCH


def test_an_item_outside_the_catalogue_is_still_unknown_item_type(client, serde):  # noqa: F811
    turn = _turn()
    data = turn.to_avro()
    data["output_items"][0]["type"] = "hologram"
    schema = _writer("TurnCompleted", "plain-long")
    published = Pipeline(serde).published(framed(_register(client, schema), schema, data),
                                          key=_key(turn))
    assert [(type(m), m.reason) for m in published] == [
        (PromotionRejected, RejectionReason.UNKNOWN_ITEM_TYPE)]


# --- 3. valid records: the old path and the serde build equal models --------------------


def _old_path(record: str, schema: dict[str, Any], body: bytes) -> Any:
    """fastavro with the writer's declared logical types (datetimes), then the model's
    validation: what the serde did before session 47 (its checks aside). A schema that
    is ratchet's but for docs was read without resolution, any other against ratchet's."""
    own = json.loads(avsc.schema_text(record))
    strip = json.dumps(own).replace('"doc": "', '"doc": "(gateway) ')
    reader = None if json.dumps(schema) in (json.dumps(own), strip) else avsc.parsed(record)
    data = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(schema), reader)
    return MODELS_BY_RECORD[record].from_avro(data)


instants = st.integers(LOW, HIGH)


@st.composite
def _valid(draw) -> tuple[str, str, dict[str, Any]]:
    record = draw(st.sampled_from(list(TIMESTAMPS)))
    kind = draw(st.sampled_from(WRITERS))
    data = _event(record).to_avro()
    for path in TIMESTAMPS[record]:
        nullable = path == ("expires_at",) or len(path) == 2
        if len(path) == 2 and draw(st.booleans()):
            data = _set(data, path[:1], None)  # the artifact, proof or receipt left out
            continue
        at: Any = data
        for name in path[:-1]:
            at = at[name]
        if at is None:
            continue
        value = draw(st.one_of(st.none(), instants) if nullable and len(path) == 1 else instants)
        data = _set(data, path, value)
    return record, kind, data


def test_valid_records_build_equal_models_on_both_paths():
    client = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})  # noqa: F811
    register_schemas(client, compatibility=False)
    serde = EventSerde(client)  # noqa: F811
    writers = {(r, k): (_writer(r, k), None) for r in TIMESTAMPS for k in WRITERS}
    ids = {key: _register(client, schema) for key, (schema, _) in writers.items()}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_valid())
    def check(case: tuple[str, str, dict[str, Any]]) -> None:
        record, kind, data = case
        schema = writers[record, kind][0]
        value = framed(ids[record, kind], schema, _as_written(data, record, kind))
        new = serde.decode_gateway_event(value, TOPIC, 0, 1)
        old = _old_path(record, schema, value[5:])
        assert new == old
        assert new.model_dump() == old.model_dump()
        for path in TIMESTAMPS[record]:
            at: Any = new
            for name in path:
                at = None if at is None else getattr(at, name)
            assert at is None or type(at) is int

    check()
