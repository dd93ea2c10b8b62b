"""A partition handed over between two workers (the old owner, still finishing or
stopped half-way, and the new one), on both backends and both entry points: each
step of a decision may be the last the old owner did, and the new owner must end in
the outcome CONTRACT 4 gives, the one the old owner published if it published one.
Found by an outside review (session 19); each test failed before its fix.

Every worker has hints of its own (the tail cache; on Cassandra a store object of its
own) over the same data; ``FailOnce`` stops a worker right at one write (everything
before it is durable, as after a crash).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from unittest import mock

import pytest

from ratchet.domain import promotion
from ratchet.domain.validation import Rejected
from ratchet.samples import (
    TENANT,
    make_tool_effect,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
    message,
    new_id,
)
from schemas.errors import Unavailable
from schemas.limits import MAX_EVENT_BYTES
from schemas.models import (
    CheckpointPromoted,
    EffectOrphaned,
    OrphanReason,
    PromotionRejected,
    RejectionReason,
)
from services.ledger.base import LedgerUnavailable, ResponseState
from services.store.base import StoreUnavailable
from tests.contract.test_processor_races import Interleaving, Worker, turn, uid

R = RejectionReason


@contextlib.contextmanager
def another_build_rejects(event):
    """While it lasts, workers run a build whose rules reject ``event``
    (``UNSUPPORTED_FORMAT``, e.g. a rolling rollback to a build that cannot read its
    format) where the old owner's build promoted it. No rule depends on the moment a
    turn is processed (an expired boundary proof costs the turn its reuse, never its
    promotion: docs/gateway-protocol.md, section 6), so two owners decide one record
    differently only when their rules differ."""
    real = promotion.validate_turn

    def stricter(turn, now_ms, **kw):
        if turn.event_id == event.event_id:
            return Rejected(R.UNSUPPORTED_FORMAT, "a format this build cannot read")
        return real(turn, now_ms, **kw)
    with mock.patch.object(promotion, "validate_turn", stricter):
        yield


class Data:
    """One backend's shared data; ``store()`` / ``ledger()`` give a worker its view."""

    def __init__(self, store: Callable[[], object], ledger: Callable[[], object]) -> None:
        self.store, self.ledger = store, ledger

    def worker(self, entry: str = "handle", *, store=None, ledger=None, **kw) -> Worker:
        return Worker(store or self.store(), ledger or self.ledger(), entry, **kw)


ENTRIES = pytest.mark.parametrize("entry", ["handle", "handle_async"])


class FailOnce:
    """A worker's store or ledger whose ``method`` raises ``exc`` on its first call:
    the worker stops right there, everything it wrote before is durable."""

    def __init__(self, target, method: str, exc: Exception) -> None:
        self._target, self._method, self._exc = target, method, exc
        self.failed = False

    def __getattr__(self, name):
        attr = getattr(self._target, name)
        if name != self._method or self.failed:
            return attr

        def stop(*args, **kwargs):
            self.failed = True
            raise self._exc
        return stop


def orphans(handled) -> list[tuple[str, OrphanReason]]:
    return [(o.model.effect_id, o.model.reason) for o in handled.outbound[1:]]


@ENTRIES
def test_a_replayed_rejection_writes_the_status_its_decider_did_not(data, entry):
    old = data.worker(ledger=FailOnce(data.ledger(), "mark_rejected",
                                      LedgerUnavailable("the old owner stopped")))
    new = data.worker(entry)
    late = turn(uid("conv"), 1)
    with pytest.raises(Unavailable):
        old.handle(late)  # decision recorded, then stopped before the status
    assert new.outcome(late).reason is R.OUT_OF_ORDER
    status = data.ledger().status(TENANT, late.response_id)
    assert (status.status, status.reason) == (ResponseState.REJECTED, "OUT_OF_ORDER")


@ENTRIES
def test_a_published_rejection_never_flips_to_a_promotion(data, entry):
    old = data.worker(store=FailOnce(data.store(), "mark_request_facts",
                                     StoreUnavailable("the old owner stopped", retryable=True)))
    new = data.worker(entry)
    conv = uid("conv")
    late, first = turn(conv, 1), turn(conv, 0)  # Kafka order: late, then first
    with pytest.raises(Unavailable):
        old.handle(late)  # decision recorded, then stopped before the facts mark
    assert new.outcome(late).reason is R.OUT_OF_ORDER  # published
    assert new.outcome(first).seq == 1
    again = new.outcome(late)  # redelivered now that it would extend the head
    assert isinstance(again, PromotionRejected) and again.reason is R.OUT_OF_ORDER
    assert data.store().head(TENANT, conv).seq == 1


@ENTRIES
def test_a_retry_held_by_a_rejected_first_response_is_answered_conflict(data, entry):
    """The first response holding its request's claim was rejected by a worker that
    stopped before the status row; its replay must write it, or a retry under another
    response id (waiting while the holder is undecided) would wait for ever."""
    store = Interleaving(data.store())
    new = data.worker(entry, store=store, ledger=FailOnce(
        data.ledger(), "mark_rejected", LedgerUnavailable("the new owner stopped")))
    old = data.worker()
    r1, (effect,) = make_tool_loop_turn(rounds=1, conversation_id=None, expected_head_seq=None)
    old.feed(effect)
    clash = make_tool_effect(effect.call_id, '{"temperature_c": 99}',
                             idempotency_key=effect.idempotency_key,
                             subturn_index=effect.subturn_index, response_id=r1.response_id,
                             conversation_id=None)
    assert clash.effect_id == effect.effect_id
    published = []  # a conflicting record lands meanwhile: its execution is orphaned
    store.before_promote = lambda: published.extend(old.handle(clash).outbound)
    with pytest.raises(Unavailable):
        new.handle(r1)  # DUPLICATE_TOOL_EFFECT recorded, stopped before the status
    assert [(o.model.effect_id, o.model.reason) for o in published] == [
        (clash.effect_id, OrphanReason.EFFECT_CONFLICT)]
    assert old.outcome(r1).reason is R.DUPLICATE_TOOL_EFFECT  # the redelivery replays it
    r2 = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                   idempotency_key=r1.idempotency_key, request_digest=r1.request_digest,
                   attempt=2)
    assert old.outcome(r2).reason is R.CONFLICT  # not retried: its holder is decided


@ENTRIES
def test_a_redelivered_promotion_publishes_its_orphans_on_any_worker(data, entry):
    old, new = data.worker(), data.worker(entry)
    conv = uid("conv")
    t = turn(conv, 0, attempt=2)  # attempt 2 uses no tool
    stray = make_tool_effect("call_1", idempotency_key=t.idempotency_key,
                             conversation_id=conv, tool_name="send_email")
    old.feed(stray)  # attempt 1's effect, recorded by the old owner
    first = new.handle(t)
    assert first.outbound[0].model.seq == 1
    assert orphans(first) == [(stray.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]
    # redelivered (the new owner stopped before publishing) to a worker with no hints
    for worker in (data.worker(entry), old, new):
        again = worker.handle(t)
        assert again.outbound == first.outbound


@ENTRIES
def test_a_refused_first_turn_never_hands_the_conversation_to_its_tenant(data, entry):
    # Kafka order on the Conversation's key: cancel(B's turn), B's turn, A's turn.
    old, new = data.worker(), data.worker(entry)
    conv = uid("conv")
    b = turn(conv, 0, tenant_id=uid("tenant-b"))
    a = turn(conv, 0, tenant_id=uid("tenant-a"))
    old.feed(make_turn_cancelled(b))  # the old owner records the cancellation
    assert new.outcome(b).reason is R.CANCELLED  # decided without it: batch refused
    promoted = new.outcome(a)
    assert isinstance(promoted, CheckpointPromoted) and promoted.seq == 1
    assert data.ledger().conversation_owner(conv) == a.tenant_id


@ENTRIES
def test_an_out_of_order_turn_never_owns_a_conversation(data, entry):
    worker = data.worker(entry)
    conv = uid("conv")
    assert worker.outcome(turn(conv, 2, tenant_id=uid("tenant-b"))).reason is R.OUT_OF_ORDER
    promoted = worker.outcome(turn(conv, 0, tenant_id=uid("tenant-a")))
    assert isinstance(promoted, CheckpointPromoted) and promoted.seq == 1


class PausedBatch(Interleaving):
    """The old owner's store: its promotion batch waits while ``meanwhile(land)`` runs
    (the new owner working); ``land`` puts the batch through when the test says."""

    def promote(self, request, **kw):
        result = {}

        def land():
            if "outcome" not in result:
                result["outcome"] = self._store.promote(request, **kw)
        if self.before_promote is not None:
            act, self.before_promote = self.before_promote, None
            act(land)
        land()
        return result["outcome"]


class BeforeDecision:
    """A ledger that runs ``before`` right before its first decision is recorded."""

    def __init__(self, ledger) -> None:
        self._ledger, self.before = ledger, None

    def __getattr__(self, name):
        return getattr(self._ledger, name)

    def record_decision(self, decision):
        if self.before is not None:
            act, self.before = self.before, None
            act()
        return self._ledger.record_decision(decision)


@ENTRIES
def test_one_event_is_never_both_promoted_and_rejected(data, entry):
    """The old owner decided to promote; the new owner, handling the same record on
    another build, rejects it. The old owner's batch lands after the new owner looked
    for a promotion, before its decision."""
    old_store, new_ledger = PausedBatch(data.store()), BeforeDecision(data.ledger())
    old = data.worker(store=old_store)
    new = data.worker(entry, ledger=new_ledger)
    t = turn(uid("conv"), 0)
    published = {}

    def the_new_owner_runs(land):
        new_ledger.before = land
        with another_build_rejects(t):
            published["new"] = new.outcome(t)
    old_store.before_promote = the_new_owner_runs
    published["old"] = old.outcome(t)
    assert {type(o) for o in published.values()} == {CheckpointPromoted}, published
    for worker in (old, new, data.worker(entry)):
        assert isinstance(worker.outcome(t), CheckpointPromoted)


@ENTRIES
def test_an_effect_recorded_after_its_requests_promotion_is_orphaned(data, entry):
    """CONTRACT 4: effects of attempts that are not accepted are published as orphaned,
    also one that arrives after the promotion (attempt 1 still running its tool)."""
    old, new = data.worker(), data.worker(entry)
    conv = uid("conv")
    t = turn(conv, 0, attempt=2)
    assert new.outcome(t).seq == 1
    late = make_tool_effect("call_1", idempotency_key=t.idempotency_key,
                            conversation_id=conv, tool_name="send_email", attempt=1)
    for worker in (old, new):  # recorded, and redelivered to the other worker
        handled = worker.handle(late)
        assert [(o.model.effect_id, o.model.reason) for o in handled.outbound] == [
            (late.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]
    # an effect the promoted turn used is never orphaned
    used, effects = make_tool_loop_turn(rounds=1, conversation_id=uid("conv"))
    new.feed(*effects)
    assert new.outcome(used).seq == 1
    assert old.handle(effects[0]).outbound == ()
    # nor one of a request not promoted (its turn comes later)
    pending = make_tool_effect("call_2", idempotency_key=uid("idem"), conversation_id=conv)
    assert old.handle(pending).outbound == ()


def _retry(first, **update):
    """Another attempt of ``first``'s request under the same response id (the same
    request digest: the samples derive it from the idempotency key)."""
    return make_turn(conversation_id=first.conversation_id,
                     expected_head_seq=first.expected_head_seq,
                     response_id=first.response_id, idempotency_key=first.idempotency_key,
                     attempt=first.attempt + 1, **update)


def _rejected_first_attempt(why: str, worker):
    """A first attempt rejected for ``why`` (published), and what its retry needs."""
    conv = uid("conv")
    if why == "out of order":
        first = turn(conv, 1)
        outcome = worker.outcome(first)
        assert worker.outcome(turn(conv, 0)).seq == 1  # now the retry extends the head
        retry = first.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2})
    elif why == "parent missing":
        root = make_turn(conversation_id=None, expected_head_seq=None,
                         response_id=uid("resp"))
        first = make_turn(conversation_id=None, expected_head_seq=None,
                          response_id=uid("resp"), chain_root_id=root.response_id,
                          previous_response_id=root.response_id)
        outcome = worker.outcome(first)
        assert isinstance(worker.outcome(root), CheckpointPromoted)
        retry = first.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2})
    elif why == "missing effect":
        first, effects = make_tool_loop_turn(rounds=1, conversation_id=conv)
        outcome = worker.outcome(first)  # its effect is not recorded yet
        worker.feed(*effects)
        retry = first.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2})
    elif why == "another build's rule":
        first = turn(conv, 0)
        with another_build_rejects(first):
            outcome = worker.outcome(first)
        retry = _retry(first)
    else:
        big = message("x" * (MAX_EVENT_BYTES + 10), role="assistant", item_id=new_id("msg"))
        first = turn(conv, 0, items=(big,))
        outcome = worker.outcome(first)
        retry = _retry(first)
    assert isinstance(outcome, PromotionRejected), outcome
    return first, outcome.reason, retry


@ENTRIES
@pytest.mark.parametrize("why", ["missing effect", "another build's rule", "too large",
                                 "out of order", "parent missing"])
def test_a_rejected_attempt_stays_rejected_after_its_retry_is_promoted(data, entry, why):
    """A retry goes on after its first attempt was rejected (gateway-protocol section
    7) and may be promoted under the same response id; the first attempt's record,
    redelivered (on the same worker, or a new owner that knows nothing of it), is
    answered with its published rejection: an outcome never flips. (An ordering
    rejection would pass every rule now: the store answers with the retry's
    promotion, and the event's recorded rejection must win.)"""
    worker = data.worker(entry)
    first, reason, retry = _rejected_first_attempt(why, worker)
    assert isinstance(worker.outcome(retry), CheckpointPromoted)
    for again in (worker, data.worker(entry)):
        out = again.outcome(first)
        assert isinstance(out, PromotionRejected) and out.reason is reason, out
    assert isinstance(worker.outcome(retry), CheckpointPromoted)  # and the retry stays


class StopAtConversationOwner:
    """A ledger whose first write of a Conversation's owner raises: the worker stops
    right after its batch applied, before the owner is durable."""

    def __init__(self, ledger) -> None:
        self._ledger, self.failed = ledger, False

    def __getattr__(self, name):
        return getattr(self._ledger, name)

    def _stop(self, conversation_id) -> None:
        if conversation_id is not None and not self.failed:
            self.failed = True
            raise LedgerUnavailable("the old owner stopped before the owner write")

    def start_recording_owners(self, *, tenant_id, response_id, conversation_id):
        self._stop(conversation_id)
        return self._ledger.start_recording_owners(
            tenant_id=tenant_id, response_id=response_id, conversation_id=conversation_id)

    async def record_owners_async(self, *, tenant_id, response_id, conversation_id):
        self._stop(conversation_id)
        return await self._ledger.record_owners_async(
            tenant_id=tenant_id, response_id=response_id, conversation_id=conversation_id)


@ENTRIES
def test_a_promotion_found_while_settling_a_rejection_owns_its_conversation(data, entry):
    """The old owner's batch of a Conversation's first turn lands right before the new
    owner (another build, which rejects the turn) records its rejection; the old owner
    stops before writing the Conversation's owner. The new owner answers with the
    promotion and writes the owner, so another tenant is TENANT_MISMATCH there
    (CONTRACT 4)."""
    old_store, new_ledger = PausedBatch(data.store()), BeforeDecision(data.ledger())
    old = data.worker(store=old_store, ledger=StopAtConversationOwner(data.ledger()))
    new = data.worker(entry, ledger=new_ledger)
    conv = uid("conv")
    first = turn(conv, 0)
    published = {}

    def the_new_owner_runs(land):
        new_ledger.before = land
        with another_build_rejects(first):
            published["new"] = new.outcome(first)
    old_store.before_promote = the_new_owner_runs
    with pytest.raises(Unavailable):
        old.handle(first)  # batch applied, stopped before the Conversation's owner
    assert isinstance(published["new"], CheckpointPromoted)
    assert data.ledger().conversation_owner(conv) == TENANT
    other = turn(conv, 1, tenant_id=uid("tenant-b"))
    out = new.outcome(other)
    assert isinstance(out, PromotionRejected) and out.reason is R.TENANT_MISMATCH, out


def _orphaned(*handled) -> list[tuple[str, OrphanReason]]:
    return [(o.model.effect_id, o.model.reason) for h in handled for o in h.outbound
            if isinstance(o.model, EffectOrphaned)]


@ENTRIES
def test_an_effect_recorded_after_its_requests_cancellation_is_orphaned(data, entry):
    """The user cancels while a tool runs; the turn is rejected CANCELLED; the tool's
    effect is recorded after that. The request never promotes (gateway-protocol
    section 6), so the effect is orphaned when it is recorded (and again when
    redelivered, on any worker: compensations are deduped by effect id)."""
    old, new = data.worker(), data.worker(entry)
    conv = uid("conv")
    t = turn(conv, 0)
    new.feed(make_turn_cancelled(t))
    assert new.outcome(t).reason is R.CANCELLED
    late = make_tool_effect("call_1", idempotency_key=t.idempotency_key,
                            conversation_id=conv, tool_name="send_email",
                            response_id=t.response_id)
    for worker in (new, old):
        assert _orphaned(worker.handle(late)) == [(late.effect_id, OrphanReason.TURN_CANCELLED)]
    # an effect of a request cancelled AFTER its promotion is the promotion's business
    done = turn(conv, 0)
    assert new.outcome(done).seq == 1
    new.feed(make_turn_cancelled(done))
    after = make_tool_effect("call_2", idempotency_key=done.idempotency_key,
                             conversation_id=conv, tool_name="send_email")
    assert _orphaned(new.handle(after)) == [(after.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


def _damaged(final, how: str):
    """``final``'s request retried under another response id, damaged so that the store
    could never take it (a rule rejects it before any write)."""
    if how == "item digest":
        items = list(final.output_items)
        items[-1] = items[-1].model_copy(update={"content_digest": "0" * 64})
        update = {"output_items": tuple(items)}
    else:
        update = {"expires_at": 253_402_300_800_000 + 1}  # past the year 9999
    return final.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2,
                                    "response_id": uid("resp"), **update})


@ENTRIES
@pytest.mark.parametrize("how", ["item digest", "expires_at"])
def test_a_damaged_retry_never_orphans_what_the_promotion_used(data, entry, how):
    """gateway-protocol section 7: no rejection of an attempt of a promoted request
    ever orphans an effect the promoted turn used, also one the store could not even
    be asked to take."""
    worker = data.worker(entry)
    final, effects = make_tool_loop_turn(rounds=1, conversation_id=uid("conv"))
    worker.feed(*effects)
    assert isinstance(worker.outcome(final), CheckpointPromoted)
    handled = worker.handle(_damaged(final, how))
    assert isinstance(handled.outbound[0].model, PromotionRejected)
    assert _orphaned(handled) == []


@ENTRIES
def test_a_late_effect_of_another_first_response_attempt_is_orphaned(data, entry):
    """A chain's first response: attempt 1 (response R1, partition R1) still runs its
    tool while its retry (attempt 2, response R2, partition R2, no tool) is promoted.
    The effect is recorded in partition R1 while R2's batch is in flight: R1's worker
    finds no promotion yet, and R2's batch does not assert R1's facts mark. R2's
    worker reads the request's effects again after its batch and orphans it."""
    p1 = data.worker()
    p2 = data.worker(entry, store=Interleaving(data.store()))
    idem, r1 = uid("idem"), uid("resp")
    retry = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                      idempotency_key=idem, attempt=2)
    late = make_tool_effect("call_1", idempotency_key=idem, conversation_id=None,
                            response_id=r1, tool_name="send_email", attempt=1)
    assert late.partition_key == r1
    recorded = {}
    p2.store.before_promote = lambda: recorded.setdefault("effect", p1.handle(late))
    promoted = p2.handle(retry)
    assert isinstance(promoted.outbound[0].model, CheckpointPromoted)
    assert _orphaned(recorded["effect"]) == []  # R1's worker saw no promotion yet
    assert _orphaned(promoted) == [(late.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


class StopAtResponseOwner:
    """A ledger whose first response owner write never becomes durable: the worker
    stops right after its chain batch applied."""

    def __init__(self, ledger) -> None:
        self._ledger, self.failed = ledger, False

    def __getattr__(self, name):
        return getattr(self._ledger, name)

    def start_recording_owners(self, *, tenant_id, response_id, conversation_id):
        if response_id is not None and not self.failed:
            self.failed = True

            def stopped():
                raise LedgerUnavailable("the old owner stopped before the owner write")
            return stopped
        return self._ledger.start_recording_owners(
            tenant_id=tenant_id, response_id=response_id, conversation_id=conversation_id)


@ENTRIES
def test_a_chain_promotion_answered_again_writes_its_response_owner(data, entry):
    """The old owner's chain batch applied, then it stopped before the response id's
    owner was durable; the redelivery, which the new owner's build rejects, is
    answered with the stored promotion and writes the owner: another tenant's child of
    that response is TENANT_MISMATCH (CONTRACT 4), not PARENT_NOT_PROMOTED."""
    root = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"))
    assert isinstance(data.worker().outcome(root), CheckpointPromoted)
    old = data.worker(ledger=StopAtResponseOwner(data.ledger()))
    child = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                      chain_root_id=root.response_id, previous_response_id=root.response_id)
    with pytest.raises(Unavailable):
        old.handle(child)
    new = data.worker(entry)
    with another_build_rejects(child):
        assert isinstance(new.outcome(child), CheckpointPromoted)
    other = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"),
                      tenant_id=uid("tenant-b"), chain_root_id=root.response_id,
                      previous_response_id=child.response_id)
    out = new.outcome(other)
    assert isinstance(out, PromotionRejected) and out.reason is R.TENANT_MISMATCH, out


@ENTRIES
def test_a_late_effect_of_a_cancelled_first_response_is_orphaned(data, entry):
    """A chain's first response, cancelled and rejected CANCELLED; its tool's effect is
    recorded after that. Its request is claimed for it (no other attempt, in another
    partition, can promote from now on), so the effect is orphaned TURN_CANCELLED, and
    again when redelivered (also after a worker stopped between the record and the
    publication)."""
    worker = data.worker(entry)
    stopped = data.worker(entry, store=FailOnce(data.store(), "promoted_key",
                                                StoreUnavailable("stopped", retryable=True)))
    t = make_turn(conversation_id=None, expected_head_seq=None, response_id=uid("resp"))
    worker.feed(make_turn_cancelled(t))
    assert worker.outcome(t).reason is R.CANCELLED
    late = make_tool_effect("call_1", idempotency_key=t.idempotency_key,
                            conversation_id=None, response_id=t.response_id,
                            tool_name="send_email")
    with pytest.raises(Unavailable):
        stopped.handle(late)  # recorded, then stopped before publishing
    for again in (stopped, worker):
        assert _orphaned(again.handle(late)) == [(late.effect_id, OrphanReason.TURN_CANCELLED)]


@ENTRIES
def test_an_attempt_in_flight_never_uses_an_effect_orphaned_by_a_cancellation(data, entry):
    """A chain's first response R1 records effect X; its retry R2 (another partition)
    reads X and is about to write; the user cancels; X is redelivered in R1's partition.
    X is orphaned TURN_CANCELLED only because R1 now holds the request: R2's write is
    refused (CONFLICT, bound to R1), so no promoted turn ever uses an orphaned effect."""
    idem, r1, r2 = uid("idem"), uid("resp"), uid("resp")
    retry, (x,) = make_tool_loop_turn(rounds=1, conversation_id=None, expected_head_seq=None,
                                      response_id=r2, idempotency_key=idem, attempt=2)
    x1 = x.model_copy(update={"event_id": str(uuid.uuid4()), "response_id": r1})
    first = retry.model_copy(update={"event_id": str(uuid.uuid4()), "response_id": r1,
                                     "attempt": 1})
    p1 = data.worker()
    assert _orphaned(p1.handle(x1)) == []  # recorded, not cancelled yet
    p2 = data.worker(entry, store=Interleaving(data.store()))
    seen = {}

    def cancel_and_redeliver():  # after R2 decided (with X), before its write
        p1.feed(make_turn_cancelled(first))
        seen["x"] = p1.handle(x1)
    p2.store.before_promote = cancel_and_redeliver
    out = p2.outcome(retry)
    assert _orphaned(seen["x"]) == [(x1.effect_id, OrphanReason.TURN_CANCELLED)]
    assert isinstance(out, PromotionRejected) and out.reason is R.CONFLICT, out
    assert p1.outcome(first).reason is R.CANCELLED


def _first_response(**kw):
    return make_tool_loop_turn(rounds=1, conversation_id=None, expected_head_seq=None, **kw)


def _keyed_to(event, response_id):
    return event.model_copy(update={"response_id": response_id, "chain_root_id": None,
                                    "conversation_id": None,
                                    "event_id": str(uuid.uuid4())})


@ENTRIES
def test_the_request_holders_retry_never_promotes_with_an_effect_orphaned_as_cancelled(
        data, entry):
    """A request held by a rejected first response Y (its retry may still promote under
    Y, asserting only Y's partition's facts mark); an effect E of another attempt X
    (partition X); Y's retry is decided using E; then a cancellation keyed to X and E
    redelivered. E is orphaned TURN_CANCELLED only after the request's facts are marked
    in Y's partition too: Y's batch is refused and decided again, CANCELLED. Never a
    promotion using an effect published orphaned (gateway-protocol sections 6-7)."""
    a, b = data.worker(), data.worker(entry, store=Interleaving(data.store()))
    key, y, x = uid("idem"), uid("resp"), uid("resp")
    y2, (e_y,) = _first_response(response_id=y, idempotency_key=key)
    y2 = y2.model_copy(update={"attempt": 2})
    e = _keyed_to(e_y, x)
    y1, (e0,) = _first_response(response_id=uid("resp"), idempotency_key=key)
    y1 = y1.model_copy(update={"response_id": y, "request_digest": y2.request_digest,
                               "event_id": str(uuid.uuid4())})
    e0 = _keyed_to(e0, y)
    a.feed(e0)
    conflicting = e0.model_copy(update={"event_id": str(uuid.uuid4()), "output": e_y.output})
    b.store.before_promote = lambda: a.handle(conflicting)  # lands after Y1's decision
    out = b.outcome(y1)
    assert isinstance(out, PromotionRejected) and out.reason is R.DUPLICATE_TOOL_EFFECT, out
    a.feed(e)  # E recorded in X's partition, nothing cancelled yet
    redelivered = {}

    def cancel_then_redeliver():  # after Y2's decision (with E), before its batch
        a.feed(_keyed_to(make_turn_cancelled(y2), x))
        redelivered["e"] = a.handle(e)
    b.store.before_promote = cancel_then_redeliver
    out = b.outcome(y2)
    assert _orphaned(redelivered["e"]) == [(e.effect_id, OrphanReason.TURN_CANCELLED)]
    assert isinstance(out, PromotionRejected) and out.reason is R.CANCELLED, out
