"""A chain parent the store's view sees promoted (at SERIAL) while every history read of
it misses it ends as a typed rejection, not a record retried without end.

Until session 49 each decision answered ``LineageChanged`` (the write, or the judgement
off the lineage, would put the turn on the parent), the turn was decided again from a
fresh read, at most ``MAX_LINEAGE_ROUNDS`` times, then a retryable ``StoreUnavailable``:
the record was processed again with backoff, for ever (each attempt bounded, the record
not; docs/decisions.md, "Session 48's off-lineage answers ... reviewed from outside",
its "Left"). A healthy store never gets there: the view's SERIAL read completes a
promotion in flight, so the next read sees it. Two states that do:

- memory: a parent row filed under another tenant (damage): the history read answers
  ``NOT_FOUND`` (no leak across tenants), the view's parent lookup finds the row;
- both backends: a store whose history reads miss the parent for good while its view
  sees it (``LaggingParentReads`` that never catches up).

Now: after ``MAX_LINEAGE_MISSES`` fresh reads in a row missed the lineage the store had
just named, ``CORRUPT`` (the history the turn would extend cannot be read, so it could
never be served either), counted in ``ratchet_worker_lineage_read_misses_total`` and
logged. Whatever the child's items: answering the parent's call (unpaired against the
empty state the missed read gives: the judgement's path), messages only (paired: the
write's path), or an output no history pairs. Cold and warm workers, both entries."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from ratchet.samples import new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import CheckpointPromoted
from schemas.models import RejectionReason as R
from services.ledger.memory import MemoryLedger
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from streams.turn_decider import MAX_LINEAGE_MISSES, MAX_LINEAGE_ROUNDS
from tests.contract.test_off_lineage_write_answers import LaggingParentReads
from tests.contract.test_processor_handover import ENTRIES, Data
from tests.unit.test_processor_order_before_pairing import self_unpaired
from tests.unit.test_processor_rules import TENANT, TOPICS, chain_turn

COLD = pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
KINDS = pytest.mark.parametrize("kind", ["answers-parent", "messages", "self-unpaired"])
METRIC = "ratchet_worker_lineage_read_misses_total"


def _child_items(kind: str) -> dict:
    if kind == "answers-parent":
        return {"input_items": [], "items": [
            function_call_output("call_p", '{"ok": true}', item_id=new_id("fco")),
            message("done", role="assistant", item_id=new_id("msg"))]}
    if kind == "messages":
        return {"items": [message("hi", role="assistant", item_id=new_id("msg"))]}
    return {"items": self_unpaired()}


def _chain(data: Data, entry: str, cold: bool):
    """A root promoted by the answering worker (warm) or another (cold), a parent on it
    promoted by a third worker (so no answering worker's tail cache holds it), and the
    answering worker."""
    first = data.worker(entry)
    root = chain_turn(None, None)
    assert first.outcome(root).seq == 1
    parent = chain_turn(root.response_id, root.response_id, items=[
        function_call("call_p", "lookup", {"q": 1}, item_id=new_id("fc"))])
    assert data.worker().outcome(parent).seq == 2
    return root, parent, (data.worker(entry) if cold else first)


def _on(worker, store) -> None:
    """``worker`` over ``store`` (its tail cache kept: warm stays warm)."""
    old = worker.processor
    worker.store = store
    worker.processor = PromotionProcessor(store, old.ledger, old.codec, TOPICS,
                                          clock_ms=old.clock_ms, tails=old.tails)


def _misses() -> float:
    return REGISTRY.get_sample_value(METRIC) or 0.0


def _missed_lines(child, caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if child.response_id in r.getMessage() and "missed" in r.getMessage()]


def _assert_rejected_corrupt(worker, child, caplog) -> None:
    before = _misses()
    with caplog.at_level(logging.ERROR, logger="streams.processor"):
        out = worker.outcome(child)
    assert not isinstance(out, CheckpointPromoted)
    assert out.reason is R.CORRUPT, out.detail
    assert "cannot be read" in out.detail
    # The operator's signals: the counter, and a log line naming the turn, once per
    # turn (the decision without the request's facts that met the bound first is
    # decided again, and told nothing: session 49's review counted 2 per turn).
    assert _misses() == before + 1
    assert len(_missed_lines(child, caplog)) == 1, [r.getMessage() for r in caplog.records]
    # Recorded like any rejection: a redelivery replays it (not counted again),
    # nothing is promoted.
    again = worker.outcome(child)
    assert (again.reason, again.detail) == (out.reason, out.detail)
    assert _misses() == before + 1
    assert worker.store.get_checkpoint(TENANT, child.response_id) is None


@ENTRIES
@COLD
@KINDS
def test_a_parent_every_read_misses_ends_corrupt(data, entry, cold, kind, caplog):
    """Both backends: the history reads of the parent never see it, the view does."""
    root, parent, worker = _chain(data, entry, cold)
    lagging = LaggingParentReads(worker.store, parent.response_id, lag=10**6)
    _on(worker, lagging)
    child = chain_turn(root.response_id, parent.response_id, **_child_items(kind))
    _assert_rejected_corrupt(worker, child, caplog)
    # Bounded per decision: the reads the two decisions (one without the request's
    # facts, one with) made of the parent, each at most ``MAX_LINEAGE_ROUNDS`` + 1.
    assert 10**6 - lagging.lag <= 2 * (MAX_LINEAGE_ROUNDS + 1)


@ENTRIES
@KINDS
def test_a_parent_row_filed_under_another_tenant_ends_corrupt(entry, kind, caplog):
    """Memory store, real state: the parent's row says another tenant (damage). Its
    history read is ``NOT_FOUND`` (never another tenant's row), its view finds it."""
    store, ledger = MemoryCheckpointStore(), MemoryLedger()
    shared = Data(lambda: store, lambda: ledger)
    root, parent, worker = _chain(shared, entry, cold=True)
    partition = store._partitions[(TENANT, root.response_id)]
    row = partition.checkpoints[parent.response_id]
    partition.checkpoints[parent.response_id] = replace(row, tenant_id="tenant-elsewhere")
    child = chain_turn(root.response_id, parent.response_id, **_child_items(kind))
    _assert_rejected_corrupt(worker, child, caplog)


@ENTRIES
@COLD
def test_a_parent_missed_fewer_times_than_the_bound_is_decided_on(data, entry, cold):
    """The control: reads that miss the parent 3 times (``MAX_LINEAGE_MISSES``: the
    first read, then re-reads after the store named it, one fewer than the bound) and
    then see it: the child is promoted on the parent, no rejection. Passes before and
    after the bound (a literal here, so that it ran on the code before it too)."""
    root, parent, worker = _chain(data, entry, cold)
    lagging = LaggingParentReads(worker.store, parent.response_id, lag=3)
    _on(worker, lagging)
    before = _misses()
    child = chain_turn(root.response_id, parent.response_id, **_child_items("answers-parent"))
    out = worker.outcome(child)
    assert isinstance(out, CheckpointPromoted), getattr(out, "detail", None)
    assert out.seq == 3
    assert lagging.lag == 0 and _misses() == before


@ENTRIES
@COLD
@pytest.mark.parametrize("lag", [MAX_LINEAGE_MISSES + 1, 2 * (MAX_LINEAGE_MISSES + 1) - 1])
def test_a_parent_only_the_decision_without_facts_missed_is_promoted_untold(
        data, entry, cold, lag, caplog):
    """Reads that miss the parent long enough for the first decision (made without
    the request's facts) to reach the bound, then see it: that decision's ``CORRUPT``
    is never recorded (the turn is decided again from fresh reads, with its facts, and
    promoted), so nothing may tell the operator a turn was rejected: no count, no log
    line. Session 49's review found both (the counter and an ERROR line "missed" for
    a turn promoted at seq 3), for any lag from ``MAX_LINEAGE_MISSES`` + 1 reads to one
    fewer than the two decisions' reads."""
    root, parent, worker = _chain(data, entry, cold)
    lagging = LaggingParentReads(worker.store, parent.response_id, lag=lag)
    _on(worker, lagging)
    before = _misses()
    child = chain_turn(root.response_id, parent.response_id, **_child_items("answers-parent"))
    with caplog.at_level(logging.ERROR, logger="streams.processor"):
        out = worker.outcome(child)
    assert isinstance(out, CheckpointPromoted), getattr(out, "detail", None)
    assert out.seq == 3 and lagging.lag == 0
    assert _misses() == before
    assert _missed_lines(child, caplog) == []


class PromoteAfterFirstRead:
    """A store whose first history read of ``parent`` returns what it read (the parent
    not promoted yet: a real miss) and then has ``promote`` (another worker) promote
    it: a parent promoted by another promoter between the child's read and its write,
    the race a healthy store has. Every later read is the store's own."""

    def __init__(self, store, parent: str, promote) -> None:
        self._store, self.parent, self._promote = store, parent, promote
        self.raced, self.reads = False, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_history(self, tenant_id, **kw):
        found = self._store.read_history(tenant_id, **kw)
        self.reads += kw.get("response_id") == self.parent
        if not self.raced and kw.get("response_id") == self.parent:
            self.raced = True
            self._promote()
        return found


@ENTRIES
@COLD
@KINDS
def test_a_parent_another_worker_promotes_between_read_and_write_is_no_miss(
        data, entry, cold, kind):
    """Two promoters racing on a healthy store (the real one on Cassandra): the child's
    first read misses the parent (not promoted yet), another worker promotes it, the
    child's write names it; the next read sees it, so nothing is counted and the child
    is decided on the parent as if it had been there all along. Passes before and
    after session 49's bound (the review's check that a healthy race never reaches it)."""
    first = data.worker(entry)
    root = chain_turn(None, None)
    assert first.outcome(root).seq == 1
    parent = chain_turn(root.response_id, root.response_id, items=[
        function_call("call_p", "lookup", {"q": 1}, item_id=new_id("fc"))])
    worker = data.worker(entry) if cold else first
    promoted = []
    racing = PromoteAfterFirstRead(worker.store, parent.response_id,
                                   lambda: promoted.append(data.worker().outcome(parent)))
    _on(worker, racing)
    before = _misses()
    child = chain_turn(root.response_id, parent.response_id, **_child_items(kind))
    out = worker.outcome(child)
    assert racing.raced and [p.seq for p in promoted] == [2]
    assert racing.reads >= 2  # the miss, and the read after the store named the parent
    assert _misses() == before
    if kind == "answers-parent":
        assert isinstance(out, CheckpointPromoted) and out.seq == 3, getattr(out, "detail", None)
    else:  # the parent's call left unanswered: the pairing on the parent's history
        assert out.reason is R.UNPAIRED_TOOL_CALL, out.detail


@ENTRIES
def test_the_recorded_corrupt_holds_for_its_request_once_the_parent_reads_well(data, entry):
    """The rejection is recorded like any (docs/gateway-protocol.md section 7), by the
    event's ``event_id``: once the reads find the parent, a redelivery of the event,
    also one carrying another response id, still gets the recorded ``CORRUPT``; a new
    request is decided on the parent as it then reads (promoted). Passes before and
    after session 49's review."""
    root, parent, worker = _chain(data, entry, cold=True)
    lagging = LaggingParentReads(worker.store, parent.response_id, lag=10**6)
    _on(worker, lagging)
    child = chain_turn(root.response_id, parent.response_id, **_child_items("answers-parent"))
    assert worker.outcome(child).reason is R.CORRUPT
    lagging.lag = 0
    assert worker.outcome(child).reason is R.CORRUPT
    retry = child.model_copy(update={"response_id": new_id("resp")})
    assert worker.outcome(retry).reason is R.CORRUPT
    fresh = chain_turn(root.response_id, parent.response_id, **_child_items("answers-parent"))
    out = worker.outcome(fresh)
    assert isinstance(out, CheckpointPromoted) and out.seq == 3, getattr(out, "detail", None)


@ENTRIES
def test_a_retry_with_a_new_event_id_is_decided_on_the_parent_as_it_then_reads(data, entry):
    """docs/gateway-protocol.md section 7 (corrected in session 50, rgwdocs): only the
    event's own decision is recorded, so a retry of the request as section 6 makes one
    (a new ``event_id`` and ``attempt``, the same ``response_id``) is decided again once
    the reads find the parent: promoted; another attempt after it under another
    response id is then ``DUPLICATE`` naming it. The docs said such a retry got the
    ``CORRUPT`` again; passes before and after (no code changed)."""
    root, parent, worker = _chain(data, entry, cold=True)
    lagging = LaggingParentReads(worker.store, parent.response_id, lag=10**6)
    _on(worker, lagging)
    child = chain_turn(root.response_id, parent.response_id, **_child_items("answers-parent"))
    assert worker.outcome(child).reason is R.CORRUPT
    lagging.lag = 0
    retry = child.model_copy(update={"event_id": new_id("evt"), "attempt": 2})
    out = worker.outcome(retry)
    assert isinstance(out, CheckpointPromoted) and out.seq == 3, getattr(out, "detail", None)
    other = child.model_copy(update={"event_id": new_id("evt"), "attempt": 3,
                                     "response_id": new_id("resp")})
    dup = worker.outcome(other)
    assert (dup.reason, dup.existing_response_id) == (R.DUPLICATE, child.response_id)
