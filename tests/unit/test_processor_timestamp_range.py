"""A turn holding any timestamp outside years 1 to 9999 is never promoted.

Promise (docs/gateway-protocol.md section 6, common fields): every timestamp of an event
(`produced_at`, and `expires_at` of a turn and of its artifact, proof and receipt) MUST
lie within 0001-01-01T00:00:00.000Z to 9999-12-31T23:59:59.999Z; a record holding one
outside is dead-lettered by the Avro decoder, and "a turn that reached the rules anyway,
not through Avro, is not promoted" (CORRUPT). Found by an outside review: only the
turn's own expiry and a certified turn's artifact expiry were checked on that path.
"""

from __future__ import annotations

import pytest

from ratchet.samples import make_turn, new_id
from schemas.models import RouterReceipt
from tests.unit.test_processor_rules import TOPICS, Harness

BEYOND = 253_402_300_799_999 + 1  # first millisecond after 9999-12-31T23:59:59.999Z
BEFORE = -62_135_596_800_000 - 1  # last millisecond before 0001-01-01


def _receipt(conv):
    return make_turn(conversation_id=conv, router_receipt=RouterReceipt(
        receipt_id="rcpt_1", router_key_format="prefix-blocks-v1", covered_tokens=10,
        expires_at=BEYOND, issuer="router-1"))


def _proof(conv):
    t = make_turn(conversation_id=conv)
    return t.model_copy(update={"boundary_proof": t.boundary_proof.model_copy(
        update={"expires_at": BEYOND})})


def _incomplete_artifact(conv):
    t = make_turn(conversation_id=conv, status="incomplete")
    return t.model_copy(update={"token_artifact": t.token_artifact.model_copy(
        update={"expires_at": BEYOND})})


@pytest.mark.parametrize("build", [
    _receipt,
    _proof,
    _incomplete_artifact,
    lambda conv: make_turn(conversation_id=conv, produced_at=BEYOND),
    lambda conv: make_turn(conversation_id=conv, produced_at=BEFORE),
], ids=["router_receipt.expires_at", "boundary_proof.expires_at",
        "token_artifact.expires_at(incomplete)", "produced_at>9999", "produced_at<0001"])
def test_a_turn_with_an_unreadable_timestamp_is_not_promoted(build):
    h = Harness()
    handled = h.processor.handle(h.record(build(new_id("conv"))))
    topics = [o.topic for o in handled.outbound]
    assert TOPICS.checkpoints not in topics, (
        f"promoted a turn holding a timestamp outside years 1..9999: {handled.outbound[0].model}")
