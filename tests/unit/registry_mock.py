"""The serde tests' registry: confluent-kafka's in-process ``mock://`` one, a fresh one
per test with every record's schema registered, and the topic they encode for. Shared
by the serde, decode and gateway send-cost tests (import the fixtures by name)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from schemas.avro import EventSerde, register_schemas

TOPIC = "ratchet.gateway-events"


@pytest.fixture
def client() -> SchemaRegistryClient:
    client = SchemaRegistryClient.new_client({"url": f"mock://{uuid.uuid4().hex}"})
    register_schemas(client, compatibility=False)  # the mock has no config endpoint
    return client


@pytest.fixture
def serde(client) -> EventSerde:
    return EventSerde(client)
