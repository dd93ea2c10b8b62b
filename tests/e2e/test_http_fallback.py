"""Fallbacks through the real stack: reuse is refused, the logical history never is."""

from __future__ import annotations

import time

import pytest

from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.samples import make_fingerprint
from services.demo.simulator import SimulatedGateway, assistant, uid, user
from services.gateway.client import Certified, Fallback
from services.gateway.events import TurnIdentity
from tests.e2e.helpers import WAIT_MS, all_item_ids, promoted_conversation

# One change per fingerprint component of CONTRACT 1.2 (build_fingerprint's inputs).
COMPONENT_CHANGES = {
    "model_name": {"model_name": "openai/gpt-oss-120b"},
    "model_weights_revision": {"model_weights_revision": "0" * 40},
    "tokenizer_name": {"tokenizer_name": "other/tokenizer"},
    "tokenizer_revision": {"tokenizer_revision": "1" * 40},
    "renderer_name": {"renderer_name": "chat-template"},
    "renderer_version": {"renderer_version": "0.0.5"},
    "chat_template_digest": {"chat_template": "{{ messages }}"},
    "chat_template_args": {"chat_template_args": {"enable_thinking": False}},
    "reasoning_parser": {"reasoning_parser": "deepseek_r1"},
    "reasoning_flags": {"reasoning_flags": {"effort": "high"}},
    "tool_parser": {"tool_parser": "hermes"},
    "instructions_digest": {"instructions": "You are terse."},
    "tools_digest": {"tools": []},
    "lora": {"lora_name": "support-adapter", "lora_revision": "2" * 40},
    "multimodal_input_digests": {"multimodal_input_digests": ["a" * 64]},
    "cache_salt_digest": {"cache_salt": "tenant-salt"},
    "block_hash_format": {"block_hash_format": "xxh3-v1"},
    "router_key_format": {"router_key_format": "prefix-blocks-v2"},
    "block_size": {"block_size": 32},
    "item_format_version": {"item_format_version": 2},
}


@pytest.fixture(scope="module")
def promoted(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    conv, turns = promoted_conversation(gw, turns=2)
    return gw, conv, turns


def test_every_component_is_covered():
    from schemas.models import Fingerprint

    components = set(Fingerprint.model_fields) - {"fingerprint_version", "lora_revision"}
    covered = {name if name != "lora" else "lora_name" for name in COMPONENT_CHANGES}
    assert components == covered


@pytest.mark.parametrize("component", sorted(COMPONENT_CHANGES))
def test_fingerprint_change_falls_back_with_the_complete_history(promoted, component):
    gw, conv, turns = promoted
    changed = fingerprint_hash(make_fingerprint(**COMPONENT_CHANGES[component]))
    assert changed != gw.fingerprint_hash
    for outcome in (
        gw.rehydrate(turns[-1].response_id, fingerprint_hash=changed),
        gw.conversation(conv, fingerprint_hash=changed),
    ):
        assert isinstance(outcome, Fallback), outcome
        assert outcome.reason == "FINGERPRINT_MISMATCH"
        assert [i.item_id for i in outcome.items] == all_item_ids(turns)
        assert [i.content.encode() for i in outcome.items] == [
            i.content for t in turns for i in t.items
        ]


def test_fingerprint_version_change_falls_back(promoted):
    gw, _, turns = promoted
    changed = fingerprint_hash(gw.fingerprint.model_copy(update={"fingerprint_version": 99}))
    outcome = gw.rehydrate(turns[-1].response_id, fingerprint_hash=changed)
    assert isinstance(outcome, Fallback) and outcome.reason == "FINGERPRINT_MISMATCH"


def test_after_a_fingerprint_change_the_next_turn_is_certified_for_the_new_one(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    conv, turns = promoted_conversation(gw, turns=1)
    gw.fingerprint = make_fingerprint(model_weights_revision="3" * 40)  # redeployed model
    fallback = gw.rehydrate(turns[0].response_id)
    assert isinstance(fallback, Fallback) and len(fallback.items) == 2
    turn = gw.turn(
        TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 1),
        [user("again")],
        [assistant("re-rendered")],
    )
    gw.publish(turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Certified) and len(outcome.items) == 4


def test_expired_artifact_falls_back(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    _, turns = promoted_conversation(gw, turns=1, artifact_ttl_ms=4_000)
    expires = turns[0].token_artifact.expires_at / 1000
    time.sleep(max(0.0, expires - time.time()) + 0.2)
    outcome = gw.rehydrate(turns[0].response_id)
    assert isinstance(outcome, Fallback) and outcome.reason == "ARTIFACT_EXPIRED"
    assert [i.item_id for i in outcome.items] == all_item_ids(turns)


def test_a_turn_processed_after_its_proof_expired_is_promoted_without_reuse(e2e_stack):
    """A turn whose artifact and boundary proof expired before the worker got to it (a
    backlog after an outage) is promoted: its history falls back ``NO_ARTIFACT`` and
    the Conversation goes on, the next turn certified with its artifact. Before
    session 43 it was rejected ``INVALID_BOUNDARY_PROOF`` and the next turn
    ``OUT_OF_ORDER``."""
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    conv = uid("conv")
    late = gw.turn(TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 0),
                   [user("hello")], [assistant("hi")], artifact_ttl_ms=-60_000)
    gw.publish(late)
    outcome = gw.rehydrate(late.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Fallback) and outcome.reason == "NO_ARTIFACT", outcome
    assert [i.item_id for i in outcome.items] == all_item_ids([late])
    following = gw.turn(TurnIdentity.conversation(gw.tenant_id, conv, uid("resp"), 1),
                        [user("again")], [assistant("yes")])
    gw.publish(following)
    outcome = gw.rehydrate(following.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Certified) and outcome.head_seq == 2, outcome
    assert [i.item_id for i in outcome.items] == all_item_ids([late, following])


def test_incomplete_turn_is_logical_only(e2e_stack):
    gw = SimulatedGateway(e2e_stack.producer, e2e_stack.client)
    turn = gw.turn(
        TurnIdentity.conversation(gw.tenant_id, uid("conv"), uid("resp"), 0),
        [user("long essay please")],
        [assistant("Once upon a")],
        status="incomplete",
        incomplete_reason="max_output_tokens",
        certified=False,
    )
    gw.publish(turn)
    outcome = gw.rehydrate(turn.response_id, wait_ms=WAIT_MS)
    assert isinstance(outcome, Fallback) and outcome.reason == "NOT_CERTIFIED"
    assert len(outcome.items) == 2
