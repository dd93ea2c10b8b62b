"""Defects `ratchet chaos` found, each pinned by the processor core (in-memory backends).

1. A response id already promoted under another idempotency key was rejected as
   DUPLICATE (naming itself as the original); CONTRACT 4 says CONFLICT ("a response id
   already bound to another turn"), and docs/decisions.md said so too.
2. ``CheckpointPromoted.item_count`` carried the items of the turn alone; the schema
   and docs/contracts.md say "items in the complete history up to and including this
   turn" (a gateway sizes its next render with it).
3. (not fixed, xfail) a cancellation arriving after its request was promoted shadows
   DUPLICATE / IDEMPOTENCY_KEY_REUSED for later events of the same key.
"""

from __future__ import annotations

import pytest

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


@pytest.mark.xfail(strict=True, reason="known defect: a cancellation that arrives after the "
                   "request was promoted is kept by idempotency key and then shadows the "
                   "idempotency rules: a retry is rejected CANCELLED instead of DUPLICATE "
                   "(which names the original response the client should answer with)")
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
