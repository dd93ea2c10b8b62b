"""An extension whose new turn's checkpoint cannot be rendered, under a head that is
not backed, answers the cold read's failure: the head's CORRUPT_HISTORY.

Promise (docs/service.md, "Damaged rows give the same reason on every load"; CONTRACT
section 5): a cold (no-cache) read and an extension answer the same typed failure,
status and detail for the same damage of the rows they both load; the extension checks
the full read's rules in the full read's order. The full read checks the head's backing
before the items and before rendering, so a head naming a ghost plus a damaged router
receipt of the loaded turn is "head seq N (ghost) is backed by no checkpoint" on both
paths (found by an outside review: the extension answered the render failure).
"""

from __future__ import annotations

from dataclasses import replace

from tests.unit.test_api_cache import CachingStack, _conv_of, _third_turn, two_turns, uid


def test_extension_and_cold_read_agree_on_ghost_head_plus_unrenderable_receipt():
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200  # linked prefix cached
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    # Damage 1: the head names a response that has no checkpoint (same seq).
    partition.head = replace(partition.head, response_id=uid("ghost"))
    # Damage 2: turn 3's router receipt is not its canonical JSON (keys out of order).
    partition.checkpoints[third] = replace(
        partition.checkpoints[third], router_receipt='{"b":1,"a":2}'
    )
    cold = stack.fresh(tenant, third)
    extended = stack.history(tenant, third, partition_key=conv)
    assert cold.json()["reason"] == "CORRUPT_HISTORY"
    assert (extended.status_code, extended.json()["reason"], extended.json()["detail"]) == (
        cold.status_code, cold.json()["reason"], cold.json()["detail"]
    )
