"""``LoopSession``: the worker's C++ driver (acsylla) for its requests on the event loop,
against the real Cassandra, with the store's and ledger's own prepared statements."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
from cassandra import ConsistencyLevel

from services.cassandra_loop import LoopResult, LoopSession, WrongLoop
from services.ledger.cassandra import CassandraLedger
from services.store.base import ResponseClaim, StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import conversation_turn, uid


@pytest.fixture
def loop_session(ledger_session, settings):
    runner = asyncio.Runner()
    session = LoopSession(replace(settings, keyspace=ledger_session.keyspace))
    yield runner, session
    runner.run(session.close())
    runner.close()


def test_a_conditional_write_answers_applied_then_the_row_it_found(ledger_session, loop_session):
    runner, session = loop_session
    store = CassandraCheckpointStore(ledger_session, StoreOptions())
    values = ("tenant", f"resp_{uuid.uuid4().hex}", "conv", "idem", "digest")

    first = runner.run(session.execute(store.cql.insert_claim, values,
                                       serial_consistency=ConsistencyLevel.SERIAL))
    assert first.was_applied
    again = runner.run(session.execute(store.cql.insert_claim, (*values[:3], "other", "d2"),
                                       serial_consistency=ConsistencyLevel.SERIAL))
    assert not again.was_applied
    found = dict(zip(again.column_names, again.one(), strict=True))
    assert (found["partition_key"], found["idempotency_key"], found["request_digest"]) == (
        "conv", "idem", "digest")


def test_the_store_claims_through_it_like_through_cassandra_driver(ledger_session,
                                                                    loop_session):
    runner, session = loop_session
    store = CassandraCheckpointStore(ledger_session, StoreOptions(), loop_session=session)
    claim = ResponseClaim("tenant", f"resp_{uuid.uuid4().hex}", "conv", "idem", "digest")
    other = replace(claim, partition_key="elsewhere", idempotency_key="idem2")
    assert runner.run(store.claim_async(claim)) == claim
    assert runner.run(store.claim_async(other)) == claim  # the holder, not the asker
    store.loop_session = None
    assert runner.run(store.claim_async(other)) == claim  # cassandra-driver agrees


def test_owners_and_status_written_and_read_through_it(ledger_session, loop_session):
    runner, session = loop_session
    ledger = CassandraLedger(ledger_session, loop_session=session)
    conversation, response = f"conv_{uuid.uuid4().hex}", f"resp_{uuid.uuid4().hex}"
    assert runner.run(ledger.conversation_owner_async(conversation)) is None
    runner.run(ledger.record_owners_async(tenant_id="t1", response_id=response,
                                          conversation_id=conversation))
    assert runner.run(ledger.conversation_owner_async(conversation)) == "t1"
    assert ledger.conversation_owner(conversation) == "t1"  # cassandra-driver reads it
    assert ledger.response_owner(response) == "t1"
    ledger.mark_rejected("t1", response, "CONFLICT", "detail")
    assert runner.run(ledger.status_async("t1", response)) == ledger.status("t1", response)


def test_reads_made_at_once_each_get_the_rows_they_asked_for(ledger_session, loop_session):
    """Single-row and whole-partition reads of the same partitions, many in flight at
    once on one C++ driver session (the API's reads), each answered with the rows it
    asked for: the shape of the lineage gap seen once (docs/decisions.md), where a
    partition read held the second turn's row and not the first's."""
    runner, session = loop_session
    store = CassandraCheckpointStore(ledger_session, StoreOptions(), loop_session=session)
    tenant = uid("tenant")
    turns: dict[str, list[str]] = {}
    for _ in range(6):
        conversation = uid("conv")
        turns[conversation] = []
        for seq in range(3):
            request = conversation_turn(tenant, conversation, seq)
            assert type(store.promote(request)).__name__ == "Promoted"
            turns[conversation].append(request.response_id)
    asked = [(conversation, response_id) for conversation, ids in turns.items()
             for response_id in (None, *ids)] * 40
    wrong: list[tuple] = []

    async def read(conversation: str, response_id: str | None) -> None:
        if response_id is None:
            snapshot = await store._load_partition_async(tenant, conversation)
            expected = set(turns[conversation])
        else:
            snapshot = await store.read_turn_async(tenant, conversation, response_id)
            expected = {response_id}
        got = (snapshot.partition_key, set(snapshot.checkpoints), snapshot.head.seq)
        if got != (conversation, expected, 3):
            wrong.append((conversation, response_id, got))

    async def all_at_once() -> None:
        in_flight = asyncio.Semaphore(32)

        async def bounded(conversation: str, response_id: str | None) -> None:
            async with in_flight:
                await read(conversation, response_id)

        await asyncio.gather(*(bounded(c, r) for c, r in asked))

    runner.run(all_at_once())
    assert wrong == []


def test_it_serves_only_the_loop_it_connected_on(ledger_session, loop_session):
    runner, session = loop_session
    ledger = CassandraLedger(ledger_session)
    runner.run(session.execute(ledger._select_conversation_owner, ("x",)))
    with pytest.raises(WrongLoop):
        asyncio.run(session.execute(ledger._select_conversation_owner, ("x",)))


def test_an_answer_without_applied_is_not_a_conditional_write():
    with pytest.raises(ValueError):
        _ = LoopResult(("tenant_id",), (("t",),)).was_applied
    with pytest.raises(ValueError):
        _ = LoopResult(("[applied]",), ()).was_applied
    assert LoopResult(("[applied]", "x"), ((False, 1),)).was_applied is False


def test_a_driver_failure_is_the_store_or_ledger_being_unavailable(ledger_session, settings):
    """No Cassandra where the C++ driver looks: the typed, retryable unavailability of
    the cassandra-driver path, never a driver exception or a silent answer."""
    from services.ledger.base import LedgerUnavailable
    from services.store.base import StoreUnavailable
    from streams.testing import free_port

    nowhere = LoopSession(replace(settings, keyspace=ledger_session.keyspace,
                                  cassandra_port=free_port()), timeout_s=1.0)
    store = CassandraCheckpointStore(ledger_session, StoreOptions(), loop_session=nowhere)
    ledger = CassandraLedger(ledger_session, loop_session=nowhere)
    with asyncio.Runner() as runner:
        with pytest.raises(StoreUnavailable) as failed:
            runner.run(store.read_head_async("tenant", "conv"))
        assert failed.value.retryable
        with pytest.raises(LedgerUnavailable):
            runner.run(ledger.status_async("tenant", "resp"))
