"""Records fastavro would read that are still undecodable (CONTRACT section 4:
"Undecodable record -> dead-letters; processing continues. Never crash, never skip
silently"), and dead letters that must always be publishable.

* a header's schema id is unsigned 32-bit, ``DeadLetter.schema_id`` an Avro ``int``;
* bytes left after the body: not written with the schema its id names, or damaged;
* ``int``/``long`` fields beyond 32/64 bits (fastavro reads an ``int`` as a long varint).

The serde runs on confluent-kafka's in-process ``mock://`` registry (the fixtures of
``test_avro_serde.py``); the processor tests run the core with the real codec and the
in-memory store and ledger.
"""

from __future__ import annotations

import asyncio
import io
import json
import struct
from datetime import UTC, datetime

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema

from ratchet.samples import NOW_MS, make_tool_effect, make_turn, make_turn_cancelled, new_id
from schemas import avro_ranges, avsc
from schemas.avro import EventSerde, dead_letter_for
from schemas.errors import DecodeError
from schemas.models import CheckpointPromoted, DeadLetter, DeadLetterReason
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.app import Runtime, _encode
from streams.codec import RegistryCodec
from streams.health import Health
from streams.processor import PromotionProcessor
from streams.records import RawRecord
from streams.retry import Backoff, LaneStopped, retry_until_done
from streams.topics import Topics
from tests.unit.registry_mock import TOPIC, client, serde  # noqa: F401 - fixtures

TOPICS = Topics.with_prefix("t.")


class Pipeline:
    """The processor core with the real codec, as ``streams/app.py`` runs it."""

    def __init__(self, serde: EventSerde) -> None:  # noqa: F811 - the fixture's value
        self.serde = serde
        self.codec = RegistryCodec(serde)
        self.processor = PromotionProcessor(
            MemoryCheckpointStore(StoreOptions()), MemoryLedger(), self.codec, TOPICS,
            clock_ms=lambda: NOW_MS)
        self.runtime = Runtime(processor=self.processor, codec=self.codec, health=Health(),
                               topics=TOPICS, backoff=Backoff(base_s=0.001, cap_s=0.001,
                                                              jitter=0))
        self.offset = 0

    def handle(self, value: bytes | None, key: bytes = b"conv_1"):
        self.offset += 1
        return self.processor.handle(RawRecord(TOPICS.gateway_events, 0, self.offset, key, value))

    def published(self, value: bytes | None, key: bytes = b"conv_1") -> list:
        """What the lane publishes for ``value`` (step 1, then ``_encode``, retried as
        the lane retries it); raises ``LaneStopped`` if it never gets through."""
        attempts = 0

        async def step():
            nonlocal attempts
            attempts += 1
            return _encode(self.runtime, self.handle(value, key))

        messages = asyncio.run(retry_until_done(
            step, lane="t.gateway-events[0]", health=self.runtime.health,
            backoff=self.runtime.backoff, stopping=lambda: attempts >= 5))
        return [self.serde.decode(v, topic, 0, 0) for topic, _, v in messages]


def framed(schema_id: int, schema: object, record: dict) -> bytes:
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    return b"\x00" + struct.pack(">I", schema_id) + body.getvalue()


def decode_error(serde: EventSerde, value: bytes) -> DecodeError:  # noqa: F811
    with pytest.raises(DecodeError) as caught:
        serde.decode_gateway_event(value, TOPIC, 1, 99)
    return caught.value


def registered_id(serde: EventSerde, event) -> int:  # noqa: F811
    return struct.unpack(">I", serde.encode(event, TOPIC)[1:5])[0]


# --- 1. a dead letter can always be encoded ---------------------------------------------


@pytest.mark.parametrize("schema_id", [2**31, 2**32 - 1])
def test_a_schema_id_beyond_an_avro_int_is_dead_lettered_and_published(serde, schema_id):  # noqa: F811
    """The header's id is unsigned 32-bit; an unknown one above 2**31-1 used to make a
    dead letter that could not be encoded, retried forever: the partition stalled."""
    value = b"\x00" + schema_id.to_bytes(4, "big") + b"\x02garbage"
    [letter] = Pipeline(serde).published(value)
    assert isinstance(letter, DeadLetter)
    assert letter.reason is DeadLetterReason.UNKNOWN_SCHEMA_ID
    assert letter.schema_id is None and f"schema id {schema_id}" in letter.error
    assert letter.value == value and letter.key == b"conv_1"


def test_dead_letter_for_keeps_an_id_beyond_an_int_in_the_error_text(serde):  # noqa: F811
    error = DecodeError(DeadLetterReason.CORRUPT_PAYLOAD, "3 bytes left", topic=TOPIC,
                        partition=0, offset=5, schema_id=2**31)
    letter = dead_letter_for(error, key=None, value=b"\x00\x80\x00\x00\x00x", now_ms=NOW_MS)
    assert letter.schema_id is None and letter.error.startswith("schema id 2147483648")
    assert serde.decode(serde.encode(letter, "ratchet.dead-letters"), "d", 0, 0) == letter


def test_a_schema_id_that_fits_an_int_is_kept(serde):  # noqa: F811
    error = DecodeError(DeadLetterReason.UNKNOWN_SCHEMA_ID, "not found", topic=TOPIC,
                        partition=0, offset=5, schema_id=2**31 - 1)
    letter = dead_letter_for(error, key=None, value=None, now_ms=NOW_MS)
    assert letter.schema_id == 2**31 - 1 and letter.error == str(error)


def test_an_error_text_that_is_not_utf8_is_escaped_and_published(client, serde):  # noqa: F811
    """``DeadLetter.error`` comes from raw input too: a registry schema named with a
    JSON ``\\udc80`` escape gives a lone surrogate in the UNEXPECTED_RECORD_TYPE text,
    which UTF-8 cannot encode (the other way a dead letter failed to encode)."""
    schema = '{"type": "record", "name": "X\\udc80", "fields": []}'
    schema_id = client.register_schema("odd-name", Schema(schema, "AVRO"))
    value = b"\x00" + struct.pack(">I", schema_id) + b"\x00"
    [letter] = Pipeline(serde).published(value)
    assert letter.reason is DeadLetterReason.UNEXPECTED_RECORD_TYPE
    assert "X\\udc80 (not io.ratchet.*) is not one of" in letter.error and letter.schema_id == schema_id


# --- 2. bytes left after the body ---------------------------------------------------------


@pytest.mark.parametrize("extra", [b"\x00", b"\x02\x04\x06"])
def test_bytes_after_the_body_are_corrupt_payload(serde, extra):  # noqa: F811
    value = serde.encode(make_turn(), TOPIC) + extra
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert f"{len(extra)} bytes left after the TurnCompleted body" in error.message
    assert error.offset == 99 and error.schema_id == registered_id(serde, make_turn())


def test_a_newer_writer_schema_labelled_with_an_older_id_is_not_read_short(client, serde):  # noqa: F811
    """A gateway writes with a newer TurnCancelled (one field appended) but frames the
    body with the id of today's: read with today's schema, the appended field used to
    vanish. Under the newer schema's own id the same body decodes (resolution drops
    the field it does not know, as BACKWARD evolution means)."""
    cancel = make_turn_cancelled(make_turn())
    newer = json.loads(avsc.schema_text("TurnCancelled"))
    newer["fields"].append({"name": "reason_text", "type": "string", "default": ""})
    record = cancel.to_avro() | {"reason_text": "user pressed stop"}
    old_id = registered_id(serde, cancel)
    error = decode_error(serde, framed(old_id, newer, record))
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD and "bytes left" in error.message

    new_id_ = client.register_schema("newer-cancel", Schema(json.dumps(newer), "AVRO"))
    assert serde.decode_gateway_event(framed(new_id_, newer, record), TOPIC, 0, 1) == cancel


def test_a_turn_with_bytes_after_its_body_is_dead_lettered_not_promoted(serde):  # noqa: F811
    turn = make_turn(conversation_id=new_id("conv"))
    value = serde.encode(turn, TOPIC) + b"\x02\x04\x06"
    published = Pipeline(serde).published(value, key=turn.partition_key.encode())
    assert [type(m) for m in published] == [DeadLetter]
    assert published[0].reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert published[0].value == value


# --- 3. int/long fields beyond 32/64 bits ---------------------------------------------


@pytest.mark.parametrize("attempt", [2**31, 2**40, -(2**31) - 1, 2**63 - 1])
def test_an_int_field_beyond_32_bits_is_corrupt_payload(serde, attempt):  # noqa: F811
    turn = make_turn()
    value = framed(registered_id(serde, turn), avsc.inlined("TurnCompleted"),
                   turn.to_avro() | {"attempt": attempt})
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert f"TurnCompleted.attempt = {attempt}: outside the 32-bit range of an Avro int" \
        in error.message


@pytest.mark.parametrize("attempt", [2**31 - 1, -(2**31), 1])
def test_the_ends_of_the_int_range_decode(serde, attempt):  # noqa: F811
    turn = make_turn(attempt=attempt)
    assert serde.decode_gateway_event(serde.encode(turn, TOPIC), TOPIC, 0, 1) == turn


def test_an_int_inside_an_array_of_records_is_checked_too(serde):  # noqa: F811
    turn = make_turn()
    data = turn.to_avro()
    data["output_items"] = [*data["output_items"][:-1],
                            data["output_items"][-1] | {"format_version": 2**35}]
    value = framed(registered_id(serde, turn), avsc.inlined("TurnCompleted"), data)
    error = decode_error(serde, value)
    last = len(data["output_items"]) - 1
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert f"TurnCompleted.output_items[{last}].format_version = {2**35}" in error.message


def test_an_int_inside_a_nullable_record_is_checked_too(serde):  # noqa: F811
    effect = make_tool_effect("call_1", idempotency_key="idem_1")
    data = effect.to_avro()
    assert data["output"] is not None
    data["output"] = data["output"] | {"format_version": -(2**33)}
    value = framed(registered_id(serde, effect), avsc.inlined("ToolEffect"), data)
    error = decode_error(serde, value)
    assert error.reason is DeadLetterReason.CORRUPT_PAYLOAD
    assert "ToolEffect.output.format_version" in error.message


def test_a_long_field_beyond_64_bits_is_reported():
    """fastavro's C reader wraps a varint longer than 64 bits, so a long beyond them
    only comes from its pure-Python reader: the check is asked directly."""
    check = avro_ranges.range_check("TurnCompleted")
    data = make_turn(expected_head_seq=3).to_avro()
    assert check(data) is None
    assert check(data | {"expected_head_seq": 2**63}) == (
        f".expected_head_seq = {2**63}: outside the 64-bit range of an Avro long")
    assert check(data | {"expected_head_seq": 2**63 - 1}) is None


def test_a_turn_with_a_32_bit_overflow_is_dead_lettered_not_republished(serde):  # noqa: F811
    """fastavro writes attempt = 2**40 into an Avro int without a word; promoted, it
    went on in CheckpointPromoted.attempt, which Java and Go readers refuse."""
    turn = make_turn(conversation_id=new_id("conv"), attempt=2**40)
    value = serde.encode(turn, TOPIC)
    published = Pipeline(serde).published(value, key=turn.partition_key.encode())
    assert not any(isinstance(m, CheckpointPromoted) for m in published)
    assert [(type(m), m.reason) for m in published] == [
        (DeadLetter, DeadLetterReason.CORRUPT_PAYLOAD)]


def test_every_record_has_a_range_check_of_its_int_and_long_fields_only():
    """Derived from the reader schemas: timestamps (epoch milliseconds within years
    1-9999, or a datetime a writer's timestamp-micros was read as) are checked too."""
    for record in avsc.TOP_LEVEL_RECORDS:
        assert callable(avro_ranges.range_check(record))
    cancel = make_turn_cancelled(make_turn()).to_avro()
    assert avro_ranges.range_check("TurnCancelled")(cancel) is None
    assert avro_ranges.range_check("TurnCancelled")(cancel | {"cancelled_at": 2**62}) == (
        f".cancelled_at = {2**62}: outside years 1 to 9999 (epoch milliseconds "
        "-62135596800000 to 253402300799999)")
    read_as_datetime = cancel | {"produced_at": datetime(9999, 12, 31, tzinfo=UTC)}
    assert avro_ranges.range_check("TurnCancelled")(read_as_datetime) is None


def test_the_range_check_follows_maps_named_references_and_recursion():
    node = {"type": "record", "name": "Node", "namespace": "x", "fields": [
        {"name": "value", "type": "int"},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "next", "type": ["null", "Node"]}]}
    check = avro_ranges._compile(node, {}, "io.ratchet")
    leaf = {"value": 1, "counts": {"a": 2**40}, "next": None}
    assert check({"value": 2, "counts": {}, "next": leaf}) is None
    assert check({"value": 2, "counts": {}, "next": leaf | {"value": 2**31}}) == (
        f".next.value = {2**31}: outside the 32-bit range of an Avro int")
    assert check(leaf | {"counts": {"b": -(2**63) - 1}}) == (
        f".counts['b'] = {-(2**63) - 1}: outside the 64-bit range of an Avro long")
    with pytest.raises(NotImplementedError):  # which branch a value took is unknown
        avro_ranges._compile(["null", "int", "string", {"type": "array", "items": "long"}], {}, "x")


def test_the_range_check_is_derived_once_not_per_record(serde, monkeypatch):  # noqa: F811
    turn = make_turn()
    value = serde.encode(turn, TOPIC)
    serde.decode_gateway_event(value, TOPIC, 0, 0)

    def compiled_again(*args, **kwargs):
        raise AssertionError("range check derived again")

    monkeypatch.setattr(avro_ranges, "_compile", compiled_again)
    for offset in range(3):
        assert serde.decode_gateway_event(value, TOPIC, 0, offset) == turn


def test_a_lane_never_stalls_on_any_of_these(serde):  # noqa: F811
    """Every record above is published as one dead letter in one attempt."""
    turn = make_turn(conversation_id=new_id("conv"))
    key = turn.partition_key.encode()
    pipeline = Pipeline(serde)
    good = serde.encode(turn, TOPIC)
    for value in (b"\x00\xff\xff\xff\xff\x02x", good + b"\x00",
                  serde.encode(make_turn(conversation_id=new_id("conv"), attempt=2**33), TOPIC)):
        try:
            [letter] = pipeline.published(value, key=key)
        except LaneStopped as exc:  # pragma: no cover - the failure being guarded against
            pytest.fail(f"lane stalled: {exc}")
        assert isinstance(letter, DeadLetter)


# --- a writer's own timestamp logical types (docs/gateway-protocol.md section 2) -------------


def _with_produced_at(logical_type: str) -> dict:
    schema = json.loads(avsc.schema_text("TurnCancelled"))
    for field in schema["fields"]:
        if field["name"] == "produced_at":
            field["type"] = {"type": "long", "logicalType": logical_type}
    return schema


def test_a_writer_declaring_timestamp_micros_is_read_as_the_same_instant(client, serde):  # noqa: F811
    """A Java gateway may declare its timestamps in microseconds: the writer's logical
    type decides how the long is read, so the instant is the one it meant."""
    cancel = make_turn_cancelled(make_turn())
    schema = _with_produced_at("timestamp-micros")
    schema_id = client.register_schema("micros-cancel", Schema(json.dumps(schema), "AVRO"))
    record = cancel.to_avro() | {"produced_at": cancel.produced_at * 1000}  # microseconds
    assert serde.decode_gateway_event(framed(schema_id, schema, record), TOPIC, 0, 1) == cancel


@pytest.mark.parametrize("logical_type", ["local-timestamp-millis", "local-timestamp-micros"])
def test_a_timestamp_without_a_time_zone_is_refused(client, serde, logical_type):  # noqa: F811
    """``local-timestamp-*`` carries no zone: refused, never taken as UTC or as the
    worker's local time. Since session 34 before any body is read (a writer logical
    type ratchet's field does not have: ``SCHEMA_MISMATCH``; it was ``INVALID_EVENT``
    once read as a naive time)."""
    cancel = make_turn_cancelled(make_turn())
    schema = _with_produced_at(logical_type)
    schema_id = client.register_schema(f"{logical_type}-cancel",
                                       Schema(json.dumps(schema), "AVRO"))
    naive = datetime.fromtimestamp(cancel.produced_at / 1000, tz=UTC).replace(
        tzinfo=None)
    record = cancel.to_avro() | {"produced_at": naive}
    error = decode_error(serde, framed(schema_id, schema, record))
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert f"TurnCancelled.produced_at has logicalType {logical_type!r}" in error.message


@pytest.mark.parametrize("field,value,said", [
    ("tool_name", "t" * 129, "tool_name of 129 characters"),
    ("tool_name", "", "tool_name of 0 characters"),
    ("call_id", "c" * 201, "call_id of 201 characters"),
    ("arguments_digest", "A" * 64, "is not a sha256 hex digest"),
    ("arguments_digest", "0" * 63, "is not a sha256 hex digest"),
])
def test_a_tool_effect_with_an_unbounded_field_is_dead_lettered(serde, field, value, said):  # noqa: F811
    """Each orphan of an effect carries its tool_name, call_id and arguments_digest, and
    every small turn of the request that leaves the effect unused orphans it again: 60
    effects with 4 MB names made each 1.7 KB turn publish 240 MB (an outside review,
    session 34). Held to the claims API's bounds."""
    effect = make_tool_effect("call_1", idempotency_key=new_id("idem")).model_copy(
        update={field: value})
    [letter] = Pipeline(serde).published(serde.encode(effect, TOPIC), key=b"conv_1")
    assert isinstance(letter, DeadLetter)
    assert letter.reason is DeadLetterReason.INVALID_EVENT
    assert said in letter.error


def test_a_tool_effect_within_the_bounds_is_recorded(serde):  # noqa: F811
    effect = make_tool_effect("c" * 200, idempotency_key=new_id("idem"), tool_name="t" * 128)
    assert Pipeline(serde).published(serde.encode(effect, TOPIC), key=b"conv_1") == []
