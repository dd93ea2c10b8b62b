"""A response id's claim whose ``request_digest`` cell reads null is damage: a turn that
may be the claim's own request (its intact cells all agree) is answered ``CORRUPT``,
never promoted on it and never ``CONFLICT`` naming its own key; a turn an intact cell
proves another (another partition or key) is ``CONFLICT``, as without the damage
(session 52's outside review: the damaged claim's ``CORRUPT`` reached a healthy
Conversation's turn).

The claim (``response_claims``, ``ResponseClaim``) binds a response id to ONE request
(idempotency key + request digest) in ONE partition; a promotion goes on only when the
holder is the turn's own request (``PromotionWriter.promote``). Every claim is written
with the digest of a turn that passed ``request_digest_problem``, so a null digest cell
is damage, like the null partition (``_claimed_partition``) and null key (``turn_lost``)
cells of session 51. Until session 52 the holder built from such a row was never
checked: it differed from every turn's claim, so every turn meeting it was answered
``CONFLICT`` "already bound to request K in P", also the same request's own retry
(whose claim it may be): a statement built from a row nobody can check. Now the write
answers it as damage (``CorruptPartition`` -> ``CORRUPT``, ``damaged_rows``), after its
view: a turn the view answers (a promoted request's redelivery, a response id whose row
stands in the partition) is answered from the view, as before.

Both backends (memory: the claim in ``_claims`` replaced by one without its digest, as
Cassandra reads a null cell), both entries, a cold worker (no hints, no cached lineage),
the same answer on redelivery; the response id is never promoted.
"""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from ratchet.domain.plan import CorruptPartition, ResponseClaim, ResponseClaimed
from ratchet.domain.promotion import interpret, promotion_request
from ratchet.samples import TENANT, make_turn, new_id
from schemas.models import Certification, PromotionRejected, RejectionReason
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.test_processor_handover import ENTRIES
from tests.contract.test_processor_races import Worker

R = RejectionReason


def set_null(store, response_id: str, cell: str) -> None:
    """The response id's claim row with its ``cell`` null (memory: as Cassandra reads it)."""
    if isinstance(store, CassandraCheckpointStore):
        store._session.execute(
            f"UPDATE response_claims SET {cell} = null "
            "WHERE tenant_id = %s AND response_id = %s", (TENANT, response_id), timeout=30)
        return
    with store._lock:
        claim = store._claims[(TENANT, response_id)]
        store._claims[(TENANT, response_id)] = dataclasses.replace(claim, **{cell: None})


def damage_digest(store, response_id: str) -> None:
    """The response id's claim row with its ``request_digest`` cell null."""
    set_null(store, response_id, "request_digest")


def claim_only(store, turn) -> None:
    """The turn's response id claimed for its request, no batch (a worker that stopped
    between the claim and its batch, or whose batch was refused)."""
    claim = ResponseClaim(turn.tenant_id, turn.response_id, turn.conversation_id,
                          turn.idempotency_key, turn.request_digest)
    assert store.start_claiming(claim)() == claim


def conversation_turn(**kw):
    return make_turn(conversation_id=new_id("conv"), **kw)


def cold(store_and_ledger, entry) -> Worker:
    """A worker that knows nothing yet: what it learns comes from the store."""
    store, ledger = store_and_ledger
    store._hints.__init__(store.options.hint_capacity)  # what the store learned
    return Worker(store, ledger, entry)


def corrupt_every_time(store_and_ledger, entry, turn) -> None:
    store, _ = store_and_ledger
    for attempt in ("first", "redelivery", "another worker"):
        worker = cold(store_and_ledger, entry)
        handled = worker.handle(turn)
        assert handled.kind == "rejected", (attempt, handled)
        out = handled.outbound[0].model
        assert isinstance(out, PromotionRejected), (attempt, out)
        assert out.reason is R.CORRUPT, (attempt, out.reason, out.detail)
        assert "request digest" in out.detail, (attempt, out.detail)
    assert store.get_checkpoint(turn.tenant_id, turn.response_id) is None


@ENTRIES
def test_the_same_request_meeting_its_claim_without_digest_is_corrupt(store_and_ledger, entry):
    """Its own claim, taken before a batch that never landed: which request holds the id
    cannot be told (this one, or another of the same key): never promoted on it, never
    ``CONFLICT`` naming its own key."""
    store, _ = store_and_ledger
    turn = conversation_turn()
    claim_only(store, turn)
    damage_digest(store, turn.response_id)
    corrupt_every_time(store_and_ledger, entry, turn)
    retry = turn.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2})
    corrupt_every_time(store_and_ledger, entry, retry)


def conflict_every_time(store_and_ledger, entry, turn, bound_in: str) -> None:
    """``CONFLICT`` naming the claim's intact partition (never a null cell), the same on
    redelivery and on another worker."""
    for attempt in ("first", "redelivery", "another worker"):
        handled = cold(store_and_ledger, entry).handle(turn)
        assert handled.kind == "rejected", (attempt, handled)
        out = handled.outbound[0].model
        assert isinstance(out, PromotionRejected), (attempt, out)
        assert out.reason is R.CONFLICT, (attempt, out.reason, out.detail)
        assert f"in {bound_in}" in out.detail and "None" not in out.detail, (attempt, out.detail)
        assert out.existing_response_id == turn.response_id, (attempt, out)


@ENTRIES
def test_another_request_meeting_a_claim_without_digest_is_conflict(store_and_ledger, entry):
    """Same partition, another idempotency key: the claim's intact key cell proves the
    id bound to another request, whatever its digest was (CONTRACT 4: ``CONFLICT``; it
    was ``CORRUPT`` from session 52's rproc7 to its outside review)."""
    store, _ = store_and_ledger
    held = conversation_turn()
    claim_only(store, held)
    damage_digest(store, held.response_id)
    other = make_turn(conversation_id=held.conversation_id, response_id=held.response_id)
    conflict_every_time(store_and_ledger, entry, other, held.conversation_id)
    assert store.get_checkpoint(TENANT, other.response_id) is None


@ENTRIES
def test_a_turn_of_another_partition_meeting_a_claim_without_digest_is_conflict(
        store_and_ledger, entry):
    """The id promoted in one Conversation; a turn of another, healthy Conversation with
    that id (its view there holds no such row: the claim decides). The claim's intact
    partition cell names the other Conversation, so the id is bound to another turn
    whatever its digest was: ``CONFLICT`` (CONTRACT 4), not the damaged claim's
    ``CORRUPT`` leaking into a healthy Conversation (docs/store.md: damage to one history
    fails that history only). ``CORRUPT`` from rproc7 to its outside review."""
    store, _ = store_and_ledger
    promoted = conversation_turn()
    assert cold(store_and_ledger, entry).handle(promoted).kind == "promoted"
    damage_digest(store, promoted.response_id)
    elsewhere = conversation_turn(response_id=promoted.response_id,
                                  idempotency_key=promoted.idempotency_key,
                                  request_digest=promoted.request_digest)
    conflict_every_time(store_and_ledger, entry, elsewhere, promoted.conversation_id)
    # The promotion that stands is untouched.
    assert store.get_checkpoint(TENANT, promoted.response_id).partition_key == (
        promoted.conversation_id)


@ENTRIES
def test_a_promoted_requests_redelivery_is_answered_from_its_view(store_and_ledger, entry):
    """Not damage the write needs: the partition's view says the request stands
    promoted with this response, so the redelivery is that promotion again (as before
    session 52; the claim is asked only for a turn the view would let write)."""
    store, _ = store_and_ledger
    turn = conversation_turn()
    first = cold(store_and_ledger, entry).handle(turn)
    assert first.kind == "promoted"
    damage_digest(store, turn.response_id)
    for attempt in ("redelivery", "another worker"):
        again = cold(store_and_ledger, entry).handle(turn)
        assert again.kind == "promoted", (attempt, again)
        assert again.outbound[0].model.seq == first.outbound[0].model.seq


@pytest.mark.parametrize("cell", ["request_digest", "idempotency_key", "partition_key"])
def test_the_store_raises_on_a_claim_with_a_null_cell(store_and_ledger, cell):
    """The store's promise (``CheckpointStore.promote``), for each cell that names the
    claim's request or partition: ``CorruptPartition`` where the holder decides, nothing
    written; the same on both backends."""
    store, _ = store_and_ledger
    turn = conversation_turn()
    claim_only(store, turn)
    set_null(store, turn.response_id, cell)
    request = promotion_request(turn, Certification.CERTIFIED)
    with pytest.raises(CorruptPartition, match="names no "):
        store.promote(request)
    # Nothing written: no turn row where the turn would be (asked of the partition, not
    # the claim, which a null partition cell makes unreadable).
    assert not store._turn_row_serial(TENANT, turn.conversation_id, turn.response_id)


@pytest.mark.parametrize("cell", ["request_digest", "idempotency_key"])
def test_the_store_answers_a_turn_of_another_partition_from_the_intact_cells(store_and_ledger, cell):
    """A claim with its partition cell intact and another partition: no null cell can
    make it the turn's own, so it is ``ResponseClaimed`` (``CONFLICT``), on both
    backends; its answer names no null cell."""
    store, _ = store_and_ledger
    turn = conversation_turn()
    claim_only(store, turn)
    set_null(store, turn.response_id, cell)
    elsewhere = conversation_turn(response_id=turn.response_id,
                                  idempotency_key=turn.idempotency_key,
                                  request_digest=turn.request_digest)
    outcome = store.promote(promotion_request(elsewhere, Certification.CERTIFIED))
    assert isinstance(outcome, ResponseClaimed), outcome
    assert outcome.holder.partition_key == turn.conversation_id
    answer = interpret(elsewhere, outcome)
    assert answer.reason is R.CONFLICT and "None" not in answer.detail, answer
