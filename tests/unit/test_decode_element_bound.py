"""A gateway event holds at most ``MAX_EVENT_ELEMENTS`` array items and map entries
(``schemas/limits.py``, docs/gateway-protocol.md "Size limit").

Why: fastavro and the model build objects per item, ~1.4 KB for a 7-byte item, so 4
MiB of tiny items took 877 MB to decode (the deployment's worker limit is 768 MiB: an
OOM kill on every restart of the partition's worker), and 200 000 valid 3-byte
subturns were decoded, stored and promoted with 150 MB. The body is counted before
fastavro builds anything: a ``TurnCompleted`` beyond the bound is read without its
arrays and rejected ``UNSUPPORTED_FORMAT`` like one above the size limit; any other
event, or a turn whose fields cannot be read safely, is dead-lettered ``INVALID_EVENT``.

The serde runs on confluent-kafka's in-process ``mock://`` registry, the processor on
the real codec with the in-memory store and ledger (``Pipeline``).
"""

from __future__ import annotations

import json
import tracemalloc

import pytest
from confluent_kafka.schema_registry import Schema

from ratchet import speedups
from ratchet.domain.bounds import elements_of
from ratchet.samples import make_tool_loop_turn, make_turn, new_id
from schemas import avro, avro_bodies, avsc
from schemas.errors import DecodeError, TooManyElements
from schemas.keys import partition_key
from schemas.limits import MAX_EVENT_ELEMENTS
from schemas.models import (
    CheckpointPromoted,
    DeadLetter,
    DeadLetterReason,
    EffectOrphaned,
    OrphanReason,
    PromotionRejected,
    RejectionReason,
    TurnCompleted,
    TurnStatus,
)
from tests.unit.registry_mock import TOPIC, client, serde  # noqa: F401 - fixtures
from tests.unit.test_decode_hardening import Pipeline, decode_error, framed, registered_id

C = speedups.load()
# The smallest Item Avro can carry: 7 bytes (six empty fields and format_version 0).
TINY_ITEM = {"item_id": "", "type": "", "role": None, "call_id": None, "content": b"",
             "content_digest": "", "format_version": 0}


def _with(serde, turn: TurnCompleted, **lists) -> bytes:  # noqa: F811 - the fixture's value
    """``turn`` framed under its registered schema id, with Avro-level lists appended to
    its own (items no model would build)."""
    data = turn.to_avro()
    for name, extra in lists.items():
        data[name] = list(data[name]) + extra
    return framed(registered_id(serde, turn), avsc.parsed("TurnCompleted"), data)


@pytest.fixture(params=["C", "Python"])
def twin(request, monkeypatch):
    """Which strict walk counts: the C walk, or the Python twin alone."""
    if request.param == "C" and C is None:
        pytest.fail("ratchet._speedups is not built (needs gcc, Python and OpenSSL headers)")
    monkeypatch.setattr(avro_bodies, "SPEEDUPS", C if request.param == "C" else None)
    return request.param


def test_tiny_items_beyond_the_bound_are_refused_before_anything_is_built(serde):  # noqa: F811
    """200 000 7-byte items (1.3 MiB): the old decode built ~280 MB of objects. Now the
    walk stops at the bound and the turn is read without its arrays: a few MB."""
    turn = make_turn(conversation_id=new_id("conv"))
    value = _with(serde, turn, output_items=[TINY_ITEM] * 200_000)
    serde.decode_gateway_event(serde.encode(turn, TOPIC), TOPIC, 0, 0)  # schemas parsed
    tracemalloc.start()
    try:
        with pytest.raises(TooManyElements) as caught:
            serde.decode_gateway_event(value, TOPIC, 0, 7)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB built"
    error = caught.value
    assert error.reason is DeadLetterReason.INVALID_EVENT
    assert f"more than {MAX_EVENT_ELEMENTS} array items and map entries" in error.message
    if C is not None:  # the turn's fields, without its arrays
        identity = error.turn
        assert isinstance(identity, TurnCompleted)
        assert (identity.response_id, identity.idempotency_key, identity.attempt) == (
            turn.response_id, turn.idempotency_key, turn.attempt)
        assert identity.output_items == identity.input_items == ()


@pytest.mark.parametrize("twin", ["C", "Python"], indirect=True)
def test_exactly_the_bound_decodes_and_one_more_is_too_many(serde, twin):  # noqa: F811
    """Counted over every array of the body (here effect ids of 3 bytes: a 0.4 MB
    body, longer than the bound, so it is walked)."""
    turn = make_turn(conversation_id=new_id("conv"))
    room = MAX_EVENT_ELEMENTS - elements_of(turn)
    ids = [f"e{i % 10}" for i in range(room)]
    decoded = serde.decode_gateway_event(_with(serde, turn, tool_effect_ids=ids), TOPIC, 0, 1)
    assert len(decoded.tool_effect_ids) == room
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(_with(serde, turn, tool_effect_ids=ids + ["e1"]),
                                   TOPIC, 0, 2)
    # Without the C module the rest of the body cannot be checked quickly: no identity
    assert (caught.value.turn is None) is (twin == "Python")


def _status_at(serde, turn: TurnCompleted) -> int:  # noqa: F811
    """Where the status enum's byte is in ``turn``'s framed value."""
    completed = serde.encode(turn, TOPIC)
    failed = serde.encode(turn.model_copy(update={"status": TurnStatus.FAILED}), TOPIC)
    [at] = [i for i, (a, b) in enumerate(zip(completed, failed, strict=True)) if a != b]
    return at


@pytest.mark.parametrize("twin", ["C", "Python"], indirect=True)
@pytest.mark.parametrize("damage", ["truncated", "trailing", "status"])
def test_a_long_damaged_body_is_refused_by_the_counting_walk(serde, twin, damage):  # noqa: F811
    """A body longer than the bound is walked before fastavro reads it; damage it finds
    is what fastavro's read would have said: TRUNCATED, or CORRUPT_PAYLOAD."""
    turn = make_turn(conversation_id=new_id("conv"))
    value = _with(serde, turn, tool_effect_ids=[f"e{i % 10}" for i in range(60_000)])
    assert len(value) > MAX_EVENT_ELEMENTS
    if damage == "truncated":
        value = value[:-50]
    elif damage == "trailing":
        value += b"\x00"
    else:  # the status enum index -6: fastavro read it as "completed" (session 33)
        at = _status_at(serde, turn)
        value = value[:at] + b"\x0b" + value[at + 1:]
    error = decode_error(serde, value)
    assert error.reason is (DeadLetterReason.TRUNCATED if damage == "truncated"
                            else DeadLetterReason.CORRUPT_PAYLOAD), error


def test_damage_after_the_bound_leaves_no_identity_to_reject(serde, monkeypatch):  # noqa: F811
    """Items beyond the bound, then a damaged field: the turn's fields are not read
    from such a body (a lenient read could change what they say): a dead letter."""
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    turn = make_turn(conversation_id=new_id("conv"))
    value = _with(serde, turn, output_items=[TINY_ITEM] * (MAX_EVENT_ELEMENTS + 1))
    value += b"\x00"  # a byte after the record
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(value, TOPIC, 0, 3)
    assert caught.value.turn is None


def test_a_tool_effect_beyond_the_bound_is_dead_lettered(serde, client):  # noqa: F811
    """A newer ToolEffect writer schema with an array ratchet does not read (an added
    field with a default, as FULL_TRANSITIVE allows): its items count all the same."""
    schema = json.loads(avsc.schema_text("ToolEffect"))
    schema["fields"].append({"name": "notes", "type": {"type": "array", "items": "string"},
                             "default": []})
    schema_id = client.register_schema("effect-with-notes", Schema(json.dumps(schema), "AVRO"))
    _, [effect, *_] = make_tool_loop_turn(rounds=1, conversation_id=new_id("conv"))
    data = effect.to_avro() | {"notes": ["n"] * (MAX_EVENT_ELEMENTS + 1)}
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(framed(schema_id, schema, data), TOPIC, 0, 4)
    assert caught.value.turn is None and caught.value.reason is DeadLetterReason.INVALID_EVENT
    # within the bound the same writer's records decode (the notes are not read)
    data["notes"] = ["n"] * 10
    decoded = serde.decode_gateway_event(framed(schema_id, schema, data), TOPIC, 0, 5)
    assert decoded == effect


# --- the processor: a typed rejection, recorded, nothing built ---------------------------

@pytest.mark.parametrize("twin", ["C"], indirect=True)
def test_a_turn_beyond_the_bound_is_rejected_unsupported_format(serde, twin):  # noqa: F811
    """Rejected like a turn above the size limit, recorded (a redelivery gets the same
    answer), with the attempt's recorded effects orphaned for compensation."""
    pipeline = Pipeline(serde)
    turn, effects = make_tool_loop_turn(rounds=1, conversation_id=new_id("conv"))
    key = partition_key(turn).encode()
    for effect in effects:
        assert pipeline.published(serde.encode(effect, TOPIC), key) == []
    value = _with(serde, turn, input_items=[TINY_ITEM] * (MAX_EVENT_ELEMENTS + 1))
    for _ in range(2):  # and its redelivery
        out = pipeline.published(value, key)
        [rejected] = [o for o in out if isinstance(o, PromotionRejected)]
        assert rejected.reason is RejectionReason.UNSUPPORTED_FORMAT
        assert rejected.response_id == turn.response_id
        assert f"at most {MAX_EVENT_ELEMENTS}" in rejected.detail
        orphans = [o for o in out if isinstance(o, EffectOrphaned)]
        assert sorted(o.effect_id for o in orphans) == sorted(e.effect_id for e in effects)
        assert {o.reason for o in orphans} == {OrphanReason.TURN_REJECTED}
    # the same attempt sent again within the bound gets the recorded rejection: an
    # outcome never flips
    again = pipeline.published(serde.encode(turn, TOPIC), key)
    assert [o.reason for o in again if isinstance(o, PromotionRejected)] == [
        RejectionReason.UNSUPPORTED_FORMAT]


@pytest.mark.parametrize("twin", ["C"], indirect=True)
def test_a_retry_beyond_the_bound_of_a_promoted_request_gets_the_promotion(serde, twin):  # noqa: F811
    pipeline = Pipeline(serde)
    turn = make_turn(conversation_id=new_id("conv"))
    key = partition_key(turn).encode()
    [promoted] = pipeline.published(serde.encode(turn, TOPIC), key)
    assert isinstance(promoted, CheckpointPromoted)
    retry = turn.model_copy(update={"attempt": 2, "event_id": new_id("e")})
    [again] = pipeline.published(_with(serde, retry, subturns=[
        {"index": 0, "ephemeral_artifact_ref": None, "effect_ids": []}] * 200_000), key)
    assert isinstance(again, CheckpointPromoted)
    assert (again.seq, again.attempt) == (promoted.seq, 1)


@pytest.mark.parametrize("twin", ["Python"], indirect=True)
def test_without_the_c_module_a_turn_beyond_the_bound_is_a_dead_letter(serde, twin):  # noqa: F811
    pipeline = Pipeline(serde)
    turn = make_turn(conversation_id=new_id("conv"))
    [letter] = pipeline.published(
        _with(serde, turn, output_items=[TINY_ITEM] * 150_000), partition_key(turn).encode())
    assert isinstance(letter, DeadLetter)
    assert letter.reason is DeadLetterReason.INVALID_EVENT
    assert f"more than {MAX_EVENT_ELEMENTS} array items" in letter.error


def test_an_ordinary_turn_is_not_walked_twice(serde, monkeypatch):  # noqa: F811
    """Bodies no longer than the bound cannot hold too many items: not counted."""
    monkeypatch.setattr(avro, "counted", _refuse_all)
    turn = make_turn(conversation_id=new_id("conv"))
    assert serde.decode_gateway_event(serde.encode(turn, TOPIC), TOPIC, 0, 6) == turn


def _refuse_all(*_args):
    raise AssertionError("a short body was counted")



# --- found by a review: the cost per item, twins, and writers ratchet cannot read -------------

def _writer_with(client, extra_fields: list, name: str) -> tuple[int, dict]:  # noqa: F811
    schema = json.loads(avsc.schema_text("TurnCompleted"))
    schema["fields"].extend(extra_fields)
    return client.register_schema(name, Schema(json.dumps(schema), "AVRO")), schema


def test_a_long_damaged_body_is_decided_in_c_without_the_python_walk(serde, client,  # noqa: F811
                                                                     monkeypatch):
    """Items, then a long beyond 64 bits after them: the C walk said "not sure" and the
    Python walk then walked every item to accept the long (26 s for a writer's wide
    items, a review). C decides such a body now, too many or damaged."""
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    schema_id, schema = _writer_with(
        client, [{"name": "late", "type": "long", "default": 0}], "late-turn")
    data = make_turn(conversation_id=new_id("conv")).to_avro() | {"late": 5}
    monkeypatch.setattr(avro_bodies, "SPEEDUPS", C)
    monkeypatch.setattr(avro_bodies, "refusal_of", _refuse_all)
    for ids, raised in ((MAX_EVENT_ELEMENTS + 1, TooManyElements), (100_000, DecodeError)):
        value = framed(schema_id, schema, data | {"tool_effect_ids": ["e1"] * ids})
        value = value[:-1] + b"\xff" * 9 + b"\x7f"  # "late" beyond 64 bits
        with pytest.raises(raised) as caught:
            serde.decode_gateway_event(value, TOPIC, 0, 8)
        if raised is DecodeError:
            assert caught.value.reason is DeadLetterReason.CORRUPT_PAYLOAD


def test_a_writer_whose_items_are_wide_for_their_bytes_is_refused(serde, client):  # noqa: F811
    """A writer's added array of records of 300 null fields and a boolean: 302 schema
    nodes a byte, so 131 072 of them (128 KiB) walked 40 M nodes in every reader (26 s
    in the Python walk at 1 000 fields, a review): SCHEMA_MISMATCH before any body. A
    realistic one (records of a name and optional metadata of 10 optional strings) is
    read."""
    wide = {"type": "record", "name": "Wide", "fields": [
        {"name": f"n{i}", "type": "null"} for i in range(300)] + [
        {"name": "b", "type": "boolean"}]}
    schema_id, schema = _writer_with(client, [
        {"name": "wide", "type": {"type": "array", "items": wide}, "default": []}],
        "wide-turn")
    data = make_turn(conversation_id=new_id("conv")).to_avro() | {"wide": [{"b": True}]}
    error = decode_error(serde, framed(schema_id, schema, data))
    assert error.reason is DeadLetterReason.SCHEMA_MISMATCH
    assert "more than 4 schema nodes a byte" in error.message


def test_a_writer_whose_arrays_are_not_ratchets_records_no_rejection(serde, client):  # noqa: F811
    """tool_effect_ids as longs: every body of it within the bound is SCHEMA_MISMATCH;
    skipping the field hid that and a rejection was recorded for the request (a review).
    Now such a body beyond the bound is a dead letter."""
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    schema = json.loads(avsc.schema_text("TurnCompleted"))
    for field in schema["fields"]:
        if field["name"] == "tool_effect_ids":
            field["type"] = {"type": "array", "items": "long"}
    schema_id = client.register_schema("long-ids", Schema(json.dumps(schema), "AVRO"))
    data = make_turn(conversation_id=new_id("conv")).to_avro()
    small = framed(schema_id, schema, data | {"tool_effect_ids": [1]})
    assert decode_error(serde, small).reason is DeadLetterReason.SCHEMA_MISMATCH
    value = framed(schema_id, schema,
                         data | {"tool_effect_ids": [1] * (MAX_EVENT_ELEMENTS + 1)})
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(value, TOPIC, 0, 9)
    assert caught.value.turn is None


def test_a_turn_costly_to_read_beyond_the_bound_is_a_dead_letter(serde, monkeypatch):  # noqa: F811
    """Reading its fields walks every value of its arrays (fastavro skips them one by
    one): beyond MAX_IDENTITY_NODES schema nodes it is not read (a writer's wide records
    took 22.5 s, a review)."""
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    turn = make_turn(conversation_id=new_id("conv"))
    value = _with(serde, turn, output_items=[TINY_ITEM] * (MAX_EVENT_ELEMENTS + 1))
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(value, TOPIC, 0, 10)
    assert caught.value.turn is not None  # ~1 M nodes: read
    monkeypatch.setattr(avro_bodies, "MAX_IDENTITY_NODES", 1_000_000)
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(value, TOPIC, 0, 11)
    assert caught.value.turn is None


def test_a_writer_whose_items_hold_optional_records_is_read(serde, client):  # noqa: F811
    """Each union branch measured as it may be written: an optional record of 10
    optional strings is 2 nodes a byte at most, not 24 nodes in 2 bytes (a review of
    the first measure, which took a union's fewest bytes and most nodes apart)."""
    meta = {"type": "record", "name": "Meta", "fields": [
        {"name": f"m{i}", "type": ["null", "string"], "default": None} for i in range(10)]}
    entry = {"type": "record", "name": "Entry", "fields": [
        {"name": "name", "type": "string"}, {"name": "meta", "type": ["null", meta]}]}
    schema_id, schema = _writer_with(client, [
        {"name": "entries", "type": {"type": "array", "items": entry}, "default": []}],
        "entries-turn")
    turn = make_turn(conversation_id=new_id("conv"))
    data = turn.to_avro() | {"entries": [{"name": "a", "meta": None}] * 3}
    assert serde.decode_gateway_event(framed(schema_id, schema, data), TOPIC, 0, 12) == turn


def test_a_fixed_no_body_can_hold_is_decided_in_c(serde, client, monkeypatch):  # noqa: F811
    """A fixed of 2^31 bytes was a node the C walk did not take: it answered "not sure"
    and the Python walk walked the whole long body (17-30 s, a review). It runs out in
    C now: TRUNCATED, without the Python walk."""
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    huge = {"type": "fixed", "name": "Huge", "size": 2**31}
    schema_id, schema = _writer_with(client, [
        {"name": "blob", "type": ["null", huge], "default": None}], "huge-fixed-turn")
    data = make_turn(conversation_id=new_id("conv")).to_avro() | {
        "blob": None, "tool_effect_ids": ["e1"] * 100_000}
    value = framed(schema_id, schema, data)
    value = value[:-1] + b"\x02" + b"x" * 10  # the fixed's branch, then 10 bytes of it
    monkeypatch.setattr(avro_bodies, "SPEEDUPS", C)
    monkeypatch.setattr(avro_bodies, "refusal_of", _refuse_all)
    assert decode_error(serde, value).reason is DeadLetterReason.TRUNCATED


def test_a_writer_with_items_fields_in_another_order_is_still_rejected(serde, client):  # noqa: F811
    """A reader resolves fields by name: an Item written with its fields in another
    order is ratchet's Item, and a turn of it beyond the bound is answered with a
    rejection, not a dead letter (a review)."""
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    schema = json.loads(avsc.schema_text("TurnCompleted"))
    for field in schema["fields"]:
        if field["name"] == "input_items":
            field["type"]["items"]["fields"].reverse()
    schema_id = client.register_schema("reordered-item", Schema(json.dumps(schema), "AVRO"))
    turn = make_turn(conversation_id=new_id("conv"))
    data = turn.to_avro()
    data["output_items"] = list(data["output_items"]) + [TINY_ITEM] * (MAX_EVENT_ELEMENTS + 1)
    with pytest.raises(TooManyElements) as caught:
        serde.decode_gateway_event(framed(schema_id, schema, data), TOPIC, 0, 13)
    assert caught.value.turn is not None
    assert caught.value.turn.response_id == turn.response_id
