"""Answers the processor gives where session 20's outside reviews found it wrong: a
response id reused in another Conversation, a rejection met on a corrupt partition
with tool effects, a retry under another response id on a history that cannot be read.
In-memory backends, both entry points; each test failed before its fix."""

from __future__ import annotations

import uuid

import pytest

from ratchet.domain.plan import CorruptPartition
from ratchet.samples import TENANT, make_tool_loop_turn, make_turn
from schemas.models import CheckpointPromoted, DeadLetter, PromotionRejected
from schemas.models import RejectionReason as R
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.test_processor_races import Worker, uid
from tests.unit.test_processor_identity import _damage_first_item

ENTRIES = pytest.mark.parametrize("entry", ["handle", "handle_async"])


@ENTRIES
def test_a_bound_response_id_in_another_conversation_is_conflict(entry):
    """gateway-protocol 7: a response id bound to a request in one Conversation is
    CONFLICT in any other, and hands that Conversation to nobody."""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    c1, c2 = uid("conv"), uid("conv")
    t1 = make_turn(conversation_id=c1, expected_head_seq=0, response_id=uid("resp"))
    assert worker.outcome(t1).seq == 1
    elsewhere = t1.model_copy(update={"event_id": str(uuid.uuid4()), "conversation_id": c2})
    out = worker.outcome(elsewhere)
    owner = ledger.conversation_owner(c2)
    # gateway-protocol 7: "any other (... another Conversation or chain) is rejected CONFLICT"
    assert (type(out).__name__, getattr(out, "reason", None), owner) == (
        "PromotionRejected", R.CONFLICT, None), (out, owner)  # nothing promoted in c2
    assert out.existing_response_id == t1.response_id  # the id's CONFLICT, not the head's


@ENTRIES
def test_only_a_response_ids_conflict_names_the_bound_id(entry):
    """A gateway tells the two CONFLICTs apart without parsing ``detail`` (an outside
    review, session 38: both read alike, and a resend at the current head of a turn
    whose response id is bound conflicts again): the id's names it in
    ``existing_response_id``, the head's leaves it null and gives the current head."""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    conv = uid("conv")
    first = make_turn(conversation_id=conv, expected_head_seq=0, response_id=uid("resp"))
    assert worker.outcome(first).seq == 1
    assert worker.outcome(make_turn(conversation_id=conv, expected_head_seq=1)).seq == 2
    reused = worker.outcome(make_turn(conversation_id=conv, expected_head_seq=2,
                                      response_id=first.response_id))
    assert (reused.reason, reused.existing_response_id, reused.head_seq) == (
        R.CONFLICT, first.response_id, 1)  # bound at seq 1: no head helps
    stale = worker.outcome(make_turn(conversation_id=conv, expected_head_seq=1))
    assert (stale.reason, stale.existing_response_id, stale.head_seq) == (R.CONFLICT, None, 2)


class CorruptStore(MemoryCheckpointStore):
    """Raises CorruptPartition reading one partition's view, as the Cassandra store
    does for an undecodable row (the memory store never does)."""

    corrupt: set = set()

    def __init__(self, options):
        super().__init__(options)
        # The store's parts ask its hints object (services/store/hints.py) for a head.
        hinted_head = self._hints.head

        def head(request):  # another worker's store object: no hints of its own
            if (request.tenant_id, request.partition_key) in self.corrupt:
                return None
            return hinted_head(request)

        self._hints.head = head

    def _read_view(self, request, head_guess=None):
        if (request.tenant_id, request.partition_key) in self.corrupt:
            raise CorruptPartition(f"partition {request.partition_key}: undecodable row")
        return super()._read_view(request, head_guess)


@ENTRIES
def test_a_corrupt_partition_rejection_with_effects_is_published(entry):
    """Recorded and published like any rejection (docs/processor.md), not dead-lettered
    by the orphan lookup meeting the same damage."""
    store, ledger = CorruptStore(StoreOptions()), MemoryLedger()
    store.corrupt = set()
    worker = Worker(store, ledger, entry)
    conv = uid("conv")
    assert worker.outcome(make_turn(conversation_id=conv, expected_head_seq=0)).seq == 1
    final, effects = make_tool_loop_turn(rounds=1, conversation_id=conv, expected_head_seq=1)
    worker.feed(*effects)
    store.corrupt.add((TENANT, conv))  # e.g. a row written by a newer version
    out = Worker(store, ledger, entry).outcome(final)  # a worker with nothing cached
    assert not isinstance(out, DeadLetter), out.error
    assert isinstance(out, PromotionRejected) and out.reason is R.CORRUPT, out


@ENTRIES
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_a_duplicate_on_an_unreadable_lineage_is_still_duplicate(entry, mode):
    """CONTRACT 4: same key and digest promoted under another response id is DUPLICATE
    naming it, whether or not the history can be read."""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    if mode == "conversation":
        conv = uid("conv")
        first = make_turn(conversation_id=conv, expected_head_seq=0, response_id=uid("resp"))
        assert isinstance(worker.outcome(first), CheckpointPromoted)
        original = make_turn(conversation_id=conv, expected_head_seq=1,
                             response_id=uid("resp"))
        assert isinstance(worker.outcome(original), CheckpointPromoted)
        key, damaged = conv, first.response_id
    else:
        root = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"))
        assert isinstance(worker.outcome(root), CheckpointPromoted)
        original = make_turn(conversation_id=None, expected_head_seq=None,
                             response_id=uid("resp"), chain_root_id=root.response_id,
                             previous_response_id=root.response_id)
        assert isinstance(worker.outcome(original), CheckpointPromoted)
        key, damaged = root.response_id, root.response_id
    retry = original.model_copy(update={"event_id": str(uuid.uuid4()),
                                        "response_id": uid("resp"), "attempt": 2})
    # readable: DUPLICATE naming the original (a fresh worker, nothing cached)
    readable = Worker(store, ledger, entry).outcome(retry)
    assert isinstance(readable, PromotionRejected) and readable.reason is R.DUPLICATE
    _damage_first_item(store, TENANT, key, damaged)
    again = retry.model_copy(update={"event_id": str(uuid.uuid4())})
    out = Worker(store, ledger, entry).outcome(again)
    assert isinstance(out, PromotionRejected)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, original.response_id), out


@ENTRIES
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_unreadable_and_corrupt_partition_is_rejected_not_dead_lettered(entry, mode):
    """A history that cannot be read on a partition whose rows are damaged too: CORRUPT,
    published, never a dead letter for a valid event."""
    store, ledger = CorruptStore(StoreOptions()), MemoryLedger()
    store.corrupt = set()
    worker = Worker(store, ledger, entry)
    if mode == "conversation":
        conv = uid("conv")
        first = make_turn(conversation_id=conv, expected_head_seq=0, response_id=uid("resp"))
        assert isinstance(worker.outcome(first), CheckpointPromoted)
        key, damaged = conv, first.response_id
        nxt = make_turn(conversation_id=conv, expected_head_seq=1, response_id=uid("resp"))
    else:
        root = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"))
        assert isinstance(worker.outcome(root), CheckpointPromoted)
        key, damaged = root.response_id, root.response_id
        nxt = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                        chain_root_id=root.response_id, previous_response_id=root.response_id)
    _damage_first_item(store, TENANT, key, damaged)   # history read: CORRUPT_HISTORY
    store.corrupt.add((TENANT, key))                  # view read: CorruptPartition
    out = Worker(store, ledger, entry).outcome(nxt)   # fresh worker, nothing cached
    assert not isinstance(out, DeadLetter), out.error
    assert isinstance(out, PromotionRejected) and out.reason is R.CORRUPT, out


@ENTRIES
def test_a_chain_turn_on_a_parent_whose_row_is_lost_is_corrupt(entry):
    """A promoted parent whose turn row is gone (storage damage) reads MISSING_HISTORY
    (docs/store.md rule 1), a lineage that cannot be read: CORRUPT, as for any damaged
    lineage, not PARENT_NOT_PROMOTED (which tells the gateway the parent is undecided)."""
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    root = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"))
    assert isinstance(Worker(store, ledger, entry).outcome(root), CheckpointPromoted)
    parent = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                       chain_root_id=root.response_id, previous_response_id=root.response_id)
    assert isinstance(Worker(store, ledger, entry).outcome(parent), CheckpointPromoted)
    partition = store._partitions[(TENANT, root.response_id)]
    del partition.checkpoints[parent.response_id]
    partition.items.pop(parent.response_id, None)
    nxt = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                    chain_root_id=root.response_id, previous_response_id=parent.response_id)
    out = Worker(store, ledger, entry).outcome(nxt)  # fresh worker, nothing cached
    assert isinstance(out, PromotionRejected) and out.reason is R.CORRUPT, out
