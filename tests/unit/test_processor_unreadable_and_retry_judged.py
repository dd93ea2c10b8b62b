"""The two answers of the thread path that still came from reads of their own after
session 48's off-lineage change (docs/decisions.md, "The off-lineage answer is the
store's judgement", its "Left") give the write's answer, in the write's order
(docs/gateway-protocol.md section 7 and "Size limit"):

- a retry of a promoted request whose pairing failed only because of its original
  (``StoreAnswers.retry_unpaired_by_its_original``) and a turn on a lineage that cannot
  be read (``on_unreadable_lineage``) answered the retry (``DUPLICATE``) before the size
  rule: the write answers ``UNSUPPORTED_FORMAT`` first (a paired retry, sent to the
  write, is the control);
- ``on_unreadable_lineage`` read a damaged idempotency record of the turn's request as
  "not promoted" and answered the read's reason (here ``UNKNOWN_ITEM_TYPE``): the write's
  plan finds the damage, ``CORRUPT``.

Memory store, a worker with no tail cache (it reads every lineage) and one with it;
``handle`` and ``handle_async`` (a cold worker: the loop's fast path gives these turns to
the thread path)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason
from ratchet.samples import new_id
from schemas.items import message
from schemas.models import RejectionReason as R
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.tail_cache import TailCache
from streams.turn_decider import MAX_LINEAGE_MISSES, MAX_LINEAGE_ROUNDS
from tests.contract.test_processor_races import Worker
from tests.unit.test_processor_retry_at_head import tool_items
from tests.unit.test_processor_rules import TENANT, Harness, conv_id, turn

LIMIT = 8_000  # the store's size bound here: an ordinary turn fits, ``_bulky()`` does not


@pytest.fixture(params=["cached", "read"], ids=["lineage-cached", "lineage-read"])
def h(request) -> Harness:
    harness = Harness()
    harness.store = MemoryCheckpointStore(StoreOptions(max_turn_bytes=LIMIT))
    harness.rewire(store=harness.store,
                   tails=TailCache(capacity=0) if request.param == "read" else None)
    return harness


ENTRIES = pytest.mark.parametrize("entry", ["handle", "handle_async"])


def _ask(h: Harness, entry: str, event):
    """The outcome of ``event`` from ``h``'s worker (``handle``) or from a cold one
    over the same store and ledger entered by ``handle_async``."""
    if entry == "handle":
        return h.outcome(event)
    return Worker(h.store, h.ledger, entry).outcome(event)


def _bulky() -> list:
    return [message("x" * (2 * LIMIT), role="assistant", item_id=new_id("msg"))]


def _unreadable(h: Harness, reason: HistoryFailureReason) -> None:
    """Every history read of the store fails with ``reason`` from now on."""
    h.rewire(tails=TailCache(capacity=0))
    h.store.read_history = lambda *a, **kw: HistoryFailure(reason, "injected")


@pytest.mark.parametrize("repeats_calls", [True, False], ids=["unpaired", "paired"])
@ENTRIES
def test_an_oversized_retry_at_its_originals_head_is_unsupported_format(h, entry, repeats_calls):
    """Unpaired: the retry repeats its original's call, which the head holds."""
    conv, call = conv_id(), new_id("call")
    original = turn(conv, 0, items=tool_items(call))
    assert h.outcome(original).seq == 1
    items = (tool_items(call) if repeats_calls else []) + _bulky()
    retry = turn(conv, 1, items=items, idempotency_key=original.idempotency_key, attempt=2)
    out = _ask(h, entry, retry)
    assert out.reason is R.UNSUPPORTED_FORMAT, out.detail
    assert f"{LIMIT}-byte" in out.detail


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "unpaired"])
@ENTRIES
def test_an_oversized_retry_on_an_unreadable_lineage_is_unsupported_format(h, entry, paired):
    conv = conv_id()
    original = turn(conv, 0)
    assert h.outcome(original).seq == 1
    _unreadable(h, HistoryFailureReason.CORRUPT_HISTORY)
    items = (tool_items(new_id("call")) if paired else
             [*tool_items(new_id("call"))[1:]]) + _bulky()
    retry = turn(conv, 1, items=items, idempotency_key=original.idempotency_key, attempt=2)
    out = _ask(h, entry, retry)
    assert out.reason is R.UNSUPPORTED_FORMAT, out.detail


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "unpaired"])
@ENTRIES
def test_a_retry_on_a_damaged_idempotency_record_and_an_unreadable_lineage_is_corrupt(
        h, entry, paired):
    """The lineage holds an item type this version does not know (its read says
    ``UNKNOWN_ITEM_TYPE``) and the request's idempotency record names a response with
    no checkpoint: the write's view cannot say whether the request stands promoted,
    ``CORRUPT`` (the read's reason, ``UNKNOWN_ITEM_TYPE``, rested on "not promoted")."""
    conv = conv_id()
    original = turn(conv, 0)
    assert h.outcome(original).seq == 1
    partition = h.store._partitions[(TENANT, conv)]
    record = partition.idempotency[original.idempotency_key]
    partition.idempotency[original.idempotency_key] = replace(record, response_id="resp_gone")
    _unreadable(h, HistoryFailureReason.UNKNOWN_ITEM_TYPE)
    items = tool_items(new_id("call")) if paired else tool_items(new_id("call"))[1:]
    retry = turn(conv, 1, items=items, idempotency_key=original.idempotency_key, attempt=2)
    out = _ask(h, entry, retry)
    assert out.reason is R.CORRUPT, out.detail
    assert "corrupt" in out.detail


def test_a_parent_every_lineage_read_misses_ends_corrupt_after_max_lineage_misses():
    """The judgement's view sees the parent, every history read misses it (a read
    lagging without end): each decision is ``LineageChanged`` and decided again from a
    fresh read; once ``MAX_LINEAGE_MISSES`` reads in a row missed the parent the view
    named, ``CORRUPT`` (session 49; until then a retryable ``StoreUnavailable`` after
    ``MAX_LINEAGE_ROUNDS``, and the record was processed again without end), never
    ``PARENT_NOT_PROMOTED``, never a promotion. The reads are bounded: the decision
    made without the request's facts and the one made with them, each one read and
    ``MAX_LINEAGE_MISSES`` more (more cases: ``contract/test_lineage_read_misses.py``)."""
    from tests.contract.test_off_lineage_write_answers import LaggingParentReads
    from tests.unit.test_processor_order_before_pairing import self_unpaired
    from tests.unit.test_processor_rules import chain_turn

    h = Harness()
    root = chain_turn(None, None)
    assert h.outcome(root).seq == 1
    lagging = LaggingParentReads(h.store, root.response_id, lag=10**6)
    h.rewire(store=lagging, tails=TailCache(capacity=0))
    child = chain_turn(root.response_id, root.response_id, items=self_unpaired())
    out = h.outcome(child)
    assert out.reason is R.CORRUPT, out.detail
    assert 10**6 - lagging.lag == 2 * (MAX_LINEAGE_MISSES + 1)
    assert MAX_LINEAGE_MISSES < MAX_LINEAGE_ROUNDS
