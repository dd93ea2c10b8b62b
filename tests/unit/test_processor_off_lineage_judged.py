"""A Conversation turn whose pairing failed against a lineage read at another head than
the one it expects (the head moved between the head read and the lineage's: a race,
set directly through ``TurnDecider._decide``) gets the write's answer, in the write's
order (docs/gateway-protocol.md section 7): the size rule first, a damaged idempotency
record of its request ``CORRUPT``, and a head that has moved to the one it expects is
no ``OUT_OF_ORDER``: the turn is decided again (``_decide`` answers None) and promoted.
The Conversation side of ``tests/contract/test_off_lineage_write_answers.py`` (the
chain's, on both backends); each case was answered by ordering before (session 48)."""

from __future__ import annotations

from dataclasses import replace

from ratchet.domain.plan import LineageChanged
from ratchet.samples import new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import RejectionReason as R
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.handled import NO_FACTS
from streams.tail_cache import TailCache
from tests.unit.test_processor_order_before_pairing import self_unpaired
from tests.unit.test_processor_rules import TENANT, Harness, conv_id, turn

LIMIT = 8_000  # the store's size bound here: an ordinary turn fits, ``bulky`` does not


def _at_head_one(h: Harness):
    """A Conversation with one turn, and its lineage read at head 1 (no cache)."""
    conv = conv_id()
    first = turn(conv, 0)
    assert h.outcome(first).seq == 1
    lineage = h.processor._decider.lineages.read(turn(conv, 1))
    assert lineage.tail.seq == 1 and lineage.off_head is None
    return conv, first, lineage


def _harness(**options) -> Harness:
    h = Harness()
    h.store = MemoryCheckpointStore(StoreOptions(**options))
    h.rewire(store=h.store, tails=TailCache(capacity=0))
    return h


def test_an_oversized_turn_off_its_head_is_unsupported_format():
    h = _harness(max_turn_bytes=LIMIT)
    conv, _, at_one = _at_head_one(h)
    bulky = message("x" * (2 * LIMIT), role="assistant", item_id=new_id("msg"))
    ahead = turn(conv, 2, items=[*self_unpaired(), bulky])
    out = h.processor._decider._decide(ahead, NO_FACTS, None, at_one, facts_read=True)
    assert out.reason is R.UNSUPPORTED_FORMAT, out.detail


def test_a_retry_off_its_head_on_a_damaged_idempotency_record_is_corrupt():
    h = _harness()
    conv, first, at_one = _at_head_one(h)
    partition = h.store._partitions[(TENANT, conv)]
    record = partition.idempotency[first.idempotency_key]
    partition.idempotency[first.idempotency_key] = replace(record, response_id="resp_gone")
    retry = turn(conv, 2, items=self_unpaired(), idempotency_key=first.idempotency_key,
                 attempt=2)
    out = h.processor._decider._decide(retry, NO_FACTS, None, at_one, facts_read=True)
    assert out.reason is R.CORRUPT, out.detail


def test_a_head_moved_to_the_one_expected_is_decided_again():
    """The lineage was read at head 1; head 2 (an open call) is promoted before the
    answer; the turn expecting head 2 answers that call (unpaired on head 1's history):
    decided again, then promoted at seq 3, not ``OUT_OF_ORDER`` at head 1."""
    h = _harness()
    conv, _, at_one = _at_head_one(h)
    second = turn(conv, 1, items=[function_call("call_h", "lookup", {}, item_id=new_id("fc"))])
    assert h.outcome(second).seq == 2
    third = turn(conv, 2, input_items=[], items=[
        function_call_output("call_h", "{}", item_id=new_id("fco")),
        message("ok", role="assistant", item_id=new_id("msg"))])
    # ``LineageChanged`` naming head 2 (None until session 49, which made ``_decide``
    # name the lineage, to count reads that keep missing it).
    decided = h.processor._decider._decide(third, NO_FACTS, None, at_one, facts_read=True)
    assert decided == LineageChanged(second.response_id)
    assert h.outcome(third).seq == 3
