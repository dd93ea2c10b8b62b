"""What a tool effect costs Cassandra: requests counted on a real keyspace.

``RecordingSession`` wraps a real session and records every request (its CQL and its
consistency level), so the tests pin the requests of the effect path and of the claim
reads. Each SERIAL read is a Paxos round on the replicas; session 43 removed two that
decided nothing (docs/decisions.md, "The effect path's requests counted"):

* the read-back of an effect whose ``INSERT ... IF NOT EXISTS`` applied (the row holds
  exactly the record just written);
* the cancellation flag read beside the claim by callers that never use it (the
  processor's reference output of an effect, a claim's completion).
"""

from __future__ import annotations

import re

import pytest
from cassandra import ConsistencyLevel

from ratchet.samples import NOW_MS, make_tool_loop_turn
from services.ledger.base import EffectWrite
from services.ledger.cassandra import CassandraLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from streams.processor import PromotionProcessor
from streams.tail_cache import TailCache
from tests.contract.store_support import migrated_keyspace, uid
from tests.contract.test_ledger_contract import NOW, claim_request, effect, output_for
from tests.unit.test_processor_rules import TOPICS, PickleCodec, raw_record

pytestmark = pytest.mark.integration

SERIAL = (ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL)


@pytest.fixture(scope="module")
def ledger_session(cassandra_cluster, settings):
    """A keyspace of its own with every migration applied (store and ledger tables)."""
    yield from migrated_keyspace(cassandra_cluster, settings, "effect_requests")


class RecordingSession:
    """Delegates to a real session; records (CQL, consistency level) of each request."""

    def __init__(self, real) -> None:
        self._real = real
        self.requests: list[tuple[str, int | None]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _record(self, statement) -> None:
        prepared = getattr(statement, "prepared_statement", statement)
        query = getattr(prepared, "query_string", None) or str(statement)
        self.requests.append((re.sub(r"\s+", " ", query),
                              getattr(statement, "consistency_level", None)))

    def execute(self, statement, *args, **kwargs):
        self._record(statement)
        return self._real.execute(statement, *args, **kwargs)

    def execute_async(self, statement, *args, **kwargs):
        self._record(statement)
        return self._real.execute_async(statement, *args, **kwargs)

    def serial_reads(self) -> list[str]:
        return [query for query, level in self.requests if level in SERIAL]

    def clear(self) -> None:
        self.requests.clear()


@pytest.fixture
def recorded(ledger_session):
    session = RecordingSession(ledger_session)
    return session, CassandraLedger(session, timeout_s=30)


def test_a_new_effect_is_one_conditional_write_and_no_read(recorded):
    session, ledger = recorded
    tenant, key = uid("tenant"), uid("key")
    assert ledger.record_effect(effect(tenant, key, "e1")) is EffectWrite.RECORDED
    assert len(session.requests) == 1 and "IF NOT EXISTS" in session.requests[0][0]
    assert session.serial_reads() == []
    # What the skipped read would have said is what a read says now.
    [stored] = ledger.effects_for(tenant, key)
    assert stored == effect(tenant, key, "e1")


def test_an_effect_already_there_is_read_and_classified(recorded):
    """An unapplied write still reads what stands (a redelivery, another output, a
    record of another scope)."""
    session, ledger = recorded
    tenant, key = uid("tenant"), uid("key")
    ledger.record_effect(effect(tenant, key, "e1", scope="conv"))
    session.clear()
    assert ledger.record_effect(effect(tenant, key, "e1", scope="conv")) \
        is EffectWrite.ALREADY_RECORDED
    assert len(session.serial_reads()) == 1
    assert ledger.record_effect(effect(tenant, key, "e1", "d2", scope="conv")) \
        is EffectWrite.CONFLICT
    assert ledger.record_effect(effect(tenant, key, "e1", scope="other")) \
        is EffectWrite.FOREIGN


def test_a_claim_is_read_with_one_serial_read(recorded):
    session, ledger = recorded
    tenant, key = uid("tenant"), uid("key")
    request = claim_request(tenant, key)
    ledger.claim_effect(request, NOW)
    session.clear()
    claim = ledger.claim(tenant, key, request.effect_id)
    assert claim is not None and claim.token == request.token
    assert len(session.requests) == 1 and len(session.serial_reads()) == 1
    assert ledger.claim(tenant, key, uid("effect")) is None


def test_a_completion_reads_its_claim_once(recorded):
    session, ledger = recorded
    tenant, key = uid("tenant"), uid("key")
    request = claim_request(tenant, key)
    ledger.claim_effect(request, NOW)
    out = output_for(request)
    session.clear()
    state, done = ledger.complete_claim(tenant, key, request.effect_id, request.token,
                                        "succeeded", out, NOW + 1)
    assert state.name == "COMPLETED" and done.output == out
    assert len(session.requests) == 2 and len(session.serial_reads()) == 1


def test_a_tool_effect_event_costs_five_requests_two_serial(ledger_session):
    """The worker's handling of a ``ToolEffect`` before its turn: the effect's
    conditional write, its claim (SERIAL), the request's facts mark, whether the request
    stands promoted (SERIAL, after the mark), whether it is cancelled. Nothing else."""
    session = RecordingSession(ledger_session)
    store = CassandraCheckpointStore(session, StoreOptions(), timeout_s=30)
    ledger = CassandraLedger(session, timeout_s=30)
    processor = PromotionProcessor(store, ledger, PickleCodec(), TOPICS,
                                   clock_ms=lambda: NOW_MS, tails=TailCache())
    turn, effects = make_tool_loop_turn(rounds=2, conversation_id=uid("conv"),
                                        response_id=uid("resp"), idempotency_key=uid("idem"))
    for offset, event in enumerate(effects, start=1):
        session.clear()
        handled = processor.handle(raw_record(event, offset))
        assert handled.kind == "effect" and handled.outbound == ()
        assert len(session.requests) == 5, session.requests
        assert len(session.serial_reads()) == 2, session.serial_reads()
    # The turn then finds the effects it lists (MISSING_TOOL_EFFECT otherwise).
    handled = processor.handle(raw_record(turn, len(effects) + 1))
    assert [type(o.model).__name__ for o in handled.outbound] == ["CheckpointPromoted"]
    assert handled.outbound[0].model.certification.value == "certified"
