"""One contract for both ``Ledger`` backends (memory, and Cassandra as an integration
test): the processor relies on them answering alike."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from ratchet.domain import claims
from ratchet.domain.claims import ClaimRequest, ClaimState, CompletionState, EffectPolicy
from ratchet.domain.promotion import RecordedEffect
from schemas import items as item_builders
from services.ledger.base import (
    Cancellation,
    Decision,
    EffectWrite,
    Ledger,
    ResponseState,
)
from services.ledger.memory import MemoryLedger
from tests.contract.store_support import uid


def effect(tenant: str, key: str, effect_id: str, digest: str = "d1", **kw) -> RecordedEffect:
    fields = dict(tenant_id=tenant, idempotency_key=key, effect_id=effect_id, attempt=1,
                  subturn_index=0, call_id=f"call_{effect_id}", tool_name="lookup",
                  arguments_digest="args", status="succeeded", output_item_id="out",
                  output_digest=digest, executed_at=1_700_000_000_000)
    fields.update(kw)
    return RecordedEffect(**fields)


NOW = 1_900_000_000_000
LEASE = 10_000


def claim_request(tenant: str, key: str, *, attempt: int = 1, token: str | None = None,
                  args: str = "args1", policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE,
                  subturn: int = 0, occurrence: int = 0) -> ClaimRequest:
    return ClaimRequest(
        tenant_id=tenant, idempotency_key=key,
        effect_id=claims.effect_id_for_claim(key, subturn, "send_email", occurrence),
        attempt=attempt, subturn_index=subturn, call_id=uid("call"), tool_name="send_email",
        arguments_digest=args, token=token or uid("tok"), lease_ms=LEASE, policy=policy)


def output_for(request: ClaimRequest, text: str = "sent"):
    return item_builders.function_call_output(request.call_id, text, item_id=uid("out"))


class LedgerContract:
    def make_ledger(self) -> Ledger:
        raise NotImplementedError

    @pytest.fixture
    def ledger(self) -> Ledger:
        return self.make_ledger()

    @pytest.fixture
    def tenant(self) -> str:
        return uid("tenant")

    def test_effects_dedupe_and_conflict(self, ledger, tenant):
        key = uid("key")
        first = effect(tenant, key, "e2")
        assert ledger.record_effect(first) is EffectWrite.RECORDED
        assert ledger.record_effect(first) is EffectWrite.ALREADY_RECORDED
        assert ledger.record_effect(effect(tenant, key, "e1", attempt=2)) is EffectWrite.RECORDED
        assert ledger.record_effect(effect(tenant, key, "e2", "d2")) is EffectWrite.CONFLICT
        effects = list(ledger.effects_for(tenant, key))
        assert [e.effect_id for e in effects] == ["e1", "e2"]
        assert effects[0] == effect(tenant, key, "e1", attempt=2)
        assert effects[1].conflicted and effects[1].output_digest == "d1"

    def test_cancellation_first_wins(self, ledger, tenant):
        key = uid("key")
        assert ledger.cancellation(tenant, key) is None
        ledger.record_cancellation(Cancellation(tenant, key, "resp_a", 1))
        ledger.record_cancellation(Cancellation(tenant, key, "resp_b", 2))
        assert ledger.cancellation(tenant, key) == Cancellation(tenant, key, "resp_a", 1)

    def test_cancellations_are_kept_by_scope(self, ledger, tenant):
        """One key in two Conversations names two requests: each scope's first
        cancellation wins in that scope, and a turn's facts hold its scope's only."""
        key = uid("key")
        ledger.record_cancellation(Cancellation(tenant, key, "resp_a", 1, "conv_1"))
        ledger.record_cancellation(Cancellation(tenant, key, "resp_b", 2, "conv_1"))
        ledger.record_cancellation(Cancellation(tenant, key, "resp_c", 3, "conv_2"))
        assert ledger.cancellation(tenant, key, "conv_1") == Cancellation(
            tenant, key, "resp_a", 1, "conv_1")
        assert ledger.cancellation(tenant, key, "conv_2") == Cancellation(
            tenant, key, "resp_c", 3, "conv_2")
        assert ledger.cancellation(tenant, key, "conv_3") is None
        assert ledger.cancellation(tenant, key, "") is None  # a chain's first responses
        assert ledger.cancellation(tenant, key) is not None  # of any scope
        for scope, expected in (("conv_2", "resp_c"), ("conv_3", None)):
            facts = ledger.turn_facts(event_id=uid("evt"), tenant_id=tenant,
                                      idempotency_key=key, conversation_id=None, scope=scope)
            assert (facts.cancellation and facts.cancellation.response_id) == expected

    def test_a_cancellation_recorded_before_scopes_cancels_every_scope(self, ledger, tenant):
        key = uid("key")
        ledger.record_cancellation(Cancellation(tenant, key, "resp_a", 1))
        for scope in ("conv_1", "", None):
            assert ledger.cancellation(tenant, key, scope) == Cancellation(
                tenant, key, "resp_a", 1)

    def test_effects_are_facts_of_their_scope(self, ledger, tenant):
        """An effect id recorded in one scope is FOREIGN to another (nothing changes:
        not conflicted); a turn's facts hold its scope's effects and those recorded
        before scopes."""
        key = uid("key")
        assert ledger.record_effect(effect(tenant, key, "e1", scope="conv_1")) is (
            EffectWrite.RECORDED)
        assert ledger.record_effect(effect(tenant, key, "e1", "d2", scope="conv_2")) is (
            EffectWrite.FOREIGN)
        assert ledger.record_effect(effect(tenant, key, "e2", scope="conv_2")) is (
            EffectWrite.RECORDED)
        assert ledger.record_effect(effect(tenant, key, "e3")) is EffectWrite.RECORDED
        (e1,) = [e for e in ledger.effects_for(tenant, key) if e.effect_id == "e1"]
        assert (e1.scope, e1.output_digest, e1.conflicted) == ("conv_1", "d1", False)
        for scope, ids in (("conv_1", ["e1", "e3"]), ("conv_2", ["e2", "e3"]),
                           (None, ["e1", "e2", "e3"])):
            facts = ledger.turn_facts(event_id=uid("evt"), tenant_id=tenant,
                                      idempotency_key=key, conversation_id=None, scope=scope)
            assert [e.effect_id for e in facts.effects] == ids, scope

    def test_an_effect_recorded_before_scopes_is_the_keys_in_every_scope(self, ledger,
                                                                          tenant):
        """docs/gateway-protocol.md section 6: facts recorded before scopes existed are
        facts of the key in every scope: an effect id recorded without a scope and again
        with one (or the other way round) is the same effect, never ``FOREIGN`` (a
        mutation review, session 45: the memory ledger calling it foreign passed every
        test)."""
        key, other = uid("key"), uid("key")
        assert ledger.record_effect(effect(tenant, key, "e1")) is EffectWrite.RECORDED
        assert ledger.record_effect(effect(tenant, key, "e1", scope="conv_1")) is (
            EffectWrite.ALREADY_RECORDED)
        assert ledger.record_effect(effect(tenant, key, "e1", "d2", scope="conv_2")) is (
            EffectWrite.CONFLICT)
        assert ledger.record_effect(effect(tenant, other, "e1", scope="conv_1")) is (
            EffectWrite.RECORDED)
        assert ledger.record_effect(effect(tenant, other, "e1")) is (
            EffectWrite.ALREADY_RECORDED)

    def test_decisions_first_wins(self, ledger, tenant):
        event, key = uid("evt"), uid("key")
        first = Decision(event, tenant, "resp_a", "rejected", "CONFLICT", "d", 3, 10, "resp_x",
                         idempotency_key=key)
        assert ledger.decision(event, tenant_id=tenant, idempotency_key=key) is None
        assert ledger.record_decision(first) == first
        later = Decision(event, tenant, "resp_a", "rejected", "OUT_OF_ORDER", "", None, 11,
                         idempotency_key=key)
        assert ledger.record_decision(later) == first
        assert ledger.decision(event, tenant_id=tenant, idempotency_key=key) == first
        # filed under its request: another request's (or tenant's) lookup does not see it
        assert ledger.decision(event, tenant_id=tenant, idempotency_key=uid("key")) is None
        assert ledger.decision(event, tenant_id=uid("tenant"), idempotency_key=key) is None
        bare = Decision(uid("evt"), tenant, "resp_b", "rejected", "CONFLICT", "", None, 12)
        with pytest.raises(ValueError):
            ledger.record_decision(bare)

    def test_decisions_of_two_tenants_reusing_one_event_id_stay_apart(self, ledger, tenant):
        # Filed under (tenant, idempotency key, event id), like the Cassandra ledger: a
        # tenant's turn reusing another tenant's event id gets its own decision recorded
        # and read back, never the other tenant's.
        event, key, other = uid("evt"), uid("key"), uid("tenant")
        mine = Decision(event, tenant, "resp_a", "rejected", "CONFLICT", "mine", 3, 10,
                        idempotency_key=key)
        theirs = Decision(event, other, "resp_b", "rejected", "CORRUPT", "theirs", None, 11,
                          idempotency_key=key)
        assert ledger.record_decision(mine) == mine
        assert ledger.record_decision(theirs) == theirs
        assert ledger.decision(event, tenant_id=tenant, idempotency_key=key) == mine
        assert ledger.decision(event, tenant_id=other, idempotency_key=key) == theirs
        facts = ledger.turn_facts(event_id=event, tenant_id=other, idempotency_key=key,
                                  conversation_id=None)
        assert facts.decision == theirs
        # the same tenant, another request reusing the event id: its own decision too
        again = Decision(event, tenant, "resp_c", "rejected", "OUT_OF_ORDER", "", None, 12,
                         idempotency_key=uid("key"))
        assert ledger.record_decision(again) == again
        assert ledger.decision(event, tenant_id=tenant, idempotency_key=key) == mine

    def test_turn_facts_reads_the_events_own_decision(self, ledger, tenant):
        key = uid("key")
        mine, other = uid("evt"), uid("evt")
        ledger.record_decision(Decision(other, tenant, "resp_1", "rejected", "CONFLICT", "",
                                        1, 10, idempotency_key=key))
        facts = ledger.turn_facts(event_id=mine, tenant_id=tenant, idempotency_key=key,
                                  conversation_id=None)
        assert facts.decision is None
        ledger.record_decision(Decision(mine, tenant, "resp_2", "rejected", "OUT_OF_ORDER",
                                        "late", None, 11, idempotency_key=key))
        ledger.record_effect(effect(tenant, key, "e1"))
        ledger.record_cancellation(Cancellation(tenant, key, "resp_2", 5))
        facts = ledger.turn_facts(event_id=mine, tenant_id=tenant, idempotency_key=key,
                                  conversation_id=None)
        assert facts.decision == Decision(mine, tenant, "resp_2", "rejected", "OUT_OF_ORDER",
                                          "late", None, 11, idempotency_key=key)
        assert facts.effects == (effect(tenant, key, "e1"),)
        assert facts.cancellation == Cancellation(tenant, key, "resp_2", 5)

    def test_turn_facts_and_promotion_bookkeeping(self, ledger, tenant):
        key, conv, resp, event = uid("key"), uid("conv"), uid("resp"), uid("evt")
        empty = ledger.turn_facts(event_id=event, tenant_id=tenant, idempotency_key=key,
                                  conversation_id=conv)
        assert (empty.decision, empty.effects, empty.cancellation,
                empty.conversation_owner) == (None, (), None, None)
        ledger.record_effect(effect(tenant, key, "e1"))
        ledger.record_cancellation(Cancellation(tenant, key, resp, 5))
        ledger.start_recording_owners(tenant_id=tenant, response_id=resp, conversation_id=conv)()
        facts = ledger.turn_facts(event_id=event, tenant_id=tenant, idempotency_key=key,
                                  conversation_id=conv)
        assert facts.effects == (effect(tenant, key, "e1"),)
        assert facts.cancellation == Cancellation(tenant, key, resp, 5)
        assert facts.conversation_owner == tenant
        no_owner_asked = ledger.turn_facts(event_id=event, tenant_id=tenant,
                                           idempotency_key=key, conversation_id=None)
        assert no_owner_asked.conversation_owner is None
        assert ledger.response_owner(resp) == tenant
        assert ledger.conversation_owner(conv) == tenant

    def test_owners_are_recorded_one_at_a_time_or_not_at_all(self, ledger, tenant):
        conv, resp = uid("conv"), uid("resp")
        ledger.start_recording_owners(tenant_id=tenant, response_id=None, conversation_id=None)()
        ledger.start_recording_owners(tenant_id=tenant, response_id=None, conversation_id=conv)()
        assert ledger.conversation_owner(conv) == tenant
        assert ledger.response_owner(resp) is None
        ledger.start_recording_owners(tenant_id=tenant, response_id=resp, conversation_id=None)()
        assert ledger.response_owner(resp) == tenant

    def test_an_owner_row_holds_the_last_tenant_written(self, ledger, tenant):
        """Owner rows are plain writes on both backends: the last one stands. Response
        ids are per tenant, so two tenants may record one id; a reader never trusts
        the row alone (``StoreAnswers.chain_owner`` checks the checkpoints). A
        Conversation's owner is written by its partition's one lane, after reading
        that none was there (docs/processor.md), so it is never written twice."""
        other, conv, resp = uid("tenant-b"), uid("conv"), uid("resp")
        for who in (tenant, other):
            ledger.start_recording_owners(tenant_id=who, response_id=resp,
                                          conversation_id=conv)()
        assert ledger.response_owner(resp) == other
        assert ledger.conversation_owner(conv) == other

    def test_status_is_the_latest_rejection_and_tenants_are_separate(self, ledger, tenant):
        resp = uid("resp")
        assert ledger.status(tenant, resp).status is ResponseState.UNKNOWN
        ledger.mark_rejected(tenant, resp, "CONFLICT", "detail")
        rejected = ledger.status(tenant, resp)
        assert (rejected.status, rejected.reason, rejected.detail) == (
            ResponseState.REJECTED, "CONFLICT", "detail")
        ledger.mark_rejected(tenant, resp, "DUPLICATE", "", "resp_original")
        latest = ledger.status(tenant, resp)
        assert (latest.status, latest.reason, latest.existing_response_id) == (
            ResponseState.REJECTED, "DUPLICATE", "resp_original")
        assert ledger.status(uid("tenant"), resp).status is ResponseState.UNKNOWN

    def test_status_of_a_duplicate_names_the_original(self, ledger, tenant):
        retry, original = uid("resp"), uid("resp")
        ledger.mark_rejected(tenant, retry, "DUPLICATE", "already promoted", original)
        status = ledger.status(tenant, retry)
        assert (status.status, status.reason, status.existing_response_id) == (
            ResponseState.REJECTED, "DUPLICATE", original)

    def test_status_awaited_is_the_status(self, ledger, tenant):
        """``status_async`` (the API's wait_ms path, on its event loop) reads the same."""
        unknown, rejected = uid("resp"), uid("resp")
        ledger.mark_rejected(tenant, rejected, "DUPLICATE", "", "resp_original")
        for resp in (unknown, rejected):
            assert asyncio.run(ledger.status_async(tenant, resp)) == ledger.status(tenant, resp)


    # -- effect claims --------------------------------------------------------------------
    def test_claim_in_progress_reclaim_and_conflict(self, ledger, tenant):
        key = uid("key")
        first = claim_request(tenant, key)
        won = ledger.claim_effect(first, NOW)
        assert won.state is ClaimState.CLAIMED
        assert (won.claim.token, won.claim.lease_until, won.claim.attempt) == (
            first.token, NOW + LEASE, 1)
        # the claim call itself re-sent (same token): the same claim, not a new one
        assert ledger.claim_effect(first, NOW + 5).claim == won.claim
        other = claim_request(tenant, key, attempt=2)
        busy = ledger.claim_effect(other, NOW + 4_000)
        assert (busy.state, busy.wait_ms, busy.claim.attempt) == (
            ClaimState.IN_PROGRESS, LEASE - 4_000, 1)
        conflict = ledger.claim_effect(claim_request(tenant, key, args="args2"), NOW)
        assert conflict.state is ClaimState.CONFLICT and conflict.claim.token == first.token
        assert [c.effect_id for c in ledger.claims_for(tenant, key)] == [first.effect_id]

    def test_complete_then_reuse(self, ledger, tenant):
        key = uid("key")
        first = claim_request(tenant, key)
        ledger.claim_effect(first, NOW)
        out = output_for(first)
        state, done = ledger.complete_claim(tenant, key, first.effect_id, first.token,
                                            "succeeded", out, NOW + 1)
        assert state is CompletionState.COMPLETED
        assert (done.completed, done.status, done.output, done.completed_at) == (
            True, "succeeded", out, NOW + 1)
        assert ledger.complete_claim(tenant, key, first.effect_id, first.token, "succeeded",
                                     out, NOW + 2)[0] is CompletionState.ALREADY_COMPLETED
        other_out = output_for(first, "other")
        assert ledger.complete_claim(tenant, key, first.effect_id, first.token, "succeeded",
                                     other_out, NOW + 2)[0] is CompletionState.OUTCOME_CONFLICT
        assert ledger.complete_claim(tenant, key, first.effect_id, uid("tok"), "succeeded",
                                     out, NOW + 2)[0] is CompletionState.NOT_HOLDER
        # a retry (new attempt, new call id, long after the lease) gets the output back
        retry = claim_request(tenant, key, attempt=2)
        reused = ledger.claim_effect(retry, NOW + 10 * LEASE)
        assert (reused.state, reused.claim.output, reused.claim.attempt) == (
            ClaimState.COMPLETED, out, 1)
        assert ledger.complete_claim(tenant, key, claims.effect_id_for_claim(
            key, 5, "send_email", 0), first.token, "succeeded", out,
            NOW)[0] is CompletionState.UNKNOWN_CLAIM

    def test_expired_lease_under_each_policy(self, ledger, tenant):
        key = uid("key")
        crashed = claim_request(tenant, key)
        ledger.claim_effect(crashed, NOW)
        later = NOW + LEASE
        careful = ledger.claim_effect(claim_request(tenant, key, attempt=2), later)
        assert (careful.state, careful.claim.token) == (ClaimState.LEASE_EXPIRED, crashed.token)
        taker = claim_request(tenant, key, attempt=3, policy=EffectPolicy.AT_LEAST_ONCE)
        took = ledger.claim_effect(taker, later + 1)
        assert (took.state, took.previous_attempt, took.claim.attempt, took.claim.token,
                took.claim.lease_until, took.claim.takeovers) == (
            ClaimState.CLAIMED, 1, 3, taker.token, later + 1 + LEASE, 1)
        # the crashed holder wakes up: its outcome is refused, the new holder's recorded
        assert ledger.complete_claim(tenant, key, crashed.effect_id, crashed.token, "succeeded",
                                     output_for(crashed), later + 2)[0] is \
            CompletionState.NOT_HOLDER
        assert ledger.complete_claim(tenant, key, taker.effect_id, taker.token, "succeeded",
                                     output_for(taker), later + 2)[0] is CompletionState.COMPLETED

    def test_a_claim_resent_after_its_lease_ran_out_is_renewed_or_loses(self, ledger, tenant):
        """A holder whose claim answer was lost re-sends its token (rule 5) after the
        lease ran out. It used to get CLAIMED with the lease already over, while another
        attempt could take the same claim over: two holders told to run at once (found
        by an outside review of effect claims, session 25). The re-send now renews the
        lease by the takeover's conditional write; a taker that came first wins."""
        key = uid("key")
        lost = claim_request(tenant, key)
        ledger.claim_effect(lost, NOW)
        later = NOW + LEASE + 5
        again = ledger.claim_effect(lost, later)
        assert (again.state, again.claim.token, again.claim.lease_until, again.claim.takeovers) \
            == (ClaimState.CLAIMED, lost.token, later + LEASE, 0)
        taker = claim_request(tenant, key, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
        busy = ledger.claim_effect(taker, later + 1)  # the renewed lease is live
        assert (busy.state, busy.claim.token) == (ClaimState.IN_PROGRESS, lost.token)
        # The other order: a taker first, then the lost answer's re-send.
        key2 = uid("key")
        lost2 = claim_request(tenant, key2)
        ledger.claim_effect(lost2, NOW)
        taker2 = claim_request(tenant, key2, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
        assert ledger.claim_effect(taker2, later).state is ClaimState.CLAIMED
        late = ledger.claim_effect(lost2, later + 1)
        assert (late.state, late.claim.token) == (ClaimState.IN_PROGRESS, taker2.token)

    def test_a_takeover_keeps_the_holders_it_replaced(self, ledger, tenant):
        """What a takeover leaves of the holders it replaced (migration 015): their
        call ids, for the turns that answer them, and the attempt replaced, for a
        claim call re-sent with the takeover's token (found by an outside review)."""
        key = uid("key")
        first = claim_request(tenant, key)
        ledger.claim_effect(first, NOW)
        second = claim_request(tenant, key, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
        ledger.claim_effect(second, NOW + LEASE)
        third = claim_request(tenant, key, attempt=3, policy=EffectPolicy.AT_LEAST_ONCE)
        took = ledger.claim_effect(third, NOW + 3 * LEASE)
        assert (took.state, took.previous_attempt) == (ClaimState.CLAIMED, 2)
        again = ledger.claim_effect(third, NOW + 3 * LEASE + 1)  # its answer was lost
        assert (again.state, again.previous_attempt) == (ClaimState.CLAIMED, 2)
        stored = ledger.claim(tenant, key, third.effect_id)
        assert stored is not None
        assert (stored.taken_over_call_ids, stored.previous_attempt, stored.takeovers) == (
            (first.call_id, second.call_id), 2, 2)
        # the request's facts carry them too (a turn's effects rule reads them there)
        facts = ledger.turn_facts(event_id=uid("ev"), tenant_id=tenant, idempotency_key=key,
                                  conversation_id=None)
        assert [c.taken_over_call_ids for c in facts.claims] == [
            (first.call_id, second.call_id)]

    def test_cancelled_request_refuses_new_claims(self, ledger, tenant):
        key = uid("key")
        held = claim_request(tenant, key)
        ledger.claim_effect(held, NOW)
        done = claim_request(tenant, key, occurrence=1)
        ledger.claim_effect(done, NOW)
        ledger.complete_claim(tenant, key, done.effect_id, done.token, "succeeded",
                              output_for(done), NOW)
        ledger.record_cancellation(Cancellation(tenant, key, "resp_c", NOW))
        fresh = ledger.claim_effect(claim_request(tenant, key, occurrence=2), NOW)
        assert (fresh.state, fresh.claim) == (ClaimState.CANCELLED, None)
        taker = claim_request(tenant, key, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
        assert ledger.claim_effect(taker, NOW + 2 * LEASE).state is ClaimState.CANCELLED
        assert ledger.claim_effect(claim_request(tenant, key, occurrence=1),
                                   NOW).state is ClaimState.COMPLETED
        # the holder still records what happened (compensation needs to know)
        assert ledger.complete_claim(tenant, key, held.effect_id, held.token, "succeeded",
                                     output_for(held), NOW + 1)[0] is CompletionState.COMPLETED
        assert ledger.claim_effect(claim_request(tenant, key, occurrence=3),
                                   NOW).state is ClaimState.CANCELLED

    def test_a_cancellation_in_any_scope_cancels_the_keys_claims(self, ledger, tenant):
        """docs/gateway-protocol.md section 6: effect claims are found by tenant and key
        alone, and a cancellation in any scope makes the key's claims ``CANCELLED`` (a
        mutation review, session 45: the memory ledger refusing claims only after an
        unscoped cancellation passed every test)."""
        key = uid("key")
        ledger.record_cancellation(Cancellation(tenant, key, "resp_c", NOW, "conv_1"))
        answer = ledger.claim_effect(claim_request(tenant, key), NOW)
        assert (answer.state, answer.claim) == (ClaimState.CANCELLED, None)

    def test_claims_are_per_tenant_and_in_turn_facts(self, ledger, tenant):
        key = uid("key")
        mine = claim_request(tenant, key)
        ledger.claim_effect(mine, NOW)
        other_tenant = uid("tenant")
        theirs = claim_request(other_tenant, key)
        assert theirs.effect_id == mine.effect_id
        assert ledger.claim_effect(theirs, NOW).state is ClaimState.CLAIMED
        assert ledger.complete_claim(uid("tenant"), key, mine.effect_id, mine.token,
                                     "succeeded", output_for(mine),
                                     NOW)[0] is CompletionState.UNKNOWN_CLAIM
        facts = ledger.turn_facts(event_id=uid("evt"), tenant_id=tenant, idempotency_key=key,
                                  conversation_id=None)
        assert [c.token for c in facts.claims] == [mine.token]
        assert facts.effects == () and facts.cancellation is None

    def test_concurrent_claims_one_winner(self, ledger, tenant):
        key = uid("key")
        contenders = [claim_request(tenant, key, attempt=a) for a in range(1, 9)]
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda r: ledger.claim_effect(r, NOW), contenders))
        states = sorted(a.state.value for a in answers)
        assert states == ["CLAIMED"] + ["IN_PROGRESS"] * 7
        winner = next(a for a in answers if a.state is ClaimState.CLAIMED)
        assert all(a.claim.token == winner.claim.token for a in answers)


class TestMemoryLedger(LedgerContract):
    def make_ledger(self) -> Ledger:
        return MemoryLedger()


@pytest.mark.integration
class TestCassandraLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _session(self, ledger_session):
        self.session = ledger_session

    def make_ledger(self) -> Ledger:
        from services.ledger.cassandra import CassandraLedger

        return CassandraLedger(self.session, timeout_s=30)
