"""Turns the API could never serve, or that two readers could read differently, are
rejected ``CORRUPT`` by the processor before anything is promoted (session 18: ids
outside the API's pattern, a Conversation turn naming a parent, one item id twice,
duplicate JSON keys). In-memory store and ledger, pickled records (no Kafka)."""

from __future__ import annotations

import pytest

from ratchet.samples import NOW_MS, TENANT, make_turn, new_id
from schemas.canonical import sha256_hex
from schemas.items import make_item, mcp_call
from schemas.models import RejectionReason
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from tests.unit.test_processor_rules import TOPICS, PickleCodec, raw_record


class ClaimsSeen(MemoryCheckpointStore):
    """The in-memory store, noting every claim a caller starts."""

    def __init__(self) -> None:
        super().__init__(StoreOptions())
        self.claims_started: list[str] = []

    def start_claiming(self, claim):
        self.claims_started.append(claim.response_id)
        return super().start_claiming(claim)


@pytest.fixture
def promote():
    """Feed one turn to a fresh processor; return (its one outcome, the store)."""
    store = ClaimsSeen()
    processor = PromotionProcessor(store, MemoryLedger(), PickleCodec(), TOPICS,
                                   clock_ms=lambda: NOW_MS)

    def run(turn):
        handled = processor.handle(raw_record(turn))
        [outcome] = [o for o in handled.outbound if o.topic != TOPICS.orphaned_effects]
        return outcome, store

    return run


def assert_corrupt(outcome, store, turn, *words):
    assert outcome.topic == TOPICS.rejections
    assert outcome.model.reason is RejectionReason.CORRUPT
    assert all(w in outcome.model.detail for w in words), outcome.model.detail
    assert store.get_checkpoint(turn.tenant_id, turn.response_id) is None


def test_a_response_id_the_api_cannot_serve_is_rejected_not_promoted(promote):
    turn = make_turn(response_id="dl 8-x")
    outcome, store = promote(turn)
    assert_corrupt(outcome, store, turn, "response_id 'dl 8-x'", "id pattern")
    # decided before the store: not even the response id's claim was sent (Cassandra's
    # ``start_claiming`` sends its LWT at once)
    assert store.claims_started == []


def test_a_chain_parent_the_api_cannot_serve_is_rejected(promote):
    turn = make_turn(conversation_id=None, expected_head_seq=None, chain_root_id="resp_root",
                     previous_response_id="resp root")
    outcome, store = promote(turn)
    assert_corrupt(outcome, store, turn, "previous_response_id")


def test_a_conversation_turn_naming_a_previous_response_is_rejected(promote):
    turn = make_turn(conversation_id=new_id("conv"), previous_response_id=new_id("resp"))
    outcome, store = promote(turn)
    assert_corrupt(outcome, store, turn, "previous_response_id", "must be null")
    assert store.head(TENANT, turn.conversation_id) is None


def test_two_mcp_calls_sharing_an_item_id_are_rejected(promote):
    first = mcp_call("docs", "search", {"q": "a"}, "found a", item_id="mcp_1")
    second = mcp_call("docs", "search", {"q": "b"}, "found b", item_id="mcp_1")
    turn = make_turn(items=[first, second])
    outcome, store = promote(turn)
    assert_corrupt(outcome, store, turn, "mcp_1", "not unique")


def test_content_with_two_type_keys_is_rejected(promote):
    content = (b'{"type":"hologram_call","x":1,"id":"msg_d","role":"assistant",'
               b'"content":"hi","type":"message"}')
    item = make_item("message", {}, item_id="msg_d", role="assistant").model_copy(
        update={"content": content, "content_digest": sha256_hex(content)})
    turn = make_turn(items=[item])
    outcome, store = promote(turn)
    assert_corrupt(outcome, store, turn, "'type' twice")
