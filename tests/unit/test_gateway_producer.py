"""The gateway producer's delivery reports: what counts as written (no broker needed:
the reports are fed to the producer's own callbacks, nothing is queued)."""

from __future__ import annotations

import hashlib

import pytest
from confluent_kafka import KafkaError, Message

from ratchet.domain.bounds import elements_of
from ratchet.samples import make_tool_effect, make_turn
from ratchet.settings import Settings
from schemas.limits import MAX_EVENT_ELEMENTS, MAX_ITEM_CONTAINERS
from services.gateway.errors import DeliveryError, EventBeyondLimits, UnservableId
from services.gateway.producer import GatewayProducer
from tests.unit.test_content_containers import item_with

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


class RefusingSerde:
    """Fails the test if the producer gets as far as encoding an event."""

    def encode(self, event, topic):
        raise AssertionError(f"{event.event_id} was encoded: it would have been produced")


@pytest.mark.parametrize("fields", [
    dict(response_id="dl 8-x"),
    dict(tenant_id="tenant/1"),
    dict(conversation_id="conv 1"),
    dict(conversation_id=None, expected_head_seq=None, chain_root_id="resp_root",
         previous_response_id="resp\n"),
], ids=["response_id", "tenant_id", "conversation_id", "previous_response_id"])
def test_an_event_with_an_id_the_api_cannot_serve_is_refused_before_producing(fields):
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=RefusingSerde(),
                               config={"log_level": 0})
    turn = make_turn(**fields)
    with pytest.raises(UnservableId, match="not produced") as refused:
        producer.send(turn)
    assert not refused.value.retryable
    with pytest.raises(UnservableId):  # its effects too, first in send_turn: nothing goes
        producer.send_turn(turn, effects=[make_tool_effect(
            "call_1", idempotency_key=turn.idempotency_key, tenant_id=turn.tenant_id,
            conversation_id=turn.conversation_id, chain_root_id=turn.chain_root_id,
            response_id=turn.response_id)])


class CountingSerde:
    """Encodes every event as a small stand-in value, noting which it was asked for."""

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, event, topic):
        self.encoded.append(event.event_id)
        return b"\x00\x00\x00\x00\x01" + b"x" * 10


@pytest.mark.parametrize("beyond", ["array items", "arrays and objects"])
def test_a_turn_beyond_the_bounds_is_refused_before_producing(beyond):
    """The processor would reject it UNSUPPORTED_FORMAT (docs/gateway-protocol.md, "Size
    limit"): neither it nor its effects are produced."""
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=RefusingSerde(),
                               config={"log_level": 0})
    if beyond == "array items":
        turn = make_turn(tool_effect_ids=tuple(f"e{i}" for i in range(MAX_EVENT_ELEMENTS)))
    else:
        turn = make_turn(items=[item_with(MAX_ITEM_CONTAINERS + 1)])
    with pytest.raises(EventBeyondLimits, match="not produced") as refused:
        producer.send(turn)
    assert not refused.value.retryable and beyond in refused.value.detail
    with pytest.raises(EventBeyondLimits):
        producer.send_turn(turn, effects=[make_tool_effect(
            "call_1", idempotency_key=turn.idempotency_key, tenant_id=turn.tenant_id,
            conversation_id=turn.conversation_id, response_id=turn.response_id)])


def test_a_turn_at_the_bounds_is_produced():
    """Exactly the bounds: encoded (the serde is asked) and queued."""
    serde = CountingSerde()
    encoded = serde.encoded
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=serde,
                               config={"log_level": 0})
    turn = make_turn(items=[item_with(MAX_ITEM_CONTAINERS)])
    others = elements_of(turn)
    turn = turn.model_copy(update={"tool_effect_ids": tuple(
        f"e{i}" for i in range(MAX_EVENT_ELEMENTS - others))})
    assert elements_of(turn) == MAX_EVENT_ELEMENTS
    producer.send(turn)
    assert encoded == [turn.event_id]


def test_a_failed_turn_is_produced_whatever_its_contents_hold():
    """The processor answers NOT_PROMOTABLE_STATUS before the content bound and orphans
    the attempt's effects: the gateway must be able to send it (a review)."""
    from schemas.models import TurnStatus
    serde = CountingSerde()
    encoded = serde.encoded
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=serde,
                               config={"log_level": 0})
    turn = make_turn(items=[item_with(MAX_ITEM_CONTAINERS + 1)], status=TurnStatus.FAILED,
                     certified=False)
    producer.send(turn)
    assert encoded == [turn.event_id]


def test_an_effect_whose_output_no_turn_could_carry_is_refused_before_producing():
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=RefusingSerde(),
                               config={"log_level": 0})
    effect = make_tool_effect("call_1", idempotency_key="idem_1")
    output = effect.output
    content = output.content[:-1] + b',"x":[' + b",".join(
        [b"[]"] * MAX_ITEM_CONTAINERS) + b"]}"
    effect = effect.model_copy(update={"output": output.model_copy(update={
        "content": content, "content_digest": hashlib.sha256(content).hexdigest()})})
    with pytest.raises(EventBeyondLimits, match="arrays and objects"):
        producer.send(effect)
