"""Response ids are per tenant (docs/gateway-protocol.md, section 1): two tenants may
promote one id. A chain turn whose parent is not in its chain's partition is
``TENANT_MISMATCH`` only when this tenant has not promoted that id but another has;
when this tenant has promoted it (elsewhere: a gateway that named the wrong chain
root), ``PARENT_NOT_PROMOTED``. The response id's owner row holds one tenant, the
last written, so it cannot say this alone. Both backends, both entry points, both
orders of the two tenants' promotions."""

from __future__ import annotations

import pytest

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted, PromotionRejected, RejectionReason
from tests.contract.test_processor_handover import ENTRIES
from tests.contract.test_processor_races import uid

R = RejectionReason


def chain_first(response_id: str, tenant_id: str):
    return make_turn(conversation_id=None, expected_head_seq=None, response_id=response_id,
                     tenant_id=tenant_id)


def child_of(parent_id: str, *, root: str, tenant_id: str):
    return make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                     tenant_id=tenant_id, chain_root_id=root, previous_response_id=parent_id)


@ENTRIES
@pytest.mark.parametrize("mine_first", [True, False])
def test_a_parent_this_tenant_promoted_elsewhere_is_not_another_tenants(data, entry,
                                                                       mine_first):
    worker = data.worker(entry)
    mine, theirs, shared = uid("tenant-a"), uid("tenant-b"), uid("resp")
    firsts = [chain_first(shared, mine), chain_first(shared, theirs)]
    for first in firsts if mine_first else reversed(firsts):
        assert isinstance(worker.outcome(first), CheckpointPromoted)
    my_root = chain_first(uid("resp"), mine)
    assert isinstance(worker.outcome(my_root), CheckpointPromoted)

    wrong_root = worker.outcome(child_of(shared, root=my_root.response_id, tenant_id=mine))
    assert isinstance(wrong_root, PromotionRejected), wrong_root
    assert wrong_root.reason is R.PARENT_NOT_PROMOTED, wrong_root

    stranger = uid("tenant-c")
    strangers_root = chain_first(uid("resp"), stranger)
    assert isinstance(worker.outcome(strangers_root), CheckpointPromoted)
    probe = worker.outcome(child_of(shared, root=strangers_root.response_id,
                                    tenant_id=stranger))
    assert isinstance(probe, PromotionRejected) and probe.reason is R.TENANT_MISMATCH, probe
