"""A retry of a request that stands promoted, under another response id, sent on the
history the original extended, is answered as the retry it is: ``DUPLICATE`` naming
the original (``IDEMPOTENCY_KEY_REUSED`` with another request digest), whatever its
items, never ``UNPAIRED_TOOL_CALL`` because the calls it repeats are in that history
(the original put them there). CONTRACT 4: "Same idempotency_key + same
request_digest already promoted -> ... another response_id: DUPLICATE, naming the
original response"; docs/gateway-protocol.md section 7.

(Found by an outside review: a gateway written in Node from the docs alone retried at
the head it rehydrated, which included its own promoted attempt, and got
UNPAIRED_TOOL_CALL with no existing_response_id for a turn with a function call, and
DUPLICATE for one with messages only.)
"""

from __future__ import annotations

import pytest

from ratchet.samples import make_turn, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import RejectionReason as R
from streams.tail_cache import TailCache
from tests.unit.test_processor_rules import Harness, chain_turn, conv_id, turn


def tool_items(call_id: str) -> list:
    return [function_call(call_id, "lookup", {"q": 1}, item_id=new_id("fc")),
            function_call_output(call_id, '{"ok": true}', item_id=new_id("fco")),
            message("done", role="assistant", item_id=new_id("msg"))]


@pytest.fixture(params=["cached", "read"], ids=["lineage-cached", "lineage-read"])
def h(request) -> Harness:
    harness = Harness()
    if request.param == "read":
        harness.rewire(tails=TailCache(capacity=0))  # a worker that reads the head
    return harness


def test_a_retry_at_the_head_its_original_made_is_duplicate(h):
    conv, items = conv_id(), tool_items("call_retry")
    original = turn(conv, 0, items=items)
    assert h.outcome(original).seq == 1
    retry = turn(conv, 1, items=items, idempotency_key=original.idempotency_key, attempt=2)
    out = h.outcome(retry)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, original.response_id)
    assert h.store.head(original.tenant_id, conv).seq == 1


def test_the_same_key_with_another_digest_at_that_head_is_key_reused(h):
    conv, items = conv_id(), tool_items("call_reuse")
    original = turn(conv, 0, items=items)
    assert h.outcome(original).seq == 1
    other = turn(conv, 1, items=items, idempotency_key=original.idempotency_key,
                 request_digest="e" * 64, attempt=2)
    out = h.outcome(other)
    assert (out.reason, out.existing_response_id) == (R.IDEMPOTENCY_KEY_REUSED,
                                                      original.response_id)


def test_a_chain_retry_continuing_its_original_is_duplicate(h):
    items = tool_items("call_chain")
    root = chain_turn(None, None)
    assert h.outcome(root).seq == 1
    original = chain_turn(root.response_id, root.response_id, items=items)
    assert h.outcome(original).seq == 2
    retry = chain_turn(root.response_id, original.response_id, items=items,
                       idempotency_key=original.idempotency_key, attempt=2)
    out = h.outcome(retry)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, original.response_id)


def test_an_unpaired_call_of_another_request_is_still_unpaired(h):
    # Not a retry (its own key): the rule stands.
    conv, items = conv_id(), tool_items("call_other")
    assert h.outcome(turn(conv, 0, items=items)).seq == 1
    out = h.outcome(make_turn(items=items, conversation_id=conv, expected_head_seq=1))
    assert out.reason is R.UNPAIRED_TOOL_CALL


def test_a_retry_deeper_in_a_conversation_is_duplicate(h):
    # The original extends a history of its own (its pairing is checked on it).
    conv = conv_id()
    assert h.outcome(turn(conv, 0, items=tool_items("call_first"))).seq == 1
    items = tool_items("call_second")
    original = turn(conv, 1, items=items)
    assert h.outcome(original).seq == 2
    retry = turn(conv, 2, items=items, idempotency_key=original.idempotency_key, attempt=2)
    out = h.outcome(retry)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, original.response_id)


def test_a_retry_whose_own_items_break_pairing_is_unpaired_at_its_originals_head(h):
    # The event's own reason comes first (docs/gateway-protocol.md section 7): an output
    # answering no call is unpaired wherever the retry is sent.
    conv = conv_id()
    original = turn(conv, 0, items=tool_items("call_ok"))
    assert h.outcome(original).seq == 1
    broken = [function_call_output("call_nowhere", "{}", item_id=new_id("fco")),
              message("x", role="assistant", item_id=new_id("msg"))]
    retry = turn(conv, 1, items=broken, idempotency_key=original.idempotency_key, attempt=2)
    assert h.outcome(retry).reason is R.UNPAIRED_TOOL_CALL


@pytest.mark.parametrize("expires_at", [0, -1])
def test_a_retry_on_an_original_whose_parent_expired_before_1970_is_duplicate(h, expires_at):
    """The original's parent is read as of before any expiry to judge the retry's pairing
    (``StoreAnswers.retry_unpaired_by_its_original``). An outside review, session 42: "before any
    expiry" was epoch 0, which a parent that expired at or before it is past too, so the
    retry was answered ``UNPAIRED_TOOL_CALL`` with no ``existing_response_id``."""
    conv = conv_id()
    assert h.outcome(turn(conv, 0, items=tool_items("call_first"),
                          expires_at=expires_at)).seq == 1
    items = tool_items("call_second")
    original = turn(conv, 1, items=items)
    assert h.outcome(original).seq == 2
    retry = turn(conv, 2, items=items, idempotency_key=original.idempotency_key, attempt=2)
    out = h.outcome(retry)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, original.response_id)
