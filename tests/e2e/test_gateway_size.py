"""The size limit end to end (issue 12 defect 5, docs/gateway-protocol.md "Size limit").

A gateway event value (5-byte header + Avro body) of at most MAX_EVENT_BYTES travels
end to end: topic, producer, consumer, store, HTTP. Above it, the gateway library refuses
with a typed error before producing, and a raw record that reaches the processor anyway is
rejected UNSUPPORTED_FORMAT. These move the largest records of the suite: ~10 s each.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

from services.demo.simulator import SimulatedGateway
from services.gateway.errors import GatewayError
from services.gateway.events import TurnIdentity
from tests.e2e.outside import (
    OutsideGateway,
    canonical,
    item,
    turn,
    uid,
)

MiB = 1024 * 1024
# The protocol's maximum value of one gateway event (docs/gateway-protocol.md).
MAX_EVENT_BYTES = 10 * MiB


def message_of_size(role: str, size: int) -> dict:
    """A Responses message object whose canonical JSON is exactly ``size`` bytes."""
    kind = "input_text" if role == "user" else "output_text"
    obj = {"id": uid("msg"), "type": "message", "role": role,
           "content": [{"type": kind, "text": ""}]}
    obj["content"][0]["text"] = "x" * (size - len(canonical(obj)))
    assert len(canonical(obj)) == size
    return obj


def messages_totalling(total: int, parts: int = 8) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of ``parts`` messages whose contents total exactly ``total`` bytes."""
    sizes = [total // parts] * parts
    sizes[-1] += total - sum(sizes)
    half = parts // 2
    return ([message_of_size("user", s) for s in sizes[:half]],
            [message_of_size("assistant", s) for s in sizes[half:]])


@pytest.fixture(scope="module")
def gw(e2e_stack):
    settings = e2e_stack.settings
    gateway = OutsideGateway(settings.kafka_bootstrap, settings.schema_registry_url,
                             settings.topic_prefix, e2e_stack.base_url)
    yield gateway
    gateway.close()


def _end_offsets(settings, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": uid("probe")})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}
    finally:
        consumer.close()


def test_an_8_mib_turn_from_an_outside_gateway_is_promoted_and_served(gw):
    tenant = uid("tenant")
    inputs, outputs = messages_totalling(8 * MiB)
    event = turn(tenant, uid("resp"), [item(o) for o in inputs], [item(o) for o in outputs])
    value = gw.registry.encode("TurnCompleted", event)
    assert 8 * MiB < len(value) <= MAX_EVENT_BYTES
    promoted = gw.promoted(event, timeout_s=120)
    assert promoted["seq"] == 1
    answer = gw.response_history(tenant, event["response_id"], **{"Cache-Control": "no-cache"})
    assert answer.status_code == 200, answer.text[:300]
    served = [i["content"].encode() for i in answer.json()["items"]]
    assert served == [canonical(o) for o in inputs + outputs]
    assert sum(map(len, served)) == 8 * MiB


def test_an_8_mib_turn_through_the_gateway_library_is_promoted(e2e_stack):
    sim = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    inputs, outputs = messages_totalling(8 * MiB)
    sent = sim.turn(TurnIdentity.conversation(sim.tenant_id, uid("conv"), uid("resp"), 0),
                    inputs, outputs)
    sim.publish(sent)
    outcome = sim.rehydrate(sent.response_id, wait_ms=10_000)
    assert type(outcome).__name__ == "Certified", outcome
    assert [i.content.encode() for i in outcome.items] == [i.content for i in sent.items]


def test_gateway_library_refuses_a_turn_above_the_maximum_before_producing(e2e_stack):
    sim = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    inputs, outputs = messages_totalling(MAX_EVENT_BYTES + 64 * 1024)
    too_big = sim.turn(TurnIdentity.conversation(sim.tenant_id, uid("conv"), uid("resp"), 0),
                       inputs, outputs)
    topic = e2e_stack.settings.topic("gateway-events")
    before = _end_offsets(e2e_stack.settings, topic)
    with pytest.raises(GatewayError) as refused:
        e2e_stack.producer.send(too_big)
    assert refused.value.retryable is False
    assert str(MAX_EVENT_BYTES) in str(refused.value)
    e2e_stack.producer.flush()
    assert _end_offsets(e2e_stack.settings, topic) == before


def test_processor_rejects_a_raw_record_above_the_maximum_unsupported_format(gw):
    inputs, outputs = messages_totalling(MAX_EVENT_BYTES + 64 * 1024)
    event = turn(uid("tenant"), uid("resp"), [item(o) for o in inputs],
                 [item(o) for o in outputs])
    assert len(gw.registry.encode("TurnCompleted", event)) > MAX_EVENT_BYTES
    rejection = gw.rejected(event, timeout_s=120)
    assert rejection["reason"] == "UNSUPPORTED_FORMAT"
    assert gw.status(event["tenant_id"], event["response_id"])["state"] == "rejected"
