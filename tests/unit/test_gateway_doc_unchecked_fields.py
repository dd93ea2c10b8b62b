"""What docs/gateway-protocol.md (session 52) says ratchet does NOT check, pinned.

A gateway written from the docs alone asked: which values may ``boundary_kind`` take,
must a router receipt agree with the fingerprint or the artifact, and what exactly is
the registry's schema text? The answers are the code's; these tests keep the docs true.
(The receipt's answer changed in session 52: it must agree, else the turn is refused.)
"""

from __future__ import annotations

import json

import pytest

from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.domain.validation import Rejected, Valid, validate_turn
from ratchet.samples import NOW_MS, make_artifact_and_proof, make_fingerprint, make_turn
from schemas import avsc
from schemas.models import BoundaryProof, RejectionReason, RouterReceipt

HOUR_MS = 3_600_000


def _reusable(turn) -> bool:
    verdict = validate_turn(turn, NOW_MS)
    assert isinstance(verdict, Valid), verdict
    return verdict.artifact_reusable


def test_boundary_kind_is_a_free_string_never_checked():
    fp_hash = fingerprint_hash(make_fingerprint())
    artifact, proof = make_artifact_and_proof(fp_hash)
    proof = BoundaryProof(**{**proof.model_dump(), "boundary_kind": "any-kind-at-all"})
    assert _reusable(make_turn(token_artifact=artifact, boundary_proof=proof))


@pytest.mark.parametrize(("receipt_fields", "why"), [
    ({"router_key_format": "not-the-fingerprints-format"}, "router_key_format"),
    ({"covered_tokens": 10**9}, "covered_tokens"),  # more than the artifact's token_count
    ({"covered_tokens": -1}, "covered_tokens"),
    ({"receipt_id": "", "issuer": ""}, "receipt_id '' is empty or only whitespace"),
])
def test_router_receipt_fields_bind_to_the_turn(receipt_fields, why):
    """Session 52 (rreceipt): these were pinned as stored and not checked; a receipt
    must now bind to its turn as the proof does (docs/gateway-protocol.md, section 4),
    else the turn is ``INVALID_BOUNDARY_PROOF``."""
    fields = {"receipt_id": "rcpt_1", "router_key_format": make_fingerprint().router_key_format,
              "covered_tokens": 64, "expires_at": NOW_MS + HOUR_MS, "issuer": "router-0"}
    assert _reusable(make_turn(router_receipt=RouterReceipt(**fields)))
    verdict = validate_turn(make_turn(router_receipt=RouterReceipt(**{**fields,
                                                                     **receipt_fields})), NOW_MS)
    assert isinstance(verdict, Rejected), verdict
    assert verdict.reason is RejectionReason.INVALID_BOUNDARY_PROOF and why in verdict.detail


@pytest.mark.parametrize("record", ["TurnCompleted", "ToolEffect", "TurnCancelled"])
def test_registry_schema_text_is_compact_json_in_the_files_key_order(record):
    text = avsc.schema_text(record)
    schema = json.loads(text)
    assert text == json.dumps(schema, separators=(",", ":"))  # no whitespace, \\u escapes
    with open(avsc.SCHEMA_DIR / f"{record}.avsc", encoding="utf-8") as f:
        assert list(schema) == list(json.load(f))  # keys in the file's order, not sorted


def test_an_unclaimed_effect_id_is_not_recomputed():
    """Section 4: ratchet does not recompute an unclaimed effect's ``effect_id``; any id
    of the id pattern is recorded, and a turn listing it is promoted."""
    from ratchet.samples import make_tool_effect, new_id
    from schemas.items import function_call, function_call_output, message
    from tests.unit.test_processor_rules import TOPICS, Harness

    h = Harness()
    key, rid, conv = new_id("idem"), new_id("resp"), new_id("conv")
    output = function_call_output("call_a", '{"temperature_c": 24}', item_id="fco_a")
    effect = make_tool_effect("call_a", output, idempotency_key=key, response_id=rid,
                              conversation_id=conv, effect_id="my-own.effect:id-1")
    assert effect.effect_id == "my-own.effect:id-1"
    recorded = h.processor.handle(h.record(effect))
    assert all(o.topic != TOPICS.dead_letters for o in recorded.outbound)
    items = [function_call("call_a", "get_weather", {"city": "Paris"}, item_id="fc_a"),
             output, message("It is 24 C.", role="assistant", item_id=new_id("msg"))]
    turn = make_turn(items, idempotency_key=key, response_id=rid, conversation_id=conv,
                     tool_effect_ids=(effect.effect_id,))
    handled = h.processor.handle(h.record(turn))
    assert handled.outbound[0].topic == TOPICS.checkpoints, handled.outbound[0].model
