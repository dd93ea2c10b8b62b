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
from dataclasses import replace

import pytest

from ratchet.domain.history import Head
from ratchet.domain.promotion import promotion_request
from ratchet.samples import new_id, tampered
from schemas.items import function_call, function_call_output, message
from schemas.models import Certification
from schemas.models import RejectionReason as R
from services.store.base import StoreOptions, turn_size
from services.store.memory import MemoryCheckpointStore
from streams.tail_cache import TailCache
from tests.unit.test_processor_rules import TENANT, Harness, conv_id, turn

TURNS = 6


class CountingStore(MemoryCheckpointStore):
    """The memory store, counting full history reads and judgements, and whose one-row
    head read may lag: its next ``lags`` reads answer ``lagging`` instead, as a replica
    that missed a promotion still in flight would."""

    def __init__(self, options) -> None:
        super().__init__(options)
        self.history_reads = 0
        self.judged = 0
        self.lagging = None
        self.lags = 0

    def read_history(self, *args, **kwargs):
        self.history_reads += 1
        return super().read_history(*args, **kwargs)

    def read_head(self, tenant_id, partition_key):
        if self.lags:
            self.lags -= 1
            return self.lagging
        return super().read_head(tenant_id, partition_key)

    def judge(self, request, head_guess=None):
        self.judged += 1
        return super().judge(request, head_guess)


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
    h.store.lagging, h.store.lags, h.store.history_reads, h.store.judged = lagging, 1, 0, 0
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


# --- a second outside review of this change (session 32) ---------------------------


def _lagging_harness(lags: int) -> tuple[Harness, str]:
    h = Harness()
    h.store = CountingStore(h.store.options)
    h.rewire(store=h.store)
    conv, _ = promoted(h)
    partition = h.store._partitions[(TENANT, conv)]
    h.store.lagging = Head.of(next(c for c in partition.checkpoints.values()
                                   if c.seq == TURNS - 1))
    h.store.lags = lags
    return h, conv


def _repeats_call_0() -> list:
    """Fine on their own; ``call_0`` is in the Conversation already: unpaired there."""
    return [function_call("call_0", "lookup", {}, item_id=new_id("fc")),
            function_call_output("call_0", "{}", item_id=new_id("fco")),
            message("ok", role="assistant", item_id=new_id("msg"))]


def test_a_lagging_head_read_never_skips_the_pairing_of_a_turn_at_the_head():
    """At the head, unpaired there, and listing an effect never recorded: section 7's
    order says ``UNPAIRED_TOOL_CALL``. A head read that lagged once sent it off the
    head, whose rules skip pairing: ``MISSING_TOOL_EFFECT`` was recorded. An off-head
    rejection now rests on a SERIAL head read too."""
    h, conv = _lagging_harness(lags=1)
    out = h.outcome(turn(conv, TURNS, items=_repeats_call_0(),
                         tool_effect_ids=("eff_never_recorded",)))
    assert out.reason is R.UNPAIRED_TOOL_CALL, out.detail


def test_two_lagging_head_reads_never_skip_it_either():
    """A rejection decided without the facts is decided again from fresh reads: two
    lagging reads in a row, and a boundary proof that fails (checked after pairing)."""
    h, conv = _lagging_harness(lags=2)
    event = turn(conv, TURNS, items=_repeats_call_0())
    event = event.model_copy(update={"boundary_proof": event.boundary_proof.model_copy(
        update={"combined_count": 999, "prefix_count": 919})})
    out = h.outcome(event)
    assert out.reason is R.UNPAIRED_TOOL_CALL, out.detail


def _damage_head(h: Harness, conv: str, lost: bool = False) -> None:
    partition = h.store._partitions[(TENANT, conv)]
    partition.head = None if lost else replace(partition.head, lineage_digest="0" * 64)


@pytest.mark.parametrize("expected", [0, 2])
def test_a_stale_turn_on_head_cells_no_row_backs_is_ordered_against_them(h, expected):
    """docs/gateway-protocol.md section 7: a lineage that cannot be read is ``CORRUPT``
    unless the turn is ``CONFLICT`` / ``OUT_OF_ORDER`` against the head; the first draft
    answered ``CORRUPT`` (the store's planner checks the head's damage first). Pairing
    that fails only against a stored history: the same answer whatever the expected
    head."""
    conv, _ = promoted(h)
    _damage_head(h, conv)
    unpaired = [function_call_output("call_nowhere", "{}", item_id=new_id("fco"))]
    out = h.outcome(turn(conv, expected, items=unpaired))
    assert (out.reason, out.head_seq) == (R.CONFLICT, TURNS)


def test_a_turn_on_a_lost_head_is_out_of_order_against_no_head(h):
    conv, _ = promoted(h)
    _damage_head(h, conv, lost=True)
    out = h.outcome(turn(conv, 2))
    assert (out.reason, out.head_seq) == (R.OUT_OF_ORDER, 0)


def test_the_size_rule_counts_the_artifact_of_a_stale_certified_turn():
    """A certified turn over the limit only with its artifact, receipt and proof is
    ``UNSUPPORTED_FORMAT`` wherever it is sent; the first draft judged it as logical_only
    (smaller) and answered ``CONFLICT``."""
    probe = turn(conv_id(), 1, router_receipt=None)
    full = turn_size(promotion_request(probe, Certification.CERTIFIED, True))
    bare = turn_size(promotion_request(probe, Certification.LOGICAL_ONLY, False))
    assert full > bare
    h = Harness()
    h.store = MemoryCheckpointStore(StoreOptions(max_turn_bytes=(full + bare) // 2))
    h.rewire(store=h.store)
    conv = conv_id()
    small = [message("k", role="assistant", item_id=new_id("msg"))]
    for head in range(3):
        assert h.outcome(turn(conv, head, items=small, certified=False)).seq == head + 1
    h.rewire(store=h.store, tails=TailCache(capacity=0))
    stale = turn(conv, 1, items=probe.output_items, input_items=probe.input_items)
    assert h.outcome(stale).reason is R.UNSUPPORTED_FORMAT


def test_a_rejected_turn_binds_its_response_id_on_the_memory_store_too():
    """docs/gateway-protocol.md section 7: a rejected turn still binds its response id.
    Cassandra sends the claim when the worker starts on the turn; the memory store
    claimed only when the waiter was called (a promotion), so the unit suites could not
    see a binding regress (an outside review, session 32)."""
    h = Harness()
    rid = new_id("resp")
    bad = turn(conv_id(), 0, response_id=rid,
               items=[tampered(message("hi", role="assistant", item_id=new_id("msg")))])
    assert h.outcome(bad).reason is R.CORRUPT
    other = turn(conv_id(), 0, response_id=rid)  # another request, another Conversation
    assert h.outcome(other).reason is R.CONFLICT


# --- a third outside review (session 32) ----------------------------------------------


def _bad_proof(event):
    return event.model_copy(update={"boundary_proof": event.boundary_proof.model_copy(
        update={"combined_count": 999, "prefix_count": 919})})


def _unpaired() -> list:
    return [function_call_output("call_nowhere", "{}", item_id=new_id("fco")),
            message("ok", role="assistant", item_id=new_id("msg"))]


@pytest.mark.parametrize("expected", [0, 2])
def test_a_stale_turn_gets_its_later_checks_whatever_head_it_expected(h, expected):
    """Section 7: a turn that does not extend the head, 0 included, is not judged by a
    pairing; its other checks stand in their order. Expecting 0 went through the
    pairing against an empty history and then to the ordering answer (``CONFLICT``),
    expecting 2 to its boundary proof's reason."""
    conv, _ = promoted(h)
    out = h.outcome(_bad_proof(turn(conv, expected, items=_unpaired())))
    assert out.reason is R.INVALID_BOUNDARY_PROOF, out.detail
    out = h.outcome(turn(conv, expected, items=_unpaired(),
                         tool_effect_ids=("eff_never_recorded",)))
    assert out.reason is R.MISSING_TOOL_EFFECT, out.detail


def test_a_stale_retry_on_a_damaged_idempotency_record_is_corrupt(h):
    """Damage of an answer that comes before ordering (the request's idempotency record
    names a checkpoint that is gone) is ``CORRUPT`` off the head too, as at the head;
    only the head's own damage is ordered against its cells."""
    conv, events = promoted(h)
    original = events[2]
    partition = h.store._partitions[(TENANT, conv)]
    record = partition.idempotency[original.idempotency_key]
    partition.idempotency[original.idempotency_key] = replace(record, response_id="resp_gone")
    retry = original.model_copy(update={"event_id": new_id("evt"), "attempt": 2,
                                        "response_id": new_id("resp")})
    assert h.outcome(retry).reason is R.CORRUPT


@pytest.mark.parametrize("expected", [2, TURNS], ids=["stale", "at-head"])
def test_a_retry_with_a_bad_boundary_proof_is_refused_for_it_anywhere(h, expected):
    """A retry under another response id repeating its original's calls was
    ``DUPLICATE`` at the head whatever its later checks said; they come before the
    write's answer (section 7)."""
    _, events = promoted(h)
    original = events[3]
    retry = _bad_proof(original.model_copy(update={
        "event_id": new_id("evt"), "attempt": 2, "response_id": new_id("resp"),
        "expected_head_seq": expected}))
    assert h.outcome(retry).reason is R.INVALID_BOUNDARY_PROOF


@pytest.mark.parametrize("items", ["valid", "unpaired"])
def test_a_first_turn_on_a_damaged_head_is_ordered_against_it(h, items):
    """Expecting head 0 (taken for a new Conversation from the turn alone) on a
    Conversation whose head cells no row backs: ``CONFLICT`` against the cells, whether
    the write found the damage (valid items: it was ``CORRUPT``) or pairing sent the
    turn to the ordering rule (unpaired items), as for any other stale head."""
    conv, _ = promoted(h)
    _damage_head(h, conv)
    kwargs = {} if items == "valid" else {"items": _unpaired()}
    out = h.outcome(turn(conv, 0, **kwargs))
    assert (out.reason, out.head_seq) == (R.CONFLICT, TURNS)


def test_a_turn_at_a_damaged_head_is_corrupt(h):
    conv, _ = promoted(h)
    _damage_head(h, conv)
    assert h.outcome(turn(conv, TURNS)).reason is R.CORRUPT
