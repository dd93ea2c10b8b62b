"""A history read that meets a damaged response claim gives the processor a typed
answer, never a dead letter and never a retry without end.

``read_history`` of a response id not in the partition its caller hints asks the claim
where the response lives (``_locate``); a claim row naming no partition is damage
(Cassandra's ``_claimed_partition``, since a claim read as absent made a promoted
response ``NOT_FOUND``). Until session 51 the store raised ``CorruptPartition`` there
and two readers in streams/ did not catch it (the record was dead-lettered
``UNKNOWN``); m-rproc6 caught it at both, then m-rapi6 made the read itself answer
``HistoryFailure(CORRUPT_HISTORY)`` (the locate step of ``HistoryReader``), and those
catches were removed as dead (rrevs). A claim that names its partition but no request
(``turn_lost``: whether the response was promoted cannot be told) is
``CORRUPT_HISTORY`` likewise (rrevs; Cassandra refused the idempotency lookup with a
null key, ``StoreUnavailable``, retried without end):

- the lineage a chain turn extends (``LineageReader``): a turn naming a parent that is
  not in its chain's partition (another chain's response) whose claim is damaged. The
  answer is the one for any lineage that cannot be read: ``CORRUPT``
  (``on_unreadable_lineage``), by the read's own reason (``CORRUPT_HISTORY`` in the
  detail), never a read miss (``MAX_LINEAGE_MISSES``: not counted).
- a retry unpaired only by its original (``StoreAnswers.retry_unpaired_by_its_original``)
  reads the history the original extended: with that parent's row lost and its claim
  damaged, that history cannot be read, and, as that method's rule says, it answers
  nothing (the pairing rejection stands). A warm worker (the retry's own lineage from
  the tail cache) gets there. The rejection, decided from the cache, is then decided
  again from a fresh read, which cannot read the retry's own lineage (the parent's row
  is lost): the write's answer in its order (``on_unreadable_lineage``), ``DUPLICATE``
  naming the original, whose idempotency record and row stand (CONTRACT 4).

Both backends (memory: ``DamagedClaims`` raises from ``_locate`` as Cassandra's decoder
does, and gives a claim without its request as Cassandra reads a null cell), both
entries; the answer is the same on redelivery.
"""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import REGISTRY

from ratchet.domain.plan import CorruptPartition
from ratchet.samples import TENANT, make_turn, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import PromotionRejected, RejectionReason
from services.ledger.cassandra import CassandraLedger
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from services.store.memory import MemoryCheckpointStore
from tests.contract.test_processor_handover import ENTRIES
from tests.contract.test_processor_races import Worker

R = RejectionReason
MISSES = "ratchet_worker_lineage_read_misses_total"
ROW = "WHERE tenant_id = %s AND partition_key = %s AND kind = 'checkpoint' AND ref = %s"


class DamagedClaims(MemoryCheckpointStore):
    """A memory store whose claims in ``damaged`` name no partition: its location
    lookups raise as Cassandra's do for such a claim row."""

    def __init__(self) -> None:
        super().__init__(StoreOptions())
        self.damaged: set[str] = set()
        self.keyless: set[str] = set()  # claims whose request's key reads null

    def _claim_of(self, tenant_id, response_id):
        claim = super()._claim_of(tenant_id, response_id)
        if claim is not None and response_id in self.keyless:
            return dataclasses.replace(claim, idempotency_key=None)
        return claim

    def _locate(self, tenant_id, response_id):
        if response_id in self.damaged:
            raise CorruptPartition(f"the claim of response {response_id} of tenant "
                                   f"{tenant_id} names no partition")
        return super()._locate(tenant_id, response_id)

    def _located_checkpoint(self, tenant_id, response_id):
        self._locate(tenant_id, response_id)
        return super()._located_checkpoint(tenant_id, response_id)


class Damage:
    """The backend's damage: a claim naming no partition, a turn row lost."""

    def __init__(self, store) -> None:
        self.store = store

    def claim(self, response_id: str) -> None:
        if isinstance(self.store, DamagedClaims):
            self.store.damaged.add(response_id)
            return
        self.store._session.execute(
            "UPDATE response_claims SET partition_key = null "
            "WHERE tenant_id = %s AND response_id = %s", (TENANT, response_id), timeout=30)

    def request(self, response_id: str) -> None:
        """The claim names its partition but no request (its key's cell null)."""
        if isinstance(self.store, DamagedClaims):
            self.store.keyless.add(response_id)
            return
        self.store._session.execute(
            "UPDATE response_claims SET idempotency_key = null "
            "WHERE tenant_id = %s AND response_id = %s", (TENANT, response_id), timeout=30)

    def row(self, partition_key: str, response_id: str) -> None:
        if isinstance(self.store, DamagedClaims):
            partition = self.store._partitions[(TENANT, partition_key)]
            del partition.checkpoints[response_id], partition.items[response_id]
            return
        self.store._session.execute(f"DELETE FROM turns {ROW}",
                                    (TENANT, partition_key, response_id), timeout=30)


@pytest.fixture(params=["memory", "cassandra"])
def backend(request):
    """(store, ledger) of one backend: a worker's, on shared data."""
    if request.param == "memory":
        return DamagedClaims(), MemoryLedger()
    session = request.getfixturevalue("ledger_session")
    return (CassandraCheckpointStore(session, StoreOptions(), timeout_s=30),
            CassandraLedger(session, timeout_s=30))


def chain(parent, root, **kw):
    return make_turn(conversation_id=None, expected_head_seq=None,
                     previous_response_id=None if parent is None else parent.response_id,
                     chain_root_id=None if root is None else root.response_id, **kw)


def answered(worker: Worker, event) -> PromotionRejected:
    handled = worker.handle(event)
    assert handled.kind == "rejected", handled
    outcome = handled.outbound[0].model
    assert isinstance(outcome, PromotionRejected), outcome
    return outcome


@ENTRIES
def test_a_parent_whose_claim_names_no_partition_is_a_lineage_that_cannot_be_read(
        backend, entry):
    store, ledger = backend
    worker = Worker(store, ledger, entry)
    root, other = chain(None, None), chain(None, None)
    for first in (root, other):
        assert worker.handle(first).kind == "promoted"
    Damage(store).claim(other.response_id)
    # Names another chain's response as its parent (not in its partition): where that
    # response lives is asked of its claim, which names no partition.
    stray = chain(other, root)
    misses = REGISTRY.get_sample_value(MISSES) or 0.0
    for attempt in ("first", "redelivery"):
        out = answered(worker, stray)
        assert out.reason is R.CORRUPT, (attempt, out.reason, out.detail)
        # The read's own reason, not a read miss of a parent the view names.
        assert "(CORRUPT_HISTORY)" in out.detail, (attempt, out.detail)
    assert (REGISTRY.get_sample_value(MISSES) or 0.0) == misses


@ENTRIES
def test_a_lost_parent_whose_claim_names_no_request_is_a_lineage_that_cannot_be_read(
        backend, entry):
    """The parent claimed in the turn's own partition, its row lost: whether it was
    promoted is asked of its claim's request (``turn_lost``), which the claim does not
    name. Before: memory read it as never promoted (the store's ``PARENT_NOT_PROMOTED``),
    Cassandra refused the lookup's null key (``StoreUnavailable``: retried for ever)."""
    store, ledger = backend
    worker = Worker(store, ledger, entry)
    root = chain(None, None)
    parent = chain(root, root)
    for first in (root, parent):
        assert worker.handle(first).kind == "promoted"
    damage = Damage(store)
    damage.row(root.response_id, parent.response_id)
    damage.request(parent.response_id)
    child = chain(parent, root)
    for attempt in ("first", "redelivery"):
        out = answered(worker, child)
        assert out.reason is R.CORRUPT, (attempt, out.reason, out.detail)
        assert "(CORRUPT_HISTORY)" in out.detail, (attempt, out.detail)


def tool_items(call_id: str) -> list:
    return [function_call(call_id, "lookup", {"q": 1}, item_id=new_id("fc")),
            function_call_output(call_id, '{"ok": true}', item_id=new_id("fco")),
            message("done", role="assistant", item_id=new_id("msg"))]


@ENTRIES
def test_a_retry_whose_originals_history_cannot_be_located_keeps_its_pairing_rejection(
        backend, entry):
    store, ledger = backend
    worker = Worker(store, ledger, entry)
    items = tool_items("call_retry")
    root = chain(None, None)
    original = chain(root, root, items=items)
    assert worker.handle(root).kind == "promoted"
    assert worker.handle(original).kind == "promoted"
    damage = Damage(store)
    damage.row(root.response_id, root.response_id)
    damage.claim(root.response_id)
    # A retry on the history its original made (the gateway lost the answer): its call
    # repeats the original's, so it pairs only against the history before the original.
    retry = chain(original, root, items=items, idempotency_key=original.idempotency_key,
                  request_digest=original.request_digest, attempt=2)
    for attempt in ("first", "redelivery"):
        out = answered(worker, retry)
        assert (out.reason, out.existing_response_id) == (
            R.DUPLICATE, original.response_id), (attempt, out.reason, out.detail)
