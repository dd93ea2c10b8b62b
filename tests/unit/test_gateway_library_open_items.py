"""The gateway library's items left open by session 43's review (session 44).

docs/service.md, section 3: delivery failures are raised on the next ``flush`` of each
thread, once per thread; a sending thread is told the failures reported from its send
on, a thread's first flush every failure no thread that sent before it has flushed past;
every refusal of the library is a typed ``GatewayError`` saying whether a retry helps;
``close()`` (also leaving the ``with`` block) releases what the object holds.

1. The producer kept each thread's place in its failures by ``threading.get_ident()``;
   Python reuses idents, so a thread that ended left its place to the next thread given
   its ident: that thread was told failures it never produced (reported before it
   sent), or not told a failure another thread's send was waiting for.
2. ``send_turn`` refused an effect keyed apart from its turn with a plain
   ``ValueError``.
3. ``EffectClaims`` had no context manager.

More of the same kind, found reading the library again:

4. Builders, producer and clients let untyped errors out: pydantic's
   ``ValidationError``, ``AttributeError`` for an SDK's item object, confluent-kafka's
   ``KafkaException`` (a fatal error, a config it refuses), httpx's ``RuntimeError``
   after ``close``; a ``config`` weakening the delivery guarantees was taken silently.
5. A history answer missing a field its outcome always has became ``None`` in it.
6. A ``close`` while another thread closed the producer returned at once, raising
   nothing.

No broker is needed: librdkafka is replaced by ``FakeKafka`` (the session 43 review's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException

from ratchet.samples import make_fingerprint, make_tool_effect, make_turn
from ratchet.settings import Settings
from schemas.keys import MissingChainRoot
from services.gateway.claims import (
    ClaimsLeftOpen,
    EffectClaims,
    EffectOutcomeUnknown,
    StillInProgress,
)
from services.gateway.client import RehydrationClient
from services.gateway.errors import (
    ClientClosed,
    DeliveryError,
    EffectKeyedApart,
    EventNotQueued,
    GatewayError,
    InvalidGatewayEvent,
    InvalidGatewayItem,
    ProducerMisconfigured,
    RehydrationUnavailable,
    UnservableId,
)
from services.gateway.events import (
    TurnIdentity,
    to_item,
    tool_effect,
    turn_cancelled,
    turn_completed,
)
from services.gateway.producer import GatewayProducer
from tests.unit.test_gateway_claims_library_review import CALL1 as CALL
from tests.unit.test_gateway_claims_library_review import CALL2, Server
from tests.unit.test_gateway_library_review import gateway

IDENTITY = TurnIdentity.conversation("t1", "conv_1", "resp_1", 0)
RETRIABLE = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not enough replicas", retriable=True)


def run_in_thread(fn: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return thread


def run_with_ident(ident: int, fn: Callable[[], None],
                   run: Callable[[Callable[[], None]], object] = run_in_thread) -> None:
    """Run ``fn`` in a new thread that has the ident ``ident`` (of a thread that ended):
    start and join threads (with ``run``) until the platform hands that ident out again
    (glibc reuses a joined thread's stack, and its ident, within a few threads)."""
    ran: list[bool] = []

    def maybe() -> None:
        if threading.get_ident() == ident:
            ran.append(True)
            fn()

    for _ in range(1000):
        run(maybe)
        if ran:
            return
    pytest.fail(f"no new thread was given the ident {ident} in 1000 threads")


# 1. ------------------------------------------------------------------------------------
def test_a_new_thread_with_a_reused_ident_is_not_told_failures_reported_before_it_sent():
    """A thread sends and ends; its event fails; a new thread given the same ident sends
    and flushes: it is told only what failed from its send on (nothing here). Keyed by
    ident, it was told the ended thread's failure as its own."""
    producer, kafka = gateway()
    told: list[DeliveryError | None] = []
    first = run_in_thread(lambda: producer.send(make_turn()))
    kafka.deliver(0, RETRIABLE)  # the ended thread's event failed
    kafka.poll()

    def second() -> None:
        producer.send(make_turn())
        kafka.deliver(0)  # its own event is written
        try:
            producer.flush(1)
            told.append(None)
        except DeliveryError as exc:
            told.append(exc)

    run_with_ident(first.ident, second)
    assert told == [None], f"told of a failure reported before it sent: {told}"


def test_a_new_thread_with_a_reused_ident_is_told_what_a_sender_has_not_flushed_past():
    """This thread sends; its event fails. A thread flushes (told of it) and ends; a new
    thread given the same ident flushes for the first time: it is told the failure, which
    the sender has not flushed past (an executor thread flushing for the sender). Keyed by
    ident, it took the ended thread's place, past the failure, and was told nothing."""
    producer, kafka = gateway()
    mine = make_turn()
    producer.send(mine)
    kafka.deliver(0, RETRIABLE)
    told: list[DeliveryError | None] = []

    def flusher() -> None:
        try:
            producer.flush(1)
            told.append(None)
        except DeliveryError as exc:
            told.append(exc)

    first = run_in_thread(flusher)
    run_with_ident(first.ident, flusher)
    assert len(told) == 2 and all(isinstance(exc, DeliveryError) for exc in told), told
    assert [eid for eid, _ in told[1].failures] == [mine.event_id]
    with pytest.raises(DeliveryError):  # and the sender is still told, once
        producer.flush(1)
    producer.flush(1)
    assert producer._failure_log == []  # no thread left needs it: not kept



# 2. ------------------------------------------------------------------------------------
def test_an_effect_keyed_apart_from_its_turn_is_a_typed_refusal_with_nothing_produced():
    producer, kafka = gateway()
    turn = make_turn()
    effect = make_tool_effect("call_1", idempotency_key=turn.idempotency_key,
                              conversation_id="conv_other")
    with pytest.raises(EffectKeyedApart, match="TurnIdentity") as refused:
        producer.send_turn(turn, effects=[effect])
    assert isinstance(refused.value, GatewayError) and not refused.value.retryable
    assert (refused.value.effect_id, refused.value.effect_key, refused.value.turn_key) == (
        effect.effect_id, "conv_other", turn.conversation_id)
    assert kafka.produced == []


def test_a_continued_chain_without_its_root_is_a_typed_refusal_with_nothing_produced():
    producer, kafka = gateway()
    turn = make_turn(conversation_id=None, expected_head_seq=None, chain_root_id=None,
                     previous_response_id="resp_0")
    for send in (producer.send, producer.send_turn):
        with pytest.raises(GatewayError, match="pass chain_root_id") as refused:
            send(turn)
        assert isinstance(refused.value, MissingChainRoot) and not refused.value.retryable
    with pytest.raises(GatewayError, match="pass chain_root_id"):
        TurnIdentity.chain("t1", "resp_1", previous_response_id="resp_0")
    assert kafka.produced == []


def test_an_event_with_an_empty_key_is_a_typed_refusal():
    producer, kafka = gateway()
    with pytest.raises(UnservableId):
        producer.send(make_turn(conversation_id=""))
    assert kafka.produced == []


# 3. ------------------------------------------------------------------------------------
def run_expecting(error: type[BaseException], effect, fn) -> None:
    with pytest.raises(error):
        effect.run(fn)


class FlakyServer(Server):
    """The claims routes (``Server``), and a switch that makes the API unreachable:
    nothing is forwarded while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def forward(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("unreachable", request=request)
        return super().forward(request)

    def stored(self):
        return self.ledger.claims_for("t1", "k1")


def test_leaving_the_claims_block_releases_the_session_and_a_later_request_is_typed():
    server = FlakyServer()
    with server.claims(1) as claims, claims.effect(CALL, subturn_index=0) as effect:
        effect.run(lambda: "sent")
    with claims.effect(CALL2, subturn_index=0) as other, \
            pytest.raises(ClientClosed, match="create a new one"):
        other.run(lambda: pytest.fail("run after close"))
    assert [claim.completed for claim in server.stored()] == [True]  # nothing claimed


def test_leaving_the_claims_block_records_an_outcome_whose_completion_failed():
    """The tool ran; its completion did not get through. Leaving the block sends it again
    (the same token): the claim records what ran, and the block leaves quietly."""
    server = FlakyServer()
    runs = []

    def send_email():
        runs.append(1)
        server.down = True  # the API goes away while the tool runs
        return "sent"

    with server.claims(1) as claims, claims.effect(CALL, subturn_index=0) as effect:
        run_expecting(RehydrationUnavailable, effect, send_email)
        server.down = False
    [stored] = server.stored()
    assert (stored.completed, stored.status, runs) == (True, "succeeded", [1])
    assert b"sent" in stored.output.content


def test_leaving_the_claims_block_with_an_unrecorded_outcome_says_so_and_holds_the_claim():
    """Its completion fails again: ``ClaimsLeftOpen`` names it; the claim is neither
    completed (nothing reported done that was not) nor released (the tool ran): the
    next attempt waits for the lease, then is told the outcome is unknown."""
    server = FlakyServer()

    def send_email():
        server.down = True
        return "sent"

    with pytest.raises(ClaimsLeftOpen) as left, \
            server.claims(1) as claims, claims.effect(CALL, subturn_index=0) as effect:
        run_expecting(RehydrationUnavailable, effect, send_email)
    assert (left.value.unrecorded, left.value.interrupted, left.value.unanswered) == (
        [effect.effect_id], [], [])
    assert not left.value.retryable and "outcome not recorded" in str(left.value)
    server.down = False
    [stored] = server.stored()
    assert not stored.completed
    later = server.claims(2, max_wait_s=0)
    with later.effect(CALL2, subturn_index=0) as retry, pytest.raises(StillInProgress):
        retry.run(lambda: pytest.fail("ran beside the holder"))
    server.now_ms += 5_000
    with later.effect(CALL2, subturn_index=0) as retry, pytest.raises(EffectOutcomeUnknown):
        retry.run(lambda: pytest.fail("ran again after the lease"))


class ToolTimeout(BaseException):
    """As gevent's Timeout: a BaseException."""


def test_leaving_the_claims_block_after_an_interrupted_tool_says_so_and_holds_the_claim():
    server = FlakyServer()

    def send_email():
        raise ToolTimeout()

    with pytest.raises(ClaimsLeftOpen, match="may have run") as left, \
            server.claims(1) as claims, claims.effect(CALL, subturn_index=0) as effect:
        run_expecting(ToolTimeout, effect, send_email)
    assert left.value.interrupted == [effect.effect_id]
    assert [claim.completed for claim in server.stored()] == [False]


def test_leaving_the_claims_block_after_a_lost_claim_answer_says_so():
    server = FlakyServer()
    server.lose_next_answer = True  # the claim lands; its answer is lost
    with pytest.raises(ClaimsLeftOpen, match="never run") as left, \
            server.claims(1) as claims, claims.effect(CALL, subturn_index=0) as effect:
        run_expecting(RehydrationUnavailable, effect, lambda: pytest.fail("not claimed: never run"))
    assert left.value.unanswered == [effect.effect_id]
    assert [claim.completed for claim in server.stored()] == [False]


def test_an_error_leaving_the_claims_block_is_the_one_raised_with_the_open_claim_noted():
    server = FlakyServer()

    def send_email():
        server.down = True
        return "sent"

    with pytest.raises(RehydrationUnavailable) as raised, \
            server.claims(1) as claims, claims.effect(CALL, subturn_index=0) as effect:
        effect.run(send_email)
    assert any(effect.effect_id in note and "outcome not recorded" in note
               for note in raised.value.__notes__)


def test_a_request_after_the_rehydration_client_is_closed_is_typed():
    with RehydrationClient("http://api.test", transport=httpx.MockTransport(
            lambda request: pytest.fail("sent after close"))) as client:
        pass
    with pytest.raises(ClientClosed):
        client.status("t1", "resp_1")


# More of the same kind (session 44). -------------------------------------------------
FUNCTION_CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


@pytest.mark.parametrize("build", [
    lambda: TurnIdentity("t1", "resp_1"),
    lambda: TurnIdentity("t1", "resp_1", conversation_id="conv_1"),
    lambda: TurnIdentity("t1", "resp_1", conversation_id="conv_1", expected_head_seq=0,
                         previous_response_id="resp_0"),
    lambda: turn_completed(IDENTITY, idempotency_key="k1", request={}, input_items=[],
                           output_items=[], fingerprint=make_fingerprint(), status="bogus"),
    lambda: turn_completed(IDENTITY, idempotency_key="k1", request={}, input_items=[],
                           output_items=[], fingerprint=make_fingerprint(), truncation=5),
    lambda: turn_cancelled(IDENTITY, idempotency_key=7),
    lambda: tool_effect(IDENTITY, idempotency_key="k1", subturn_index="first",
                        call=FUNCTION_CALL, output={"type": "function_call_output",
                                                    "call_id": "c1", "output": "ok"}),
], ids=["no mode", "no head", "conversation with parent", "status", "truncation",
        "key type", "subturn type"])
def test_a_builder_refusing_its_arguments_is_a_typed_gateway_error(build):
    """pydantic's ``ValidationError`` (and ``TurnIdentity``'s plain ``ValueError``) left
    the builders untyped; still a ``ValueError``."""
    with pytest.raises(InvalidGatewayEvent) as refused:
        build()
    assert isinstance(refused.value, GatewayError) and isinstance(refused.value, ValueError)
    assert not refused.value.retryable


@pytest.mark.parametrize("build", [
    lambda: to_item({"content": "no type"}, default_id="i1"),
    lambda: tool_effect(IDENTITY, idempotency_key="k1", subturn_index=0,
                        call={"type": "message"}, output={}),
], ids=["item", "effect"])
def test_an_item_the_builders_refuse_is_a_typed_gateway_error(build):
    with pytest.raises(InvalidGatewayItem) as refused:
        build()
    assert isinstance(refused.value, GatewayError) and not refused.value.retryable


ITEM = {"item_id": "m1", "type": "message", "role": "user", "call_id": None,
        "content": '{"id":"m1","type":"message"}', "content_digest": "d" * 64,
        "format_version": 1}
CHECKPOINT = {"seq": 3, "fingerprint_hash": "f" * 64, "expires_at": None,
              "token_artifact": {}, "router_receipt": None, "boundary_proof": None}
CERTIFIED = {"outcome": "certified", "reason": None, "head_seq": 3, "response_id": "resp_1",
             "items": [ITEM], "checkpoint": CHECKPOINT}


def _without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


@pytest.mark.parametrize("body", [
    {**CERTIFIED, "items": [_without(ITEM, "content")]},
    {**CERTIFIED, "items": [{**ITEM, "content": None}]},
    {**CERTIFIED, "items": [{**ITEM, "content_digest": 7}]},
    {**CERTIFIED, "items": [{**ITEM, "format_version": "1"}]},
    {**CERTIFIED, "checkpoint": _without(CHECKPOINT, "seq")},
    {**CERTIFIED, "checkpoint": {**CHECKPOINT, "fingerprint_hash": None}},
    {**CERTIFIED, "checkpoint": {**CHECKPOINT, "token_artifact": "reuse me"}},
    _without(CERTIFIED, "items"),
    {**_without(CERTIFIED, "checkpoint"), "outcome": "fallback", "reason": "NO_ARTIFACT",
     "items": None},
], ids=["item without content", "null content", "digest not a string",
        "format version not an int", "checkpoint without seq", "null fingerprint hash",
        "artifact not an object", "certified without items", "fallback with null items"])
def test_a_history_answer_missing_a_field_its_outcome_always_has_is_not_the_services(body):
    """The client filled a missing field with ``None``: a certified history whose item
    has no content, a checkpoint without ``seq``, a certified history with no items at
    all, was handed to the gateway as the service's answer."""
    client = RehydrationClient("http://api.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=body)))
    with pytest.raises(RehydrationUnavailable, match="not the rehydration service's"):
        client.response_history("t1", "resp_1", "f" * 64)



@pytest.mark.parametrize(("error", "retryable"), [
    (KafkaError(KafkaError._FATAL, "the idempotent producer failed", fatal=True), False),
    (KafkaError(KafkaError._STATE, "not ready", retriable=True), True),
], ids=["fatal", "retriable"])
def test_an_event_librdkafka_refuses_to_queue_is_a_typed_gateway_error(error, retryable):
    """``produce`` raising (as confluent-kafka does after the idempotent producer's fatal
    error) leaked its untyped ``KafkaException`` from ``send``."""
    producer, kafka = gateway()

    def refuse(*args, **kwargs):
        raise KafkaException(error)

    kafka.produce = refuse
    turn = make_turn()
    with pytest.raises(EventNotQueued, match="not produced") as refused:
        producer.send(turn)
    assert (refused.value.event_id, refused.value.retryable) == (turn.event_id, retryable)
    assert refused.value.fatal is not retryable


@pytest.mark.parametrize("config", [
    {"enable.idempotence": False}, {"acks": 1}, {"acks": "1"},
    {"request.required.acks": 0}, {"allow.auto.create.topics": "true"},
    {"delivery.report.only.error": True},
], ids=lambda config: ",".join(f"{k}={v}" for k, v in config.items()))
def test_a_config_weakening_the_delivery_guarantees_is_refused(config):
    """``config`` overrode the producer's defaults whatever they were: ``acks=1`` or
    idempotence off (order of effects before their turn, no duplicates) was taken
    silently, so was a topic created by producing to it or successes left unreported
    (one without an offset is not a confirmed write)."""
    with pytest.raises(ProducerMisconfigured, match="no producer made") as refused:
        GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=object(),
                        config={"log_level": 0, **config})
    assert isinstance(refused.value, GatewayError) and not refused.value.retryable


class SdkItem:
    """As an SDK's pydantic item (openai's ``ResponseOutputMessage``): not a dict."""

    def model_dump(self) -> dict:
        return {"type": "message", "role": "user", "content": []}


@pytest.mark.parametrize("build", [
    lambda: to_item(SdkItem(), default_id="i1"),
    lambda: turn_completed(IDENTITY, idempotency_key="k1", request={}, input_items=["hi"],
                           output_items=[], fingerprint=make_fingerprint()),
    lambda: to_item({"type": "message", "content": b"bytes"}, default_id="i1"),
    lambda: tool_effect(IDENTITY, idempotency_key="k1", subturn_index=0, call=FUNCTION_CALL,
                        output="ok"),
    lambda: tool_effect(IDENTITY, idempotency_key="k1", subturn_index=0, call=SdkItem()),
    lambda: EffectClaims("http://api.test", IDENTITY, idempotency_key="k1",
                         attempt=1).effect(SdkItem(), subturn_index=0).__enter__(),
], ids=["sdk object", "str item", "bytes in an item", "str output", "sdk call",
        "sdk call claimed"])
def test_an_item_that_is_not_a_json_dict_is_a_typed_refusal(build):
    """A gateway holding its items as an SDK's objects (or a string) got an
    ``AttributeError`` ("no attribute 'get'") or a ``TypeError`` from the builders."""
    with pytest.raises(InvalidGatewayItem) as refused:
        build()
    assert isinstance(refused.value, GatewayError)


@pytest.mark.parametrize("build", [
    lambda: TurnIdentity.conversation(5, "conv_1", "resp_1", 0),
    lambda: TurnIdentity.conversation("t1", "conv_1", "resp_1", "3"),
    lambda: turn_completed(IDENTITY, idempotency_key="k1", request=[("model", "m")],
                           input_items=[], output_items=[], fingerprint=make_fingerprint()),
    lambda: turn_completed(IDENTITY, idempotency_key="k1", request={"t": float("nan")},
                           input_items=[], output_items=[], fingerprint=make_fingerprint()),
    lambda: turn_completed(IDENTITY, idempotency_key="k1", request={}, input_items=[],
                           output_items=[], fingerprint={"model_name": "m"}),
], ids=["int tenant", "str head", "request not a dict", "NaN in the request",
        "fingerprint a dict"])
def test_an_argument_of_another_type_is_a_typed_refusal(build):
    with pytest.raises(InvalidGatewayEvent) as refused:
        build()
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(("settings", "config"), [
    (Settings(kafka_bootstrap="127.0.0.1:1"), {"linger.ms": "soon"}),
    (Settings(kafka_bootstrap="127.0.0.1:1"), {"lingr.ms": 5}),
    (Settings(kafka_bootstrap="127.0.0.1:1", schema_registry_url="registry"), {}),
], ids=["bad value", "unknown property", "registry url"])
def test_a_config_librdkafka_or_the_registry_client_refuses_is_typed(settings, config):
    with pytest.raises(ProducerMisconfigured):
        GatewayProducer(settings, config={"log_level": 0, **config})


def test_a_close_while_another_thread_closes_raises_what_was_not_delivered():
    """Two threads close the producer (each leaving its ``with`` block, or a shutdown
    hook and a worker): the second returned at once, raising nothing, while the first
    was still flushing; its event was then purged, never written."""
    producer, kafka = gateway()
    flushing, release = threading.Event(), threading.Event()
    sent, go = threading.Event(), threading.Event()
    outcome: dict[str, BaseException | None] = {}
    plain_flush = kafka.flush

    def slow_flush(timeout=None):
        if timeout:  # close's first flush waits for the broker
            flushing.set()
            release.wait(10)
        return plain_flush(timeout)

    kafka.flush = slow_flush

    def closer(name: str, send_first: bool) -> Callable[[], None]:
        def close() -> None:
            if send_first:
                producer.send(make_turn())  # never acknowledged: purged by close
                sent.set()
                go.wait(10)
            try:
                producer.close()
                outcome[name] = None
            except DeliveryError as exc:
                outcome[name] = exc
        return close

    second = threading.Thread(target=closer("second", send_first=True))
    second.start()
    assert sent.wait(10)
    first = threading.Thread(target=closer("first", send_first=False))
    first.start()
    assert flushing.wait(10)  # the first close is under way
    go.set()  # the second closes now
    release.set()
    for thread in (first, second):
        thread.join(10)
    assert isinstance(outcome["second"], DeliveryError), outcome
    assert outcome["second"].retryable  # purged: may or may not be written


@pytest.mark.parametrize(("status", "body"), [
    (200, {**CERTIFIED, "response_id": None}),
    (200, {**CERTIFIED, "head_seq": "3"}),
    (200, {**_without(CERTIFIED, "checkpoint"), "outcome": "fallback", "reason": None}),
    (404, {"outcome": "failure", "reason": None, "detail": "no such response"}),
    (404, {"outcome": "failure", "reason": "NOT_FOUND", "detail": {"why": 1}}),
], ids=["certified without response_id", "head_seq a string", "fallback without reason",
        "failure without reason", "detail an object"])
def test_an_outcome_whose_own_fields_are_missing_or_mistyped_is_not_the_services(
        status, body):
    client = RehydrationClient("http://api.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(status, json=body)))
    with pytest.raises(RehydrationUnavailable, match="not the rehydration service's"):
        client.response_history("t1", "resp_1", "f" * 64)


@pytest.mark.parametrize("body", [
    {"response_id": "resp_1", "state": "promoted", "reason": None, "seq": "3"},
    {"response_id": "resp_1", "state": "rejected", "reason": 7, "seq": None},
], ids=["seq a string", "reason a number"])
def test_a_status_answer_with_a_mistyped_field_is_not_the_services(body):
    client = RehydrationClient("http://api.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=body)))
    with pytest.raises(RehydrationUnavailable, match="not the rehydration service's"):
        client.status("t1", "resp_1")


def test_closing_the_producer_releases_the_registry_client_it_made():
    """A producer made without a serde makes its registry client (an HTTP session to
    the registry): ``close`` released the Kafka client only."""
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1",
                                        schema_registry_url="http://127.0.0.1:1"),
                               config={"log_level": 0})
    session = producer._serde.client._rest_client.session
    producer.close(timeout_s=0)
    assert session.is_closed


def test_a_close_inside_the_first_close_of_the_same_thread_does_not_wait_for_itself():
    """A signal handler's ``close`` while its thread is inside ``close``: waiting for the
    first close to end would wait for ever (the first version of the fix above did)."""
    producer, kafka = gateway()
    producer.send(make_turn())
    plain_flush = kafka.flush
    inner: list[BaseException | None] = []

    def flush_with_a_signal(timeout=None):
        if timeout and not inner:
            try:
                producer.close()  # as a handler of SIGTERM would, in this thread
                inner.append(None)
            except DeliveryError as exc:
                inner.append(exc)
        return plain_flush(timeout)

    kafka.flush = flush_with_a_signal
    outer: list[BaseException | None] = []

    def close() -> None:
        try:
            producer.close()
            outer.append(None)
        except DeliveryError as exc:
            outer.append(exc)

    thread = threading.Thread(target=close, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "close waited for itself"
    assert inner == [None]  # nothing failed yet when the handler closed
    assert isinstance(outer[0], DeliveryError)  # the purged event, told by the first
