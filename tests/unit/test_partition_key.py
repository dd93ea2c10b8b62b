"""One partition-key rule (``schemas.keys``): the gateway library, the models and the
processor key every kind of turn identically, including a chain's first response sent
without ``chain_root_id``; a continued chain without it is refused, typed, by all three."""

from __future__ import annotations

import pickle

import pytest

from ratchet.samples import NOW_MS, TENANT, make_turn, new_id
from ratchet.settings import Settings
from schemas.keys import MissingChainRoot, partition_key
from schemas.models import RejectionReason
from services.gateway.events import TurnIdentity
from services.gateway.producer import GatewayProducer
from services.ledger.memory import MemoryLedger
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from streams.records import RawRecord
from streams.topics import Topics
from tests.unit.test_processor_rules import raw_record

TOPICS = Topics.with_prefix("t.")


class PickleCodec:
    def decode(self, record: RawRecord):
        return pickle.loads(record.value)


class CapturingProducer:
    """Stands in for librdkafka: records the key each event is produced with."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []

    def produce(self, topic, value, key, on_delivery):
        self.keys.append(key)

    def poll(self, timeout):
        return 0


class NoSerde:
    def encode(self, event, topic):
        return b""


def gateway_key(event) -> str:
    producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=NoSerde(),
                               config={"log_level": 0})
    producer._producer = CapturingProducer()
    producer.send(event)
    return producer._producer.keys[0].decode()


def processor_key(event) -> tuple[str, str]:
    """(Kafka key, partition_key field) of the processor's outcome for ``event``."""
    processor = PromotionProcessor(MemoryCheckpointStore(), MemoryLedger(), PickleCodec(),
                                   TOPICS, clock_ms=lambda: NOW_MS)
    handled = processor.handle(raw_record(event))
    outcome = handled.outbound[0]
    return outcome.key.decode(), outcome.model.partition_key


CASES = {
    # name: (identity fields, the key CONTRACT section 2 gives)
    "conversation": (dict(conversation_id="conv_k", chain_root_id=None,
                          expected_head_seq=0, previous_response_id=None), "conv_k"),
    "chain root with chain_root_id": (dict(conversation_id=None, chain_root_id="resp_root",
                                           expected_head_seq=None, previous_response_id=None,
                                           response_id="resp_root"), "resp_root"),
    "chain root without chain_root_id": (dict(conversation_id=None, chain_root_id=None,
                                              expected_head_seq=None, previous_response_id=None,
                                              response_id="resp_alone"), "resp_alone"),
    "chain child": (dict(conversation_id=None, chain_root_id="resp_root",
                         expected_head_seq=None, previous_response_id="resp_root"),
                    "resp_root"),
}


@pytest.mark.parametrize("name", CASES)
def test_models_gateway_and_processor_agree(name):
    fields, expected = CASES[name]
    turn = make_turn(**fields)

    assert partition_key(turn) == turn.partition_key == expected
    assert gateway_key(turn) == expected
    assert processor_key(turn) == (expected, expected)


def test_the_gateway_identity_keys_like_the_models():
    root = TurnIdentity.chain(TENANT, "resp_r")  # a chain's first response is its own root
    child = TurnIdentity.chain(TENANT, "resp_c", previous_response_id="resp_r",
                               chain_root_id="resp_r")
    conversation = TurnIdentity.conversation(TENANT, "conv_i", "resp_i", 0)
    assert [i.partition_key for i in (root, child, conversation)] == ["resp_r", "resp_r",
                                                                       "conv_i"]
    with pytest.raises(ValueError, match="chain_root_id"):
        TurnIdentity.chain(TENANT, "resp_c", previous_response_id="resp_r")


def test_a_continued_chain_without_its_root_is_refused_by_all_three():
    turn = make_turn(conversation_id=None, chain_root_id=None, expected_head_seq=None,
                     previous_response_id="resp_parent", response_id=new_id("resp"))

    with pytest.raises(MissingChainRoot):
        partition_key(turn)
    with pytest.raises(MissingChainRoot):
        gateway_key(turn)
    processor = PromotionProcessor(MemoryCheckpointStore(), MemoryLedger(), PickleCodec(),
                                   TOPICS, clock_ms=lambda: NOW_MS)
    handled = processor.handle(raw_record(turn))
    rejection = handled.outbound[0].model
    assert handled.kind == "rejected"
    assert rejection.reason is RejectionReason.PARENT_NOT_PROMOTED
    assert "chain_root_id" in rejection.detail
    assert rejection.partition_key == turn.response_id == handled.outbound[0].key.decode()
