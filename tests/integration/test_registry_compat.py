"""Against the REAL schema registry (Apicurio 3, ccompat API): registration, each
subject's compatibility (FULL_TRANSITIVE for what gateways write, BACKWARD for ratchet's
outcomes), refusal of incompatible changes, and the serde."""

from __future__ import annotations

import io
import json

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryError

from ratchet.samples import make_tool_loop_turn, make_turn_cancelled
from schemas import avsc
from schemas.avro import EventSerde, compatibility_of, register_schemas, subject_for
from schemas.errors import DecodeError
from schemas.models import DeadLetterReason, TurnCompleted

pytestmark = pytest.mark.integration
TOPIC = "ratchet.gateway-events"


def with_field_changed(record: str, name: str, new_type: object) -> str:
    """``record`` with one field's type replaced (and its default dropped)."""
    schema = json.loads(avsc.schema_text(record))
    for field in schema["fields"]:
        if field["name"] == name:
            field["type"] = new_type
            field.pop("default", None)
    return json.dumps(schema)


def without_field(record: str, name: str) -> str:
    schema = json.loads(avsc.schema_text(record))
    schema["fields"] = [field for field in schema["fields"] if field["name"] != name]
    return json.dumps(schema)


def with_required_field(record: str) -> str:
    schema = json.loads(avsc.schema_text(record))
    schema["fields"].append({"name": "service_tier", "type": "string", "doc": "no default"})
    return json.dumps(schema)


@pytest.fixture
def evolving_subject(schema_registry_client, unique_name):
    """A private subject holding TurnCompleted v1 under the compatibility ratchet sets on
    its subject, deleted afterwards."""
    subject = unique_name("ratchet-contract") + "-" + subject_for("TurnCompleted")
    v1 = Schema(avsc.schema_text("TurnCompleted", avsc.V1_DIR), "AVRO")
    schema_registry_client.register_schema(subject, v1)
    schema_registry_client.set_compatibility(subject, compatibility_of("TurnCompleted"))
    yield subject
    schema_registry_client.delete_subject(subject)


def test_register_schemas_sets_each_subjects_compatibility(schema_registry_client) -> None:
    ids = register_schemas(schema_registry_client)
    assert set(ids) == {subject_for(r) for r in avsc.TOP_LEVEL_RECORDS}
    for record in avsc.TOP_LEVEL_RECORDS:
        assert schema_registry_client.get_compatibility(subject_for(record)) == (
            "FULL_TRANSITIVE" if record in ("TurnCompleted", "ToolEffect", "TurnCancelled")
            else "BACKWARD")
    assert register_schemas(schema_registry_client) == ids  # idempotent: same ids


def test_backward_compatible_change_is_accepted(schema_registry_client, evolving_subject) -> None:
    current = Schema(avsc.schema_text("TurnCompleted"), "AVRO")
    assert schema_registry_client.test_compatibility(evolving_subject, current)
    schema_registry_client.register_schema(evolving_subject, current)
    assert schema_registry_client.get_versions(evolving_subject) == [1, 2]


@pytest.mark.parametrize(
    "incompatible",
    [
        with_required_field("TurnCompleted"),
        with_field_changed("TurnCompleted", "attempt", "string"),
        with_field_changed("TurnCompleted", "expected_head_seq", "long"),  # no longer nullable
        # Readable by a newer reader only (BACKWARD let both in; ratchet's readers cannot
        # read them: found by a gateway built in Java from the docs).
        with_field_changed("TurnCompleted", "attempt", "long"),
        without_field("TurnCompleted", "stream"),
    ],
    ids=["new-required-field", "changed-type", "dropped-null", "widened-int",
         "dropped-field-without-default"],
)
def test_incompatible_change_is_refused(
    schema_registry_client, evolving_subject, incompatible: str
) -> None:
    schema = Schema(incompatible, "AVRO")
    assert not schema_registry_client.test_compatibility(evolving_subject, schema)
    with pytest.raises(SchemaRegistryError) as refused:
        schema_registry_client.register_schema(evolving_subject, schema)
    assert refused.value.http_status_code == 409
    assert schema_registry_client.get_versions(evolving_subject) == [1]


def test_events_round_trip_through_the_real_registry(schema_registry_client) -> None:
    register_schemas(schema_registry_client)
    serde = EventSerde(schema_registry_client)
    turn, effects = make_tool_loop_turn()
    for event in (effects[0], turn, make_turn_cancelled(turn)):
        value = serde.encode(event, TOPIC)
        assert serde.decode_gateway_event(value, TOPIC, 0, 0) == event


def test_v1_data_decodes_with_the_current_schema(schema_registry_client, unique_name) -> None:
    """A writer id of the v1 schema (as old producers registered it), current reader."""
    v1_text = avsc.schema_text("TurnCompleted", avsc.V1_DIR)
    old_subject = unique_name("ratchet-v1") + "-" + subject_for("TurnCompleted")
    v1_id = schema_registry_client.register_schema(old_subject, Schema(v1_text, "AVRO"))
    try:
        record = make_tool_loop_turn()[0].to_avro()
        del record["gateway_id"]
        body = io.BytesIO()
        fastavro.schemaless_writer(body, avsc.parsed("TurnCompleted", avsc.V1_DIR), record)
        value = b"\x00" + v1_id.to_bytes(4, "big") + body.getvalue()
        turn = EventSerde(schema_registry_client).decode_gateway_event(value, TOPIC, 0, 0)
        assert isinstance(turn, TurnCompleted) and turn.gateway_id is None
    finally:
        schema_registry_client.delete_subject(old_subject)


def test_unknown_schema_id_is_a_dead_letter_reason(schema_registry_client) -> None:
    with pytest.raises(DecodeError) as caught:
        EventSerde(schema_registry_client).decode_gateway_event(
            b"\x00\x7f\xff\xff\xf0body", TOPIC, 0, 5
        )
    assert caught.value.reason is DeadLetterReason.UNKNOWN_SCHEMA_ID
