"""An extension and a cold read agree when a Conversation's head and a loaded turn's
items are both damaged.

Promise (docs/service.md "Damaged rows give the same reason on every load"; CONTRACT
section 5): a cold (no-cache) read and an extension answer the same typed failure,
status and detail for the same damage of the rows they both load; the extension checks
the full read's rules in the full read's order. The full read checks that the head is
backed by a checkpoint before it checks the items, so a head naming a ghost response
plus a bad item of the new turn is the head's CORRUPT_HISTORY on both paths (found by
an outside review: the extension answered the item's failure first).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_api_cache import CachingStack, _conv_of, _third_turn, two_turns, uid


def _setup(item_damage: str):
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200  # linked prefix cached
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    # Damage 1: the head names a response that has no checkpoint (same seq).
    partition.head = replace(partition.head, response_id=uid("ghost"))
    # Damage 2: turn 3's item.
    stored = partition.items[third]
    if item_damage == "format":
        partition.items[third] = replace(stored, formats=(2, *stored.formats[1:]))
    else:
        partition.items[third] = replace(stored, contents=(b'{"x":1}', *stored.contents[1:]))
    return stack, tenant, conv, third


@pytest.mark.parametrize("item_damage", ["format", "digest"])
def test_cold_and_extension_agree_on_head_plus_item_damage(item_damage):
    stack, tenant, conv, third = _setup(item_damage)
    cold = stack.fresh(tenant, third)
    extended = stack.history(tenant, third, partition_key=conv)
    assert cold.json()["reason"] == "CORRUPT_HISTORY"
    assert (extended.status_code, extended.json()["reason"], extended.json()["detail"]) == (
        cold.status_code, cold.json()["reason"], cold.json()["detail"]
    )
