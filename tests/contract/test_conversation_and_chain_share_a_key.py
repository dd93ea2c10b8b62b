"""A Conversation id equal to a chain's first response id: two histories, one key.

Ids are opaque (CONTRACT section 2), so one tenant's Conversation ``X`` and its chain
whose first response is ``X`` share one Kafka key and one store partition
``(tenant, X)``. The rule (docs/gateway-protocol.md, "A Conversation and a chain that
share a key"): they are separate histories. Each is promoted, ordered, read, expired,
cancelled and retried as if the other were not there, in every order; only the
duplicates' scope (the partition) is shared, so a key reused across the two is
refused, never promoted into the other history.

On both backends, both worker entry points, one worker for every event (warm hints
and tail cache) or a new one for each (cold: on Cassandra a store object of its own).
Session 45 left a memory-store mutant alive (a chain's turns counted as the
Conversation's marker: the Conversation was refused after the chain); these kill it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from ratchet.samples import NOW_MS, make_tool_loop_turn, make_turn, make_turn_cancelled
from schemas.models import CheckpointPromoted, PromotionRejected, RejectionReason
from services.api.status_reader import StatusReader
from tests.contract.test_processor_handover import ENTRIES
from tests.contract.test_processor_races import uid

R = RejectionReason
NOW = datetime.fromtimestamp(NOW_MS / 1000, UTC)

# The four turns, in the orders a gateway may send them (one Kafka key: in this order).
ORDERS = {
    "chain_first": ("c1", "c2", "v1", "v2"),
    "conversation_first": ("v1", "v2", "c1", "c2"),
    "interleaved": ("v1", "c1", "v2", "c2"),
    "interleaved_chain_first": ("c1", "v1", "c2", "v2"),
}


class Shared:
    """One tenant's Conversation ``key`` and the chain whose first response is ``key``."""

    def __init__(self, data, entry: str, fresh: bool) -> None:
        self.data, self.entry, self.fresh = data, entry, fresh
        self.tenant, self.key = uid("tenant"), uid("shared")
        self._one = data.worker(entry)

    def worker(self):
        return self.data.worker(self.entry) if self.fresh else self._one

    def conversation(self, expected: int, **kw):
        return make_turn(tenant_id=self.tenant, conversation_id=self.key,
                         expected_head_seq=expected, **kw)

    def chain(self, previous: str | None, **kw):
        if previous is None:
            kw.setdefault("response_id", self.key)
        else:
            kw.setdefault("response_id", uid("resp"))
        return make_turn(tenant_id=self.tenant, conversation_id=None, expected_head_seq=None,
                         chain_root_id=None if previous is None else self.key,
                         previous_response_id=previous, **kw)

    def promoted(self, event, seq: int) -> CheckpointPromoted:
        outcome = self.worker().outcome(event)
        assert isinstance(outcome, CheckpointPromoted), outcome
        assert (outcome.response_id, outcome.seq) == (event.response_id, seq), outcome
        return outcome

    def rejected(self, event, reason: R) -> PromotionRejected:
        outcome = self.worker().outcome(event)
        assert isinstance(outcome, PromotionRejected), outcome
        assert outcome.reason is reason, outcome
        return outcome

    def history(self, now=NOW, **which) -> VerifiedHistory | HistoryFailure:
        return self.data.store().read_history(self.tenant, now=now, **which)


def items_of(*events) -> list[str]:
    return [item.item_id for e in events for item in (*e.input_items, *e.output_items)]


def assert_history(found, last, events, head_seq: int) -> None:
    assert isinstance(found, VerifiedHistory), found
    assert found.response_id == last.response_id
    assert [i.item_id for i in found.items] == items_of(*events)
    assert found.head_seq == head_seq


@ENTRIES
@pytest.mark.parametrize("fresh", [False, True], ids=["one_worker", "worker_each"])
@pytest.mark.parametrize("order", list(ORDERS))
def test_both_histories_promote_and_read_apart_in_every_order(data, entry, fresh,
                                                              order):
    s = Shared(data, entry, fresh)
    v1 = s.conversation(0)
    v2 = s.conversation(1)
    c1 = s.chain(None)
    c2 = s.chain(c1.response_id)
    events = {"v1": v1, "v2": v2, "c1": c1, "c2": c2}
    seqs = {"v1": 1, "v2": 2, "c1": 1, "c2": 2}
    for name in ORDERS[order]:
        s.promoted(events[name], seqs[name])

    # A Conversation turn is ordered by the Conversation's head alone: the partition's
    # chain turns count for nothing (4 turns stored, the head is 2).
    s.rejected(s.conversation(1), R.CONFLICT)
    assert s.rejected(s.conversation(3), R.OUT_OF_ORDER).head_seq == 2
    v3 = s.conversation(2)
    s.promoted(v3, 3)
    # A chain turn by its parent alone: a fork of the root, a child of the child.
    fork = s.chain(c1.response_id)
    s.promoted(fork, 2)
    c3 = s.chain(c2.response_id)
    s.promoted(c3, 3)
    # No chain parent among the Conversation's turns (its responses are not the chain's).
    s.rejected(s.chain(v1.response_id), R.PARENT_NOT_PROMOTED)

    head = s.data.store().head(s.tenant, s.key)
    assert (head.seq, head.response_id) == (3, v3.response_id)
    assert_history(s.history(conversation_id=s.key), v3, (v1, v2, v3), 3)
    assert_history(s.history(response_id=v1.response_id), v1, (v1,), 3)
    assert_history(s.history(response_id=c1.response_id), c1, (c1,), 1)
    assert_history(s.history(response_id=c3.response_id), c3, (c1, c2, c3), 3)
    assert_history(s.history(response_id=fork.response_id), fork, (c1, fork), 2)
    # ``/status`` (its Conversation responses' head checked, chain responses' not).
    status = StatusReader(s.data.store(), s.data.ledger())
    for event, seq in ((v1, 1), (v3, 3), (c1, 1), (c3, 3), (fork, 2)):
        body = status.status(s.tenant, event.response_id)
        assert (body.state, body.seq) == ("promoted", seq), body


@ENTRIES
@pytest.mark.parametrize("chain_first", [True, False])
def test_retries_are_answered_within_their_own_history(data, entry, chain_first):
    s = Shared(data, entry, fresh=False)
    v1, c1 = s.conversation(0), s.chain(None)
    for event in (c1, v1) if chain_first else (v1, c1):
        s.promoted(event, 1)
    # The same request again: its own promotion re-emitted.
    for event in (c1, v1):
        again = event.model_copy(update={"event_id": uid("ev"), "attempt": 2})
        s.promoted(again, 1)
    # Under another response id: DUPLICATE naming its own original, never the other's.
    v_retry = s.conversation(0, response_id=uid("resp"), idempotency_key=v1.idempotency_key,
                             request_digest=v1.request_digest, attempt=2)
    assert s.rejected(v_retry, R.DUPLICATE).existing_response_id == v1.response_id
    c_retry = s.chain(None, response_id=uid("resp"), idempotency_key=c1.idempotency_key,
                      request_digest=c1.request_digest, attempt=2)
    assert s.rejected(c_retry, R.DUPLICATE).existing_response_id == c1.response_id
    # A key reused across the two (a gateway error: keys are unique per tenant) is
    # refused by the duplicates' scope, the partition: never promoted in the other. (Its
    # request digest differs: a Conversation's request body names its Conversation.)
    reused = s.conversation(1, idempotency_key=c1.idempotency_key, request_digest="a" * 64)
    s.rejected(reused, R.IDEMPOTENCY_KEY_REUSED)
    reused = s.chain(c1.response_id, idempotency_key=v1.idempotency_key,
                     request_digest="b" * 64)
    s.rejected(reused, R.IDEMPOTENCY_KEY_REUSED)
    assert_history(s.history(conversation_id=s.key), v1, (v1,), 1)
    assert_history(s.history(response_id=c1.response_id), c1, (c1,), 1)


@ENTRIES
@pytest.mark.parametrize("chain_first", [True, False])
def test_expiry_of_one_history_never_expires_the_other(data, entry, chain_first):
    s = Shared(data, entry, fresh=True)
    soon, late = NOW_MS + 60_000, NOW_MS + 600_000
    c1 = s.chain(None, expires_at=soon if chain_first else late)
    v1 = s.conversation(0, expires_at=late if chain_first else soon)
    s.promoted(c1, 1)
    s.promoted(v1, 1)
    between = NOW + timedelta(seconds=120)
    expired, alive = (c1, v1) if chain_first else (v1, c1)
    found = s.history(response_id=expired.response_id, now=between)
    assert isinstance(found, HistoryFailure) and found.reason is HistoryFailureReason.EXPIRED
    assert_history(s.history(response_id=alive.response_id, now=between), alive, (alive,), 1)
    conversation = s.history(conversation_id=s.key, now=between)
    if chain_first:
        assert_history(conversation, v1, (v1,), 1)
    else:
        assert isinstance(conversation, HistoryFailure)
        assert conversation.reason is HistoryFailureReason.EXPIRED
    # Extending one history renews it alone (promotion ignores expiry).
    s.promoted(s.chain(c1.response_id) if chain_first else s.conversation(1), 2)


@ENTRIES
@pytest.mark.parametrize("cancelled", ["chain", "conversation"])
def test_a_cancellation_and_tool_effects_stay_with_their_history(data, entry,
                                                                 cancelled):
    s = Shared(data, entry, fresh=False)
    s.promoted(s.chain(None), 1)
    s.promoted(s.conversation(0), 1)
    chain_loop, chain_effects = make_tool_loop_turn(
        rounds=2, tenant_id=s.tenant, conversation_id=None, expected_head_seq=None,
        chain_root_id=s.key, previous_response_id=s.key)
    conv_loop, conv_effects = make_tool_loop_turn(
        rounds=2, tenant_id=s.tenant, conversation_id=s.key, expected_head_seq=1)
    worker = s.worker()
    worker.feed(*chain_effects, *conv_effects)
    doomed, kept = (chain_loop, conv_loop) if cancelled == "chain" else (conv_loop, chain_loop)
    handled = worker.handle(make_turn_cancelled(doomed))
    # Orphaned are the cancelled request's effects only (never the other history's).
    orphaned = {o.model.effect_id for o in handled.outbound}
    doomed_effects = chain_effects if cancelled == "chain" else conv_effects
    assert orphaned == {e.effect_id for e in doomed_effects}
    s.rejected(doomed, R.CANCELLED)
    s.promoted(kept, 2)
    if cancelled == "chain":
        found = s.history(conversation_id=s.key)
        assert isinstance(found, VerifiedHistory) and found.response_id == conv_loop.response_id
        assert found.head_seq == 2
    else:
        found = s.history(response_id=chain_loop.response_id)
        assert isinstance(found, VerifiedHistory) and found.head_seq == 2
        assert s.data.store().head(s.tenant, s.key).seq == 1


@ENTRIES
@pytest.mark.parametrize("chain_first", [True, False])
def test_each_history_is_absent_until_its_own_first_turn(data, entry, chain_first):
    """The partition holding one history says nothing of the other: NOT_FOUND, no
    head, ``/status`` unknown for the chain's first response id."""
    s = Shared(data, entry, fresh=True)
    first = s.chain(None) if chain_first else s.conversation(0)
    s.promoted(first, 1)
    store, status = s.data.store(), StatusReader(s.data.store(), s.data.ledger())
    if chain_first:
        found = s.history(conversation_id=s.key)
        assert isinstance(found, HistoryFailure), found
        assert found.reason is HistoryFailureReason.NOT_FOUND
        assert store.head(s.tenant, s.key) is None
        assert store.read_head(s.tenant, s.key) is None
    else:
        for found in (s.history(response_id=s.key),
                      s.history(response_id=s.key, partition_key=s.key)):
            assert isinstance(found, HistoryFailure), found
            assert found.reason is HistoryFailureReason.NOT_FOUND
        assert status.status(s.tenant, s.key).state == "unknown"
    second = s.conversation(0) if chain_first else s.chain(None)
    s.promoted(second, 1)
    # Read again through the store object that found the history absent (Cassandra
    # remembers a partition without a Conversation, to read no chain items again).
    for which in ({"conversation_id": s.key}, {"response_id": s.key}):
        found = store.read_history(s.tenant, now=NOW, **which)
        assert isinstance(found, VerifiedHistory) and found.checkpoint.seq == 1, found
    conversation = store.read_history(s.tenant, conversation_id=s.key, now=NOW)
    assert conversation.response_id == (second if chain_first else first).response_id
