"""A Conversation head that names a chain turn of the same partition backs nothing.

A tenant may use a Conversation id that is also the first response id of a chain: both
live in one partition. A head cell damaged to name the chain's turn at the head's seq
is a head no Conversation checkpoint backs: CORRUPT_HISTORY on every endpoint and every
load (CONTRACT section 5), never the chain's history served as the Conversation's, and
a replica with cached prefixes answers as a cold read does. Found by an outside review
(session 21); each test failed before its fix.
"""

from __future__ import annotations

from dataclasses import replace

from tests.unit.test_api_cache import NO_CACHE, CachingStack, message, uid


def _mixed_partition_with_damaged_head():
    stack = CachingStack(fast_path=True)
    tenant, shared = uid("tenant"), uid("shared")
    stack.promote(tenant, shared, 0, (message("a", item_id=uid("m")),))
    c2 = stack.promote(tenant, shared, 1, (message("b", item_id=uid("m")),))
    stack.chain(tenant, shared, shared, None)  # chain root whose id is the Conversation id
    y = stack.chain(tenant, shared, uid("resp"), shared)
    # Warm this replica: the Conversation turn and the chain root are verified and cached.
    assert stack.history(tenant, c2).status_code == 200
    assert stack.history(tenant, shared).status_code == 200
    partition = stack.store._partitions[(tenant, shared)]
    partition.head = replace(partition.head, response_id=y)  # damaged head cell
    return stack, tenant, shared, c2, y


def test_cached_conversation_turn_answers_like_the_cold_read():
    stack, tenant, _, c2, _ = _mixed_partition_with_damaged_head()
    cold = stack.fresh(tenant, c2)
    assert (cold.status_code, cold.json()["reason"]) == (500, "CORRUPT_HISTORY")
    hit = stack.history(tenant, c2)
    assert (hit.status_code, hit.json()["reason"]) == (500, "CORRUPT_HISTORY"), hit.text


def test_conversation_endpoint_never_serves_a_chain_history():
    stack, tenant, shared, _, y = _mixed_partition_with_damaged_head()
    for resp in (stack.conversation(tenant, shared, **NO_CACHE),
                 stack.conversation(tenant, shared)):
        body = resp.json()
        assert body["response_id"] != y, (
            f"Conversation {shared} answered {resp.status_code} with the history of chain "
            f"turn {y} (conversation_head_seq={body['conversation_head_seq']})"
        )
        assert (resp.status_code, body["reason"]) == (500, "CORRUPT_HISTORY")
