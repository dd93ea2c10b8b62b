"""Every conditional write of the Cassandra ledger whose outcome is unknown is resolved
by a SERIAL read (or said retryable), never guessed (CONTRACT 4).

``FlakySession`` wraps a real session: the chosen LWT (a prepared statement or a
conditional batch) is sent and THEN an error is raised (it landed), or the error is
raised WITHOUT sending it (it did not). A retry must not read its own landed write as
someone else's (a claim "in progress", an effect "in conflict", a takeover counted
twice).
"""

from __future__ import annotations

import pytest

from ratchet.domain.claims import ClaimState, CompletionState, EffectPolicy
from services.ledger.base import Cancellation, Decision, EffectWrite, LedgerUnavailable
from services.ledger.cassandra import CassandraLedger
from tests.contract.store_support import migrated_keyspace, uid
from tests.contract.test_ledger_contract import LEASE, NOW, claim_request, effect, output_for
from tests.integration.flaky_session import (
    UNKNOWN_OUTCOMES,
    FlakySession,
    batch,
    cas_timeout,
    query,
    serial_reads_only,
)

pytestmark = pytest.mark.integration

ERRORS = UNKNOWN_OUTCOMES


@pytest.fixture(scope="module")
def ledger_session(cassandra_cluster, settings):
    """A keyspace of its own with every migration applied (the ledger's tables)."""
    yield from migrated_keyspace(cassandra_cluster, settings, "ledger_lwt")


INSERT_EFFECT = query("'effect', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false, ?) IF NOT EXISTS")
MARK_CONFLICTED = query("SET conflicted = true")
TAKE_OVER = query("SET attempt = ?, call_id = ?, claim_token = ?")
COMPLETE = query("SET claim_completed = true")
INSERT_DECISION = query("'decision', ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS")


@pytest.fixture
def healthy(ledger_session):
    return CassandraLedger(ledger_session, timeout_s=30)


def flaky(ledger_session, match, error, **kw) -> tuple[FlakySession, CassandraLedger]:
    session = FlakySession(ledger_session, match, error, **kw)
    return session, CassandraLedger(session, timeout_s=30)


# -- tool effects -------------------------------------------------------------------------

@pytest.mark.parametrize("error", ERRORS)
def test_effect_that_landed_is_never_a_conflict(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, INSERT_EFFECT, error, land=True)
    mine = effect(tenant, key, "e1")
    # ours or a redelivery's: the row has no writer's token, and callers treat both alike
    assert ledger.record_effect(mine) in (EffectWrite.RECORDED, EffectWrite.ALREADY_RECORDED)
    assert session.sent == 1
    serial_reads_only(session)
    (stored,) = healthy.effects_for(tenant, key)
    assert not stored.conflicted and stored.output_digest == mine.output_digest
    assert healthy.record_effect(mine) is EffectWrite.ALREADY_RECORDED


@pytest.mark.parametrize("error", ERRORS)
def test_effect_that_did_not_land_is_retryable(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, INSERT_EFFECT, error, land=False)
    mine = effect(tenant, key, "e1")
    with pytest.raises(LedgerUnavailable):
        ledger.record_effect(mine)
    serial_reads_only(session)
    assert not healthy.effects_for(tenant, key)
    assert ledger.record_effect(mine) is EffectWrite.RECORDED  # the processor's retry


def test_effect_written_by_another_meanwhile_is_a_conflict(ledger_session, healthy):
    tenant, key = uid("tenant"), uid("key")
    rival = effect(tenant, key, "e1", "d_rival")
    _, ledger = flaky(ledger_session, INSERT_EFFECT, cas_timeout, land=False,
                      meanwhile=lambda: healthy.record_effect(rival))
    assert ledger.record_effect(effect(tenant, key, "e1")) is EffectWrite.CONFLICT
    (stored,) = healthy.effects_for(tenant, key)
    assert stored.conflicted and stored.output_digest == "d_rival"


def test_unresolvable_landed_effect_is_retryable_then_already_recorded(ledger_session,
                                                                        healthy):
    tenant, key = uid("tenant"), uid("key")
    mine = effect(tenant, key, "e1")
    _, ledger = flaky(ledger_session, INSERT_EFFECT, cas_timeout, land=True, break_reads=True)
    with pytest.raises(LedgerUnavailable):
        ledger.record_effect(mine)
    assert healthy.record_effect(mine) is EffectWrite.ALREADY_RECORDED


@pytest.mark.parametrize("land", [True, False])
def test_conflict_mark_with_unknown_outcome_is_retryable_and_idempotent(ledger_session,
                                                                         healthy, land):
    tenant, key = uid("tenant"), uid("key")
    healthy.record_effect(effect(tenant, key, "e1"))
    _, ledger = flaky(ledger_session, MARK_CONFLICTED, cas_timeout, land=land)
    second = effect(tenant, key, "e1", "d2")
    with pytest.raises(LedgerUnavailable):
        ledger.record_effect(second)
    assert ledger.record_effect(second) is EffectWrite.CONFLICT  # the retry
    (stored,) = healthy.effects_for(tenant, key)
    assert stored.conflicted and stored.output_digest == "d1"


# -- cancellations ------------------------------------------------------------------------

@pytest.mark.parametrize("error", ERRORS)
def test_cancellation_that_landed_is_recorded(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, batch, error, land=True)
    ledger.record_cancellation(Cancellation(tenant, key, "resp_a", NOW, "conv_1"))
    assert session.sent == 1
    assert healthy.cancellation(tenant, key, "conv_1") == Cancellation(
        tenant, key, "resp_a", NOW, "conv_1")
    # the flag came with it: no new claim
    assert healthy.claim_effect(claim_request(tenant, key), NOW).state is ClaimState.CANCELLED


@pytest.mark.parametrize("error", ERRORS)
def test_cancellation_with_unknown_outcome_is_read_at_serial(ledger_session, error):
    """A QUORUM read does not complete a Paxos round still in flight: a cancellation
    it does not see may land after it (CONTRACT 4: resolved by a SERIAL read)."""
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, batch, error, land=True)
    ledger.record_cancellation(Cancellation(tenant, key, "resp_a", NOW, "conv_1"))
    serial_reads_only(session)


@pytest.mark.parametrize("error", ERRORS)
def test_cancellation_that_did_not_land_is_retryable(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, batch, error, land=False)
    cancel = Cancellation(tenant, key, "resp_a", NOW, "conv_1")
    with pytest.raises(LedgerUnavailable):
        ledger.record_cancellation(cancel)
    serial_reads_only(session)
    assert not healthy.cancellations(tenant, key)
    ledger.record_cancellation(cancel)  # the processor's retry
    assert healthy.cancellation(tenant, key, "conv_1") == cancel


def test_cancellation_of_another_meanwhile_stands(ledger_session, healthy):
    tenant, key = uid("tenant"), uid("key")
    first = Cancellation(tenant, key, "resp_first", NOW, "conv_1")
    _, ledger = flaky(ledger_session, batch, cas_timeout, land=False,
                      meanwhile=lambda: healthy.record_cancellation(first))
    ledger.record_cancellation(Cancellation(tenant, key, "resp_b", NOW + 1, "conv_1"))
    assert healthy.cancellation(tenant, key, "conv_1") == first


# -- effect claims --------------------------------------------------------------------------

@pytest.mark.parametrize("error", ERRORS)
def test_claim_that_landed_is_ours(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, batch, error, land=True)
    mine = claim_request(tenant, key)
    answer = ledger.claim_effect(mine, NOW)
    assert (answer.state, answer.claim.token) == (ClaimState.CLAIMED, mine.token)
    assert session.sent == 1  # read, not written again
    serial_reads_only(session)
    # the gateway's re-send (its answer was lost) is the same claimant
    assert healthy.claim_effect(mine, NOW + 1).state is ClaimState.CLAIMED


@pytest.mark.parametrize("error", ERRORS)
def test_claim_that_did_not_land_is_written_again(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    session, ledger = flaky(ledger_session, batch, error, land=False)
    mine = claim_request(tenant, key)
    answer = ledger.claim_effect(mine, NOW)
    assert (answer.state, answer.claim.token) == (ClaimState.CLAIMED, mine.token)
    assert session.sent == 1
    assert healthy.claim(tenant, key, mine.effect_id).token == mine.token


def test_claim_of_another_meanwhile_is_in_progress(ledger_session, healthy):
    tenant, key = uid("tenant"), uid("key")
    rival = claim_request(tenant, key)
    _, ledger = flaky(ledger_session, batch, cas_timeout, land=False,
                      meanwhile=lambda: healthy.claim_effect(rival, NOW))
    answer = ledger.claim_effect(claim_request(tenant, key, attempt=2), NOW)
    assert (answer.state, answer.claim.token) == (ClaimState.IN_PROGRESS, rival.token)


def test_cancellation_meanwhile_refuses_a_claim_that_did_not_land(ledger_session, healthy):
    tenant, key = uid("tenant"), uid("key")
    _, ledger = flaky(ledger_session, batch, cas_timeout, land=False, meanwhile=lambda:
                      healthy.record_cancellation(Cancellation(tenant, key, "r", NOW)))
    assert ledger.claim_effect(claim_request(tenant, key), NOW).state is ClaimState.CANCELLED


def test_unresolvable_landed_claim_is_retryable_and_ours_when_sent_again(ledger_session,
                                                                         healthy):
    tenant, key = uid("tenant"), uid("key")
    mine = claim_request(tenant, key)
    _, ledger = flaky(ledger_session, batch, cas_timeout, land=True, break_reads=True)
    with pytest.raises(LedgerUnavailable):
        ledger.claim_effect(mine, NOW)
    assert healthy.claim_effect(mine, NOW + 1).state is ClaimState.CLAIMED


@pytest.mark.parametrize("land", [True, False])
@pytest.mark.parametrize("error", ERRORS)
def test_takeover_with_unknown_outcome_is_counted_once(ledger_session, healthy, error, land):
    tenant, key = uid("tenant"), uid("key")
    vanished = claim_request(tenant, key, policy=EffectPolicy.AT_LEAST_ONCE)
    healthy.claim_effect(vanished, NOW)
    taker = claim_request(tenant, key, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
    session, ledger = flaky(ledger_session, TAKE_OVER, error, land=land)
    later = NOW + 2 * LEASE
    answer = ledger.claim_effect(taker, later)
    assert (answer.state, answer.claim.token, answer.previous_attempt) == (
        ClaimState.CLAIMED, taker.token, 1)
    assert session.sent == 1
    serial_reads_only(session)
    stored = healthy.claim(tenant, key, taker.effect_id)
    assert (stored.token, stored.takeovers, stored.taken_over_call_ids,
            stored.previous_attempt, stored.lease_until) == (
        taker.token, 1, (vanished.call_id,), 1, later + LEASE)
    # the taker's re-sent call: its claim, not a second takeover
    again = healthy.claim_effect(taker, later + 1)
    assert (again.state, again.previous_attempt, again.claim.takeovers) == (
        ClaimState.CLAIMED, 1, 1)


@pytest.mark.parametrize("land", [True, False])
def test_lease_renewal_with_unknown_outcome_renews_once(ledger_session, healthy, land):
    tenant, key = uid("tenant"), uid("key")
    mine = claim_request(tenant, key)
    healthy.claim_effect(mine, NOW)
    session, ledger = flaky(ledger_session, TAKE_OVER, cas_timeout, land=land)
    later = NOW + 2 * LEASE
    answer = ledger.claim_effect(mine, later)  # re-sent after the lease ran out
    assert (answer.state, answer.claim.lease_until) == (ClaimState.CLAIMED, later + LEASE)
    assert session.sent == 1
    stored = healthy.claim(tenant, key, mine.effect_id)
    assert (stored.token, stored.takeovers, stored.lease_until, stored.claimed_at) == (
        mine.token, 0, later + LEASE, later)


# -- claim completions ----------------------------------------------------------------------

@pytest.mark.parametrize("error", ERRORS)
def test_completion_that_landed_is_completed(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    mine = claim_request(tenant, key)
    healthy.claim_effect(mine, NOW)
    session, ledger = flaky(ledger_session, COMPLETE, error, land=True)
    out = output_for(mine)
    state, claim = ledger.complete_claim(tenant, key, mine.effect_id, mine.token,
                                         "succeeded", out, NOW + 1)
    assert (state, claim.completed, claim.output_digest) == (
        CompletionState.COMPLETED, True, out.content_digest)
    assert session.sent == 1
    serial_reads_only(session)


@pytest.mark.parametrize("error", ERRORS)
def test_completion_that_did_not_land_is_retryable(ledger_session, healthy, error):
    tenant, key = uid("tenant"), uid("key")
    mine = claim_request(tenant, key)
    healthy.claim_effect(mine, NOW)
    _, ledger = flaky(ledger_session, COMPLETE, error, land=False)
    out = output_for(mine)
    with pytest.raises(LedgerUnavailable):
        ledger.complete_claim(tenant, key, mine.effect_id, mine.token, "succeeded", out,
                              NOW + 1)
    assert not healthy.claim(tenant, key, mine.effect_id).completed
    # the gateway's re-send with the same token
    assert ledger.complete_claim(tenant, key, mine.effect_id, mine.token, "succeeded", out,
                                 NOW + 2)[0] is CompletionState.COMPLETED


@pytest.mark.parametrize("land", [True, False])
def test_completion_sent_again_after_it_landed_is_already_completed(ledger_session, healthy,
                                                                    land):
    """A completion re-sent after the first one landed (its answer lost) whose own
    outcome is unknown: ALREADY_COMPLETED, as the memory ledger and the healthy path
    answer it. (The re-send's write never applies: the claim is completed already.)"""
    tenant, key = uid("tenant"), uid("key")
    mine = claim_request(tenant, key)
    healthy.claim_effect(mine, NOW)
    out = output_for(mine)
    assert healthy.complete_claim(tenant, key, mine.effect_id, mine.token, "succeeded", out,
                                  NOW + 1)[0] is CompletionState.COMPLETED
    _, ledger = flaky(ledger_session, COMPLETE, cas_timeout, land=land)
    state, claim = ledger.complete_claim(tenant, key, mine.effect_id, mine.token,
                                         "succeeded", out, NOW + 2)
    assert (state, claim.completed_at) == (CompletionState.ALREADY_COMPLETED, NOW + 1)


def test_taken_over_meanwhile_is_not_holder(ledger_session, healthy):
    tenant, key = uid("tenant"), uid("key")
    slow = claim_request(tenant, key, policy=EffectPolicy.AT_LEAST_ONCE)
    healthy.claim_effect(slow, NOW)
    taker = claim_request(tenant, key, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
    _, ledger = flaky(ledger_session, COMPLETE, cas_timeout, land=False,
                      meanwhile=lambda: healthy.claim_effect(taker, NOW + 2 * LEASE))
    state, claim = ledger.complete_claim(tenant, key, slow.effect_id, slow.token,
                                         "succeeded", output_for(slow), NOW + 2 * LEASE)
    assert (state, claim.token) == (CompletionState.NOT_HOLDER, taker.token)


def test_unresolvable_landed_completion_is_retryable_then_already_completed(ledger_session,
                                                                            healthy):
    tenant, key = uid("tenant"), uid("key")
    mine = claim_request(tenant, key)
    healthy.claim_effect(mine, NOW)
    out = output_for(mine)
    _, ledger = flaky(ledger_session, COMPLETE, cas_timeout, land=True, break_reads=True)
    with pytest.raises(LedgerUnavailable):
        ledger.complete_claim(tenant, key, mine.effect_id, mine.token, "succeeded", out,
                              NOW + 1)
    assert healthy.complete_claim(tenant, key, mine.effect_id, mine.token, "succeeded", out,
                                  NOW + 2)[0] is CompletionState.ALREADY_COMPLETED


# -- decisions ----------------------------------------------------------------------------

def decision(tenant: str, key: str, event: str, reason: str = "STALE_TURN") -> Decision:
    return Decision(event_id=event, tenant_id=tenant, response_id=uid("resp"),
                    outcome="rejected", reason=reason, detail="", seq=1, decided_at=NOW,
                    idempotency_key=key)


@pytest.mark.parametrize("land", [True, False])
@pytest.mark.parametrize("error", ERRORS)
def test_decision_with_unknown_outcome(ledger_session, healthy, error, land):
    tenant, key, event = uid("tenant"), uid("key"), uid("evt")
    session, ledger = flaky(ledger_session, INSERT_DECISION, error, land=land)
    mine = decision(tenant, key, event)
    if land:
        assert ledger.record_decision(mine) == mine
    else:
        with pytest.raises(LedgerUnavailable):  # settled, not written: the processor retries
            ledger.record_decision(mine)
        assert ledger.record_decision(mine) == mine
    serial_reads_only(session)
    assert healthy.decision(event, tenant_id=tenant, idempotency_key=key) == mine


def test_decision_of_another_worker_meanwhile_holds(ledger_session, healthy):
    tenant, key, event = uid("tenant"), uid("key"), uid("evt")
    first = decision(tenant, key, event, "DUPLICATE")
    _, ledger = flaky(ledger_session, INSERT_DECISION, cas_timeout, land=False,
                      meanwhile=lambda: healthy.record_decision(first))
    assert ledger.record_decision(decision(tenant, key, event)) == first
