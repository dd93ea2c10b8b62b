"""The gateway producer against the real Kafka and registry: an event that was not
written is never reported written (docs/gateway-protocol.md, section 1: a gateway MUST
NOT report a turn persisted before the broker acknowledged it with an offset).

Found by an outside review of the library (session 43): producing under a topic prefix
with no topics created the topic (the broker's auto-creation, on in the local stack)
with one partition nobody consumes, and ``flush`` reported the turn written; leaving
``with GatewayProducer(...)`` with a turn no broker acknowledged raised nothing.
No broker is restarted: the failures come from a topic that does not exist and a
bootstrap address where nothing listens.
"""

from __future__ import annotations

import dataclasses
import socket

import pytest

from ratchet.samples import make_turn
from schemas.avro import register_schemas, registry_client
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer

pytestmark = pytest.mark.integration

# Give up on an unacknowledged event after 3 s instead of 30 (the library's default).
QUICK = {"delivery.timeout.ms": 3000, "log_level": 0}


@pytest.fixture(scope="module")
def registered(settings):
    register_schemas(registry_client(settings.schema_registry_url))  # idempotent


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket is closed


def test_a_topic_that_does_not_exist_is_a_delivery_error_and_is_not_created(
        settings, registered, kafka_admin, unique_name):
    prefix = unique_name("rgwnone") + "."
    absent = dataclasses.replace(settings, topic_prefix=prefix)
    producer = GatewayProducer(absent, config=QUICK)
    try:
        producer.send(turn := make_turn())
        with pytest.raises(DeliveryError) as raised:
            producer.flush(30)
        assert [eid for eid, _ in raised.value.failures] == [turn.event_id]
    finally:
        created = [t for t in kafka_admin.list_topics(timeout=10).topics if t.startswith(prefix)]
        if created:
            kafka_admin.delete_topics(created)
    producer.close(0)
    assert created == []


def test_leaving_the_with_block_with_an_event_no_broker_acknowledged_raises(
        settings, registered):
    nowhere = dataclasses.replace(settings, kafka_bootstrap=f"127.0.0.1:{closed_port()}")
    with pytest.raises(DeliveryError) as raised, GatewayProducer(nowhere,
                                                                 config=QUICK) as producer:
        producer.send(turn := make_turn())
    assert [eid for eid, _ in raised.value.failures] == [turn.event_id]
    assert raised.value.retryable
