"""BACKWARD compatibility: the current schemas read data written with the v1 schemas.

``schemas/v1/`` is the frozen first published version. Every current schema must read
v1 data (fastavro schema resolution: the rules the registry's BACKWARD check applies).
The change since v1 is ``TurnCompleted.gateway_id`` (nullable, default null).
"""

from __future__ import annotations

import hashlib
import io
import uuid
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ratchet.samples import (
    make_checkpoint_promoted,
    make_dead_letter,
    make_effect_orphaned,
    make_promotion_rejected,
    make_tool_loop_turn,
    make_turn_cancelled,
)
from schemas import avsc
from schemas.avro import EventSerde, register_schemas, subject_for
from schemas.models import MODELS_BY_RECORD, EffectOrphaned, TurnCompleted

# Digest of the published v1 files. Editing them would rewrite what is already in
# Kafka: change the CURRENT schemas instead, and snapshot a v2 when publishing it.
PINNED_V1_SHA256 = "b3c8523b87f83fe3d2847b6168eb086b5cd0b037258c43edbd3059084b653420"
GATEWAY_TOPIC = "ratchet.gateway-events"


def v1_sample(record: str) -> dict[str, Any]:
    """A v1-shaped record for ``record`` (v1 had no TurnCompleted.gateway_id)."""
    turn, effects = make_tool_loop_turn()
    v1_turn = turn.to_avro()
    del v1_turn["gateway_id"]
    samples = {
        "TurnCompleted": v1_turn,
        "ToolEffect": effects[0].to_avro(),
        "TurnCancelled": make_turn_cancelled(turn).to_avro(),
        "CheckpointPromoted": make_checkpoint_promoted(turn).to_avro(),
        "PromotionRejected": make_promotion_rejected(turn).to_avro(),
        "EffectOrphaned": make_effect_orphaned(effects[0]).to_avro(),
        "DeadLetter": make_dead_letter().to_avro(),
    }
    return samples[record]


def write(schema: Any, record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, record)
    return buffer.getvalue()


def read(data: bytes, writer: Any, reader: Any) -> dict[str, Any]:
    return fastavro.schemaless_reader(io.BytesIO(data), writer, reader)


def test_v1_snapshot_covers_every_schema() -> None:
    current = {p.name for p in avsc.SCHEMA_DIR.glob("*.avsc")}
    assert current == {p.name for p in avsc.V1_DIR.glob("*.avsc")}


def test_v1_snapshot_is_frozen() -> None:
    digest = hashlib.sha256()
    for path in sorted(avsc.V1_DIR.glob("*.avsc")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    assert digest.hexdigest() == PINNED_V1_SHA256


def test_the_current_schemas_really_changed_since_v1() -> None:
    """Otherwise the evolution tests below would prove nothing."""
    assert avsc.schema_text("TurnCompleted") != avsc.schema_text("TurnCompleted", avsc.V1_DIR)


@pytest.mark.parametrize("record", avsc.TOP_LEVEL_RECORDS)
def test_current_schema_reads_v1_data(record: str) -> None:
    v1_schema = avsc.parsed(record, avsc.V1_DIR)
    data = write(v1_schema, v1_sample(record))
    as_v1 = read(data, v1_schema, v1_schema)
    as_current = read(data, v1_schema, avsc.parsed(record))
    added = {k: v for k, v in as_current.items() if k not in as_v1}
    assert {k: as_current[k] for k in as_v1} == as_v1
    assert all(value is None for value in added.values()), added
    MODELS_BY_RECORD[record].from_avro(as_current)  # and today's model accepts it


def test_new_field_defaults_to_null_for_v1_data() -> None:
    v1_schema = avsc.parsed("TurnCompleted", avsc.V1_DIR)
    data = write(v1_schema, v1_sample("TurnCompleted"))
    turn = TurnCompleted.from_avro(read(data, v1_schema, avsc.parsed("TurnCompleted")))
    assert turn.gateway_id is None


def test_orphans_written_before_claims_read_with_completion_unknown() -> None:
    v1_schema = avsc.parsed("EffectOrphaned", avsc.V1_DIR)
    data = write(v1_schema, v1_sample("EffectOrphaned"))
    orphan = EffectOrphaned.from_avro(read(data, v1_schema, avsc.parsed("EffectOrphaned")))
    assert orphan.effect_completed is None and orphan.effect_id


def test_every_added_field_has_a_default() -> None:
    """The rule behind BACKWARD: a reader field the writer lacks needs a default."""
    old_definitions = avsc.definitions(avsc.V1_DIR)
    for name, current in avsc.definitions().items():
        old = old_definitions.get(name)
        if old is None or current["type"] != "record":
            continue
        old_fields = {f["name"] for f in old["fields"]}
        for field in current["fields"]:
            if field["name"] not in old_fields:
                assert "default" in field, f"{name}.{field['name']} added without a default"


def test_v1_bytes_in_kafka_decode_with_the_current_serde() -> None:
    """Through the (mock) registry: bytes framed with the v1 schema id, current reader."""
    client = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})
    old_producer = AvroSerializer(
        client,
        avsc.schema_text("TurnCompleted", avsc.V1_DIR),
        conf={"auto.register.schemas": True, "subject.name.strategy": record_subject_name_strategy},
    )
    sample = v1_sample("TurnCompleted")
    value = old_producer(sample, SerializationContext(GATEWAY_TOPIC, MessageField.VALUE))
    register_schemas(client, compatibility=False)  # the current version is published
    assert client.get_latest_version(subject_for("TurnCompleted")).version == 2

    turn = EventSerde(client).decode_gateway_event(value, GATEWAY_TOPIC, 0, 0)
    assert isinstance(turn, TurnCompleted)
    assert turn.gateway_id is None
    assert turn.response_id == sample["response_id"] and len(turn.items) == 20
