"""A chain parent whose verified history read and the store's view (and write) disagree
for good ends as a typed rejection, not a record retried without end.

The write compares the caller's copy of the parent (the one the turn was validated on:
its hint, else what the store's own reads learnt) with the row its view reads
(``promotion_checks._parent_changed``); a copy that differs in anything the child is
built from is ``LineageChanged`` naming that very parent, and the worker reads the
lineage again. Until session 50 that was never counted by ``MAX_LINEAGE_MISSES`` (the
read did extend the parent): each attempt ended after ``MAX_LINEAGE_ROUNDS`` in a
retryable ``StoreUnavailable`` and the record was processed again with backoff, for
ever (session 49's "Left").

Neither backend gets there in a healthy state (docs/decisions.md, session 50): the read
learns the row it verified into the store's hints, decoded by the very function the view
decodes it with, from the same partition, so the next view compares equal. A store whose
history read decodes the row otherwise than its view does (``DifferingParentReads``, a
double around either backend) does. Now: after ``MAX_LINEAGE_MISSES`` fresh reads in a
row that extended the parent while the store named it again, ``CORRUPT`` (the history
the turn would extend cannot be read as it is stored), counted in
``ratchet_worker_lineage_read_misses_total`` and logged once."""

from __future__ import annotations

import logging
from dataclasses import replace

from ratchet.domain.history import VerifiedHistory
from schemas.models import CheckpointPromoted
from schemas.models import RejectionReason as R
from tests.contract.test_lineage_read_misses import (
    COLD,
    _chain,
    _child_items,
    _misses,
    _on,
)
from tests.contract.test_processor_handover import ENTRIES
from tests.unit.test_processor_rules import TENANT, chain_turn


class DifferingParentReads:
    """A store whose first ``times`` history reads of response ``parent`` decode its row
    with a seq 5 higher than the row's (and learn that copy, as the store's reader
    learns what it verified), while its view and its write take the row as stored."""

    def __init__(self, store, parent: str, times: int = 10**6) -> None:
        self._store, self.parent, self.times = store, parent, times

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_history(self, tenant_id, **kw):
        found = self._store.read_history(tenant_id, **kw)
        if (self.times and kw.get("response_id") == self.parent
                and isinstance(found, VerifiedHistory)):
            self.times -= 1
            changed = replace(found.checkpoint, seq=found.checkpoint.seq + 5)
            self._store._hints.checkpoints.put(
                (tenant_id, changed.partition_key, self.parent), changed)
            return replace(found, checkpoint=changed,
                           lineage=(*found.lineage[:-1], changed))
        return found


def _lines(child, caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if child.response_id in r.getMessage() and "differs" in r.getMessage()]


@ENTRIES
@COLD
def test_a_parent_whose_read_and_view_differ_for_good_ends_corrupt(data, entry, cold, caplog):
    """Both backends: every history read of the parent gives a copy the view does not.
    The child answers the parent's call: paired on that history, it reaches the write
    (a child that does not pair is rejected for its own pairing before any write)."""
    root, parent, worker = _chain(data, entry, cold)
    differing = DifferingParentReads(worker.store, parent.response_id)
    _on(worker, differing)
    child = chain_turn(root.response_id, parent.response_id,
                       **_child_items("answers-parent"))
    before = _misses()
    with caplog.at_level(logging.ERROR, logger="streams.processor"):
        out = worker.outcome(child)
    assert not isinstance(out, CheckpointPromoted)
    assert out.reason is R.CORRUPT, out.detail
    assert "cannot be read (CORRUPT_HISTORY)" in out.detail, out.detail
    assert _misses() == before + 1
    assert len(_lines(child, caplog)) == 1, [r.getMessage() for r in caplog.records]
    # Recorded: a redelivery replays it, counted once; nothing promoted.
    again = worker.outcome(child)
    assert (again.reason, again.detail) == (out.reason, out.detail)
    assert _misses() == before + 1
    assert worker.store.get_checkpoint(TENANT, child.response_id) is None


@ENTRIES
@COLD
def test_a_parent_read_otherwise_fewer_times_than_the_bound_is_decided_on(data, entry, cold):
    """The control: the first 3 reads (``MAX_LINEAGE_MISSES``, a literal so that it ran
    on the code before too) give the differing copy, the next the row as stored: the
    child is promoted on the parent at seq 3, nothing counted."""
    root, parent, worker = _chain(data, entry, cold)
    differing = DifferingParentReads(worker.store, parent.response_id, times=3)
    _on(worker, differing)
    before = _misses()
    child = chain_turn(root.response_id, parent.response_id,
                       **_child_items("answers-parent"))
    out = worker.outcome(child)
    assert isinstance(out, CheckpointPromoted), getattr(out, "detail", None)
    assert out.seq == 3
    assert differing.times == 0 and _misses() == before
