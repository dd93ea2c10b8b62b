"""A chain turn whose parent was not there when its lineage was read gets the answer the
write would give it, in the write's order (docs/gateway-protocol.md section 7), whatever
its own pairing: the size rule first (``UNSUPPORTED_FORMAT``), a damaged idempotency
record of its request ``CORRUPT``, and a parent promoted since that read is no
``PARENT_NOT_PROMOTED``: the turn is decided again on the parent's lineage. Three
leftovers of an outside review of session 48 (docs/decisions.md, "Session 47's last
merges reviewed from outside", its "Left"): with unpaired items of its own the turn was
answered by ordering (``PARENT_NOT_PROMOTED``) in all three. Both backends, both entry
points, on the worker that promoted the chain's root (warm) and on one that never saw
the chain (cold). The paired cases went to the write before too: they pin that both
answers agree."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason
from ratchet.samples import new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import CheckpointPromoted
from schemas.models import RejectionReason as R
from services.ledger.cassandra import CassandraLedger
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from tests.contract.test_processor_handover import ENTRIES, Data
from tests.unit.test_processor_order_before_pairing import self_unpaired
from tests.unit.test_processor_retry_at_head import tool_items
from tests.unit.test_processor_rules import TENANT, TOPICS, chain_turn

# The store's size bound in these tests: a chain root (~1.5 KB) fits, a turn carrying
# ``_bulky()`` does not.
LIMIT = 8_000
COLD = pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])
ITEMS = pytest.mark.parametrize("paired", [True, False], ids=["paired", "unpaired"])


@pytest.fixture(params=["memory", "cassandra"])
def data(request) -> Data:
    options = StoreOptions(max_turn_bytes=LIMIT)
    if request.param == "memory":
        store, ledger = MemoryCheckpointStore(options), MemoryLedger()
        return Data(lambda: store, lambda: ledger)
    session = request.getfixturevalue("ledger_session")
    return Data(lambda: CassandraCheckpointStore(session, options, timeout_s=30),
                lambda: CassandraLedger(session, timeout_s=30))


def _answer(out) -> tuple:
    if isinstance(out, CheckpointPromoted):
        return ("promoted", out.seq)
    return (out.reason, out.existing_response_id)


def _items(paired: bool) -> list:
    return tool_items(new_id("call")) if paired else self_unpaired()


def _bulky() -> list:
    return [message("x" * (2 * LIMIT), role="assistant", item_id=new_id("msg"))]


def _root_and_worker(data: Data, entry: str, cold: bool):
    """A promoted chain root, and the worker that is to answer its continuation: the
    one that promoted the root (warm) or another (cold)."""
    first = data.worker(entry)
    root = chain_turn(None, None)
    assert first.outcome(root).seq == 1
    return root, (data.worker(entry) if cold else first)


@ENTRIES
@COLD
@ITEMS
def test_an_oversized_turn_with_no_parent_is_unsupported_format(data, entry, cold, paired):
    """The size rule is the write's first answer: before the parent's absence."""
    root, worker = _root_and_worker(data, entry, cold)
    out = worker.outcome(chain_turn(root.response_id, new_id("resp"),
                                    items=_items(paired) + _bulky()))
    assert out.reason is R.UNSUPPORTED_FORMAT, out.detail
    assert f"{LIMIT}-byte" in out.detail


@ENTRIES
@COLD
@ITEMS
def test_a_retry_on_a_damaged_idempotency_record_with_no_parent_is_corrupt(
        data, entry, cold, paired):
    """The root's idempotency record names a response that has no checkpoint (damage):
    a retry of the root's request under another response id, naming a parent that is
    not there, is ``CORRUPT`` as the write answers it; the damaged record was read as
    "not promoted" (``PARENT_NOT_PROMOTED``)."""
    root, worker = _root_and_worker(data, entry, cold)
    _damage_idempotency(data, root)
    retry = chain_turn(root.response_id, new_id("resp"), items=_items(paired),
                       idempotency_key=root.idempotency_key, attempt=2)
    assert _answer(worker.outcome(retry))[0] is R.CORRUPT


def _damage_idempotency(data: Data, root) -> None:
    store = data.store()
    if isinstance(store, MemoryCheckpointStore):
        partition = store._partitions[(TENANT, root.response_id)]
        record = partition.idempotency[root.idempotency_key]
        partition.idempotency[root.idempotency_key] = replace(record, response_id="resp_gone")
        return
    store._session.execute(
        "UPDATE turns SET response_id = 'resp_gone' WHERE tenant_id = %s AND "
        "partition_key = %s AND kind = 'idempotency' AND ref = %s",
        (TENANT, root.response_id, root.idempotency_key), timeout=30)


class LaggingParentReads:
    """A store whose first ``lag`` history reads of response ``parent`` miss it: a
    promotion in flight (another worker's batch, across a rebalance) that a read at
    read consistency does not see yet and the write's view, at SERIAL, does. As many
    reads as the worker decides the turn from, before the fix: each decision read
    the parent once."""

    def __init__(self, store, parent: str, lag: int = 2) -> None:
        self._store, self.parent, self.lag = store, parent, lag

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_history(self, tenant_id, **kw):
        if self.lag and kw.get("response_id") == self.parent:
            self.lag -= 1
            return HistoryFailure(HistoryFailureReason.NOT_FOUND, "not seen yet")
        return self._store.read_history(tenant_id, **kw)


@ENTRIES
@COLD
def test_a_parent_the_lineage_read_missed_is_decided_on(data, entry, cold):
    """The child answers the parent's call (its pairing holds on the parent's history
    only); the parent stands promoted, by another worker, but the child's lineage reads
    miss it: the child is promoted on the parent, as the write plans it, not
    ``PARENT_NOT_PROMOTED`` from a read the write's view contradicts."""
    root, worker = _root_and_worker(data, entry, cold)
    parent = chain_turn(root.response_id, root.response_id, items=[
        function_call("call_p", "lookup", {"q": 1}, item_id=new_id("fc"))])
    child = chain_turn(root.response_id, parent.response_id, input_items=[], items=[
        function_call_output("call_p", '{"ok": true}', item_id=new_id("fco")),
        message("done", role="assistant", item_id=new_id("msg"))])
    assert _answer(data.worker().outcome(parent)) == ("promoted", 2)
    lagging = LaggingParentReads(worker.store, parent.response_id)
    worker.processor = PromotionProcessor(lagging, worker.processor.ledger,
                                          worker.processor.codec, TOPICS,
                                          clock_ms=worker.processor.clock_ms,
                                          tails=worker.processor.tails)
    out = worker.outcome(child)
    assert _answer(out) == ("promoted", 3), getattr(out, "detail", None)
    assert lagging.lag == 0  # every read it was to miss, it missed
