"""Certified rehydration through the real stack: gateway library -> Kafka -> worker ->
Cassandra -> API -> typed client outcome."""

from __future__ import annotations

import hashlib
import json

import httpx

from services.demo.simulator import (
    SimulatedGateway,
    assistant,
    call,
    output_of,
    reasoning,
    uid,
    user,
)
from services.gateway.client import Certified
from services.gateway.events import TurnIdentity


def test_two_turn_conversation_is_certified_with_every_item(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    conv = uid("conv")
    first = gw.turn(
        TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0),
        [user("Hello")],
        [assistant("Hi! How can I help?")],
    )
    gw.publish(first)
    assert isinstance(gw.rehydrate(first.response_id, wait_ms=10_000), Certified)

    fc = call("get_weather", '{"city":"Paris"}')
    second_id = TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 1)
    key = uid("idem")
    effect = gw.effect(second_id, key, 0, fc, output_of(fc, "sunny"))
    second = gw.turn(
        second_id,
        [user("Weather in Paris?")],
        [
            reasoning("need weather"),
            fc,
            effect.output.model_dump() and json.loads(effect.output.content),
            assistant("Sunny."),
        ],
        idempotency_key=key,
        tool_effect_ids=[effect.effect_id],
    )
    gw.publish(second, [effect])

    outcome = gw.rehydrate(second.response_id, wait_ms=10_000)
    assert isinstance(outcome, Certified), outcome
    assert outcome.head_seq == 2 and outcome.checkpoint.seq == 2
    expected = [i.item_id for i in first.items + second.items]
    assert [i.item_id for i in outcome.items] == expected
    for item, sent in zip(outcome.items, first.items + second.items, strict=True):
        assert item.content.encode() == sent.content  # byte-exact
        assert hashlib.sha256(item.content.encode()).hexdigest() == item.content_digest
    assert outcome.checkpoint.fingerprint_hash == gw.fingerprint_hash
    assert outcome.checkpoint.token_artifact["artifact_id"] == second.token_artifact.artifact_id

    by_conversation = gw.conversation(conv)
    assert isinstance(by_conversation, Certified)
    assert by_conversation.response_id == second.response_id
    assert [i.item_id for i in by_conversation.items] == expected

    status = e2e_stack.client.status(gw.tenant_id, second.response_id)
    assert (status.state, status.seq) == ("promoted", 2)


def test_metrics_and_health_are_served(e2e_stack):
    assert httpx.get(f"{e2e_stack.base_url}/healthz").json()["status"] == "ok"
    text = httpx.get(f"{e2e_stack.base_url}/metrics").text
    assert "ratchet_api_lookup_seconds" in text
    assert "ratchet_api_notifier_up 1.0" in text
