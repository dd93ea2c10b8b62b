"""An extension whose newest row has a damaged mode cell answers another detail than the
cold full read.

Promised (docs/service.md "Damaged rows give the same reason on every load"; commit
da7719d; ``verify_extension`` docstring): the extension checks the full read's rules in
the full read's order "with the same details", so a replica holding a prefix and one
without answer alike (status, reason AND detail).

Before its fix (found by an outside review, session 21): the full read (``_lineage``) takes the mode of the response READ as the
reference and walks its parent links, checking each turn's seq step before the parent's
mode. ``verify_extension`` takes the mode of the cached TIP as the reference and checks
the newest turn's mode before anything else. So a Conversation turn whose mode cell
says ``chain``:
- alone: the cold read blames the parent ("<tip> does not belong to this partition"),
  the extension blames the turn ("<turn> does not belong to this partition");
- with its seq cell damaged too: the cold read says "<turn> seq 4 after 2", the
  extension still "<turn> does not belong to this partition".
(The mode cell is a real stored column, ``rows._MODES``, on Cassandra too.)
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratchet.domain.history import PromotionMode
from tests.unit.test_api_cache import CachingStack, _conv_of, _third_turn, two_turns


@pytest.mark.parametrize("seq_too", [False, True], ids=["mode", "mode+seq"])
def test_mode_cell_of_the_newest_row_has_one_detail_on_every_load(seq_too):
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200  # linked prefix (seq 2) cached
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    changes = {"mode": PromotionMode.CHAIN}
    if seq_too:
        changes["seq"] = 4
    partition.checkpoints[third] = replace(partition.checkpoints[third], **changes)

    extended = stack.history(tenant, third, partition_key=conv)  # first: extension
    cold = stack.fresh(tenant, third)
    answer = lambda r: (r.status_code, r.json()["reason"], r.json()["detail"])  # noqa: E731
    assert answer(cold)[:2] == (500, "CORRUPT_HISTORY")
    assert answer(extended) == answer(cold)
