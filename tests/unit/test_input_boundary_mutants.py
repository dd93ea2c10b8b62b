"""What a mutation review of the input boundary (``schemas/``, session 50) found no test
holding: each test here fails with one hand-made defect of its module applied
(docs/decisions.md, "The input boundary under mutation")."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryError
from fastavro import parse_schema, schemaless_writer

from ratchet.samples import make_tool_effect, make_turn, new_id
from ratchet.speedups import SPEEDUPS
from schemas import avsc
from schemas.avro import _registry_call, dead_letter_for
from schemas.canonical import is_sha256_hex, json_containers, sha256_hex
from schemas.errors import DecodeError, RegistryUnavailable, TooManyElements
from schemas.ids import is_servable_id, unservable_id
from schemas.items import from_responses
from schemas.keys import key_problem, partition_key, root_problem
from schemas.limits import (
    DEAD_LETTER_MAX_MESSAGE_BYTES,
    MAX_EVENT_ELEMENTS,
    TOPIC_MAX_MESSAGE_BYTES,
)
from schemas.models import DeadLetterReason
from schemas.strict import plan_of, refusal_of, strict_violation, unsafe_shape
from schemas.writer_schema import foreign_logical_type, record_name_of
from tests.unit.registry_mock import TOPIC, client, serde  # noqa: F401 - fixtures
from tests.unit.test_decode_hardening import decode_error, framed

DIGEST = sha256_hex(b"request")


# --- schemas/canonical.py: what a digest is -----------------------------------------------

def test_a_digest_is_64_lowercase_hex_and_nothing_else() -> None:
    # A request's identity across retries is its request_digest compared as text: the
    # same sha256 in capitals would be "another request" of the same key.
    assert is_sha256_hex(DIGEST)
    assert not is_sha256_hex(DIGEST.upper())
    assert not is_sha256_hex(DIGEST[:-1] + "A")
    assert not is_sha256_hex(DIGEST + "0")  # 65 digits
    assert not is_sha256_hex(DIGEST + "\n")
    assert not is_sha256_hex(DIGEST[:63])


# --- schemas/keys.py: the Kafka key and a chain's first response ---------------------------

def test_a_record_without_a_kafka_key_is_not_at_its_partition_key() -> None:
    turn = make_turn()
    assert key_problem(turn, turn.partition_key.encode()) is None
    assert key_problem(turn, None) is not None
    assert key_problem(turn, turn.partition_key.encode() + b"x") is not None


def test_a_chain_first_response_may_name_only_itself_as_root() -> None:
    response_id = new_id("resp")
    own = make_turn(response_id=response_id, conversation_id=None, chain_root_id=response_id)
    unrooted = make_turn(response_id=response_id, conversation_id=None, chain_root_id=None)
    other = make_turn(response_id=response_id, conversation_id=None,
                      chain_root_id=new_id("resp"))
    assert root_problem(own) is None
    assert root_problem(unrooted) is None
    assert root_problem(other) is not None


def test_a_continued_chain_names_its_first_response_as_root() -> None:
    root = new_id("resp")
    continued = make_turn(conversation_id=None, chain_root_id=root,
                          previous_response_id=new_id("resp"))
    assert root_problem(continued) is None


@pytest.mark.parametrize("kafka_key", [None, b"anything"])
def test_a_continued_chain_without_a_root_leaves_its_key_to_its_own_rule(kafka_key) -> None:
    # MissingChainRoot decides such an event (INVALID_EVENT), not a key mismatch
    continued = make_turn(conversation_id=None, chain_root_id=None,
                          previous_response_id=new_id("resp"))
    assert key_problem(continued, kafka_key) is None


def test_an_empty_chain_root_is_still_the_key_it_names() -> None:
    # CONTRACT section 2: chain_root_id when set (not null). An empty one is set: the
    # key is "" (its turn is then CORRUPT by the id pattern), never the response id.
    turn = make_turn(conversation_id=None, chain_root_id="")
    assert partition_key(turn) == ""
    assert key_problem(turn, b"") is None
    assert key_problem(turn, turn.response_id.encode()) is not None


# --- schemas/writer_schema.py: a dotted name is a full name --------------------------------

def _registered(**schema: object) -> SimpleNamespace:
    return SimpleNamespace(schema_type="AVRO", schema_str=json.dumps(schema))


def test_a_dotted_record_name_ignores_the_namespace_beside_it() -> None:
    # Avro: a name holding a dot is the full name, its namespace attribute ignored
    ours = _registered(type="record", name="io.ratchet.TurnCompleted", namespace="elsewhere",
                       fields=[])
    theirs = _registered(type="record", name="elsewhere.TurnCompleted",
                         namespace="io.ratchet", fields=[])
    short = _registered(type="record", name="TurnCompleted", namespace="io.ratchet", fields=[])
    assert record_name_of(ours) == "TurnCompleted"
    assert record_name_of(short) == "TurnCompleted"
    assert record_name_of(theirs) != "TurnCompleted"


# --- schemas/limits.py: a dead letter of the largest gateway record is publishable ---------

def test_the_dead_letter_of_the_largest_gateway_record_fits_its_topic() -> None:
    # The dead letter carries the key twice (Kafka key and value) beside the value and
    # the error: a record of a key near the whole topic limit makes the largest one.
    key = b"k" * (TOPIC_MAX_MESSAGE_BYTES - 64)
    value = b"\x00\x00\x00\x00\x01"  # a header and no body
    error = DecodeError(DeadLetterReason.TRUNCATED, "no body after the header " + "x" * 500,
                        topic="t.gateway-events", partition=0, offset=1, schema_id=1)
    letter = dead_letter_for(error, key=key, value=value, now_ms=1)
    out = io.BytesIO()
    out.write(b"\x00" * 5)
    schemaless_writer(out, avsc.parsed("DeadLetter"), letter.to_avro())
    assert len(key) + out.tell() <= DEAD_LETTER_MAX_MESSAGE_BYTES


# --- schemas/strict.py: the Python walk's own bounds --------------------------------------

def test_a_long_varint_of_eleven_bytes_is_refused() -> None:
    # Ten bytes hold 64 bits; Java refuses an eleventh. Ten continuation bytes whose
    # last adds no bit beyond 64, then a last byte: the eleventh.
    assert strict_violation(bytes([0x80] * 10 + [0x00]), "long") is not None
    assert strict_violation(bytes([0x80] * 9 + [0x00]), "long") is None


def test_the_python_walk_refuses_one_element_past_its_bound() -> None:
    schema = parse_schema({"type": "array", "items": "int"})
    at_bound = bytes([4, 2, 2, 0])  # a block of two ints
    past = bytes([6, 2, 2, 2, 0])  # of three
    assert refusal_of(at_bound, schema, most_elements=2) is None
    refused = refusal_of(past, schema, most_elements=2)
    assert refused is not None and refused.too_many


# --- schemas/items.py: the content's id is the record's ------------------------------------

@pytest.mark.parametrize("own", [None, ""])
def test_an_item_without_its_own_id_takes_the_given_one_in_its_content(own) -> None:
    item = from_responses({"type": "message", "id": own, "role": "user", "content": []},
                          item_id="msg_given")
    assert item.item_id == "msg_given"
    assert json.loads(item.content)["id"] == "msg_given"


# --- session 50, the rest of the review (rmut4) ----------------------------------------------

def test_a_tenth_varint_byte_may_carry_bit_63_alone() -> None:
    # The tenth byte of a long holds bit 63 (its 0x01); any other bit is beyond 64 bits:
    # every one of them is refused, not only a full byte (0x7f).
    assert strict_violation(bytes([0xFF] * 9 + [0x01]), "long") is None
    for extra in (0x02, 0x04, 0x40, 0x03):
        assert strict_violation(bytes([0x80] * 9 + [extra]), "long") is not None, hex(extra)


def _array_of_records(nulls: int) -> object:
    fields = [{"name": f"n{i}", "type": "null"} for i in range(nulls)]
    return parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "array", "items": {
            "type": "record", "name": "I", "fields": [*fields, {"name": "b", "type": "boolean"}]}}}]})


def test_array_items_may_take_four_schema_nodes_a_byte_and_no_more() -> None:
    # An item of k nulls and a boolean is one byte and k + 2 nodes (its record, its
    # fields): at 4 nodes a byte it is read, at 5 refused (MAX_NODES_PER_BYTE, whose
    # bound the 131 M-node review bomb showed is needed; 5 was let through).
    assert unsafe_shape(_array_of_records(2)) is None
    assert unsafe_shape(_array_of_records(3)) is not None


def test_a_backslash_before_a_raw_newline_escapes_it_in_the_container_count() -> None:
    # Not JSON (a raw control character in a string), counted all the same, and as the C
    # twin counts it: the string runs over the newline to the next quote, so the "["
    # after it is outside (its twins' random test has no newline in its alphabet).
    text = b'"\\\n"['
    assert json_containers(text, 5) == 1
    if SPEEDUPS is not None:
        assert SPEEDUPS.json_containers(text, 5) == 1


def test_a_writer_that_left_a_field_out_is_a_schema_mismatch_beyond_the_bound_too(
        client, serde) -> None:  # noqa: F811 - the fixtures
    # Every body of such a writer is SCHEMA_MISMATCH; one holding more than
    # MAX_EVENT_ELEMENTS items must not become a rejection of the request instead.
    schema = json.loads(avsc.schema_text("TurnCompleted"))
    for field in schema["fields"]:
        if field["name"] == "tool_effect_ids":
            field["name"] = "effect_ids"
    schema_id = client.register_schema("renamed-ids", Schema(json.dumps(schema), "AVRO"))
    data = make_turn(conversation_id=new_id("conv")).to_avro()
    data["effect_ids"] = ["e"] * (MAX_EVENT_ELEMENTS + 1)
    del data["tool_effect_ids"]
    error = decode_error(serde, framed(schema_id, schema, data))
    assert type(error) is DecodeError
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH


# --- schemas/ids.py: the pattern's last alternative and the key ids -------------------------

def test_an_id_after_two_dots_is_bound_to_200_characters_in_all() -> None:
    assert is_servable_id(".." + "a" * 198)
    assert not is_servable_id(".." + "a" * 199)


def test_an_effect_id_no_row_could_be_keyed_by_is_found() -> None:
    # Cassandra refuses a key above 64 KiB: its write would stall the partition for good
    key = new_id("idem")
    assert unservable_id(make_tool_effect("call_1", idempotency_key=key)) is None
    effect = make_tool_effect("call_1", idempotency_key=key, effect_id="e" * 201)
    assert "effect_id" in (unservable_id(effect) or "")


# --- schemas/avro.py: the registry's 500 and a record another topic carries -----------------

def test_a_registry_500_is_unavailable_not_a_refusal() -> None:
    # Retried (the worker degraded), never a dead letter: 500 is a server error as 503 is
    def fails(status: int):
        def call():
            raise SchemaRegistryError(status, status * 100, "server error")
        return call
    for status in (500, 503, 408, 429):
        with pytest.raises(RegistryUnavailable):
            _registry_call(fails(status))
    with pytest.raises(SchemaRegistryError):
        _registry_call(fails(404))


def test_a_gateway_record_is_unexpected_where_outcomes_are_read(serde) -> None:  # noqa: F811
    turn = make_turn(conversation_id=new_id("conv"))
    with pytest.raises(DecodeError) as caught:
        serde.decode(serde.encode(turn, TOPIC), TOPIC, 0, 1, expected={"CheckpointPromoted"})
    assert caught.value.reason is DeadLetterReason.UNEXPECTED_RECORD_TYPE


# --- schemas/writer_schema.py and strict.py's plan: a micros instant, a zero-size fixed ----

def _turn_writer(field: str, kind: object) -> object:
    schema = json.loads(avsc.schema_text("TurnCompleted"))
    for each in schema["fields"]:
        if each["name"] == field:
            each["type"] = kind
    return parse_schema(schema)


def test_timestamp_micros_stands_only_where_ratchet_reads_timestamp_millis() -> None:
    # read as the same instant where ratchet's field is one (gateway-protocol section 2);
    # on a plain long fastavro would build a datetime of a sequence number
    micros = {"type": "long", "logicalType": "timestamp-micros"}
    reader = avsc.parsed("TurnCompleted")
    assert foreign_logical_type(_turn_writer("produced_at", micros), reader) is None
    refused = foreign_logical_type(_turn_writer("expected_head_seq", ["null", micros]), reader)
    assert refused is not None and "expected_head_seq" in refused


def test_the_c_walk_counts_through_a_zero_size_fixed() -> None:
    # A zero-size fixed is valid Avro and takes no byte: the C walk answers it, so a
    # writer's record holding one is counted there (refused as "cannot check", a body
    # beyond the element bound would be CORRUPT_PAYLOAD, not a rejection)
    if SPEEDUPS is None:
        pytest.fail("ratchet._speedups is not built")
    schema = parse_schema({"type": "record", "name": "Z", "fields": [
        {"name": "z", "type": {"type": "fixed", "name": "Empty", "size": 0}},
        {"name": "n", "type": {"type": "array", "items": "long"}}]})
    body = bytes([4, 2, 4, 0])  # no byte for z, then a block of two longs
    assert strict_violation(body, schema) is None
    assert SPEEDUPS.avro_counted(plan_of(schema), body, 10)[0] == 1  # conforms


# --- schemas/avro_bodies.py: a turn beyond the bound is read with its range check ----------

def test_a_turn_beyond_the_bound_with_an_int_beyond_32_bits_carries_no_identity(
        serde) -> None:  # noqa: F811 - the fixture
    # fastavro reads an int as a long varint and the model takes any int: without the
    # range check a rejection would be recorded with an attempt no Avro int holds
    if SPEEDUPS is None:
        pytest.fail("ratchet._speedups is not built")
    turn = make_turn(conversation_id=new_id("conv"))
    schema_id = int.from_bytes(serde.encode(turn, TOPIC)[1:5], "big")
    data = turn.to_avro() | {"attempt": 2**31,
                             "tool_effect_ids": ["e"] * (MAX_EVENT_ELEMENTS + 1)}
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(framed(schema_id, avsc.parsed("TurnCompleted"), data),
                                   TOPIC, 0, 1)
    assert caught.value.turn is None
