"""An extension answers the same damage with the same reason and detail as a cold read.

docs/service.md: damaged rows give the same answer on every load; ``verify_extension``
checks the full read's rules in the full read's order (the lineage's structure newest
turn first, then the items, then the lineage digests), with the same details, so a
replica holding a prefix and one without answer alike. Found by an outside review
(session 21); each test failed before its fix.
"""

from __future__ import annotations

from tests.unit.test_api_cache import (
    CachingStack,
    _conv_of,
    _third_turn,
    two_turns,
    uid,
)


def test_two_damaged_rows_get_one_reason_on_every_load():
    stack = CachingStack()
    tenant, root = uid("tenant"), uid("resp")
    stack.chain(tenant, root, root, None)
    assert stack.history(tenant, root).status_code == 200  # linked prefix cached
    a = stack.chain(tenant, root, uid("resp"), root)
    b = stack.chain(tenant, root, uid("resp"), a)
    partition = stack.store._partitions[(tenant, root)]
    stored = partition.items[a]
    partition.items[a] = type(stored)(*(column[:-1] for column in (
        stored.seqs, stored.ids, stored.types, stored.roles, stored.call_ids,
        stored.contents, stored.digests, stored.formats)))  # A lost its item
    stack.rewrite_checkpoint(tenant, root, b, seq=7)  # B's seq cell damaged

    cold = stack.fresh(tenant, b)
    extended = stack.history(tenant, b, partition_key=root)
    assert (cold.status_code, cold.json()["reason"]) == (500, "CORRUPT_HISTORY")
    assert (extended.status_code, extended.json()["reason"]) == (
        cold.status_code, cold.json()["reason"])


def test_a_wrong_lineage_digest_has_one_detail_on_every_load():
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200
    third = _third_turn(stack, tenant, conv)
    stack.rewrite_checkpoint(tenant, conv, third, lineage_digest="0" * 64)
    cold = stack.fresh(tenant, third)
    extended = stack.history(tenant, third, partition_key=conv)
    assert cold.json()["reason"] == extended.json()["reason"] == "CORRUPT_HISTORY"
    assert extended.json()["detail"] == cold.json()["detail"]
