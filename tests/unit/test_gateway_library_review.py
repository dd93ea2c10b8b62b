"""The gateway library used as a gateway author would (an outside review, session 43).

docs/gateway-protocol.md, section 1: a gateway MUST NOT report a turn persisted before
the broker acknowledged it with an offset. docs/service.md, section 3: delivery failures
are raised on ``flush``; the producer is one per process and thread-safe; every error of
the library is a typed ``GatewayError`` saying whether a retry helps; a turn refused
before producing is refused with none of its effects produced.

1. Leaving ``with GatewayProducer(...)`` flushed for 10 s and raised nothing: a turn
   never written (no broker) left the block as if it had been.
2. One flush took every thread's failures: a thread whose turn failed could flush after
   another thread and be told nothing.
3. ``send_turn`` produced the effects, then refused the turn as too large; an effect
   the processor dead-letters for its fields' bounds was produced.
4. A registry answering something that is not a schema id leaked confluent-kafka's
   ``SerializationError`` / ``struct.error``; a registry's errors were not
   ``GatewayError``s.
5. Producing to a topic that does not exist created it (the broker's auto-creation).
6. A ``DeliveryError`` raised while other events were still in flight did not say so.
7. A 200 that is not the service's answer leaked raw ``JSONDecodeError`` / ``KeyError``
   from the rehydration and claims clients (or was "fix your request").

No broker is needed for 1-5: librdkafka is replaced by ``FakeKafka``, which delivers what the
test tells it to, so every report is the library's own handling of it.
"""

from __future__ import annotations

import contextlib
import struct
import threading

import httpx
import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.serialization import SerializationError

from ratchet.samples import make_tool_effect, make_turn
from ratchet.settings import Settings
from schemas.errors import EncodeError, RegistryUnavailable
from schemas.limits import MAX_EVENT_BYTES
from services.gateway.claims import EffectClaims
from services.gateway.client import RehydrationClient
from services.gateway.errors import (
    DeliveryError,
    EventBeyondLimits,
    EventNotEncoded,
    EventTooLarge,
    GatewayError,
    ProducerClosed,
    RehydrationUnavailable,
)
from services.gateway.events import TurnIdentity
from services.gateway.producer import PRODUCER_DEFAULTS, GatewayProducer
from tests.unit.test_gateway_claims_library_review import CALL1 as CALL
from tests.unit.test_gateway_claims_library_review import Server


def effect_of(turn, call_id: str = "call_1"):
    """An effect of ``turn``'s request (its tenant, key, response and Conversation)."""
    return make_tool_effect(call_id, idempotency_key=turn.idempotency_key,
                            tenant_id=turn.tenant_id, response_id=turn.response_id,
                            conversation_id=turn.conversation_id,
                            chain_root_id=turn.chain_root_id)


class FakeKafka:
    """Stands in for librdkafka's producer: queues what is produced; ``deliver`` answers
    one queued event (an offset, or an error); ``purge`` reports the rest purged."""

    def __init__(self) -> None:
        self.queued: list[tuple[bytes, bytes, object]] = []
        self.produced: list[bytes] = []  # values, in produce order
        self.reports: list[tuple[object, KafkaError | None, int]] = []
        self.closed = False

    def produce(self, topic, value, key, on_delivery):
        assert not self.closed
        self.queued.append((key, value, on_delivery))
        self.produced.append(value)

    def deliver(self, index: int, err: KafkaError | None = None) -> None:
        _, _, callback = self.queued.pop(index)
        self.reports.append((callback, err, 7 if err is None else -1001))

    def poll(self, timeout=0):
        if self.closed:
            raise RuntimeError("Producer has been closed")  # as confluent-kafka's
        reports, self.reports = self.reports, []
        for callback, err, offset in reports:
            callback(err, Message(topic="t", partition=0, offset=offset))
        return len(reports)

    def flush(self, timeout=None):
        self.poll()
        return len(self.queued)

    def purge(self, *args, **kwargs):
        for _, _, callback in self.queued:
            self.reports.append((callback, KafkaError(KafkaError._PURGE_QUEUE), -1001))
        self.queued = []

    def close(self):
        self.closed = True


class SizedSerde:
    """Encodes an event as ``size`` bytes (the size an event id asks for, else 100)."""

    def __init__(self, sizes: dict[str, int] | None = None) -> None:
        self.sizes = sizes or {}
        self.encoded: list[str] = []

    def encode(self, event, topic):
        self.encoded.append(event.event_id)
        return b"\0" * self.sizes.get(event.event_id, 100)


def gateway(serde=None) -> tuple[GatewayProducer, FakeKafka]:
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"),
                               serde=serde or SizedSerde(), config={"log_level": 0})
    producer._producer.close()  # the real client is not used
    kafka = producer._producer = FakeKafka()
    return producer, kafka


# 1. ------------------------------------------------------------------------------------
def test_leaving_the_with_block_with_an_undelivered_turn_raises():
    producer, kafka = gateway()
    with pytest.raises(DeliveryError) as raised, producer:
        producer.send(turn := make_turn())
            # never acknowledged: the broker cannot be reached
    assert [eid for eid, _ in raised.value.failures] == [turn.event_id]
    assert raised.value.retryable  # it may or may not have been written: send it again
    assert kafka.closed  # the client's threads and sockets are released


def test_leaving_the_with_block_raises_a_failure_reported_after_the_last_send():
    producer, kafka = gateway()
    with pytest.raises(DeliveryError), producer:
        producer.send(make_turn())
        kafka.deliver(0, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))


def test_leaving_the_with_block_after_delivery_raises_nothing_and_closes():
    producer, kafka = gateway()
    with producer:
        producer.send(make_turn())
        kafka.deliver(0)
    assert kafka.closed
    with pytest.raises(ProducerClosed):
        producer.send(make_turn())
    producer.flush()  # nothing in flight: not confluent-kafka's RuntimeError
    producer.close()  # closing again changes nothing


def test_an_error_in_the_block_is_the_one_raised():
    producer, kafka = gateway()
    with pytest.raises(KeyError), producer:
        producer.send(make_turn())
        raise KeyError("the gateway's own error")
    assert kafka.closed


# 2. ------------------------------------------------------------------------------------
def test_a_thread_whose_event_failed_is_told_even_if_another_thread_flushed_first():
    producer, kafka = gateway()
    raised: dict[str, BaseException | None] = {}
    sent = threading.Barrier(2)
    flushed_first = threading.Event()
    mine = make_turn()

    def thread_a():  # its turn fails; it flushes after thread B
        producer.send(mine)
        sent.wait()
        flushed_first.wait()
        try:
            producer.flush(1)
            raised["a"] = None
        except DeliveryError as exc:
            raised["a"] = exc

    def thread_b():
        producer.send(make_turn())
        sent.wait()
        kafka.deliver(1)  # B's turn is written
        kafka.deliver(0, KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not enough replicas",
                                    retriable=True))  # A's is not
        with contextlib.suppress(DeliveryError):  # told of A's event too: harmless,
            producer.flush(1)                      # it lists it by id
        flushed_first.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert isinstance(raised["a"], DeliveryError)
    assert [eid for eid, _ in raised["a"].failures] == [mine.event_id]


def test_a_failure_is_raised_once_to_each_thread():
    producer, kafka = gateway()
    producer.send(make_turn())
    kafka.deliver(0, KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "x", retriable=True))
    with pytest.raises(DeliveryError):
        producer.flush(1)
    producer.flush(1)  # raised once: this thread's next flush is clean


@pytest.mark.parametrize(("code", "retryable", "says"), [
    (KafkaError._MSG_TIMED_OUT, True, "send it again"),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, False, "topic 'ratchet.gateway-events' does not exist"),
], ids=["timed out", "no such topic"])
def test_a_delivery_failure_says_whether_to_send_again(code, retryable, says):
    producer, kafka = gateway()
    producer.send(make_turn())
    kafka.deliver(0, KafkaError(code))
    with pytest.raises(DeliveryError) as raised:
        producer.flush(1)
    assert raised.value.retryable is retryable
    assert says in str(raised.value)


def test_a_delivery_error_raised_with_events_in_flight_says_so():
    # Listed by id, the failures read as the whole story: an event neither listed nor
    # written (still in flight at the timeout) was taken for written.
    producer, kafka = gateway()
    producer.send(make_turn())
    producer.send(make_turn())
    kafka.deliver(0, KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "x", retriable=True))
    with pytest.raises(DeliveryError) as raised:
        producer.flush(1)
    assert raised.value.pending == 1
    assert "1 event(s) still in flight" in str(raised.value)


# 3. ------------------------------------------------------------------------------------
def test_a_turn_too_large_is_refused_with_none_of_its_effects_produced():
    turn = make_turn()
    effect = effect_of(turn)
    producer, kafka = gateway(SizedSerde({turn.event_id: MAX_EVENT_BYTES + 1}))
    with pytest.raises(EventTooLarge):
        producer.send_turn(turn, effects=[effect])
    assert kafka.produced == []


def test_a_turn_at_the_size_limit_is_produced_after_its_effects():
    turn = make_turn()
    effect = effect_of(turn)
    producer, kafka = gateway(SizedSerde({turn.event_id: MAX_EVENT_BYTES}))
    producer.send_turn(turn, effects=[effect])
    assert [len(value) for value in kafka.produced] == [100, MAX_EVENT_BYTES]


def test_an_effect_too_large_is_refused_with_nothing_of_the_turn_produced():
    turn = make_turn()
    first, second = effect_of(turn, "call_1"), effect_of(turn, "call_2")
    producer, kafka = gateway(SizedSerde({second.event_id: MAX_EVENT_BYTES + 1}))
    with pytest.raises(EventTooLarge):
        producer.send_turn(turn, effects=[first, second])
    assert kafka.produced == []


# 3b. -----------------------------------------------------------------------------------
# docs/gateway-protocol.md, section 6: a ToolEffect whose tool_name is longer than 128
# characters, whose call_id is longer than 200, or whose arguments_digest is not sha256
# hex is dead-lettered INVALID_EVENT, nothing recorded; the library produced it, and
# the turn listing it was then MISSING_TOOL_EFFECT.
@pytest.mark.parametrize("fields", [
    dict(tool_name="t" * 129), dict(call_id="c" * 201), dict(arguments_digest="ab" * 10),
], ids=["tool_name", "call_id", "arguments_digest"])
def test_an_effect_the_processor_would_dead_letter_is_refused_before_producing(fields):
    turn = make_turn()
    effect = effect_of(turn).model_copy(update=fields)
    producer, kafka = gateway()
    with pytest.raises(EventBeyondLimits):
        producer.send(effect)
    with pytest.raises(EventBeyondLimits):
        producer.send_turn(turn, effects=[effect])
    assert kafka.produced == []


def test_an_effect_at_the_bounds_is_produced():
    effect = effect_of(make_turn()).model_copy(update=dict(tool_name="t" * 128,
                                                           call_id="c" * 200))
    producer, kafka = gateway()
    producer.send(effect)
    assert len(kafka.produced) == 1


# 4. ------------------------------------------------------------------------------------
class FailingSerde:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def encode(self, event, topic):
        raise self.error


@pytest.mark.parametrize(("error", "retryable"), [
    (RegistryUnavailable("[Errno 111] Connection refused"), True),
    (EncodeError("TurnCompleted", "Subject not found (is the schema registered?)"), False),
    # what confluent-kafka's serializer raises on a registry answer without a schema id
    (SerializationError("Schema ID is not set"), False),
    (struct.error("required argument is not an integer"), False),
], ids=["registry down", "not registered", "answer without an id", "id not an integer"])
def test_a_registry_failure_is_a_typed_gateway_error(error, retryable):
    producer, kafka = gateway(FailingSerde(error))
    with pytest.raises(GatewayError) as raised:
        producer.send(turn := make_turn())
    assert isinstance(raised.value, EventNotEncoded)
    assert raised.value.retryable is retryable
    assert turn.event_id in str(raised.value)
    assert kafka.produced == []


# 5. ------------------------------------------------------------------------------------
def test_producing_never_creates_the_topic():
    assert PRODUCER_DEFAULTS["allow.auto.create.topics"] is False


# 7. ------------------------------------------------------------------------------------
# docs/service.md, section 3: every answer of the contract is a typed outcome;
# ``RehydrationUnavailable`` (retry) when the service could not answer. A 200 whose body
# is not the service's answer (a proxy's page, a cut body) leaked ``JSONDecodeError`` /
# ``KeyError`` / ``TypeError``, or was ``InvalidRehydrationRequest`` ("fix the request").
GARBLED = [b"<html>502 Bad Gateway</html>", b"[]", b"{}", b'{"outcome": "certified"}',
           b'{"outcome": "fallback", "response_id": "r1"}']


def answering(body: bytes) -> httpx.MockTransport:
    return httpx.MockTransport(lambda request: httpx.Response(
        200, content=body, headers={"content-type": "application/json"}))


@pytest.mark.parametrize("body", GARBLED)
@pytest.mark.parametrize("ask", [
    lambda client: client.response_history("t1", "r1", "f" * 64),
    lambda client: client.conversation_history("t1", "conv_1", "f" * 64),
    lambda client: client.status("t1", "r1"),
], ids=["response history", "conversation history", "status"])
def test_a_200_that_is_not_the_services_answer_is_retryable(body, ask):
    client = RehydrationClient("http://api.test", transport=answering(body))
    with pytest.raises(RehydrationUnavailable):
        ask(client)


# An output of the wrong types (not the service's: it answers the item it recorded)
# leaked pydantic's ValidationError from ``run`` (found by an outside review of the
# session 43 fix above, which caught KeyError/TypeError/AttributeError only).
WRONG_TYPES = [
    b'{"state": "COMPLETED", "output": {"item_id": 5, "type": "function_call_output", '
    b'"content": "{}", "content_digest": "' + b"0" * 64 + b'"}}',
    b'{"state": "COMPLETED", "output": {"item_id": "i1", "type": "function_call_output", '
    b'"content": "{}", "content_digest": "' + b"0" * 64 + b'", "format_version": "v2"}}',
]


@pytest.mark.parametrize("body", [*GARBLED, b'{"state": "IN_PROGRESS"}',
                                  b'{"state": "COMPLETED", "output": null}', *WRONG_TYPES])
def test_a_claim_answer_that_is_not_the_services_runs_nothing_and_is_retryable(body):
    identity = TurnIdentity(tenant_id="t1", response_id="r1", conversation_id="conv_1",
                            expected_head_seq=0)
    claims = EffectClaims("http://api.test", identity, idempotency_key="k1", attempt=1,
                          transport=answering(body))
    runs = []
    with claims.effect(CALL, subturn_index=0) as effect, \
            pytest.raises(RehydrationUnavailable):
        effect.run(lambda: runs.append(1) or "sent")
    assert runs == []


def test_after_a_garbled_claim_answer_the_retry_runs_the_tool_once():
    server = Server()
    garble = [True]

    def forward(request: httpx.Request) -> httpx.Response:
        resp = server.http.post(request.url.path, content=request.content,
                                headers={"content-type": "application/json"})
        if garble.pop() if garble else False:  # the claim is written; its answer garbled
            return httpx.Response(200, content=b"<html>", headers={"content-type": "text/html"})
        return httpx.Response(resp.status_code, content=resp.content,
                              headers={"content-type": "application/json"})

    identity = TurnIdentity(tenant_id="t1", response_id="r1", conversation_id="conv_1",
                            expected_head_seq=0)
    claims = EffectClaims("http://claims.test", identity, idempotency_key="k1", attempt=1,
                          transport=httpx.MockTransport(forward))
    runs = []
    with claims.effect(CALL, subturn_index=0) as effect, \
            pytest.raises(RehydrationUnavailable):
        effect.run(lambda: runs.append(1) or "sent")
    with claims.effect(CALL, subturn_index=0) as effect:  # the documented retry
        effect.run(lambda: runs.append(1) or "sent")
    assert runs == [1]
    assert server.ledger.claims_for("t1", "k1")[0].completed
