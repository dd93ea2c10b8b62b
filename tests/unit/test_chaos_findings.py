"""Defects `ratchet chaos` found, each pinned by the processor core (in-memory backends).

1. A response id already promoted under another idempotency key was rejected as
   DUPLICATE (naming itself as the original); CONTRACT 4 says CONFLICT ("a response id
   already bound to another turn"), and docs/decisions.md said so too.
2. ``CheckpointPromoted.item_count`` carried the items of the turn alone; the schema
   and docs/contracts.md say "items in the complete history up to and including this
   turn" (a gateway sizes its next render with it).
3. A cancellation arriving after its request was promoted shadowed DUPLICATE /
   IDEMPOTENCY_KEY_REUSED for later events of the same key (rejected CANCELLED).
"""

from __future__ import annotations

from ratchet.samples import make_turn_cancelled
from schemas.models import RejectionReason as R
from tests.unit.test_processor_rules import Harness, chain_turn, conv_id, turn


def test_response_id_rebound_under_another_key_is_conflict():
    h = Harness()
    conv = conv_id()
    first = turn(conv, 0)
    assert h.outcome(first).seq == 1
    rebound = turn(conv, 1, response_id=first.response_id)  # a new idempotency key
    assert rebound.idempotency_key != first.idempotency_key
    assert h.outcome(rebound).reason is R.CONFLICT


def test_promoted_item_count_is_the_complete_history_conversation():
    h = Harness()
    conv = conv_id()
    first, second = turn(conv, 0), turn(conv, 1)
    assert h.outcome(first).item_count == len(first.items)
    assert h.outcome(second).item_count == len(first.items) + len(second.items)


def test_promoted_item_count_is_the_complete_history_chain():
    h = Harness()
    root = chain_turn(None, None)
    child = chain_turn(root.response_id, root.response_id)
    assert h.outcome(root).item_count == len(root.items)
    assert h.outcome(child).item_count == len(root.items) + len(child.items)


def test_cancel_after_promotion_does_not_shadow_duplicate():
    h = Harness()
    conv = conv_id()
    original = turn(conv, 0)
    assert h.outcome(original).seq == 1
    h.feed(make_turn_cancelled(original))
    retry = turn(conv, 1, idempotency_key=original.idempotency_key, attempt=2,
                 request_digest=original.request_digest)
    out = h.outcome(retry)
    assert out.reason is R.DUPLICATE and out.existing_response_id == original.response_id


def test_cancel_after_promotion_does_not_shadow_key_reused():
    h = Harness()
    conv = conv_id()
    original = turn(conv, 0)
    assert h.outcome(original).seq == 1
    h.feed(make_turn_cancelled(original))
    other_request = turn(conv, 1, idempotency_key=original.idempotency_key, attempt=2,
                         request_digest="0" * 64)
    assert other_request.request_digest != original.request_digest
    assert h.outcome(other_request).reason is R.IDEMPOTENCY_KEY_REUSED


def test_cancel_before_completion_still_prevents_promotion():
    h = Harness()
    conv = conv_id()
    original = turn(conv, 0)
    h.feed(make_turn_cancelled(original))
    assert h.outcome(original).reason is R.CANCELLED
