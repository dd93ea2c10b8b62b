"""``PromotionProcessor.handle_async``: the common promotion runs on the event loop, and
everything else is handed to ``handle`` (the thread path) whole.

The races between workers run through both entry points in
``tests/contract/test_processor_races.py``; here: which turns take which path, and that
the loop path's outcomes and writes are the thread path's.
"""

from __future__ import annotations

import asyncio
import pickle

from ratchet.samples import TENANT, make_tool_loop_turn
from schemas.models import RejectionReason, TurnStatus
from services.cassandra_loop import WrongLoop
from services.ledger.base import LedgerUnavailable
from streams import loop_promotion
from streams.processor import Handled, PromotionProcessor
from streams.records import RawRecord
from tests.unit.test_processor_rules import (
    TOPICS,
    Harness,
    PickleCodec,
    chain_turn,
    conv_id,
    turn,
)

R = RejectionReason


class LoopHarness(Harness):
    """Feeds events through ``handle_async``; counts the hand-overs to the thread path."""

    def __init__(self, codec=None) -> None:
        super().__init__()
        if codec is not None:
            self.processor = PromotionProcessor(self.store, self.ledger, codec, TOPICS,
                                                clock_ms=self.processor.clock_ms)
        self.handed_over = 0

    def handle(self, event) -> Handled:
        async def in_thread(handle):
            self.handed_over += 1
            return handle()

        return asyncio.run(self.processor.handle_async(self.record(event), in_thread))

    def outcome(self, event):
        return self.handle(event).outbound[0].model


def test_conversation_and_chain_turns_promote_on_the_loop():
    h = LoopHarness()
    conv = conv_id()
    assert [h.outcome(turn(conv, head)).seq for head in range(3)] == [1, 2, 3]
    root = chain_turn(None, None)
    child = chain_turn(root.response_id, root.response_id)
    assert h.outcome(root).seq == 1 and h.outcome(child).seq == 2
    # a chain's first response claims its request too: the thread path (store.promote)
    assert (h.processor.loop_promotions, h.handed_over) == (4, 1)
    assert h.store.head(TENANT, conv).seq == 3
    # the owners the thread path writes: a Conversation's, a chain's response ids
    assert h.ledger.conversation_owner(conv) == TENANT
    assert h.ledger.response_owner(child.response_id) == TENANT


def test_what_the_loop_does_not_decide_goes_to_the_thread_path_whole():
    h = LoopHarness()
    conv = conv_id()
    final, effects = make_tool_loop_turn(rounds=1, conversation_id=conv)
    for effect in effects:
        assert h.handle(effect).outbound == ()  # effects: the thread path
    assert h.outcome(final).seq == 1  # a turn that uses effects reads them
    assert h.outcome(turn(conv, 0)).reason is R.CONFLICT  # a rejection is recorded there
    failed = turn(conv, 1, status=TurnStatus.FAILED)
    assert h.outcome(failed).reason is R.NOT_PROMOTABLE_STATUS
    assert h.processor.loop_promotions == 0
    assert h.handed_over == len(effects) + 3


def test_a_claim_held_by_another_request_is_decided_on_the_thread_path():
    h = LoopHarness()
    first = turn(conv_id(), 0)
    assert h.outcome(first).seq == 1
    reused = turn(conv_id(), 0, response_id=first.response_id)
    assert h.outcome(reused).reason is R.CONFLICT
    assert (h.processor.loop_promotions, h.handed_over) == (1, 1)


def test_a_redelivered_promotion_is_republished_as_it_was():
    h = LoopHarness()
    t = turn(conv_id(), 0)
    first, again = h.outcome(t), h.outcome(t)
    assert again == first  # the stored checkpoint's outcome, promoted once
    assert h.store.head(TENANT, t.conversation_id).seq == 1
    # the loop's batch was refused (the head moved); the thread path found the promotion
    assert (h.processor.loop_promotions, h.handed_over) == (1, 1)


def test_a_large_record_is_promoted_on_the_thread_path(monkeypatch):
    """Decoding and validating a large turn would hold up every other lane."""
    monkeypatch.setattr(loop_promotion, "LOOP_MAX_RECORD_BYTES", 100)
    h = LoopHarness()
    assert h.outcome(turn(conv_id(), 0)).seq == 1
    assert (h.processor.loop_promotions, h.handed_over) == (0, 1)


class RegistryBound(PickleCodec):
    """A codec that would have to ask a registry for every record."""

    def decodes_offline(self, record: RawRecord) -> bool:
        return False


def test_a_record_the_codec_cannot_decode_offline_goes_to_the_thread_path():
    h = LoopHarness(codec=RegistryBound())
    assert h.outcome(turn(conv_id(), 0)).seq == 1
    assert (h.processor.loop_promotions, h.handed_over) == (0, 1)


def test_an_undecodable_record_is_dead_lettered_by_the_thread_path():
    h = LoopHarness()
    record = RawRecord(TOPICS.gateway_events, 0, 1, b"k", b"\x00not a pickle")

    async def in_thread(handle):
        h.handed_over += 1
        return handle()

    handled = asyncio.run(h.processor.handle_async(record, in_thread))
    assert handled.kind == "dead_lettered" and h.handed_over == 1
    assert pickle.loads(pickle.dumps(handled.outbound[0].model)).value == record.value


def test_any_failure_on_the_loop_hands_the_record_to_the_thread_path():
    """A request of the loop path that fails in any way (the ledger unavailable, the C++
    driver's session serving another loop, a bug of the loop path) gives the record to
    ``handle`` whole: ``handle_async``'s docstring, services/cassandra_loop.py. A mutation
    review (session 45): handing over only ``StoreUnavailable`` passed every test (a
    ``TypeError`` of the awaited claim, fixed that session, reached exactly this)."""
    h = LoopHarness()

    async def ledger_down(conversation_id):
        raise LedgerUnavailable("injected")

    async def another_loop(claim):
        raise WrongLoop("injected")

    async def broken(claim):
        raise TypeError("injected")

    for patch in ((h.ledger, "conversation_owner_async", ledger_down),
                  (h.store, "claim_async", another_loop), (h.store, "claim_async", broken)):
        h.handed_over = 0
        setattr(*patch)
        conv = conv_id()
        assert h.outcome(turn(conv, 0)).seq == 1
        assert h.handed_over == 1
        assert h.store.head(TENANT, conv).seq == 1
        delattr(patch[0], patch[1])
    assert h.processor.loop_promotions == 0


def test_a_claim_that_failed_beside_another_failure_is_not_logged_as_never_retrieved(caplog):
    """The claim runs as a task beside the owner's read. When both fail (Cassandra
    down: the store and the ledger alike), the read's error hands the record to the
    thread path; the claim's error is retrieved there too, not left for the task's
    finalizer to log ``Task exception was never retrieved`` with a traceback on
    every such turn (a review, session 47)."""
    import gc
    import logging

    from services.store.errors import StoreUnavailable

    h = LoopHarness()
    claim_failed = None

    async def claim_down(claim):
        claim_failed.set()
        raise StoreUnavailable("injected", retryable=True)

    async def ledger_down(conversation_id):
        nonlocal claim_failed
        await claim_failed.wait()  # the claim's task has run and failed
        raise LedgerUnavailable("injected")

    async def run(record, in_thread):
        nonlocal claim_failed
        claim_failed = asyncio.Event()
        return await h.processor.handle_async(record, in_thread)

    async def in_thread(handle):
        h.handed_over += 1
        return handle()

    h.store.claim_async, h.ledger.conversation_owner_async = claim_down, ledger_down
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        handled = asyncio.run(run(h.record(turn(conv_id(), 0)), in_thread))
        gc.collect()
    assert handled.outbound[0].model.seq == 1 and h.handed_over == 1
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_loop_promotion_observes_its_validation_and_write_times():
    """Each turn promoted on the loop is one observation of the validation and of the
    promotion write histograms (timed by hand there since session 46, not by their
    ``time()`` context managers)."""
    from streams import metrics

    def counts():
        return tuple(next(s.value for s in histogram.collect()[0].samples
                          if s.name.endswith("_count"))
                     for histogram in (metrics.VALIDATION_SECONDS, metrics.LWT_SECONDS))

    h = LoopHarness()
    conv = conv_id()
    before = counts()
    assert [h.outcome(turn(conv, head)).seq for head in range(3)] == [1, 2, 3]
    assert h.processor.loop_promotions == 3 and h.handed_over == 0
    assert tuple(after - was for after, was in zip(counts(), before, strict=True)) == (3, 3)


def test_each_event_counts_once_under_its_path():
    """``ratchet_worker_events_total{path}``: one per event, ``loop`` for a promotion on
    the loop, ``thread`` for one handed over (the children are held since session 47,
    not looked up by label per event)."""
    from streams import metrics

    def counts():
        return tuple(metrics.EVENTS_BY_PATH.labels(path)._value.get()
                     for path in ("loop", "thread"))

    h = LoopHarness()
    conv = conv_id()
    before = counts()
    assert [h.outcome(turn(conv, head)).seq for head in range(2)] == [1, 2]
    assert h.outcome(chain_turn(None, None)).seq == 1  # a chain's first: the thread path
    assert tuple(after - was for after, was in zip(counts(), before, strict=True)) == (2, 1)
    again = LoopHarness()  # another processor counts into the same children
    assert again.outcome(turn(conv_id(), 0)).seq == 1
    assert tuple(after - was for after, was in zip(counts(), before, strict=True)) == (3, 1)
