"""A Conversation turn that does not expect the current head is decided without reading
the Conversation's history (an outside review, session 31: a turn with a stale
``expected_head_seq`` on a Conversation of 10 000 turns cost its worker a full
verified read, ~3 s, so a few thousand of them held its lane for hours).

The head is one row; a turn that expects another one continues no stored history, so
it gets every rule but pairing, then the store's answer at SERIAL
(``CheckpointStore.judge``: the request standing promoted, the response id bound in
the partition, ``CONFLICT`` / ``OUT_OF_ORDER``), and is never written from there. A
head read that lags a promotion still in flight sends the turn back to the full read
(SERIAL sees that promotion): never a wrong ``OUT_OF_ORDER``.
"""

from __future__ import annotations

import hashlib

import pytest

from ratchet.samples import new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import RejectionReason as R
from services.store.memory import MemoryCheckpointStore
from streams.tail_cache import TailCache
from tests.unit.test_processor_rules import TENANT, Harness, conv_id, turn

TURNS = 6


class CountingStore(MemoryCheckpointStore):
    """The memory store, counting full history reads and judgements, and whose one-row
    head read may lag (``stale``: the head it answers instead, as a replica that missed
    a promotion still in flight would)."""

    def __init__(self, options) -> None:
        super().__init__(options)
        self.history_reads = 0
        self.judged = 0
        self.stale = None

    def read_history(self, *args, **kwargs):
        self.history_reads += 1
        return super().read_history(*args, **kwargs)

    def read_head(self, tenant_id, partition_key):
        if self.stale is not None:
            return self.stale
        return super().read_head(tenant_id, partition_key)

    def judge(self, request):
        self.judged += 1
        return super().judge(request)


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.store = CountingStore(harness.store.options)
    harness.rewire(store=harness.store)
    return harness


def promoted(h: Harness, turns: int = TURNS) -> tuple[str, list]:
    """A Conversation of ``turns`` turns, then a cold processor (no tail cache: every
    turn's lineage is looked up in the store)."""
    conv = conv_id()
    events = []
    for head in range(turns):
        call_id = f"call_{head}"
        event = turn(conv, head, items=[
            function_call(call_id, "lookup", {}, item_id=new_id("fc")),
            function_call_output(call_id, "{}", item_id=new_id("fco")),
            message("ok", role="assistant", item_id=new_id("msg"))])
        assert h.outcome(event).seq == head + 1
        events.append(event)
    h.rewire(store=h.store, tails=TailCache(capacity=0))
    h.store.history_reads = h.store.judged = 0
    return conv, events


@pytest.mark.parametrize("expected", [0, 1, TURNS - 1])
def test_a_stale_turn_is_conflict_without_reading_the_history(h, expected):
    conv, _ = promoted(h)
    out = h.outcome(turn(conv, expected))
    assert (out.reason, out.head_seq) == (R.CONFLICT, TURNS)
    assert h.store.history_reads == 0
    # Expecting 0 is a new Conversation's first turn, taken from the turn alone: the
    # write itself answers it (nothing read either).
    assert h.store.judged >= (1 if expected else 0)


def test_a_turn_beyond_the_head_is_out_of_order_without_reading_the_history(h):
    conv, _ = promoted(h)
    out = h.outcome(turn(conv, TURNS + 3))
    assert (out.reason, out.head_seq) == (R.OUT_OF_ORDER, TURNS)
    assert h.store.history_reads == 0


def test_a_turn_on_a_conversation_never_begun_is_out_of_order_unread(h):
    out = h.outcome(turn(conv_id(), 2))
    assert (out.reason, out.head_seq) == (R.OUT_OF_ORDER, 0)
    assert h.store.history_reads == 0


def test_a_turn_at_the_head_still_reads_its_lineage_and_promotes(h):
    conv, _ = promoted(h)
    assert h.outcome(turn(conv, TURNS)).seq == TURNS + 1
    assert h.store.history_reads == 1
    assert h.store.judged == 0


def test_a_redelivered_promoted_turn_gets_its_promotion_again(h):
    conv, events = promoted(h)
    out = h.outcome(events[1])  # expected head 1, the head is 6: the store's answer
    assert (out.response_id, out.seq) == (events[1].response_id, 2)
    assert h.store.history_reads == 0


def test_a_retry_under_another_response_id_is_duplicate(h):
    conv, events = promoted(h)
    retry = events[2].model_copy(update={"response_id": new_id("resp"),
                                         "event_id": new_id("evt"), "attempt": 2})
    out = h.outcome(retry)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, events[2].response_id)


def test_a_reused_idempotency_key_is_key_reused(h):
    conv, events = promoted(h)
    reuse = turn(conv, 1, idempotency_key=events[3].idempotency_key,
                 request_digest=hashlib.sha256(b"another request").hexdigest())
    assert h.outcome(reuse).reason is R.IDEMPOTENCY_KEY_REUSED


def test_a_response_id_of_this_conversation_is_conflict_whatever_the_head(h):
    conv, events = promoted(h)
    out = h.outcome(turn(conv, TURNS + 2, response_id=events[0].response_id))
    assert out.reason is R.CONFLICT


def test_an_invalid_stale_turn_gets_its_own_reason_first(h):
    conv, _ = promoted(h)
    assert h.outcome(turn(conv, 1, status="failed")).reason is R.NOT_PROMOTABLE_STATUS


def test_pairing_is_not_checked_off_the_head(h):
    """Its items could only be paired against a history it does not continue."""
    conv, _ = promoted(h)
    unpaired = [function_call_output("call_never_made", "{}", item_id=new_id("fco"))]
    out = h.outcome(turn(conv, 2, items=unpaired))
    assert (out.reason, out.head_seq) == (R.CONFLICT, TURNS)


def test_a_lagging_head_read_never_answers_out_of_order(h):
    """The one-row read is at read consistency: it may miss a promotion in flight. The
    store's SERIAL answer finds the expected head, and the turn is read and promoted."""
    conv, _ = promoted(h)
    lagging = h.store.head(TENANT, conv)
    h.outcome(turn(conv, TURNS))  # promoted: the head read below still says TURNS
    h.store.stale, h.store.history_reads, h.store.judged = lagging, 0, 0
    assert h.outcome(turn(conv, TURNS + 1)).seq == TURNS + 2
    assert h.store.judged == 1
    assert h.store.history_reads == 1
    assert h.store.head(TENANT, conv).seq == TURNS + 2


@pytest.mark.parametrize("begun", [True, False], ids=["existing", "new"])
def test_a_negative_expected_head_is_corrupt_not_a_dead_letter(h, begun):
    """Found by an outside review (a gateway in Node, from the docs): the store's own
    refusal of the request (``InvalidPromotion``) escaped the judgement, and the record
    was dead-lettered ``UNKNOWN`` where gateway-protocol.md section 6 says ``CORRUPT``."""
    conv = promoted(h)[0] if begun else conv_id()
    out = h.outcome(turn(conv, -1))
    assert out.reason is R.CORRUPT
