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


class TinySerde:
    def encode(self, event, topic):
        return b"\0" * 16


def test_a_thread_that_never_flushes_does_not_keep_every_failure(producer, monkeypatch):
    """A thread that sent and lives on without flushing (a pool's worker whose flushes
    happen elsewhere) held every failure reported after its send: kept for its flush,
    for the process's life (an outside review of session 43's per-thread cursors). The
    failures kept are bounded; that thread's flush is still told, by number, of the ones
    no longer listed (not retryable: they cannot be named), never told nothing."""
    import threading

    from services.gateway import producer as producer_module

    monkeypatch.setattr(producer_module, "MAX_KEPT_FAILURES", 10, raising=False)
    producer._serde = TinySerde()
    sent, done = threading.Event(), threading.Event()
    raised: list[DeliveryError] = []

    def pool_worker() -> None:
        producer.send(make_turn())  # never acknowledged: no broker at 127.0.0.1:1
        sent.set()
        done.wait(10)
        try:
            producer.flush(timeout_s=0)
        except DeliveryError as exc:
            raised.append(exc)

    worker = threading.Thread(target=pool_worker)
    worker.start()
    assert sent.wait(10)
    for n in range(50):
        report(producer, f"ev-{n}", KafkaError(KafkaError._MSG_TIMED_OUT), 0)
        with pytest.raises(DeliveryError):
            producer.flush(timeout_s=0)
    kept = len(producer._failure_log)
    done.set()
    worker.join(10)
    assert kept <= 10, f"{kept} failures kept for a thread that never flushed"
    assert raised and raised[0].forgotten == 40, raised
    assert not raised[0].retryable
    assert [eid for eid, _ in raised[0].failures] == [f"ev-{n}" for n in range(40, 50)]
    assert "40 earlier" in str(raised[0])
