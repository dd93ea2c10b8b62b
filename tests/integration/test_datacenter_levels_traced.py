"""``RATCHET_DATACENTERS`` as a real Cassandra receives it (session 51's outside review of
m-rmdc2).

``tests/unit/test_datacenter_levels.py`` checks the levels the store's statements carry
and the arguments the worker and the API pass, through stand-ins. Here the coordinator
says what it was sent: every request is traced (cassandra-driver's ``trace`` flag, the C++
driver's ``set_tracing``) and ``system_traces.sessions`` records each one's consistency
level, whatever the driver took it from (the statement, the batch, the session's default
profile, the C++ driver's own default). The worker is built as ``ratchet worker`` builds it
(``streams.worker.build_runtime``) and promotes a Conversation's first two turns; the API
is built as ``ratchet api`` builds it (``ApiProcess``) and reads that history. Ours are
the requests that name the test's own keyspace, and the batches whose Paxos events name
the test's own tenant (a batch's trace records no statement text). docs/decisions.md,
"Workers and APIs in several datacenters, as a setting" and "RATCHET_DATACENTERS
reviewed from outside".
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from datetime import UTC, datetime, timedelta

import acsylla
import cassandra.cluster
import pytest

import services.cassandra_loop as cassandra_loop
from ratchet.samples import make_fingerprint, make_turn
from schemas.avro import EventSerde, encode_key, register_schemas, registry_client
from streams.records import RawRecord

pytestmark = pytest.mark.integration

BATCH = "Execute batch of CQL3 queries"
TRACE_WAIT_S = 30.0  # traces are written by the server after it answers


@pytest.fixture
def own(own_migrated):
    """Settings of the test's own: a migrated keyspace, a topic prefix, a home; every
    record's schema registered."""
    s = own_migrated("dclevels")
    register_schemas(registry_client(s.schema_registry_url))
    return s


@pytest.fixture
def traced(monkeypatch):
    """Every request of this process traced, through both drivers."""
    execute_async = cassandra.cluster.Session.execute_async

    def traced_execute_async(self, query, parameters=None, trace=False, *args, **kwargs):
        return execute_async(self, query, parameters, True, *args, **kwargs)

    monkeypatch.setattr(cassandra.cluster.Session, "execute_async", traced_execute_async)
    bound = cassandra_loop._bound

    def traced_bound(prepared, values):
        statement = bound(prepared, values)
        statement.set_tracing(True)
        return statement

    monkeypatch.setattr(cassandra_loop, "_bound", traced_bound)
    for name in ("create_batch_logged", "create_batch_unlogged"):
        monkeypatch.setattr(acsylla, name, _tracing(getattr(acsylla, name)))


def _tracing(create):
    def create_traced(*args, **kwargs):
        batch = create(*args, **kwargs)
        batch.set_tracing(True)
        return batch
    return create_traced


def _promote_and_read(s) -> tuple[str, list[str]]:
    """A worker promotes a Conversation's turns 1 and 2; an API reads its history. The
    tenant and the outcomes' kinds."""
    from services.api.server import ApiProcess
    from streams.worker import build_runtime

    tenant, conversation = f"tenant-{uuid.uuid4().hex[:12]}", f"conv_{uuid.uuid4().hex[:12]}"
    fingerprint = make_fingerprint()
    turns = [make_turn(tenant_id=tenant, conversation_id=conversation, expected_head_seq=head,
                       fingerprint=fingerprint) for head in (0, 1)]
    runtime, cluster = build_runtime(s)
    serde = EventSerde(registry_client(s.schema_registry_url))
    topic = runtime.topics.gateway_events
    records = [RawRecord(topic, 0, offset, encode_key(conversation), serde.encode(turn, topic),
                         int(time.time() * 1000)) for offset, turn in enumerate(turns)]

    async def inline(handle):
        return handle()

    async def worker() -> list[str]:
        kinds = [(await runtime.processor.handle_async(r, inline)).kind for r in records]
        if runtime.loop_session is not None:
            await runtime.loop_session.close()
        return kinds

    try:
        kinds = asyncio.run(worker())
    finally:
        cluster.shutdown()
    api = ApiProcess(s)

    async def read() -> int:
        answer = await api.service.conversation_history(
            tenant, conversation, turns[0].fingerprint_hash, use_cache=False)
        if api.store.loop_session is not None:
            await api.store.loop_session.close()
        return answer.status_code

    try:
        status = asyncio.run(read())
    finally:
        api.close()
    assert status == 200
    return tenant, kinds


def _ours(session, s, tenant: str, since: datetime) -> list[tuple[str, str, str]]:
    """(request, its CQL or "batch", its consistency level) of every traced request of
    ours since ``since``."""
    found = []
    for row in session.execute("SELECT session_id, started_at, request, parameters "
                               "FROM system_traces.sessions"):
        started = row.started_at and row.started_at.replace(tzinfo=UTC)
        if started is None or started < since or not row.parameters:
            continue
        level = row.parameters.get("consistency_level")
        if row.request == BATCH:
            events = session.execute("SELECT activity FROM system_traces.events "
                                     "WHERE session_id = %s", (row.session_id,))
            if any(f"key={tenant}:" in e.activity for e in events):
                found.append((row.request, "batch", level))
        elif f"{s.keyspace}." in row.parameters.get("query", ""):
            found.append((row.request, " ".join(row.parameters["query"].split()), level))
    return found


def _traces(session, s, tenant, since, done) -> list[tuple[str, str, str]]:
    """Ours, once ``done(ours)`` (the server writes a trace after its answer)."""
    deadline = time.monotonic() + TRACE_WAIT_S
    while True:
        ours = _ours(session, s, tenant, since)
        if done(ours) or time.monotonic() > deadline:
            return ours
        time.sleep(0.5)


def _promotions(ours):
    return [level for _, cql, level in ours if cql == "batch"]


def _history_reads(ours):
    """The API's history reads: the turns partition read whole (not at SERIAL: the
    worker's view is)."""
    return [level for _, cql, level in ours
            if cql.startswith("SELECT") and ".turns WHERE" in cql and level != "SERIAL"]


@pytest.mark.parametrize("loop_driver", ["acsylla", "cassandra-driver"])
def test_several_sends_every_request_of_a_promotion_and_a_history_read_at_quorum(
        own, cassandra_session, traced, loop_driver):
    s = dataclasses.replace(own, datacenters="several", loop_driver=loop_driver)
    since = datetime.now(UTC) - timedelta(seconds=1)
    tenant, kinds = _promote_and_read(s)
    assert kinds == ["promoted", "promoted"]
    ours = _traces(cassandra_session, s, tenant, since,
                   lambda o: len(_promotions(o)) >= 2 and _history_reads(o))
    assert _promotions(ours) == ["QUORUM", "QUORUM"]
    assert _history_reads(ours) and set(_history_reads(ours)) == {"QUORUM"}
    # Nothing at a datacenter's own level: not the start's schema check, not a claim,
    # not a read the C++ driver would send at its default (LOCAL_ONE).
    local = [(request, cql) for request, cql, level in ours if level.startswith("LOCAL_")]
    assert local == []
    assert {level for _, _, level in ours} <= {"QUORUM", "SERIAL"}


def test_one_keeps_the_promotion_and_the_history_read_in_the_datacenter(
        own, cassandra_session, traced):
    """The same run with ``one``: what the test above tells apart."""
    since = datetime.now(UTC) - timedelta(seconds=1)
    tenant, kinds = _promote_and_read(own)
    assert kinds == ["promoted", "promoted"]
    ours = _traces(cassandra_session, own, tenant, since,
                   lambda o: len(_promotions(o)) >= 2 and _history_reads(o))
    assert _promotions(ours) == ["LOCAL_QUORUM", "LOCAL_QUORUM"]
    assert set(_history_reads(ours)) == {"LOCAL_QUORUM"}
    assert ("Execute CQL3 query", f"SELECT version FROM {own.keyspace}.schema_migrations",
            "LOCAL_ONE") in ours
