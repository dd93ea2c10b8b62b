"""One contract for both ``Ledger`` backends (memory, and Cassandra as an integration
test): the processor relies on them answering alike."""

from __future__ import annotations

import pytest

from ratchet.domain.promotion import RecordedEffect
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
        ledger.record_promotion(tenant_id=tenant, response_id=resp, seq=1, conversation_id=conv)
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

    def test_status_promoted_wins_and_tenants_are_separate(self, ledger, tenant):
        resp = uid("resp")
        assert ledger.status(tenant, resp).status is ResponseState.UNKNOWN
        ledger.mark_rejected(tenant, resp, "CONFLICT", "detail")
        rejected = ledger.status(tenant, resp)
        assert (rejected.status, rejected.reason, rejected.detail) == (
            ResponseState.REJECTED, "CONFLICT", "detail")
        ledger.mark_promoted(tenant, resp, 4)
        ledger.mark_rejected(tenant, resp, "DUPLICATE", "")
        promoted = ledger.status(tenant, resp)
        assert (promoted.status, promoted.seq) == (ResponseState.PROMOTED, 4)
        assert ledger.status(uid("tenant"), resp).status is ResponseState.UNKNOWN

    def test_status_of_a_duplicate_names_the_original(self, ledger, tenant):
        retry, original = uid("resp"), uid("resp")
        ledger.mark_rejected(tenant, retry, "DUPLICATE", "already promoted", original)
        status = ledger.status(tenant, retry)
        assert (status.status, status.reason, status.existing_response_id) == (
            ResponseState.REJECTED, "DUPLICATE", original)


class TestMemoryLedger(LedgerContract):
    def make_ledger(self) -> Ledger:
        return MemoryLedger()


@pytest.mark.integration
class TestCassandraLedger(LedgerContract):
    @pytest.fixture(scope="class")
    def ledger_keyspace(self, settings, cassandra_cluster):
        """A keyspace of its own with every migration applied (this branch's schema,
        not whatever the shared servers' keyspace was migrated to)."""
        import dataclasses
        import uuid

        from infra.migrate import apply_migrations

        keyspace = f"ledger_it_{uuid.uuid4().hex[:8]}"
        apply_migrations(cassandra_cluster, dataclasses.replace(settings, keyspace=keyspace))
        yield keyspace
        cassandra_cluster.connect().execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=60)

    @pytest.fixture(autouse=True)
    def _session(self, ledger_keyspace, cassandra_cluster):
        self.session = cassandra_cluster.connect(ledger_keyspace)

    def make_ledger(self) -> Ledger:
        from services.ledger.cassandra import CassandraLedger

        return CassandraLedger(self.session, timeout_s=30)
