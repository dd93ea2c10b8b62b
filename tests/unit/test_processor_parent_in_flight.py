"""A chain turn whose parent was not there when its lineage was read, and is there
when its batch is written (the parent's promotion in flight: another worker's, a
zombie's across a rebalance): the turn is never promoted on a lineage its pairing was
not checked against (``streams/promotion_hints.py``, ``_Hints``; a mutation review of the
worker's machinery, session 43, docs/decisions.md)."""

from __future__ import annotations

from ratchet.domain.history import HistoryFailure, HistoryFailureReason
from ratchet.domain.plan import Promoted
from ratchet.domain.promotion import promotion_request
from ratchet.samples import TENANT, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import Certification, RejectionReason
from tests.unit.test_tail_cache import chain_turn, harness


def _parent_lands_after_the_read(h, parent) -> None:
    """The first history read finds no parent; the parent is promoted right after it
    (by "another worker", behind the processor's back)."""
    read = h.store.read_history
    reads = []

    def racing(*args, **kwargs):
        reads.append(1)
        if len(reads) == 1:
            assert isinstance(h.store.promote(promotion_request(parent, Certification.CERTIFIED)),
                              Promoted)
            return HistoryFailure(HistoryFailureReason.NOT_FOUND, "not yet")
        return read(*args, **kwargs)

    h.store.read_history = racing


def test_a_child_read_before_its_parent_landed_is_paired_against_the_parent():
    h = harness()
    parent = chain_turn(None, None, items=[function_call("c1", "lookup", {}, item_id=new_id("fc"))])
    _parent_lands_after_the_read(h, parent)
    # A user message while the parent's call c1 is unanswered: UNPAIRED_TOOL_CALL.
    child = chain_turn(parent.response_id, parent.response_id,
                       input_items=[message("hi", role="user", item_id=new_id("msg"))])
    out = h.outcome(child)
    assert out.reason is RejectionReason.UNPAIRED_TOOL_CALL
    assert h.store.get_checkpoint(TENANT, child.response_id) is None
    assert h.processor.tails.tail(TENANT, child.chain_root_id, child.response_id) is None
    # The same race, a child that does pair with its parent: promoted on it.
    h = harness()
    parent = chain_turn(None, None, items=[function_call("c1", "lookup", {}, item_id=new_id("fc"))])
    _parent_lands_after_the_read(h, parent)
    child = chain_turn(parent.response_id, parent.response_id,
                       input_items=[function_call_output("c1", "{}", item_id=new_id("fco"))])
    out = h.outcome(child)
    assert out.seq == 2 and out.previous_response_id == parent.response_id
    # What the cache learnt is the lineage through the parent: c1 is answered there.
    tail = h.processor.tails.tail(TENANT, child.chain_root_id, child.response_id)
    assert tail is not None and "c1" in tail.pairing.call_ids and not tail.pairing.open_calls
