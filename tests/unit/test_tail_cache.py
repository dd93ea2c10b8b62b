"""The processor's tail cache (``streams/tail_cache.py``): reads it saves, and why a
stale or wrong entry never changes an outcome.

"Another worker" is simulated by promoting straight through the store, behind the
processor's back, so its cache still describes the old head.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ratchet.domain.history import PromotionMode
from ratchet.domain.plan import LineageChanged, Promoted
from ratchet.domain.promotion import promotion_request
from ratchet.domain.validation import EMPTY_PAIRING, PairingState
from ratchet.samples import NOW_MS, TENANT, new_id
from schemas.items import function_call, function_call_output, message
from schemas.models import Certification, RejectionReason
from services.ledger.base import ResponseState
from services.ledger.memory import MemoryLedger
from services.store.base import ANY_LINEAGE, StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from streams.tail_cache import ID_OVERHEAD, WEIGHT_CHARS, Tail, TailCache, tail_weight
from tests.unit.test_processor_rules import TOPICS, Harness, PickleCodec, chain_turn, conv_id, turn

R = RejectionReason


class CountingStore(MemoryCheckpointStore):
    def __init__(self) -> None:
        super().__init__(StoreOptions())
        self.history_reads = 0

    def read_history(self, *args, **kwargs):
        self.history_reads += 1
        return super().read_history(*args, **kwargs)


class CountingLedger(MemoryLedger):
    def __init__(self) -> None:
        super().__init__()
        self.owner_reads = 0

    def conversation_owner(self, conversation_id):
        self.owner_reads += 1
        return super().conversation_owner(conversation_id)


def harness(tails: TailCache | None = None) -> Harness:
    h = Harness()
    h.store, h.ledger = CountingStore(), CountingLedger()
    h.processor = PromotionProcessor(h.store, h.ledger, PickleCodec(), TOPICS,
                                     clock_ms=lambda: NOW_MS, tails=tails)
    return h


def msg(text: str = "ok", role: str = "assistant"):
    return message(text, role=role, item_id=new_id("msg"))


def promote_behind_the_back(h: Harness, event) -> None:
    """Another promoter (a second worker) moves the partition; our cache is not told."""
    outcome = h.store.promote(promotion_request(event, Certification.CERTIFIED))
    assert isinstance(outcome, Promoted), outcome


# --- what it saves ---------------------------------------------------------------------


@pytest.mark.parametrize("capacity, history_reads, owner_reads", [(10_000, 0, 1), (0, 2, 3)])
def test_later_turns_of_a_conversation_read_neither_history_nor_owner(
        capacity, history_reads, owner_reads):
    h = harness(TailCache(capacity=capacity))
    conv = conv_id()
    assert [h.outcome(turn(conv, head)).seq for head in range(3)] == [1, 2, 3]
    assert h.store.history_reads == history_reads
    assert h.ledger.owner_reads == owner_reads


def test_chain_children_read_no_history():
    h = harness()
    root = chain_turn(None, None)
    assert h.outcome(root).seq == 1
    child = chain_turn(root.response_id, root.response_id)
    fork = chain_turn(root.response_id, root.response_id)
    grandchild = chain_turn(root.response_id, child.response_id)
    assert [h.outcome(t).seq for t in (child, fork, grandchild)] == [2, 2, 3]
    assert h.store.history_reads == 0


def test_pairing_across_turns_still_checked_from_the_cache():
    h = harness()
    conv = conv_id()
    call = function_call("c_once", "lookup", {}, item_id=new_id("fc"))
    answer = function_call_output("c_once", "{}", item_id=new_id("fco"))
    assert h.outcome(turn(conv, 0, items=[call, answer, msg()])).seq == 1
    again = function_call("c_once", "lookup", {}, item_id=new_id("fc"))
    out = h.outcome(turn(conv, 1, items=[again]))
    assert out.reason is R.UNPAIRED_TOOL_CALL
    # ... and the rejection was confirmed from a fresh read before it was recorded
    assert h.processor.cache_rechecks == 1 and h.store.history_reads == 1


# --- stale entries ----------------------------------------------------------------------


def test_head_moved_behind_the_cache_gives_the_fresh_verdict_not_the_cached_one():
    h = harness()
    conv = conv_id()
    call = function_call("c_client", "lookup", {}, item_id=new_id("fc"))
    assert h.outcome(turn(conv, 0, items=[call])).seq == 1  # cache: head 1, c_client open
    answer = function_call_output("c_client", "{}", item_id=new_id("fco"))
    promote_behind_the_back(h, turn(conv, 1, input_items=[answer], items=[msg()]))
    # Decided on the cached head 1 this turn is UNPAIRED (c_client unanswered before a
    # message); on the real state (head 2, c_client answered) it is a CONFLICT.
    stale = turn(conv, 1, input_items=[msg("hi", role="user")])
    out = h.outcome(stale)
    assert out.reason is R.CONFLICT and out.head_seq == 2
    assert h.processor.cache_rechecks == 1
    assert h.ledger.status(TENANT, stale.response_id).reason == R.CONFLICT.value
    # the recheck's read taught the cache the real head: the next turns read nothing
    assert h.outcome(turn(conv, 2)).seq == 3
    assert h.outcome(turn(conv, 3)).seq == 4
    assert h.store.history_reads == 1


def test_a_wrong_entry_never_makes_a_wrong_rejection():
    h = harness()
    conv = conv_id()
    first = h.outcome(turn(conv, 0))
    cp = h.store.get_checkpoint(TENANT, first.response_id)
    # A (buggy) entry claiming the head has an unanswered call: a plain message after
    # it would be UNPAIRED_TOOL_CALL if the cache were believed.
    h.processor.tails.learn(Tail(cp, PairingState(frozenset({"ghost"}), (("ghost", "function_call"),))))
    out = h.outcome(turn(conv, 1))
    assert out.seq == 2
    assert h.processor.cache_rechecks == 1


def test_a_wrong_head_entry_never_makes_a_wrong_promotion():
    h = harness()
    conv = conv_id()
    call = function_call("c_dup", "lookup", {}, item_id=new_id("fc"))
    answer = function_call_output("c_dup", "{}", item_id=new_id("fco"))
    assert h.outcome(turn(conv, 0, items=[call, answer, msg()])).seq == 1
    real = h.store.head(TENANT, conv)
    cp = h.store.get_checkpoint(TENANT, real.response_id)
    # The cache believes another response is at seq 1, with a lineage without c_dup:
    # reusing c_dup looks fine to it. The store must not promote the turn on top of the
    # real head, whose lineage it was never checked against.
    h.processor.tails.learn(Tail(replace(cp, response_id="resp_bogus"), EMPTY_PAIRING))
    again = function_call("c_dup", "lookup", {}, item_id=new_id("fc"))
    reuse = turn(conv, 1, items=[again])
    out = h.outcome(reuse)
    assert out.reason is R.UNPAIRED_TOOL_CALL
    assert h.store.head(TENANT, conv).seq == 1
    assert h.store.get_checkpoint(TENANT, reuse.response_id) is None


def test_expired_entries_are_not_used():
    h = harness()
    conv = conv_id()
    first = h.outcome(turn(conv, 0))
    cp = h.store.get_checkpoint(TENANT, first.response_id)
    from datetime import UTC, datetime
    expired = replace(cp, logical_expires_at=datetime.fromtimestamp(NOW_MS / 1000 - 1, UTC))
    h.processor.tails.learn(Tail(expired, EMPTY_PAIRING))
    assert h.outcome(turn(conv, 1)).seq == 2
    assert h.store.history_reads == 1


# --- the store's ``extends`` guard (both paths rely on it) ---------------------------------


def test_store_refuses_a_plan_on_another_lineage_than_the_caller_checked():
    store = MemoryCheckpointStore(StoreOptions())
    conv = conv_id()
    first = turn(conv, 0)
    assert isinstance(store.promote(promotion_request(first, Certification.CERTIFIED)),
                      Promoted)
    second = promotion_request(turn(conv, 1), Certification.CERTIFIED)
    assert store.promote(second, extends="resp_other") == LineageChanged(first.response_id)
    assert store.head(TENANT, conv).seq == 1
    assert isinstance(store.promote(second, extends=first.response_id), Promoted)
    third = promotion_request(turn(conv, 2), Certification.CERTIFIED)
    assert isinstance(store.promote(third, extends=ANY_LINEAGE), Promoted)


# --- the corrupt partition ----------------------------------------------------------------


def test_corrupt_partition_is_a_recorded_corrupt_rejection_not_a_dead_letter():
    h = harness()
    conv = conv_id()
    original = turn(conv, 0)
    assert h.outcome(original).seq == 1
    # Damage: the idempotency record survives, the checkpoint it points at is gone.
    partition = h.store._partitions[(TENANT, conv)]
    del partition.checkpoints[original.response_id]
    # A retried attempt of the same request (same key and digest) must decide on it.
    retry = original.model_copy(update={"event_id": new_id("evt"), "attempt": 2,
                                        "response_id": new_id("resp")})
    handled = h.processor.handle(h.record(retry))
    assert handled.kind == "rejected"
    out = handled.outbound[0].model
    assert out.reason is R.CORRUPT and "corrupt" in out.detail
    status = h.ledger.status(TENANT, retry.response_id)
    assert status.status is ResponseState.REJECTED and status.reason == R.CORRUPT.value
    decision = h.ledger.decision(retry.event_id, tenant_id=TENANT,
                                 idempotency_key=retry.idempotency_key)
    assert decision is not None and decision.reason == R.CORRUPT.value


# --- bounds ---------------------------------------------------------------------------------


def test_the_cache_is_bounded():
    h = harness(TailCache(capacity=5))
    for _ in range(20):
        conv = conv_id()
        h.outcome(turn(conv, 0))
        h.outcome(turn(conv, 1))
    tails = h.processor.tails
    assert len(tails) <= 15  # 5 tails + 5 heads + 5 owners


def test_lineages_with_many_call_ids_are_cached_and_weighed():
    """A long agent loop's pairing state holds every call id of its history: cached
    all the same (until session 35 a lineage of more than 256 call ids was not, and
    every later turn read the whole history), weighing more the more ids it holds."""
    h = harness()
    conv = conv_id()
    items = []
    for n in range(600):
        items += [function_call(f"c{n}", "lookup", {}, item_id=new_id("fc")),
                  function_call_output(f"c{n}", "{}", item_id=new_id("fco"))]
    assert h.outcome(turn(conv, 0, items=[*items, msg()])).seq == 1
    reads = h.store.history_reads
    for head in range(1, 4):
        assert h.outcome(turn(conv, head)).seq == head + 1
    assert h.store.history_reads == reads  # each decided from the cached tail
    [tail] = [h.processor.tails.head_at(TENANT, conv, 4)]
    assert tail is not None and len(tail.pairing.call_ids) == 600
    assert tail_weight(tail) == 1 + (sum(map(len, tail.pairing.call_ids))
                                     + ID_OVERHEAD * 600) // WEIGHT_CHARS > 1


def test_tails_are_weighed_by_the_size_of_their_ids():
    """A gateway's call ids have no length limit: counted by entries alone, 100 tails
    with a 4 MB open call id held 400 MB (an outside review, session 34). Weighed, the
    cache keeps ids of at most ~capacity x WEIGHT_CHARS characters; a tail heavier than
    MAX_TAIL_SHARE of the cache is not kept at all (one emptied the cache, a review of
    session 35), and small tails still fill it by count."""
    h = harness()
    first = h.outcome(turn(conv_id(), 0))
    cp = replace(h.store.get_checkpoint(TENANT, first.response_id), mode=PromotionMode.CHAIN)
    cache = TailCache(capacity=1000)
    for i in range(50):
        cache.learn(Tail(replace(cp, response_id=f"small_{i}"), EMPTY_PAIRING))
    huge = "c" * 4_000_000
    for i in range(20):
        tail = Tail(replace(cp, response_id=f"resp_{i}"),
                    PairingState(frozenset({huge + str(i)}), ((huge + str(i), "function_call"),)))
        assert tail_weight(tail) == 1 + (2 * len(huge + str(i)) + 2 * ID_OVERHEAD) // WEIGHT_CHARS
        assert not cache.learn(tail)
    mid = "m" * 100_000  # ~50 weight: under 1/16 of 1000
    for i in range(40):
        tail = Tail(replace(cp, response_id=f"mid_{i}"),
                    PairingState(frozenset({mid + str(i)}), ((mid + str(i), "function_call"),)))
        assert cache.learn(tail)
        held = [cache.tail(TENANT, cp.partition_key, f"mid_{j}") for j in range(i + 1)]
        assert sum(2 * len(mid) for t in held if t is not None) <= 1000 * WEIGHT_CHARS
    for i in range(50):
        cache.learn(Tail(replace(cp, response_id=f"small_{i}"), EMPTY_PAIRING))
    assert all(cache.tail(TENANT, cp.partition_key, f"small_{i}") for i in range(50))


def test_a_long_agent_loop_keeps_one_tail_and_leaves_the_others():
    """A Conversation's tails are kept as its head only: 300 turns of one loop, each
    tail a little heavier, leave 100 chains' tails cached (before: its last tails filled
    the cache and evicted them, a review of session 35)."""
    h = harness()
    first = h.outcome(turn(conv_id(), 0))
    conversation = h.store.get_checkpoint(TENANT, first.response_id)
    chain = replace(conversation, mode=PromotionMode.CHAIN)
    cache = TailCache(capacity=400)
    for i in range(100):
        assert cache.learn(Tail(replace(chain, response_id=f"chain_{i}"), EMPTY_PAIRING))
    ids: set[str] = set()
    for seq in range(1, 301):
        ids.add(f"call_{seq:06d}" + "x" * 40)
        assert cache.learn(Tail(replace(conversation, seq=seq, response_id=f"r{seq}"),
                                PairingState(frozenset(ids))))
    assert cache.head_at(TENANT, conversation.partition_key, 300) is not None
    assert all(cache.tail(TENANT, chain.partition_key, f"chain_{i}") for i in range(100))


def test_the_effect_ids_a_cached_checkpoint_keeps_are_weighed():
    """One id per effect the turn used: 3 000 of them held 0.28 MB at weight 1."""
    h = harness()
    first = h.outcome(turn(conv_id(), 0))
    cp = h.store.get_checkpoint(TENANT, first.response_id)
    effects = tuple(f"eff_{i:032x}" for i in range(3000))
    tail = Tail(replace(cp, accepted_effect_ids=effects), EMPTY_PAIRING)
    assert tail_weight(tail) == 1 + (sum(map(len, effects)) + ID_OVERHEAD * 3000) // WEIGHT_CHARS
    assert tail_weight(tail) > 80


def test_a_small_cache_still_keeps_small_tails():
    """RATCHET_TAIL_CACHE_ENTRIES below 16 made every tail heavier than 1/16 of it: the
    cache was off without saying so (a review). A tail of weight 1 fits any cache."""
    h = harness()
    first = h.outcome(turn(conv_id(), 0))
    cp = replace(h.store.get_checkpoint(TENANT, first.response_id), mode=PromotionMode.CHAIN)
    cache = TailCache(capacity=4)
    assert cache.learn(Tail(cp, EMPTY_PAIRING))
    assert cache.tail(TENANT, cp.partition_key, cp.response_id) is not None


# --- the head pointer (a mutation review, session 43) -----------------------------------


def test_a_head_is_found_only_at_its_own_seq_and_never_moves_back():
    """The head pointer is used only by a turn that expects exactly its seq (the seq ->
    response mapping is immutable, the head itself is not), and an older response
    learnt later (a redelivery, a slow thread) never replaces a newer head."""
    h = harness()
    conv = conv_id()
    for head in range(3):
        assert h.outcome(turn(conv, head)).seq == head + 1
    cp = h.store.get_checkpoint(TENANT, h.store.head(TENANT, conv).response_id)
    cache = TailCache()
    newer = Tail(cp, EMPTY_PAIRING)
    older = Tail(replace(cp, seq=cp.seq - 1, response_id="resp_older"), EMPTY_PAIRING)
    assert cache.learn(newer)
    assert cache.head_at(TENANT, conv, cp.seq) is newer
    assert cache.head_at(TENANT, conv, cp.seq - 1) is None
    assert cache.head_at(TENANT, conv, cp.seq + 1) is None
    assert cache.learn(older)
    assert cache.head_at(TENANT, conv, cp.seq) is newer
    assert cache.head_at(TENANT, conv, cp.seq - 1) is None


def test_a_tail_expired_by_a_fraction_of_a_second_is_not_used():
    """Expiry is to the millisecond (as a history read judges it): a tail that expired
    300 ms before the processor's clock is a miss, read again."""
    from datetime import UTC, datetime
    now_ms = (NOW_MS // 1000) * 1000 + 500
    h = harness()
    h.processor = PromotionProcessor(h.store, h.ledger, PickleCodec(), TOPICS,
                                     clock_ms=lambda: now_ms)
    conv = conv_id()
    first = h.outcome(turn(conv, 0))
    cp = h.store.get_checkpoint(TENANT, first.response_id)
    expired = replace(cp, logical_expires_at=datetime.fromtimestamp((now_ms - 300) / 1000, UTC))
    h.processor.tails.learn(Tail(expired, EMPTY_PAIRING))
    reads = h.store.history_reads
    assert h.outcome(turn(conv, 1)).seq == 2
    assert h.store.history_reads == reads + 1


def test_each_kind_of_id_weighs_alone():
    """A tail weighs 1 only when it holds no id at all (``_weight_of``'s shortcut):
    ids of any one kind alone (calls, open calls, approval requests, open requests,
    used effects) weigh what the sum over every kind gives."""
    h = harness()
    cp = h.store.get_checkpoint(TENANT, h.outcome(turn(conv_id(), 0)).response_id)
    cp = replace(cp, accepted_effect_ids=())
    big = "i" * 40_000
    assert tail_weight(Tail(cp, EMPTY_PAIRING)) == 1
    alone = [
        Tail(cp, PairingState(call_ids=frozenset({big}))),
        Tail(cp, PairingState(open_calls=((big, "function_call"),))),
        Tail(cp, PairingState(request_ids=frozenset({big}))),
        Tail(cp, PairingState(open_requests=(big,))),
        Tail(replace(cp, accepted_effect_ids=(big,)), EMPTY_PAIRING),
    ]
    for tail in alone:
        assert tail_weight(tail) == 1 + (len(big) + ID_OVERHEAD) // WEIGHT_CHARS > 1
