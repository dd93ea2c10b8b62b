"""What ``send_turn`` does once per event, and the encoding's shortcut that keeps its bytes.

A helper measured ``send_turn`` at ~2 ms a turn (session 50): the turn was checked twice
(by ``send_turn``, then again before its encoding) and each event was dumped
(``to_avro``) by its range check and again by its encoding, five dumps for a turn with
one effect. Now each event is checked and dumped once and the checked dump is what is
written. The encoding names the branch of each top-level ``null``-or-record union
(``schemas.avro.nullable_record_fields``), so fastavro does not validate the record to
pick it: these tests pin that the bytes are the registry serializer's, whichever
branch, and that a wrong record there is still an ``EncodeError``.
"""

from __future__ import annotations

import pytest

from ratchet.samples import make_tool_effect, make_turn
from ratchet.settings import Settings
from schemas import avsc
from schemas.avro import EventSerde, nullable_record_fields
from schemas.errors import EncodeError
from schemas.models import Frozen, RouterReceipt
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer
from tests.unit import registry_mock

TOPIC = registry_mock.TOPIC
client = registry_mock.client  # the shared mock registry's fixture


class Recording:
    """librdkafka's producer, with the values handed to it noted."""

    def __init__(self, producer) -> None:
        self._producer = producer
        self.values: list[bytes] = []

    def produce(self, topic, value, **kwargs):
        self.values.append(value)
        return self._producer.produce(topic, value=value, **kwargs)

    def __getattr__(self, name):
        return getattr(self._producer, name)


def turn_with_effect():
    turn = make_turn(router_receipt=RouterReceipt(
        receipt_id="r", router_key_format="k", covered_tokens=3, expires_at=10**12,
        issuer="i"))
    effect = make_tool_effect(
        "call_1", idempotency_key=turn.idempotency_key, tenant_id=turn.tenant_id,
        conversation_id=turn.conversation_id, chain_root_id=turn.chain_root_id,
        response_id=turn.response_id)
    return turn, effect


def test_send_turn_dumps_each_event_once_and_writes_the_registry_serializers_bytes(
        client, monkeypatch):
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"),
                               serde=EventSerde(client), config={"log_level": 0})
    recording = producer._producer = Recording(producer._producer)
    turn, effect = turn_with_effect()
    warm, warm_effect = turn_with_effect()
    producer.send_turn(warm, effects=[warm_effect])  # the serde's writers are made
    recording.values.clear()
    dumps: list[str] = []
    dump = Frozen.to_avro

    def counted(self):
        dumps.append(type(self).__name__)
        return dump(self)

    monkeypatch.setattr(Frozen, "to_avro", counted)
    producer.send_turn(turn, effects=[effect])
    monkeypatch.undo()
    assert sorted(dumps) == ["ToolEffect", "TurnCompleted"]  # 2 ToolEffect, 3 turn before
    reference = EventSerde(client)
    reference._writers = {"ToolEffect": None, "TurnCompleted": None}  # the serializer
    assert recording.values == [reference.encode(effect, TOPIC), reference.encode(turn, TOPIC)]
    with pytest.raises(DeliveryError):  # nothing listens: purged by the close
        producer.close(0)


def test_the_hinted_fields_are_the_turns_optional_records():
    assert nullable_record_fields(avsc.parsed("TurnCompleted")) == (
        ("boundary_proof", "io.ratchet.BoundaryProof"),
        ("token_artifact", "io.ratchet.TokenArtifact"),
        ("router_receipt", "io.ratchet.RouterReceipt"))
    assert nullable_record_fields(avsc.parsed("ToolEffect")) == ()


@pytest.mark.parametrize("certified", [True, False])
@pytest.mark.parametrize("receipt", [True, False])
def test_the_fast_path_writes_the_serializers_bytes_with_each_branch(client, certified,
                                                                     receipt):
    turn = make_turn(certified=certified)
    if receipt:
        turn = turn_with_effect()[0].model_copy(
            update={"token_artifact": turn.token_artifact, "boundary_proof": turn.boundary_proof})
    fast, reference = EventSerde(client), EventSerde(client)
    fast.encode(make_turn(), TOPIC)  # its writer is made on the first
    assert fast._writers["TurnCompleted"] is not None
    reference._writers["TurnCompleted"] = None  # the serializer every time
    assert fast.encode(turn, TOPIC) == reference.encode(turn, TOPIC)


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic's, on the broken field
def test_a_wrong_record_in_a_hinted_field_is_still_an_encode_error(client):
    serde = EventSerde(client)
    turn = make_turn()
    serde.encode(turn, TOPIC)
    broken = turn.model_copy(update={"boundary_proof": turn.token_artifact})  # no validation
    with pytest.raises(EncodeError):
        serde.encode(broken, TOPIC)
