"""What a mutation review of the gateway library (``services/gateway/``, session 51)
found no test holding: each test here failed with its mutant applied (named in its
docstring; the review's table is in docs/decisions.md, "The gateway library under
mutation")."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from ratchet.settings import Settings
from schemas.items import arguments_digest
from schemas.models import ToolEffectStatus
from services.gateway.claims import ClaimTakenOver, EffectClaims
from services.gateway.client import RehydrationClient, parse_outcome
from services.gateway.errors import (
    DeliveryError,
    EventNotQueued,
    InvalidGatewayEvent,
    InvalidRehydrationRequest,
    ProducerClosed,
    ProducerMisconfigured,
    RehydrationUnavailable,
)
from services.gateway.events import TurnIdentity, arguments_digest_of, tool_effect
from services.gateway.kafka_calls import interruptible
from services.gateway.producer import Delivery, GatewayProducer
from tests.ctrl_c import python_ctrl_c

ITEM = {"item_id": "m1", "type": "message", "role": "user", "call_id": None,
        "content": '{"id":"m1","type":"message"}', "content_digest": "d",
        "format_version": 1}
CHECKPOINT = {"seq": 3, "fingerprint_hash": "f" * 64, "expires_at": None,
              "token_artifact": {}, "router_receipt": None, "boundary_proof": None}


CALL = {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "book",
        "arguments": "{}"}


def claims_answering(completed: list[dict], completion: httpx.Response) -> EffectClaims:
    """Claims whose API answers CLAIMED, and ``completion`` to each completion (kept)."""
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/complete"):
            completed.append(json.loads(request.content))
            return completion
        return httpx.Response(200, json={"state": "CLAIMED", "lease_until": 0, "attempt": 1})

    identity = TurnIdentity(tenant_id="t", response_id="r1", conversation_id="conv",
                            expected_head_seq=0)
    return EffectClaims("http://claims.test", identity, idempotency_key="k", attempt=1,
                        transport=httpx.MockTransport(answer))


def producer_with(config: dict) -> GatewayProducer:
    # No broker and no encoding: only the constructor's handling of ``config`` is tested.
    return GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=object(),
                           config={"log_level": 0, **config})


def test_a_systemerror_of_another_kind_is_left_as_it_is_where_ctrl_c_can_be_lost():
    """k1 (the ``_LOST`` text check dropped): only the ``SystemError`` confluent-kafka
    raises for an exception it lost is taken for a Ctrl-C. The existing control ran
    without Python's SIGINT handler, where nothing is taken for one anyway."""
    def other():
        raise SystemError("something else")

    caught: list[BaseException] = []
    with python_ctrl_c():
        try:
            interruptible(other)
        except BaseException as exc:  # a KeyboardInterrupt would end pytest's run
            caught.append(exc)
    assert [type(exc) for exc in caught] == [SystemError]


def test_a_lost_exception_out_of_another_thread_is_no_ctrl_c_with_pythons_handler():
    """k3 (the main-thread check dropped): no signal's handler runs outside the main
    thread, so what confluent-kafka lost there is left a ``SystemError``, even with
    Python's SIGINT handler installed (the existing control ran without it)."""
    def lost():
        raise SystemError("<method 'poll'> returned NULL without setting an exception")

    caught: list[BaseException] = []

    def other():
        try:
            interruptible(lost)
        except BaseException as exc:
            caught.append(exc)

    with python_ctrl_c():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert [type(exc) for exc in caught] == [SystemError]


@pytest.mark.parametrize("config", [
    {"acks": "ALL"}, {"enable.idempotence": "True"}, {"allow.auto.create.topics": "FALSE"},
    {"request.required.acks": "All"},
], ids=str)
def test_a_guaranteed_setting_given_in_capitals_is_taken(config):
    """p2 (``_among`` without ``lower``): librdkafka reads these values whatever their
    case, so the protocol's own value in capitals is not a weakening."""
    producer_with(config).close(timeout_s=1)


@pytest.mark.parametrize("body,status", [
    ({"outcome": "failure", "reason": "NOT_FOUND"}, 200),
    ({"outcome": "fallback", "reason": "FINGERPRINT_MISMATCH", "response_id": "r",
      "head_seq": None, "items": [ITEM]}, 404),
    ({"outcome": "certified", "response_id": "r", "head_seq": 3, "items": [ITEM],
      "checkpoint": CHECKPOINT}, 500),
], ids=["failure-200", "fallback-404", "certified-500"])
def test_a_history_body_contradicting_its_status_is_not_the_services(body, status):
    """c1 (the status check of ``_outcome`` dropped): CONTRACT 5 answers a history with
    200 and a failure with anything else; a body saying otherwise is not trusted."""
    with pytest.raises(RehydrationUnavailable, match=f"with HTTP {status}"):
        parse_outcome(body, status)


def test_a_setting_confluent_kafka_refuses_by_its_python_type_is_typed():
    """A defect the review met beside p2: confluent-kafka reads
    ``delivery.report.only.error`` itself and refuses any value but a ``bool`` with a
    ``TypeError``, which left the constructor untyped (not a ``GatewayError``).
    ``GUARANTEED`` listed ``"false"`` among its values until session 52 (now refused
    by the table itself: ``test_gateway_producer_guaranteed.py``)."""
    with pytest.raises(ProducerMisconfigured, match="delivery.report.only.error"):
        producer_with({"delivery.report.only.error": "false"})


def test_a_429_is_retried_later_not_a_malformed_request():
    """c6 (the 429 branch of ``_unexpected`` dropped): too many requests is the
    service's load, not the request's fault: ``RehydrationUnavailable`` (retry later),
    never ``InvalidRehydrationRequest`` ("do not retry")."""
    transport = httpx.MockTransport(lambda request: httpx.Response(429, text="slow down"))
    with RehydrationClient("http://api", transport=transport) as client:
        with pytest.raises(RehydrationUnavailable, match="429"):
            client.status("t", "r")
        with pytest.raises(RehydrationUnavailable, match="429"):
            client.response_history("t", "r", "f" * 64)


def test_a_waiting_history_request_outlasts_the_server_side_wait():
    """c8 (the wait left out of the request's timeout): with ``wait_ms`` the server
    holds the answer up to that long, so the HTTP read timeout is the client's own plus
    the wait (else every long wait timed out as ``RehydrationUnavailable``)."""
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"]["read"])
        return httpx.Response(200, json={"outcome": "fallback", "reason": "NOT_CERTIFIED",
                                         "response_id": "r", "head_seq": None,
                                         "items": []})

    with RehydrationClient("http://api", timeout_s=2.0,
                           transport=httpx.MockTransport(handler)) as client:
        client.response_history("t", "r", "f" * 64, wait_ms=7000)
    assert seen == [pytest.approx(9.0)]


def test_a_tool_that_raised_is_recorded_failed_before_the_error_goes_on():
    """l3 (the failed outcome's completion dropped): a tool that raised may have acted;
    its claim is completed ``failed`` (so no later attempt runs it again) before its
    exception reaches the caller."""
    completed: list[dict] = []
    claims = claims_answering(completed, httpx.Response(200, json={"state": "COMPLETED"}))

    def tool() -> str:
        raise ValueError("card declined")

    with claims.effect(CALL, subturn_index=0) as effect, \
            pytest.raises(ValueError, match="card declined"):
        effect.run(tool)
    assert [c["status"] for c in completed] == ["failed"]
    assert "card declined" in completed[0]["output"]["content"]
    claims.close()


def test_a_completion_refused_409_for_another_reason_is_not_a_take_over():
    """l5 (``NOT_HOLDER`` not checked): only that 409 means another attempt took the
    claim; ``OUTCOME_CONFLICT`` (another outcome already recorded) is the API's refusal,
    typed as such, never ``ClaimTakenOver`` (retryable: run again and claim again)."""
    completed: list[dict] = []
    refusal = httpx.Response(409, json={"error": "OUTCOME_CONFLICT", "detail": "other"})
    claims = claims_answering(completed, refusal)
    with claims.effect(CALL, subturn_index=0) as effect, \
            pytest.raises(InvalidRehydrationRequest) as raised:
        effect.run(lambda: "done")
    assert not isinstance(raised.value, ClaimTakenOver) and raised.value.status == 409


def test_a_call_entered_again_with_another_occurrence_is_another_effect():
    """l11 (the occurrence not compared): the same call id entered again is the same
    effect only with no occurrence or its own; an explicit other occurrence is the
    gateway naming another effect key, never the first one's claim and token."""
    claims = claims_answering([], httpx.Response(200, json={"state": "COMPLETED"}))
    with claims.effect(CALL, subturn_index=0) as first:
        pass
    with claims.effect(CALL, subturn_index=0) as again:
        pass
    with claims.effect(CALL, subturn_index=0, occurrence=1) as other:
        pass
    assert again is first
    assert other is not first and other.occurrence == 1
    assert other.effect_id != first.effect_id
    claims.close()


def test_a_delivery_whose_event_failed_fatally_is_not_retryable():
    """p12 (``Delivery``'s outcome without the fatal check): a fatal error of the
    idempotent producer fails every later event too; librdkafka may flag it retriable
    as well, and the ``Delivery`` must say not retryable (as ``flush`` does): send with
    a new producer."""
    producer = producer_with({})
    delivery = Delivery(producer, ("ev-1",))
    fatal = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied", fatal=True,
                       retriable=True)
    producer._on_delivery("ev-1", delivery)(fatal, Message(topic=producer.topic,
                                                           partition=0, offset=0))
    with pytest.raises(DeliveryError) as raised:
        delivery.wait(timeout_s=0)
    assert not raised.value.retryable
    assert [event_id for event_id, _ in raised.value.failures] == ["ev-1"]
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=1)


def test_an_identity_in_both_modes_is_refused():
    """v1 (the mode check loosened to "at least one"): a Conversation's turn that also
    names a chain root is neither one Conversation nor one chain (CONTRACT 2: the key is
    one or the other)."""
    with pytest.raises(InvalidGatewayEvent, match="exactly one"):
        TurnIdentity("t", "r", conversation_id="c", expected_head_seq=0,
                     chain_root_id="root")


def test_a_head_given_as_a_bool_is_refused():
    """v4 (``bool`` taken as an integer head): ``True`` is an ``int`` to Python, and a
    head of 1 the gateway never rehydrated would be its turn's ``expected_head_seq``."""
    with pytest.raises(InvalidGatewayEvent, match="not an integer"):
        TurnIdentity.conversation("t", "c", "r", expected_head_seq=True)


def test_a_chain_turn_carries_no_head_whatever_its_identity_holds():
    """v8 (the head passed on in chain mode too): ``TurnIdentity`` takes an
    ``expected_head_seq`` beside ``chain_root_id`` (its constructor checks the
    Conversation mode only); a chain's turn has no Conversation head (CONTRACT 3), so
    the builder leaves it null."""
    from tests.unit.test_gateway_events import build

    identity = TurnIdentity("t", "resp_2", chain_root_id="resp_1",
                            previous_response_id="resp_1", expected_head_seq=3)
    assert build(identity).expected_head_seq is None


class RefusingKafka:
    """librdkafka's producer refusing every event with ``refusal``; counts its polls."""

    def __init__(self, refusal: BaseException) -> None:
        self.refusal, self.polls = refusal, 0

    def produce(self, *args, **kwargs):
        raise self.refusal

    def poll(self, timeout_s: float) -> int:
        self.polls += 1
        return 0


def queue_one(producer: GatewayProducer):
    event = SimpleNamespace(event_id="ev-1", partition_key="conv")
    return producer._queue(event, b"value", lambda err, msg: None, lambda ref: None,
                           queued=(), not_queued=("ev-1",))


@pytest.mark.parametrize("refusal", [
    KafkaException("boom"),
    KafkaException(KafkaError(KafkaError._FATAL, "fenced", fatal=True, retriable=True)),
], ids=["no KafkaError", "fatal and retriable"])
def test_a_refusal_to_queue_that_may_be_fatal_is_not_retryable(refusal):
    """p29 (``fatal`` read as "a fatal ``KafkaError``" only): a ``KafkaException``
    carrying no ``KafkaError`` says nothing of the producer's state; the library fails
    closed: fatal, not retryable (close and send with a new producer). p30 (retryable
    without the fatal check): after a fatal error this producer refuses every event,
    whatever librdkafka's retriable flag says."""
    producer = producer_with({})
    kafka, producer._producer = producer._producer, RefusingKafka(refusal)
    try:
        with pytest.raises(EventNotQueued) as raised:
            queue_one(producer)
        assert raised.value.fatal and not raised.value.retryable
    finally:
        producer._producer = kafka
        producer.close(timeout_s=1)


def test_a_full_queue_once_a_close_began_waits_for_no_room():
    """p27 (the close's check before waiting for room dropped): with librdkafka's queue
    full and a close of another thread begun, the send gives up at once (the close
    waits for its lock), without polling for room first (up to 0.1 s more)."""
    producer = producer_with({})
    kafka = producer._producer
    producer._producer = full = RefusingKafka(BufferError("queue full"))
    producer._closing.set()
    try:
        with pytest.raises(ProducerClosed):
            queue_one(producer)
        assert full.polls == 0
    finally:
        producer._producer = kafka
        producer._closing.clear()
        producer.close(timeout_s=1)


def test_a_tool_effect_built_failed_says_so():
    """v12 (``succeeded`` ignored): a call that failed is recorded ``failed``; recorded
    ``succeeded``, the turn would be promoted over an effect that did not happen."""
    identity = TurnIdentity.conversation("t", "conv", "r1", 0)
    call = {"type": "function_call", "call_id": "c1", "name": "book", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "error: denied"}
    built = [tool_effect(identity, idempotency_key="k", subturn_index=0, call=call,
                         output=output, succeeded=ok).status for ok in (True, False)]
    assert built == [ToolEffectStatus.SUCCEEDED, ToolEffectStatus.FAILED]


def test_arguments_holding_a_key_twice_are_digested_as_raw_text():
    """v13 (the duplicate-key check dropped): parsers disagree on which of two equal
    keys wins, so such arguments are digested as ``{"__raw__": text}``
    (docs/gateway-protocol.md section 4), never as the object Python's parser made."""
    text = '{"to":"a@x","to":"b@x"}'
    call = {"type": "function_call", "call_id": "c1", "name": "mail", "arguments": text}
    assert arguments_digest_of(call) == arguments_digest({"__raw__": text})
    assert arguments_digest_of(call) != arguments_digest({"to": "b@x"})


def test_an_event_reported_written_is_not_failed_by_a_later_look_for_lost_reports():
    """p38 (``_record``'s "told already" check dropped): a look for lost reports (a
    close's ``_fail_unreported``, another thread's ``_fail_lost``) that reaches an event
    whose report just ran to its end must leave it as reported: written, not a lost
    report's retryable failure told to the flushes."""
    producer = producer_with({})
    delivery = Delivery(producer, ("ev-1",))
    producer._on_delivery("ev-1", delivery)(None, Message(topic=producer.topic,
                                                          partition=0, offset=7))
    producer._fail_as_lost("ev-1", delivery)
    producer.flush(timeout_s=1)  # nothing raised
    delivery.wait(timeout_s=0)
    producer.close(timeout_s=1)


def test_a_close_while_a_handlers_close_is_pending_waits_for_it():
    """p49 (a later close of another thread no longer waits for the first): a signal
    handler's close inside a delivery report is finished only once its thread's
    librdkafka call returns (``_finish_close``); another thread's close meanwhile must
    wait for that release, or it returns (raising nothing) while the events are still
    in flight: told they were delivered. Ordered by the events, not by a sleep (the
    join's bound only lets the mutant's early return show)."""
    producer = producer_with({})
    order: list[str] = []
    closed_inside, go = threading.Event(), threading.Event()

    def handler_thread():
        producer._serving.depth = 1  # inside a poll's report, as a handler runs
        producer.close(timeout_s=1)  # pending: finished by the call's return
        closed_inside.set()
        go.wait()
        order.append("the handler's call returned")
        producer._serving.depth = 0
        producer._finish_close()

    def other_thread():
        producer.close(timeout_s=1)
        order.append("the other close returned")

    first = threading.Thread(target=handler_thread)
    first.start()
    closed_inside.wait()
    other = threading.Thread(target=other_thread)
    other.start()
    other.join(timeout=1)
    go.set()
    first.join()
    other.join()
    assert order == ["the handler's call returned", "the other close returned"]
    assert producer._released
