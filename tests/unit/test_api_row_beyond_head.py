"""A Conversation checkpoint beyond the head is CORRUPT_HISTORY on a full read.

Promise (docs/store.md, "Verification on read", rule 3; CONTRACT section 5: rehydration
verifies every row it loads): "a Conversation has one checkpoint per seq, none beyond
the head, and a head its own checkpoint backs ..., whichever turn is read
(CORRUPT_HISTORY)". A Conversation checkpoint at seq head+1 (no turn at that seq, so
not the documented limit of a stray row at another turn's seq) fails the no-cache full
read on both endpoints (found by an outside review: it was ignored and the history
served).
"""

from __future__ import annotations

from dataclasses import replace

from tests.unit.test_api_cache import CachingStack, _conv_of, two_turns, uid


def _beyond_head():
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    partition = stack.store._partitions[(tenant, conv)]
    head = partition.head
    assert head.seq == 2
    # A Conversation checkpoint at seq 3, child of the head, while the head stays at 2.
    beyond = uid("resp")
    partition.checkpoints[beyond] = replace(
        partition.checkpoints[rid],
        response_id=beyond,
        parent_response_id=rid,
        seq=3,
        first_item_seq=partition.checkpoints[rid].last_item_seq + 1,
        last_item_seq=partition.checkpoints[rid].last_item_seq,  # no items
    )
    return stack, tenant, conv, rid


def test_cold_response_read_reports_a_checkpoint_beyond_the_head():
    stack, tenant, _, rid = _beyond_head()
    resp = stack.fresh(tenant, rid)
    assert (resp.status_code, resp.json()["reason"]) == (500, "CORRUPT_HISTORY"), resp.text[:300]


def test_cold_conversation_read_reports_a_checkpoint_beyond_the_head():
    stack, tenant, conv, _ = _beyond_head()
    resp = stack.conversation(tenant, conv, **{"Cache-Control": "no-cache"})
    assert (resp.status_code, resp.json()["reason"]) == (500, "CORRUPT_HISTORY"), resp.text[:300]
