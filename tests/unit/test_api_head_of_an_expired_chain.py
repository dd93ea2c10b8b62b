"""A Conversation head naming an EXPIRED (or otherwise failing) chain turn of the same
partition is answered with the chain turn's own failure, not CORRUPT_HISTORY.

Promised (CONTRACT section 5: "A head that no verified checkpoint backs is an integrity
failure on every endpoint"; docs/service.md: a Conversation head that names a chain
turn of the same partition backs nothing: CORRUPT_HISTORY; brief: CORRUPT_HISTORY on
every endpoint and path).

Before its fix (found by an outside review, session 21): ``verify_conversation_history`` verifies the chain turn's own history
FIRST and returns any failure but NOT_FOUND as is, before its new mode check. So when
the chain turn's logical retention has passed, the Conversation endpoint answers 410
EXPIRED (the Conversation's own turns are not expired), while the response endpoint
for the Conversation's turn answers 500 CORRUPT_HISTORY for the same head: two
endpoints, two answers, and a non-integrity status for an unbacked head.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tests.unit.test_api_cache import NO_CACHE, NOW, CachingStack, message, uid


def test_head_naming_an_expired_chain_turn_is_corrupt_on_both_endpoints():
    stack = CachingStack(fast_path=True)
    tenant, shared = uid("tenant"), uid("shared")
    stack.promote(tenant, shared, 0, (message("a", item_id=uid("m")),))
    c2 = stack.promote(tenant, shared, 1, (message("b", item_id=uid("m")),))
    stack.chain(tenant, shared, shared, None)  # chain root whose id is the Conversation id
    y = stack.chain(tenant, shared, uid("resp"), shared)
    partition = stack.store._partitions[(tenant, shared)]
    partition.checkpoints[y] = replace(partition.checkpoints[y],
                                       logical_expires_at=NOW - timedelta(seconds=1))
    partition.head = replace(partition.head, response_id=y)  # damaged head cell

    response = stack.fresh(tenant, c2)
    assert (response.status_code, response.json()["reason"]) == (500, "CORRUPT_HISTORY")
    for conv in (stack.conversation(tenant, shared, **NO_CACHE),
                 stack.conversation(tenant, shared)):
        assert (conv.status_code, conv.json()["reason"]) == (500, "CORRUPT_HISTORY"), (
            f"Conversation endpoint answered {conv.status_code} {conv.json()['reason']} "
            f"for a head backed by no Conversation checkpoint; the response endpoint "
            f"answered 500 CORRUPT_HISTORY"
        )
