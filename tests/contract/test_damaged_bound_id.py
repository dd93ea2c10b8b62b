"""A damaged checkpoint row of a bound response id is answered ``CORRUPT``, as the write
answers it, never as a row that is not there and never as a dead letter.

docs/gateway-protocol.md, section 7: an event whose response id stands promoted with the
same request is answered with that promotion, whatever else it carries (a ``failed``
status, ...). Whether it does cannot be known when the id's checkpoint row is damaged:
the answer is the write's, ``CORRUPT``. Before session 49 ``get_checkpoint`` read such a
row as absent, so a ``failed`` retry of the promoted request was answered
``NOT_PROMOTABLE_STATUS`` (the event's own rule); making it raise alone dead-lettered
every case (``UNKNOWN``), because the worker's lookups (``already_promoted``,
``chain_owner``, a cancellation's check) did not catch it.

The partition of ``test_shared_key_damage``: the chain ``c1`` <- ``c2`` and the
Conversation ``v1`` <- ``v2`` under one key; ``v2`` or ``c2`` damaged. Cassandra: the
row's ``mode`` cell unknown (the row cannot be decoded). Memory holds records, nothing
undecodable: its store here reads the damaged id's row as Cassandra decodes it
(``CorruptPartition`` from the checkpoint lookup and from a promotion's view).
Warm worker (promoted the partition) and cold, ``handle`` and ``handle_async``.
"""

from __future__ import annotations

import pytest

from ratchet.domain.plan import CorruptPartition
from ratchet.samples import make_turn, make_turn_cancelled
from schemas.models import PromotionRejected, RejectionReason, TurnStatus
from services.ledger.cassandra import CassandraLedger
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from services.store.memory import MemoryCheckpointStore
from tests.contract.test_conversation_and_chain_share_a_key import Shared
from tests.contract.test_processor_handover import ENTRIES, Data
from tests.contract.test_processor_races import uid
from tests.contract.test_shared_key_damage import Partition, damage

R = RejectionReason


class DamagedRows(MemoryCheckpointStore):
    """A memory store whose rows in ``damaged`` (tenant, response id) cannot be decoded:
    what a Cassandra store's lookup and view raise for such a row (``CorruptPartition``)."""

    def __init__(self) -> None:
        super().__init__(StoreOptions())
        self.damaged: set[tuple[str, str]] = set()

    def _located_checkpoint(self, tenant_id, response_id):
        if (tenant_id, response_id) in self.damaged:
            raise CorruptPartition(f"checkpoint row of {response_id} cannot be decoded")
        return super()._located_checkpoint(tenant_id, response_id)

    def _read_view(self, request, head_guess=None):
        view = super()._read_view(request, head_guess)
        rows = (view.existing, view.original, view.parent, view.head_backing)
        if any(row is not None and (request.tenant_id, row.response_id) in self.damaged
               for row in rows):
            raise CorruptPartition(f"partition {request.partition_key}: undecodable row")
        return view


@pytest.fixture(params=["memory", "cassandra"])
def backend(request):
    if request.param == "memory":
        store, ledger = DamagedRows(), MemoryLedger()
        return Data(lambda: store, lambda: ledger)
    session = request.getfixturevalue("ledger_session")
    return Data(lambda: CassandraCheckpointStore(session, StoreOptions(), timeout_s=30),
                lambda: CassandraLedger(session, timeout_s=30))


def damage_row(s: Shared, response_id: str) -> None:
    store = s.data.store()
    if isinstance(store, DamagedRows):  # and a history read of it fails, as on Cassandra
        store.damaged.add((s.tenant, response_id))
        damage(s, response_id, "content")
    else:
        damage(s, response_id, "row")


def cases(p: Partition, name: str) -> dict[str, object]:
    """The events that meet the damaged row of ``name``'s response id (fresh ones each
    call): the promoted event redelivered, a ``failed`` retry of its request under its
    id, and another request with its id (on the lineage the turn was promoted on)."""
    turn = p.event(name)
    retry = turn.model_copy(update={"event_id": uid("event"), "attempt": turn.attempt + 1,
                                    "status": TurnStatus.FAILED})
    if name.startswith("v"):
        other = p.s.conversation(turn.expected_head_seq, response_id=turn.response_id)
    else:
        other = p.s.chain(turn.previous_response_id, response_id=turn.response_id)
    return {"redelivery": turn, "failed_retry": retry, "other_request": other}


def assert_corrupt(outcome, what) -> None:
    assert isinstance(outcome, PromotionRejected), (what, outcome)
    assert outcome.reason is R.CORRUPT, (what, outcome)


@ENTRIES
@pytest.mark.parametrize("target", ["v2", "c2"])
@pytest.mark.parametrize("worker", ["warm", "cold"])
@pytest.mark.parametrize("case", ["redelivery", "failed_retry", "other_request"])
def test_a_damaged_row_of_a_bound_id_is_answered_corrupt(backend, entry, target, worker, case):
    """``CORRUPT`` by the warm worker or a cold one (the ``failed`` retry was
    ``NOT_PROMOTABLE_STATUS`` before session 49), and again for a redelivery of the
    event (the answer recorded, not dead-lettered)."""
    p = Partition(backend, entry)
    damage_row(p.s, p.event(target).response_id)
    event = cases(p, target)[case]
    assert_corrupt((p.warm.outcome if worker == "warm" else p.cold)(event), worker)
    assert_corrupt(p.cold(event), "again")


@ENTRIES
@pytest.mark.parametrize("target", ["v2", "c2"])
def test_a_cancelled_retry_on_a_damaged_row_is_answered_corrupt(backend, entry, target):
    """A cancellation of the promoted attempt, then a ``completed`` retry of its request
    under its id: whether the cancellation came after the promotion (and changes nothing)
    is the damaged row's to tell: ``CORRUPT``, not a dead letter."""
    p = Partition(backend, entry)
    turn = p.event(target)
    damage_row(p.s, turn.response_id)
    p.s.data.worker(entry).handle(make_turn_cancelled(turn))
    retry = turn.model_copy(update={"event_id": uid("event"), "attempt": turn.attempt + 1})
    assert_corrupt(p.warm.outcome(retry), "warm")
    assert_corrupt(p.cold(retry), "cold")


@ENTRIES
def test_a_parent_whose_other_tenant_row_is_damaged_is_corrupt(backend, entry):
    """A chain turn naming a parent id its tenant never promoted, which another tenant
    promoted (the response owner row names it) and whose row there is damaged: the write
    finds no parent (``ParentMissing``) and ``chain_owner`` asks whether that tenant's
    checkpoint of the id is there (the owner row is written beside a batch that may
    have been refused). Damaged, that cannot be told: ``CORRUPT``, like every answer
    resting on a damaged row (``PARENT_NOT_PROMOTED`` before session 49, the row read
    as absent; with ``get_checkpoint`` raising alone, a dead letter)."""
    mine = Shared(backend, entry, fresh=False)
    theirs = Shared(backend, entry, fresh=False)
    theirs.promoted(theirs.chain(None), 1)
    damage_row(theirs, theirs.key)
    child = make_turn(tenant_id=mine.tenant, conversation_id=None, expected_head_seq=None,
                      chain_root_id=uid("root"), previous_response_id=theirs.key)
    for worker in ("warm", "cold"):
        run = mine.worker() if worker == "warm" else backend.worker(entry)
        assert_corrupt(run.outcome(child), worker)



def retried_after_a_cancellation(p: Partition, name: str, naming: str, entry: str):
    """``name``'s request cancelled (the cancellation naming ``naming``'s response id:
    it is recorded, never compared) after its promotion, and retried under another
    response id."""
    turn = p.event(name)
    cancel = make_turn_cancelled(turn).model_copy(
        update={"response_id": p.event(naming).response_id})
    p.s.data.worker(entry).handle(cancel)
    return turn.model_copy(update={"event_id": uid("event"), "attempt": turn.attempt + 1,
                                   "response_id": uid("resp")})


@ENTRIES
@pytest.mark.parametrize("target", ["v2", "c2"])
def test_a_retry_whose_promotion_row_is_damaged_is_corrupt_not_cancelled(
        backend, entry, target):
    """The promoted attempt's row damaged, a cancellation of the request, a retry under
    another response id: whether the cancellation came after the promotion (and changes
    nothing) cannot be told from the damaged row or the request's key (the write's view
    of its original raises too): ``CORRUPT``, as the write answers it. Session 49
    answered ``CANCELLED`` (the first lookup's damage read as "cancelled first"), telling
    the gateway that a request which stands promoted never promotes."""
    p = Partition(backend, entry)
    damage_row(p.s, p.event(target).response_id)
    retry = retried_after_a_cancellation(p, target, target, entry)
    for worker, run in (("warm", p.warm.outcome), ("cold", p.cold), ("again", p.cold)):
        assert_corrupt(run(retry), worker)


@ENTRIES
@pytest.mark.parametrize("target", ["v2", "c2"])
def test_a_cancellation_naming_a_damaged_row_of_another_request_changes_nothing(
        backend, entry, target):
    """A cancellation after the promotion naming another request's response id, whose
    row is damaged: that row says nothing of this request, whose own key says it stands
    promoted, so the cancellation changes nothing and a retry under another id is
    ``DUPLICATE`` naming the promoted response. Session 49 answered ``CANCELLED``."""
    p = Partition(backend, entry)
    other = "c2" if target == "v2" else "v1"  # not the head (memory's view reads it)
    damage_row(p.s, p.event(other).response_id)
    retry = retried_after_a_cancellation(p, target, other, entry)
    for worker, run in (("warm", p.warm.outcome), ("cold", p.cold), ("again", p.cold)):
        outcome = run(retry)
        assert isinstance(outcome, PromotionRejected), (worker, outcome)
        assert outcome.reason is R.DUPLICATE, (worker, outcome)
        assert outcome.existing_response_id == p.event(target).response_id, (worker, outcome)


@ENTRIES
@pytest.mark.parametrize("target", ["v2", "c2"])
@pytest.mark.parametrize("order", ["cancel-names-the-retry", "cancel-then-damage",
                                   "retry-then-cancel"])
def test_every_order_of_cancellation_damage_and_retry_is_corrupt_as_the_write(
        backend, entry, target, order):
    """The other orders of the case above (session 50, checking that the review's fix
    leaves none answered otherwise than the write, whose view of the damaged original
    raises): the cancellation naming the retry's own response id; the cancellation
    recorded before the damage; a retry answered before the cancellation, then another.
    Each retry under another response id is ``CORRUPT``, warm, cold and again. Passed
    before and after session 50 (nothing changed: a guard, not a fix)."""
    p = Partition(backend, entry)
    turn = p.event(target)
    retry = turn.model_copy(update={"event_id": uid("event"), "attempt": turn.attempt + 1,
                                    "response_id": uid("resp")})
    cancel = make_turn_cancelled(turn)
    if order == "cancel-names-the-retry":
        damage_row(p.s, turn.response_id)
        p.s.data.worker(entry).handle(
            cancel.model_copy(update={"response_id": retry.response_id}))
    elif order == "cancel-then-damage":
        p.s.data.worker(entry).handle(cancel)
        damage_row(p.s, turn.response_id)
    else:
        damage_row(p.s, turn.response_id)
        assert_corrupt(p.cold(retry), "before the cancellation")
        p.s.data.worker(entry).handle(cancel)
        retry = retry.model_copy(update={"event_id": uid("event"),
                                         "attempt": turn.attempt + 2,
                                         "response_id": uid("resp")})
    for worker, run in (("warm", p.warm.outcome), ("cold", p.cold), ("again", p.cold)):
        assert_corrupt(run(retry), worker)
