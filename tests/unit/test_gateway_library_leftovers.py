"""The gateway library's leftovers of session 44's reviews.

docs/service.md, section 3, and docs/gateway-protocol.md: every refusal of the library is
a typed ``GatewayError``; ``send_turn`` produces nothing of a turn it refuses; an answer
that is not the service's is ``RehydrationUnavailable``; ``close`` of ``EffectClaims``
reports what it could not record.

1. ``send_turn`` compared only the partition key of an effect with its turn's: an effect
   of another request (tenant, idempotency key, response) was produced with the turn.
2. ``RehydrationClient.status`` handed on a ``state`` it does not know.
3. ``EffectClaims.close`` re-sent a completion, the producer refused its ``ToolEffect``,
   and ``close`` said nothing of it.
4. A ``close`` of the producer in another thread between a turn's events queued some of
   them and refused the rest (``ProducerClosed`` after effects were queued).

No broker is needed: librdkafka is replaced by ``FakeKafka``.
"""

from __future__ import annotations

import threading

import httpx
import pytest

from ratchet.samples import make_turn
from services.gateway.claims import ClaimsLeftOpen, ToolEffectsNotProduced
from services.gateway.client import RehydrationClient
from services.gateway.errors import (
    DeliveryError,
    EffectOfAnotherTurn,
    GatewayError,
    ProducerClosed,
    RehydrationUnavailable,
)
from tests.unit.test_gateway_library_open_items import CALL, FlakyServer, run_expecting
from tests.unit.test_gateway_library_review import effect_of, gateway


# 1. ------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["tenant_id", "idempotency_key", "response_id"])
def test_an_effect_of_another_request_is_a_typed_refusal_with_nothing_produced(field):
    producer, kafka = gateway()
    turn = make_turn()
    mine = effect_of(turn, "call_1")
    other = effect_of(turn, "call_2").model_copy(update={field: "other_1"})
    with pytest.raises(EffectOfAnotherTurn, match="another request") as refused:
        producer.send_turn(turn, effects=[mine, other])
    assert isinstance(refused.value, GatewayError) and not refused.value.retryable
    assert refused.value.effect_id == other.effect_id
    assert refused.value.fields == [(field, "other_1", getattr(turn, field))]
    assert kafka.produced == []


def test_the_effects_of_the_turns_request_are_produced_before_it():
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    producer.send_turn(turn, effects=effects)
    assert len(kafka.produced) == 3


# 2. ------------------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["PROMOTED", "cancelled", ""])
def test_a_status_answer_with_a_state_the_client_does_not_know_is_not_the_services(state):
    body = {"response_id": "resp_1", "state": state, "reason": None, "seq": None}
    client = RehydrationClient("http://api.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=body)))
    with pytest.raises(RehydrationUnavailable, match="not the rehydration service's"):
        client.status("t1", "resp_1")


@pytest.mark.parametrize("state", ["promoted", "rejected", "unknown"])
def test_a_status_answer_with_a_known_state_is_handed_on(state):
    body = {"response_id": "resp_1", "state": state, "reason": None, "seq": None}
    client = RehydrationClient("http://api.test", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json=body)))
    assert client.status("t1", "resp_1").state == state


# 3. ------------------------------------------------------------------------------------
def test_a_tool_effect_refused_after_closes_re_sent_completion_is_reported():
    """The tool ran, its completion failed; ``close`` re-sends it (it lands) but the
    producer, closed meanwhile, refuses its ``ToolEffect``: ``close`` raises
    ``ToolEffectsNotProduced`` carrying the event to send with the turn."""
    server = FlakyServer()
    producer, kafka = gateway()

    def send_email():
        server.down = True
        return "sent"

    claims = server.claims(1)
    claims._producer = producer
    with pytest.raises(ToolEffectsNotProduced, match="send_turn") as left, claims, \
            claims.effect(CALL, subturn_index=0) as effect:
        run_expecting(RehydrationUnavailable, effect, send_email)
        server.down = False
        producer.close()
    assert left.value.retryable
    assert [e.effect_id for e in left.value.effects] == [effect.effect_id]
    assert kafka.produced == []
    [stored] = server.stored()
    assert stored.completed  # the claim records what ran


def test_a_tool_effect_refused_in_run_is_sent_again_by_close():
    """``run``'s completion landed, its ``ToolEffect`` was refused (``ProducerClosed``,
    raised to the caller); ``close`` sends it once more, and reports it when refused
    again."""
    server = FlakyServer()
    producer, kafka = gateway()
    producer.close()
    claims = server.claims(1)
    claims._producer = producer
    with pytest.raises(ToolEffectsNotProduced) as left, claims, \
            claims.effect(CALL, subturn_index=0) as effect:
        run_expecting(ProducerClosed, effect, lambda: "sent")
    assert [e.effect_id for e in left.value.effects] == [effect.effect_id]
    assert [claim.completed for claim in server.stored()] == [True]


def test_a_refused_tool_effect_is_noted_on_claims_left_open():
    server = FlakyServer()
    producer, _ = gateway()
    producer.close()
    claims = server.claims(1)
    claims._producer = producer

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(ClaimsLeftOpen) as left, claims:
        with claims.effect(CALL, subturn_index=0) as first:
            run_expecting(ProducerClosed, first, lambda: "sent")
        with claims.effect({**CALL, "call_id": "call_9"}, subturn_index=1) as second:
            run_expecting(KeyboardInterrupt, second, interrupted)
    assert left.value.interrupted == [second.effect_id]
    assert [e.effect_id for e in left.value.unsent] == [first.effect_id]
    assert any("ToolEffect" in note for note in left.value.__notes__)


# 4. ------------------------------------------------------------------------------------
def test_a_close_in_another_thread_never_comes_between_a_turns_events():
    """A close in another thread while ``send_turn`` runs (here: once the turn's second
    event has its delivery report) comes before the turn (``ProducerClosed``, nothing
    queued) or after it (all queued, then purged and named by the close), never between:
    the effect queued alone with the turn refused."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    closer: list[threading.Thread] = []
    closed: list[DeliveryError] = []

    def close() -> None:
        try:
            producer.close(timeout_s=0)
        except DeliveryError as exc:  # FakeKafka never delivers: the close purges
            closed.append(exc)

    on_delivery = producer._on_delivery
    made: list[str] = []

    def on_delivery_then_close(event_id, *delivery):
        made.append(event_id)
        if len(made) == 2:
            closer.append(threading.Thread(target=close))
            closer[0].start()
            closer[0].join(0.5)  # a close not held off has closed by now
        return on_delivery(event_id, *delivery)

    producer._on_delivery = on_delivery_then_close
    try:
        producer.send_turn(turn, effects=effects)
    except ProducerClosed:
        assert kafka.produced == []  # before the turn: nothing of it
    else:
        assert len(kafka.produced) == 3  # after the turn: all of it, purged by the close
        closer[0].join(10)
        assert sorted(eid for eid, _ in closed[0].failures) == sorted(
            e.event_id for e in (*effects, turn))
    closer[0].join(10)
    assert not closer[0].is_alive()
    with pytest.raises(ProducerClosed):
        producer.send(make_turn())
