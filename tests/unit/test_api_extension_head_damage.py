"""An extension and a cold read agree when a Conversation's head and the new turn are
both damaged.

Promise (docs/service.md "Damaged rows give the same reason on every load"; CONTRACT
section 5): a cold (no-cache) read and an extension answer the same typed failure,
status and detail for the same damage of the rows they both load; the extension checks
the full read's rules in the full read's order. The full read checks that the head is
backed by a checkpoint before it checks the items and renders, so a head naming a ghost
response plus a bad item, or a router receipt that is not its canonical JSON, of the
new turn is the head's CORRUPT_HISTORY on both paths (found by outside reviews: the
extension answered the item's or the rendering's failure first).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_api_cache import CachingStack, _conv_of, _third_turn, two_turns, uid


def _damage_turn(partition, third: str, damage: str) -> None:
    if damage == "receipt":  # keys out of order: not the canonical JSON written
        partition.checkpoints[third] = replace(
            partition.checkpoints[third], router_receipt='{"b":1,"a":2}')
        return
    stored = partition.items[third]
    if damage == "format":
        partition.items[third] = replace(stored, formats=(2, *stored.formats[1:]))
    else:
        partition.items[third] = replace(stored, contents=(b'{"x":1}', *stored.contents[1:]))


@pytest.mark.parametrize("damage", ["format", "digest", "receipt"])
def test_cold_and_extension_agree_on_a_ghost_head_plus_a_damaged_new_turn(damage):
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200  # linked prefix cached
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    # The head names a response that has no checkpoint (same seq).
    partition.head = replace(partition.head, response_id=uid("ghost"))
    _damage_turn(partition, third, damage)
    cold = stack.fresh(tenant, third)
    extended = stack.history(tenant, third, partition_key=conv)
    assert cold.json()["reason"] == "CORRUPT_HISTORY"
    assert (extended.status_code, extended.json()["reason"], extended.json()["detail"]) == (
        cold.status_code, cold.json()["reason"], cold.json()["detail"]
    )
