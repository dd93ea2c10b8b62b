"""An LWT whose outcome is unknown is resolved by a SERIAL read, never guessed (every
read after the failure is at SERIAL: ``serial_reads_only``).

``FlakySession`` wraps a real session: the promotion batch is sent and THEN a timeout
is raised (the write landed), or the timeout is raised WITHOUT sending (it did not).
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from cassandra.cluster import NoHostAvailable

from ratchet.domain.history import VerifiedHistory
from ratchet.domain.plan import (
    Conflict,
    Duplicate,
    FactsChanged,
    IdempotencyRecord,
    Promoted,
    ResponseClaim,
)
from services.store.base import StoreUnavailable
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import chain_turn, conversation_turn, uid
from tests.integration.flaky_session import (
    FlakyLoopSession,
    FlakySession,
    batch,
    cas_timeout,
    cas_write_unknown,
    client_timeout,
    connection_lost,
    query,
    serial_reads_only,
    server_error,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def healthy(store_session):
    return CassandraCheckpointStore(store_session, timeout_s=30)


def flaky_store(store_session, error, **kw):
    """The promotion batch's outcome unknown (``FlakySession`` on batches)."""
    session = FlakySession(store_session, batch, error, **kw)
    return session, CassandraCheckpointStore(session, timeout_s=30)


def one_turn_history(store, turn):
    history = store.read_history(turn.tenant_id, conversation_id=turn.partition_key)
    assert isinstance(history, VerifiedHistory), history
    assert history.head_seq == 1 and history.items == turn.items


@pytest.mark.parametrize(
    "error", [client_timeout, cas_timeout, cas_write_unknown, server_error, connection_lost]
)
def test_landed_write_is_reported_promoted(store_session, healthy, error):
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    session, store = flaky_store(store_session, error, land=True)
    outcome = store.promote(turn)
    assert isinstance(outcome, Promoted) and outcome.seq == 1
    assert session.sent == 1  # resolved by reading, not by writing again
    serial_reads_only(session)
    one_turn_history(healthy, turn)


@pytest.mark.parametrize(
    "error", [client_timeout, cas_timeout, cas_write_unknown, server_error, connection_lost]
)
def test_write_that_did_not_land_is_made_again(store_session, healthy, error):
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    session, store = flaky_store(store_session, error, land=False)
    outcome = store.promote(turn)
    assert isinstance(outcome, Promoted) and outcome.seq == 1
    assert session.sent == 1
    serial_reads_only(session)
    one_turn_history(healthy, turn)


def test_another_promoters_write_is_not_mistaken_for_ours(store_session, healthy):
    tenant, conv = uid("tenant"), uid("conv")
    rival = conversation_turn(tenant, conv, 0)
    mine = conversation_turn(tenant, conv, 0)
    _, store = flaky_store(
        store_session, cas_timeout, land=False, meanwhile=lambda: healthy.promote(rival)
    )
    assert store.promote(mine) == Conflict(1)
    assert healthy.head(tenant, conv).response_id == rival.response_id


def test_the_same_requests_write_by_another_promoter_is_not_mistaken_for_ours(
        store_session, healthy):
    """The same request promoted by another worker (a zombie across a rebalance) while
    our batch's outcome is unknown: its turn row is there, with its batch's token, not
    ours. Ours did not land: ``Duplicate``, never a second ``Promoted`` (a mutation
    review of the write path, session 44: the token check could go, every test passing)."""
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    _, store = flaky_store(
        store_session, cas_timeout, land=False, meanwhile=lambda: healthy.promote(turn)
    )
    outcome = store.promote(turn)
    assert isinstance(outcome, Duplicate), outcome
    assert outcome.original.response_id == turn.response_id
    one_turn_history(healthy, turn)


def test_unresolvable_landed_write_is_retryable_and_later_a_duplicate(store_session, healthy):
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    _, store = flaky_store(store_session, cas_timeout, land=True, break_reads=True)
    with pytest.raises(StoreUnavailable) as caught:
        store.promote(turn)
    assert caught.value.retryable
    again = healthy.promote(turn)
    assert isinstance(again, Duplicate) and again.original.response_id == turn.response_id
    one_turn_history(healthy, turn)


def test_unresolvable_lost_write_is_retryable_and_later_promoted(store_session, healthy):
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    _, store = flaky_store(store_session, cas_timeout, land=False, break_reads=True)
    with pytest.raises(StoreUnavailable) as caught:
        store.promote(turn)
    assert caught.value.retryable
    assert isinstance(healthy.promote(turn), Promoted)


def test_unreachable_cluster_is_retryable_and_writes_nothing(store_session, healthy):
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    _, store = flaky_store(store_session, lambda: NoHostAvailable("injected", {}), land=False)
    with pytest.raises(StoreUnavailable) as caught:
        store.promote(turn)
    assert caught.value.retryable
    assert healthy.head(turn.tenant_id, turn.partition_key) is None


def FlakyClaimSession(real, error, *, land: bool,  # noqa: N802 - reads as the class it builds
                      fragment: str = "response_claims (tenant_id") -> FlakySession:
    """The first response-id claim (its LWT insert), or the first statement whose CQL
    holds ``fragment``, fails after being sent (``land``) or without being sent."""
    return FlakySession(real, query(fragment), error, land=land)


@pytest.mark.parametrize("error", [client_timeout, cas_timeout, cas_write_unknown])
def test_claim_with_unknown_outcome_is_read_at_serial(store_session, healthy, error):
    """A landed claim is found ours by the SERIAL read; one that did not land is never
    guessed: retryable, and the retry claims and promotes."""
    landed = conversation_turn(uid("tenant"), uid("conv"), 0)
    session = FlakyClaimSession(store_session, error, land=True)
    outcome = CassandraCheckpointStore(session, timeout_s=30).promote(landed)
    assert session.tripped and isinstance(outcome, Promoted)
    serial_reads_only(session)
    lost = conversation_turn(uid("tenant"), uid("conv"), 0)
    session = FlakyClaimSession(store_session, error, land=False)
    store = CassandraCheckpointStore(session, timeout_s=30)
    with pytest.raises(StoreUnavailable) as caught:
        store.promote(lost)
    assert caught.value.retryable
    serial_reads_only(session)
    assert isinstance(store.promote(lost), Promoted)
    one_turn_history(healthy, lost)


@pytest.mark.parametrize("error", [client_timeout, cas_timeout, cas_write_unknown])
def test_request_claim_with_unknown_outcome_is_read_at_serial(store_session, healthy, error):
    """A chain's first response also claims its request (``request_claims``): settled
    the same way, and a retry under another response id stays the request's
    duplicate."""
    tenant = uid("tenant")
    root = uid("resp")
    landed = chain_turn(tenant, root, root, None)
    session = FlakyClaimSession(store_session, error, land=True,
                                fragment="request_claims (tenant_id")
    assert isinstance(CassandraCheckpointStore(session, timeout_s=30).promote(landed), Promoted)
    assert session.tripped
    serial_reads_only(session)
    root = uid("resp")
    lost = chain_turn(tenant, root, root, None)
    session = FlakyClaimSession(store_session, error, land=False,
                                fragment="request_claims (tenant_id")
    store = CassandraCheckpointStore(session, timeout_s=30)
    with pytest.raises(StoreUnavailable) as caught:
        store.promote(lost)
    assert caught.value.retryable
    serial_reads_only(session)
    assert isinstance(store.promote(lost), Promoted)
    for turn in (landed, lost):
        other = uid("resp")
        retry = chain_turn(tenant, other, other, None, key=turn.idempotency_key)
        again = healthy.promote(retry)
        assert isinstance(again, Duplicate) and again.original.response_id == turn.response_id


@pytest.mark.parametrize("land", [True, False])
def test_chain_turn_with_unknown_outcome(store_session, healthy, land):
    """The batch's parent condition (``_check_parent``) settled with the rest."""
    tenant, root = uid("tenant"), uid("resp")
    assert isinstance(healthy.promote(chain_turn(tenant, root, root, None)), Promoted)
    second = chain_turn(tenant, root, uid("resp"), root)
    session, store = flaky_store(store_session, cas_timeout, land=land)
    outcome = store.promote(second)
    assert isinstance(outcome, Promoted) and outcome.seq == 2
    assert session.sent == 1
    serial_reads_only(session)


@pytest.mark.parametrize("land", [True, False])
def test_turn_asserting_a_facts_mark_with_unknown_outcome(store_session, healthy, land):
    """The idempotency row's conditional update (``_claim_marked_idempotency``, a
    request with recorded facts) settled with the rest of the batch."""
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    mark = healthy.mark_request_facts(turn.tenant_id, turn.partition_key, turn.idempotency_key)
    session, store = flaky_store(store_session, cas_timeout, land=land)
    outcome = store.promote(turn, facts_mark=mark)
    assert isinstance(outcome, Promoted) and outcome.seq == 1
    assert session.sent == 1
    one_turn_history(healthy, turn)


CLAIM_MARK = "IF response_id = null AND request_digest = null"


@pytest.mark.parametrize("land", [True, False])
def test_claim_mark_with_unknown_outcome_is_retryable(store_session, healthy, land):
    """``mark_claim``'s conditional mark: an unknown outcome is ``StoreUnavailable``
    (retryable: the claims API's 503, and the gateway's claim sent again marks again);
    a mark that landed refuses a batch decided before it."""
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    where = (turn.tenant_id, turn.partition_key, turn.idempotency_key)
    before = healthy.mark_request_facts(*where)
    store = CassandraCheckpointStore(
        FlakyClaimSession(store_session, cas_timeout, land=land, fragment=CLAIM_MARK),
        timeout_s=30)
    with pytest.raises(StoreUnavailable) as caught:
        store.mark_claim(*where)
    assert caught.value.retryable
    assert (healthy.request_facts_mark(*where) != before) is land
    assert store.mark_claim(*where) is None  # sent again: marked
    assert isinstance(healthy.promote(turn, facts_mark=before), FactsChanged)
    assert isinstance(healthy.promote(turn, facts_mark=healthy.request_facts_mark(*where)),
                      Promoted)
    # after the promotion: the record, whether the refused mark's answer was lost or not
    store = CassandraCheckpointStore(
        FlakyClaimSession(store_session, cas_timeout, land=land, fragment=CLAIM_MARK),
        timeout_s=30)
    with pytest.raises(StoreUnavailable):
        store.mark_claim(*where)
    assert store.mark_claim(*where) == IdempotencyRecord(
        turn.idempotency_key, turn.request_digest, turn.response_id)


def settled_by_promote(store, healthy, turn, land: bool) -> None:
    """The thread path's ``promote`` after a batch sent on the loop with an unknown
    outcome: a batch that landed is the request's own promotion (its own response id:
    ``promotion.interpret`` accepts it, replayed), one that did not is written now."""
    outcome = store.promote(turn)
    if land:
        assert isinstance(outcome, Duplicate)
        assert outcome.original.response_id == turn.response_id
    else:
        assert isinstance(outcome, Promoted)
    one_turn_history(healthy, turn)


@pytest.mark.parametrize("land", [True, False])
def test_loop_write_with_unknown_outcome_is_settled_by_promote(store_session, healthy, land):
    """On the event loop an unknown outcome is not settled (its SERIAL read would block
    the loop): None, and the thread path's ``promote`` finds the write that landed as
    the request's own promotion (accepted, replayed), or writes it."""
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    session = FlakySession(store_session, batch, cas_timeout, land=land)
    store = CassandraCheckpointStore(session, timeout_s=30)
    assert store.start_claiming(ResponseClaim.of(turn))() == ResponseClaim.of(turn)
    assert asyncio.run(store.promote_from_hints_async(turn)) is None
    assert session.tripped and session.sent == int(land)
    settled_by_promote(store, healthy, turn, land)


@pytest.mark.parametrize("error", [client_timeout, cas_timeout, connection_lost])
@pytest.mark.parametrize("land", [True, False])
def test_a_claim_awaited_with_unknown_outcome_is_never_taken(store_session, healthy, land,
                                                              error):
    """``claim_async`` (the worker's loop path, here on cassandra-driver's callbacks) does
    not settle an unknown outcome (its SERIAL read would block the loop): a retryable
    ``StoreUnavailable``, never the claim taken as ours (the batch would then be written
    for a response id the request may not hold) and never a bare driver error.
    ``promote`` claims again and finds the holder: the request itself (a mutation
    review, session 45: either change passed every test)."""
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    session = FlakyClaimSession(store_session, error, land=land)
    store = CassandraCheckpointStore(session, timeout_s=30)
    with pytest.raises(StoreUnavailable) as caught:
        asyncio.run(store.claim_async(ResponseClaim.of(turn)))
    assert caught.value.retryable and session.tripped
    assert isinstance(store.promote(turn), Promoted)
    one_turn_history(healthy, turn)


@pytest.fixture
def loop_runner(store_session, settings):
    """An event loop and a C++ driver session (``LoopSession``) on the store's keyspace."""
    from services.cassandra_loop import LoopSession  # noqa: PLC0415 - the C++ driver

    runner = asyncio.Runner()
    session = LoopSession(dataclasses.replace(settings, keyspace=store_session.keyspace))
    yield runner, session
    runner.run(session.close())
    runner.close()


@pytest.mark.parametrize("land", [True, False])
def test_the_c_drivers_claim_with_unknown_outcome_is_never_taken(store_session, healthy,
                                                                  loop_runner, land):
    """The same through the C++ driver (``loop_session``): its failed claim is a
    retryable ``StoreUnavailable``, never the claim taken as ours."""
    runner, real = loop_runner
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    flaky = FlakyLoopSession(real, kind="claim", land=land)
    store = CassandraCheckpointStore(store_session, timeout_s=30, loop_session=flaky)
    with pytest.raises(StoreUnavailable) as caught:
        runner.run(store.claim_async(ResponseClaim.of(turn)))
    assert caught.value.retryable and flaky.tripped
    assert isinstance(store.promote(turn), Promoted)
    one_turn_history(healthy, turn)


@pytest.mark.parametrize("land", [True, False])
def test_the_c_drivers_batch_with_unknown_outcome_is_never_taken(store_session, healthy,
                                                                  loop_runner, land):
    """The promotion batch through the C++ driver: an unknown outcome is not settled on
    the loop (a retryable ``StoreUnavailable``; the processor hands the record to the
    thread path), never ``Promoted``; ``promote`` then finds a batch that landed as the
    request's own promotion, or writes it (a mutation review, session 45: a failed
    batch taken as applied passed every test)."""
    runner, real = loop_runner
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    flaky = FlakyLoopSession(real, kind="batch", land=land)
    store = CassandraCheckpointStore(store_session, timeout_s=30, loop_session=flaky)
    assert runner.run(store.claim_async(ResponseClaim.of(turn))) == ResponseClaim.of(turn)
    with pytest.raises(StoreUnavailable) as caught:
        runner.run(store.promote_from_hints_async(turn))
    assert caught.value.retryable and flaky.tripped
    settled_by_promote(store, healthy, turn, land)
