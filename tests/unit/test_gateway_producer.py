"""The gateway producer's delivery reports: what counts as written (no broker needed:
the reports are fed to the producer's own callbacks, nothing is queued)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message

from ratchet.settings import Settings
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer

# librdkafka's "no offset" (RD_KAFKA_OFFSET_INVALID): Message.offset() reads it as None.
NO_OFFSET = -1001


@pytest.fixture
def producer() -> GatewayProducer:
    # serde is never used here: nothing is encoded, only delivery reports are fed. No
    # broker either: librdkafka's connection errors to the dummy address are muted.
    return GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=object(),
                           config={"log_level": 0})


def report(producer: GatewayProducer, event_id: str, err: KafkaError | None,
           offset: int) -> None:
    producer._on_delivery(event_id)(err, Message(topic=producer.topic, partition=3,
                                                 offset=offset))


def test_a_delivery_with_an_offset_is_written(producer):
    report(producer, "ev-1", None, 17)
    producer.flush(timeout_s=1)  # nothing raised


def test_a_success_without_an_offset_is_a_retryable_delivery_error(producer):
    report(producer, "ev-ok", None, 4)
    report(producer, "ev-unconfirmed", None, NO_OFFSET)

    with pytest.raises(DeliveryError) as raised:
        producer.flush(timeout_s=1)

    assert raised.value.retryable
    assert [eid for eid, _ in raised.value.failures] == ["ev-unconfirmed"]
    assert "without an offset" in raised.value.failures[0][1]
    producer.flush(timeout_s=1)  # reported once: the next flush is clean


def test_a_fatal_broker_error_is_not_retryable(producer):
    report(producer, "ev-unconfirmed", None, NO_OFFSET)
    report(producer, "ev-fatal", KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                            "denied", fatal=True), 0)

    with pytest.raises(DeliveryError) as raised:
        producer.flush(timeout_s=1)

    assert not raised.value.retryable  # one fatal failure makes the batch non-retryable
    assert {eid for eid, _ in raised.value.failures} == {"ev-unconfirmed", "ev-fatal"}
