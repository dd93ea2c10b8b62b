"""A turn whose response id is bound to another request in its partition, sent where it
extends no lineage (a chain parent that is not there, a Conversation head it does not
expect): the write's answer is ``CONFLICT`` naming the bound id (gateway-protocol.md
section 7: the write answers a bound response id before ``OUT_OF_ORDER`` and
``PARENT_NOT_PROMOTED``), whatever the turn's own pairing. Found by an outside review
of session 47's out-of-lineage fix (docs/decisions.md, "Session 47's last merges
reviewed from outside"): with unpaired items of its own the answer was the ordering's,
resting on a pairing against a lineage the turn does not extend."""

from __future__ import annotations

import pytest

from ratchet.samples import new_id
from schemas.models import RejectionReason
from streams.handled import NO_FACTS
from streams.tail_cache import TailCache
from tests.contract.test_processor_races import Worker
from tests.unit.test_processor_order_before_pairing import self_unpaired
from tests.unit.test_processor_retry_at_head import tool_items
from tests.unit.test_processor_rules import Harness, chain_turn, conv_id, turn


@pytest.mark.parametrize("entry", ["handle", "handle_async"])
@pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
def test_a_chain_turn_with_no_parent_and_a_bound_id_is_conflict_whatever_its_pairing(
        entry, cold):
    """A continuation of chain ``root`` under ``root``'s own response id (bound to the
    root's request) naming a parent that is not there: ``CONFLICT`` naming the id, with
    paired items (the write answers it) and with unpaired ones alike; on a worker that
    promoted the root and on one that never saw it (after a rebalance)."""
    h = Harness()
    worker = Worker(h.store, h.ledger, entry)
    root = chain_turn(None, None)
    assert worker.outcome(root).seq == 1
    if cold:
        worker = Worker(h.store, h.ledger, entry)
    answers = []
    for items in (tool_items("call_b"), self_unpaired()):
        out = worker.outcome(chain_turn(root.response_id, new_id("resp"), items=items,
                                        response_id=root.response_id))
        answers.append((out.reason, out.existing_response_id))
    assert answers == [(RejectionReason.CONFLICT, root.response_id)] * 2


def test_a_bound_id_in_another_partition_with_no_parent_stays_parent_not_promoted():
    """The id bound in another chain's partition: the write reads the parent first
    there (``PARENT_NOT_PROMOTED``), paired or not; the check is the partition's own."""
    h = Harness()
    root, other = chain_turn(None, None), chain_turn(None, None)
    assert (h.outcome(root).seq, h.outcome(other).seq) == (1, 1)
    for items in (tool_items("call_b"), self_unpaired()):
        out = h.outcome(chain_turn(root.response_id, new_id("resp"), items=items,
                                   response_id=other.response_id))
        assert out.reason is RejectionReason.PARENT_NOT_PROMOTED


def test_a_conversation_turn_off_its_head_with_a_bound_id_is_conflict_naming_it():
    """``TurnDecider._decide`` with a lineage read at head 1 for a turn expecting head 2
    (the head moved between the head read and the lineage's: a race, set directly),
    under the response id of turn 1: ``CONFLICT`` naming the id, as the write answers,
    not ``OUT_OF_ORDER`` at head 1."""
    h = Harness()
    h.rewire(tails=TailCache(capacity=0))
    conv = conv_id()
    first = turn(conv, 0)
    assert h.outcome(first).seq == 1
    at_head_one = h.processor._decider.lineages.read(turn(conv, 1))
    assert at_head_one.tail.seq == 1 and at_head_one.off_head is None
    ahead = turn(conv, 2, items=self_unpaired(), response_id=first.response_id)
    out = h.processor._decider._decide(ahead, NO_FACTS, None, at_head_one, facts_read=True)
    assert (out.reason, out.existing_response_id) == (RejectionReason.CONFLICT,
                                                      first.response_id)


def test_an_unpaired_conversation_turn_off_its_head_is_still_out_of_order():
    """The same race without a bound id: ordering's answer stands (``OUT_OF_ORDER``)."""
    h = Harness()
    h.rewire(tails=TailCache(capacity=0))
    conv = conv_id()
    assert h.outcome(turn(conv, 0)).seq == 1
    at_head_one = h.processor._decider.lineages.read(turn(conv, 1))
    ahead = turn(conv, 2, items=self_unpaired())
    out = h.processor._decider._decide(ahead, NO_FACTS, None, at_head_one, facts_read=True)
    assert (out.reason, out.head_seq) == (RejectionReason.OUT_OF_ORDER, 1)


@pytest.mark.parametrize("chain", [False, True], ids=["conversation", "chain"])
def test_a_turn_on_an_unreadable_lineage_with_a_bound_id_is_conflict_naming_it(chain):
    """A turn at the head (or on the chain parent) whose lineage cannot be read, under a
    response id another request promoted in its partition: the write answers the bound
    id (``ResponseExists``) before ordering, so ``CONFLICT`` naming it, as the same turn
    off its head gets (section 7: "whatever the expected head"). It was ``CORRUPT``:
    ``on_unreadable_lineage`` asked only the retry, not ``_before_ordering`` (session
    48's review)."""
    from tests.unit.test_processor_identity import TENANT, _damage_first_item

    h = Harness()
    if chain:
        # The bound id is the root's child's, sent on the root: a turn naming its own
        # id as its parent (as this case did until session 48's second review) is
        # ``CORRUPT`` wherever it is sent (gateway-protocol.md section 6).
        root = chain_turn(None, None)
        child = chain_turn(root.response_id, root.response_id)
        assert (h.outcome(root).seq, h.outcome(child).seq) == (1, 2)
        _damage_first_item(h.store, TENANT, root.response_id, root.response_id)
        bound = child.response_id
        sent = chain_turn(root.response_id, root.response_id, response_id=bound)
    else:
        conv = conv_id()
        first = turn(conv, 0)
        assert h.outcome(first).seq == 1
        _damage_first_item(h.store, TENANT, conv, first.response_id)
        bound = first.response_id
        sent = turn(conv, 1, response_id=bound)
    h.rewire(tails=TailCache(capacity=0))  # a worker that reads the lineage
    out = h.outcome(sent)
    assert (out.reason, out.existing_response_id) == (RejectionReason.CONFLICT, bound), out
