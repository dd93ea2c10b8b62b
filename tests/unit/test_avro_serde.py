"""Confluent wire format through confluent-kafka's in-process ``mock://`` registry."""

from __future__ import annotations

import io
import json
import struct
import uuid

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from ratchet.samples import (
    NOW_MS,
    make_checkpoint_promoted,
    make_dead_letter,
    make_effect_orphaned,
    make_promotion_rejected,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
)
from schemas import avsc
from schemas.avro import EventSerde, dead_letter_for, encode_key, subject_for
from schemas.errors import DecodeError, EncodeError, RegistryUnavailable
from schemas.limits import (
    CLIENT_MAX_BYTES,
    DEAD_LETTER_MAX_MESSAGE_BYTES,
    MIB,
    TOPIC_MAX_MESSAGE_BYTES,
)
from schemas.models import DeadLetter, DeadLetterReason, OrphanReason, RejectionReason
from tests.unit import registry_mock

TOPIC = registry_mock.TOPIC
# The shared mock registry's fixtures (tests/unit/registry_mock.py).
client, serde = registry_mock.client, registry_mock.serde


def outcome_events():
    return [
        make_checkpoint_promoted(),
        make_promotion_rejected(head_seq=4),
        make_effect_orphaned(
            reason=OrphanReason.TURN_REJECTED, rejection_reason=RejectionReason.CORRUPT
        ),
        make_dead_letter(),
    ]


def gateway_events():
    turn, effects = make_tool_loop_turn(rounds=3, total_items=20)
    return [turn, effects[0], make_turn_cancelled(turn), make_turn(certified=False)]


@pytest.mark.parametrize("event", gateway_events(), ids=lambda e: type(e).__name__)
def test_gateway_events_round_trip(serde: EventSerde, event) -> None:
    value = serde.encode(event, TOPIC)
    assert value[0] == 0
    assert serde.decode_gateway_event(value, TOPIC, 0, 7) == event


@pytest.mark.parametrize("event", outcome_events(), ids=lambda e: type(e).__name__)
def test_outcome_events_round_trip(serde: EventSerde, event) -> None:
    assert serde.decode(serde.encode(event, "ratchet.x"), "ratchet.x", 0, 0) == event


def test_subjects_follow_the_record_name_strategy(client, serde) -> None:
    serde.encode(make_turn(), "any.prefix.gateway-events")
    assert subject_for("TurnCompleted") == "io.ratchet.TurnCompleted"
    assert set(client.get_subjects()) == {avsc.full_name(r) for r in avsc.TOP_LEVEL_RECORDS}


def test_gateway_topic_refuses_other_record_types(serde) -> None:
    value = serde.encode(outcome_events()[0], TOPIC)
    with pytest.raises(DecodeError) as caught:
        serde.decode_gateway_event(value, TOPIC, 3, 42)
    assert caught.value.reason is DeadLetterReason.UNEXPECTED_RECORD_TYPE
    assert (caught.value.topic, caught.value.partition, caught.value.offset) == (TOPIC, 3, 42)


def decode_reason(serde: EventSerde, value: bytes | None) -> DeadLetterReason:
    with pytest.raises(DecodeError) as caught:
        serde.decode_gateway_event(value, TOPIC, 1, 99)
    assert caught.value.offset == 99
    return caught.value.reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, DeadLetterReason.NULL_VALUE),
        (b"", DeadLetterReason.TRUNCATED),
        (b"\x00\x00\x01", DeadLetterReason.TRUNCATED),
        (b'{"json": "not avro"}', DeadLetterReason.BAD_MAGIC_BYTE),
        (b"\x01\x00\x00\x00\x01payload", DeadLetterReason.BAD_MAGIC_BYTE),
        (b"\x00\x00\x00\x30\x39payload", DeadLetterReason.UNKNOWN_SCHEMA_ID),
    ],
    ids=["null", "empty", "short-header", "json", "magic-1", "unknown-id"],
)
def test_undecodable_headers(serde, value, reason) -> None:
    assert decode_reason(serde, value) is reason


def test_truncated_body(serde) -> None:
    value = serde.encode(make_turn(), TOPIC)
    assert decode_reason(serde, value[: len(value) // 2]) is DeadLetterReason.TRUNCATED
    assert decode_reason(serde, value[:5]) is DeadLetterReason.TRUNCATED


def test_garbage_body(serde) -> None:
    value = serde.encode(make_turn_cancelled(make_turn()), TOPIC)
    garbage = value[:5] + b"\xff" * 40  # huge negative lengths
    assert decode_reason(serde, garbage) in {
        DeadLetterReason.CORRUPT_PAYLOAD,
        DeadLetterReason.TRUNCATED,
    }


def test_schema_mismatch(client, serde) -> None:
    """A writer schema with our record's name but an incompatible field type."""
    foreign = json.loads(avsc.schema_text("TurnCancelled"))
    for field in foreign["fields"]:
        if field["name"] == "cancelled_at":
            field["type"] = "string"
    schema_id = client.register_schema("someone-else", Schema(json.dumps(foreign), "AVRO"))
    body = io.BytesIO()
    record = make_turn_cancelled(make_turn()).to_avro() | {"cancelled_at": "yesterday"}
    fastavro.schemaless_writer(body, fastavro.parse_schema(foreign), record)
    value = b"\x00" + struct.pack(">I", schema_id) + body.getvalue()
    assert decode_reason(serde, value) is DeadLetterReason.SCHEMA_MISMATCH


def test_a_writer_differing_only_in_docs_is_read_without_resolution(client, serde,
                                                                     monkeypatch) -> None:
    """Doc strings never change decoding: a gateway that registered other docs is read
    with its own schema alone (resolving against ours doubled the decode's cost), and
    gives the same event."""
    writer = json.loads(avsc.schema_text("TurnCompleted"))
    writer["doc"] = "registered by a gateway with other docs"
    for field in writer["fields"]:
        field["doc"] = f"other words for {field['name']}"
    schema_id = client.register_schema("gateway-docs", Schema(json.dumps(writer), "AVRO"))
    turn = make_turn()
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(writer), turn.to_avro())
    value = b"\x00" + struct.pack(">I", schema_id) + body.getvalue()

    def no_resolution(record: str):
        raise AssertionError(f"resolved against the reader schema of {record}")

    monkeypatch.setattr(avsc, "parsed", no_resolution)
    assert serde.decode_gateway_event(value, TOPIC, 0, 1) == turn


def test_dead_letter_keeps_the_bytes_and_the_source(serde) -> None:
    with pytest.raises(DecodeError) as caught:
        serde.decode_gateway_event(b"\x07junk", TOPIC, 2, 11)
    letter = dead_letter_for(
        caught.value, key=encode_key("conv_1"), value=b"\x07junk", now_ms=NOW_MS
    )
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (TOPIC, 2, 11)
    assert letter.reason is DeadLetterReason.BAD_MAGIC_BYTE and letter.value == b"\x07junk"
    assert serde.decode(serde.encode(letter, "ratchet.dead-letters"), "d", 0, 0) == letter


def test_unregistered_schema_is_an_encode_error() -> None:
    empty = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})
    with pytest.raises(EncodeError):
        EventSerde(empty).encode(make_turn(), TOPIC)
    assert EventSerde(empty, auto_register=True).encode(make_turn(), TOPIC)[0] == 0


def test_unreachable_registry_is_retryable_not_a_dead_letter() -> None:
    client = SchemaRegistryClient({"url": "http://127.0.0.1:9", "timeout": 2, "max.retries": 0})
    with pytest.raises(RegistryUnavailable) as caught:
        EventSerde(client).decode_gateway_event(b"\x00\x00\x00\x00\x01x", TOPIC, 0, 0)
    assert caught.value.retryable


def test_schemas_are_parsed_once() -> None:
    avsc.parsed.cache_clear()
    for _ in range(3):
        avsc.parsed("TurnCompleted")
    assert avsc.parsed.cache_info().misses == 1


@pytest.mark.parametrize("event", [*outcome_events(), *gateway_events()],
                         ids=lambda e: type(e).__name__)
def test_encoding_after_the_first_skips_the_serializer_with_the_same_bytes(client, event) -> None:
    """From the second event of a record type on, ``encode`` writes header + body
    itself (``_writer_of``): byte for byte what the registry serializer writes."""
    fast, reference = EventSerde(client), EventSerde(client)
    first = fast.encode(event, TOPIC)
    assert fast._writers[type(event).__name__] is not None  # the fast path is on
    again = fast.encode(event, TOPIC)
    reference._writers[type(event).__name__] = None  # the serializer every time
    assert again == first == reference.encode(event, TOPIC) == reference.encode(event, TOPIC)
    assert fast.decode(again, TOPIC, 0, 0) == event


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic's, on the broken field
def test_a_bad_value_is_an_encode_error_on_the_fast_path_too(serde) -> None:
    event = make_checkpoint_promoted()
    serde.encode(event, TOPIC)
    broken = event.model_copy(update={"seq": "not a number"})  # no validation on copy
    with pytest.raises(EncodeError):
        serde.encode(broken, TOPIC)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("encodes_before", [0, 1])
def test_a_long_beyond_64_bits_is_an_encode_error(client, encodes_before):
    """fastavro's ``OverflowError`` (an ``ArithmeticError``) left ``encode`` raw, on the
    registry serializer's path and on the fast one, where a bad value is ``EncodeError``
    (before session 51)."""
    serde = EventSerde(client)
    event = make_checkpoint_promoted()
    for _ in range(encodes_before):
        serde.encode(event, TOPIC)
    with pytest.raises(EncodeError):
        serde.encode(event.model_copy(update={"seq": 2**64}), TOPIC)


@pytest.mark.parametrize("key_mib", [0, 4, 8])
def test_a_dead_letter_of_any_gateway_record_fits_its_topic(serde, key_mib) -> None:
    # A dead letter carries the record's key twice (its Kafka key, and in its value) and
    # its value, plus at most 4 000 characters of error: a record the gateway topic
    # accepts (key + value up to TOPIC_MAX_MESSAGE_BYTES) must make a dead letter the
    # dead-letters topic accepts, or its publish is retried forever and the partition
    # stalls (found by an outside review of the worker's stream layer, 2026-12-04: a 4 MiB
    # key and an 11 MiB value made a 19.9 MiB dead letter against a 17 MiB limit).
    key = b"k" * (key_mib * MIB)
    value = b"\x07" + b"v" * (TOPIC_MAX_MESSAGE_BYTES - len(key) - 1)
    letter = DeadLetter(key=key, value=value, error="\U0001F600" * 4000,
                        reason=DeadLetterReason.BAD_MAGIC_BYTE, source_topic=TOPIC,
                        source_partition=0, source_offset=2**62, schema_id=None,
                        dead_lettered_at=NOW_MS)
    encoded = serde.encode(letter, "ratchet.dead-letters")
    record_overhead = 1024  # Kafka's record and batch headers, generously
    assert len(key) + len(encoded) + record_overhead <= DEAD_LETTER_MAX_MESSAGE_BYTES
    assert DEAD_LETTER_MAX_MESSAGE_BYTES < CLIENT_MAX_BYTES


def _framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


@pytest.mark.parametrize("name", ["TurnCompleted", "com.evil.TurnCompleted"])
def test_a_record_outside_ratchets_namespace_is_unexpected(client, serde, name) -> None:
    """docs/gateway-protocol.md section 2: records are ``io.ratchet.<Record>``. A record
    named ``TurnCompleted`` without a namespace, registered under another subject, was
    taken for ratchet's and promoted (found by an outside review, session 26)."""
    ours = json.loads(avsc.schema_text("TurnCompleted"))
    foreign = {**ours, "name": name}
    foreign.pop("namespace", None)
    schema_id = client.register_schema(f"other-{uuid.uuid4().hex}", Schema(
        json.dumps(foreign), "AVRO"))
    body = serde.encode(make_turn(), TOPIC)[5:]
    with pytest.raises(DecodeError) as caught:
        serde.decode_gateway_event(_framed(schema_id, body), TOPIC, 0, 1)
    assert caught.value.reason is DeadLetterReason.UNEXPECTED_RECORD_TYPE


def test_a_protobuf_schema_id_is_unexpected_not_unknown(client, serde) -> None:
    """A record framed with the id of a Protobuf schema was dead-lettered ``UNKNOWN``
    after a JSON error (found by an outside review, session 26)."""
    schema_id = client.register_schema(f"proto-{uuid.uuid4().hex}", Schema(
        'syntax = "proto3"; message M { string a = 1; }', "PROTOBUF"))
    with pytest.raises(DecodeError) as caught:
        serde.decode_gateway_event(_framed(schema_id, b"\x0a\x01a"), TOPIC, 0, 1)
    assert caught.value.reason is DeadLetterReason.UNEXPECTED_RECORD_TYPE
    assert "PROTOBUF" in str(caught.value)
