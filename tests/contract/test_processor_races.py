"""Races between two workers of one partition (the old owner, still running after a
rebalance, and the new one), on both backends: the promotion batch asserts the
request's facts (``mark_request_facts``) instead of reading them, so every fact one
worker records must reach the other's decision or come after its promotion.

Each worker is a ``PromotionProcessor`` with a tail cache and store hints of its own
over the same data (Cassandra: two store objects on one keyspace; memory: one store).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from ratchet.samples import (
    NOW_MS,
    TENANT,
    make_tool_effect,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
)
from schemas.models import (
    Certification,
    CheckpointPromoted,
    EffectOrphaned,
    OrphanReason,
    PromotionRejected,
    RejectionReason,
    TurnStatus,
)
from services.cassandra_loop import LoopSession
from services.ledger.cassandra import CassandraLedger
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from tests.unit.test_processor_rules import TOPICS, PickleCodec, raw_record

R = RejectionReason


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class Worker:
    """``entry``: ``handle`` (the thread path) or ``handle_async`` (the event loop's
    fast path, giving way to ``handle`` for everything else, as the app runs it)."""

    def __init__(self, store, ledger, entry: str = "handle",
                 clock_ms=lambda: NOW_MS) -> None:
        self.store = store
        self.processor = PromotionProcessor(store, ledger, PickleCodec(), TOPICS,
                                            clock_ms=clock_ms)
        self.entry = entry
        self.offset = 0
        self.runner = asyncio.Runner()

    def handle(self, event):
        self.offset += 1
        record = raw_record(event, self.offset)
        if self.entry == "handle":
            return self.processor.handle(record)

        async def in_thread(handle):
            return handle()

        # One loop for the worker's life, as in the app (a LoopSession serves one loop).
        return self.runner.run(self.processor.handle_async(record, in_thread))

    def outcome(self, event):
        return self.handle(event).outbound[0].model

    def feed(self, *events) -> None:
        for event in events:
            assert self.handle(event).outbound == ()


class Interleaving:
    """A store whose next ``promote`` first lets another worker act: the other worker's
    event lands between this worker's decision and its batch."""

    def __init__(self, store) -> None:
        self._store = store
        self.before_promote = None

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _interleave(self) -> None:
        if self.before_promote is not None:
            act, self.before_promote = self.before_promote, None
            act()

    def promote(self, request, **kw):
        self._interleave()
        return self._store.promote(request, **kw)

    async def promote_from_hints_async(self, request, **kw):
        self._interleave()
        return await self._store.promote_from_hints_async(request, **kw)


@pytest.fixture(params=[("memory", "handle"), ("memory", "handle_async"),
                        ("cassandra", "handle"), ("cassandra", "handle_async"),
                        ("cassandra", "handle_async", "acsylla")],
                ids="-".join)
def workers(request, settings):
    """(old owner, new owner) on shared data; the new owner uses the entry point (and,
    with "acsylla", the worker's C++ driver for its requests on the loop)."""
    backend, entry, *driver = request.param
    if backend == "memory":
        store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
        yield Worker(store, ledger), Worker(Interleaving(store), ledger, entry)
        return
    session = request.getfixturevalue("ledger_session")

    def store():
        return CassandraCheckpointStore(session, StoreOptions(), timeout_s=30)

    loop_session = (LoopSession(replace(settings, keyspace=session.keyspace)) if driver
                    else None)
    old = Worker(store(), CassandraLedger(session, timeout_s=30))
    new = Worker(Interleaving(CassandraCheckpointStore(session, StoreOptions(), timeout_s=30,
                                                       loop_session=loop_session)),
                 CassandraLedger(session, timeout_s=30, loop_session=loop_session), entry)
    yield old, new
    if loop_session is not None:
        new.runner.run(loop_session.close())
    new.runner.close()


def turn(conv: str, head: int, **kw):
    kw.setdefault("response_id", uid("resp"))
    kw.setdefault("idempotency_key", uid("idem"))
    return make_turn(conversation_id=conv, expected_head_seq=head, **kw)


def test_cancel_by_the_old_owner_then_completion_by_the_new_one(workers):
    old, new = workers
    conv = uid("conv")
    t = turn(conv, 0)
    old.feed(make_turn_cancelled(t))
    assert new.outcome(t).reason is R.CANCELLED
    assert new.store.head(TENANT, conv) is None
    assert old.outcome(t).reason is R.CANCELLED  # a redelivery on the old owner agrees


def test_completion_by_the_new_owner_then_cancel_by_the_old_one(workers):
    old, new = workers
    conv = uid("conv")
    t = turn(conv, 0)
    assert new.outcome(t).seq == 1
    old.feed(make_turn_cancelled(t))  # came after the promotion: changes nothing
    assert old.outcome(t).seq == 1
    assert new.outcome(t).seq == 1
    assert new.store.head(TENANT, conv).seq == 1


def test_cancel_landing_between_the_decision_and_the_batch(workers):
    old, new = workers
    conv = uid("conv")
    t = turn(conv, 0)
    new.store.before_promote = lambda: old.feed(make_turn_cancelled(t))
    assert new.outcome(t).reason is R.CANCELLED  # the batch was refused, facts read
    assert new.store.head(TENANT, conv) is None
    assert old.outcome(t).reason is R.CANCELLED


def test_effect_recorded_by_the_previous_owner_is_used(workers):
    old, new = workers
    final, effects = make_tool_loop_turn(rounds=2, conversation_id=uid("conv"))
    old.feed(*effects)
    promoted = new.outcome(final)
    assert promoted.seq == 1 and promoted.certification is Certification.CERTIFIED


def test_effect_recorded_by_the_previous_owner_and_unused_is_orphaned(workers):
    old, new = workers
    conv = uid("conv")
    t = turn(conv, 0, attempt=2)  # attempt 2 uses no tool
    stray = make_tool_effect("call_1", idempotency_key=t.idempotency_key,
                             conversation_id=conv, tool_name="send_email")
    old.feed(stray)
    handled = new.handle(t)
    assert handled.outbound[0].model.seq == 1
    orphans = [o.model for o in handled.outbound[1:]]
    assert [(o.effect_id, o.reason) for o in orphans] == [
        (stray.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


def test_effect_landing_between_the_decision_and_the_batch_is_orphaned(workers):
    old, new = workers
    conv = uid("conv")
    t = turn(conv, 0, attempt=2)
    stray = make_tool_effect("call_1", idempotency_key=t.idempotency_key,
                             conversation_id=conv, tool_name="send_email")
    new.store.before_promote = lambda: old.feed(stray)
    handled = new.handle(t)
    assert handled.outbound[0].model.seq == 1
    assert [o.model.effect_id for o in handled.outbound[1:]] == [stray.effect_id]


def test_a_stale_facts_hint_ends_in_the_right_outcome(workers):
    old, new = workers
    final, effects = make_tool_loop_turn(rounds=1, conversation_id=uid("conv"), attempt=2)
    new.feed(*effects)  # the new owner's hint: the mark it wrote itself
    stray = make_tool_effect("call_x", idempotency_key=final.idempotency_key,
                             conversation_id=final.conversation_id, tool_name="send_email")
    old.feed(stray)  # the old owner moved the mark after it
    handled = new.handle(final)
    assert handled.outbound[0].model.seq == 1
    assert [(o.model.effect_id, o.model.reason) for o in handled.outbound[1:]] == [
        (stray.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


def test_a_stale_head_hint_ends_in_the_right_outcome(workers):
    old, new = workers
    conv = uid("conv")
    assert new.outcome(turn(conv, 0)).seq == 1  # the new owner caches head 1
    assert old.outcome(turn(conv, 1)).seq == 2  # the old owner moves the head
    late = new.outcome(turn(conv, 1))
    assert (late.reason, late.head_seq) == (R.CONFLICT, 2)
    assert new.outcome(turn(conv, 2)).seq == 3


def test_a_rejection_by_the_old_owner_never_flips_on_the_new_one(workers):
    old, new = workers
    conv = uid("conv")
    late = turn(conv, 1)
    assert old.outcome(late).reason is R.OUT_OF_ORDER
    assert old.outcome(turn(conv, 0)).seq == 1  # now ``late`` would fit the head
    # the new owner's fast path would promote it: its batch finds the decision's mark
    assert new.outcome(late).reason is R.OUT_OF_ORDER
    assert new.store.head(TENANT, conv).seq == 1


def test_a_turn_with_nothing_recorded_promotes_on_the_loop(workers):
    """The loop path is really taken (with either driver): a fast path that silently gave
    way to the thread path would pass every race above."""
    _, new = workers
    t = turn(uid("conv"), 0)
    assert new.outcome(t).seq == 1
    assert new.processor.loop_promotions == (1 if new.entry == "handle_async" else 0)


def test_unkeyed_retry_never_orphans_effect_the_promotion_used(workers):
    """A rejected continued chain turn without a root never orphans an effect its
    request's promotion used.

    Promise (docs/gateway-protocol.md section 7, "A retry of a promoted request": no
    rejection of an attempt of a promoted request ever orphans an effect the promoted turn
    used; section 6: a continued chain turn without ``chain_root_id`` names no partition to
    look for its request's promotion in, so its rejection orphans nothing). Continuation X1
    of a chain (request K) is promoted using effect E; a retry of K under another response
    id whose event lost its ``chain_root_id`` is PARENT_NOT_PROMOTED and publishes no
    EffectOrphaned for E (found by an outside review: it published TURN_REJECTED).
    """
    _, w = workers  # both backends, both entry points
    root = make_turn(conversation_id=None, chain_root_id=None, expected_head_seq=None)
    assert isinstance(w.outcome(root), CheckpointPromoted)
    key = uid("idem")
    x1, effects = make_tool_loop_turn(rounds=1, conversation_id=None,
                                      chain_root_id=root.response_id,
                                      previous_response_id=root.response_id,
                                      expected_head_seq=None, idempotency_key=key)
    w.feed(*effects)
    assert isinstance(w.outcome(x1), CheckpointPromoted)
    retry = x1.model_copy(update={"event_id": uid("ev"), "attempt": 2, "chain_root_id": None,
                                 "response_id": uid("resp")})
    out = [o.model for o in w.handle(retry).outbound]
    assert isinstance(out[0], PromotionRejected), type(out[0])
    orphaned = {m.effect_id: m.reason for m in out if isinstance(m, EffectOrphaned)}
    used = {e.effect_id for e in effects}
    assert not (set(orphaned) & used), f"live effects of promoted {x1.response_id} orphaned: {orphaned}"


def _first_response_with_effect(key: str, attempt: int = 1):
    """A chain's first response of request ``key`` with one tool round, and its effect."""
    turn, (effect,) = make_tool_loop_turn(rounds=1, conversation_id=None, chain_root_id=None,
                                          expected_head_seq=None, idempotency_key=key,
                                          attempt=attempt)
    return turn, effect


def _no_effect_orphaned_and_used(published, outcome, effect) -> None:
    """R1 promoted using ``effect``: no rejected attempt published it orphaned; R1 not
    promoted (its batch refused or CONFLICT once the request is cancelled): fine."""
    assert any(isinstance(m, PromotionRejected) for m in published), published
    orphaned = {m.effect_id for m in published if isinstance(m, EffectOrphaned)}
    if isinstance(outcome, CheckpointPromoted):
        assert effect.effect_id not in orphaned, "an effect published orphaned and used"
    else:
        assert isinstance(outcome, PromotionRejected), outcome


def test_a_cancelled_retry_never_orphans_what_the_first_attempt_promotes_with(workers):
    """A chain's first response R1 records effect E and is decided with it; before its
    batch, a TurnCancelled keyed to the retry R2 (attempt 2, another partition, its own
    effect) and R2's TurnCompleted are processed by another worker: R2 is CANCELLED.

    Promise (docs/gateway-protocol.md section 7, "The first response of a chain": a
    cancellation ... "after the request's promotion it changes nothing, as everywhere, and
    no rejected attempt orphans an effect the promoted turn used"; section 6: an effect
    the promoted turn uses is never orphaned). R2's rejection settles the request first
    (its claim, or a mark in the holder's partition), so E is never both published
    orphaned and promoted (found by an outside review: it was)."""
    other, first_owner = workers
    key = uid("idem")
    first, effect = _first_response_with_effect(key)
    retry, retry_effect = _first_response_with_effect(key, attempt=2)
    retry = retry.model_copy(update={"request_digest": first.request_digest})
    assert retry.response_id != first.response_id  # two partitions
    assert effect.effect_id not in retry.tool_effect_ids  # the retry ran its own round
    first_owner.feed(effect)
    published = []

    def cancel_and_reject_the_retry():  # after R1 is decided, before its batch
        other.feed(retry_effect, make_turn_cancelled(retry))
        published.extend(o.model for o in other.handle(retry).outbound)

    first_owner.store.before_promote = cancel_and_reject_the_retry
    _no_effect_orphaned_and_used(published, first_owner.outcome(first), effect)


class _BeforeWrite(MemoryCheckpointStore):
    """Runs ``hook`` once just before the next conditional write: after a promoting
    first response has claimed its request, before its batch."""

    hook = None

    def _write(self, request, plan, checkpoint, facts_mark):
        if self.hook is not None:
            act, self.hook = self.hook, None
            act()
        return super()._write(request, plan, checkpoint, facts_mark)


@pytest.mark.parametrize("entry", ["handle", "handle_async"])
def test_a_cancelled_retry_never_orphans_what_the_holder_promotes_with(entry):
    """The same race, later: R1 holds the request's claim and its batch is about to be
    written when R2 is cancelled and rejected; the mark R2's rejection leaves in R1's
    partition refuses that batch (in-memory store: the hook sits inside its write)."""
    store, ledger = _BeforeWrite(StoreOptions()), MemoryLedger()
    first, effect = _first_response_with_effect(uid("idem"))
    retry = first.model_copy(update={"event_id": str(uuid.uuid4()),
                                     "response_id": uid("resp"), "attempt": 2})
    first_owner, other = Worker(store, ledger, entry), Worker(store, ledger)
    first_owner.feed(effect)
    published = []

    def cancel_and_reject_the_retry():
        other.feed(make_turn_cancelled(retry))
        published.extend(o.model for o in other.handle(retry).outbound)

    store.hook = cancel_and_reject_the_retry
    _no_effect_orphaned_and_used(published, first_owner.outcome(first), effect)


def test_a_failed_retry_never_orphans_what_the_first_attempt_promotes_with(workers):
    """A chain's first response R1 records effect E and is decided with it; before its
    batch, its retry R2 (attempt 2, another partition) replays the call with E's id and
    fails: R2 is NOT_PROMOTABLE_STATUS.

    Promise (docs/gateway-protocol.md section 7, "The first response of a chain": no
    rejected attempt orphans an effect the promoted turn used; section 6: an attempt of
    a chain's first response leaves another attempt's effects to that attempt's own
    outcome). R2 orphans only its own attempt's effects, so E is never both published
    orphaned and promoted."""
    other, first_owner = workers
    first, effect = _first_response_with_effect(uid("idem"))
    retry = first.model_copy(update={"event_id": str(uuid.uuid4()),
                                     "response_id": uid("resp"), "attempt": 2,
                                     "status": TurnStatus.FAILED})
    assert effect.effect_id in retry.tool_effect_ids  # the retry replays E's call
    first_owner.feed(effect)
    published = []

    def reject_the_retry():  # after R1 is decided, before its batch
        published.extend(o.model for o in other.handle(retry).outbound)

    first_owner.store.before_promote = reject_the_retry
    outcome = first_owner.outcome(first)
    assert isinstance(outcome, CheckpointPromoted), outcome
    _no_effect_orphaned_and_used(published, outcome, effect)


def test_the_same_turn_promoted_by_the_old_owner_while_the_new_ones_batch_is_pending(workers):
    """A zombie: the old owner, still running, promotes the turn the new owner has
    decided (its batch pending) and the next one too. The new owner's batch, on the
    head it cached, is refused; it must publish the very promotion the old owner
    published (same seq, same outcome id), never a rejection of its own or another
    seq. (An outside review of the worker across rebalances, session 42: held.)"""
    old, new = workers
    conv = uid("conv")
    assert new.outcome(turn(conv, 0)).seq == 1  # the new owner caches head 1
    contested, after = turn(conv, 1), turn(conv, 2)
    by_old = []
    new.store.before_promote = lambda: by_old.extend(
        [old.outcome(contested), old.outcome(after)])
    by_new = new.outcome(contested)
    assert [type(o) for o in by_old] == [CheckpointPromoted, CheckpointPromoted]
    assert (by_old[0].seq, by_old[1].seq) == (2, 3)
    assert by_new == by_old[0], (by_new, by_old[0])
    assert new.outcome(turn(conv, 3)).seq == 4


@pytest.mark.parametrize("expires_at", [NOW_MS - 1, 0, -1])
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_a_turn_continuing_an_expired_one_is_promoted_on_every_backend(workers, mode,
                                                                       expires_at):
    """Promotion ignores expiry (docs/gateway-protocol.md, "Logical expiry"): a turn
    whose parent expired (a moment ago, at epoch 0, before 1970) is promoted on it by
    either worker, both entry points, both backends; its history holds the parent's
    items. An outside review, session 42: a parent expired at or before epoch 0 made its
    child ``CORRUPT`` ("cannot be read (EXPIRED)")."""
    first_owner, new_owner = workers
    if mode == "conversation":
        conv = uid("conv")
        parent = turn(conv, 0, expires_at=expires_at)
        child = turn(conv, 1)
    else:
        root = uid("resp")
        parent = make_turn(conversation_id=None, chain_root_id=root, response_id=root,
                           expected_head_seq=None, previous_response_id=None,
                           idempotency_key=uid("idem"), expires_at=expires_at)
        child = make_turn(conversation_id=None, chain_root_id=root, response_id=uid("resp"),
                          expected_head_seq=None, previous_response_id=root,
                          idempotency_key=uid("idem"))
    promoted = first_owner.outcome(parent)
    assert (promoted.seq, promoted.expires_at) == (1, expires_at), promoted
    outcome = new_owner.outcome(child)
    assert isinstance(outcome, CheckpointPromoted), outcome
    assert outcome.seq == 2 and outcome.item_count == len(parent.items) + len(child.items)
