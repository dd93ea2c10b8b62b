"""A late effect of a cancelled chain's first response whose request settles on a damaged
partition is answered as every other request lookup answers damage: recorded, nothing
published, logged (``RequestFacts.record_effect``), never a dead letter.

The path (streams/request_facts.py): the effect's first lookup (``promoted_key``) finds
the request promoted nowhere; the request was cancelled, so before orphaning the effect
``_settle_request`` takes the request's claim (``hold_request``) and, finding another
first response holding it, reads that response's partition again (``promoted_key``).
Between the two reads that other attempt's batch lands (decided before the
cancellation: the batch ``_settle_request``'s docstring lets stand) and its row is
damaged; its claim was taken before the first lookup or between the two. Until session
51 the second read's ``CorruptPartition`` escaped: the processor dead-lettered the
recorded effect ``UNKNOWN`` (session 50's "Left").

Both backends (memory: ``DamagedRows`` raises from the view as Cassandra's decoder
does; Cassandra: the row's ``mode`` cell unknown), both entries.
"""

from __future__ import annotations

import logging

import pytest

from ratchet.domain.plan import Promoted, ResponseClaim
from ratchet.domain.promotion import promotion_request
from ratchet.samples import TENANT, make_tool_loop_turn, make_turn_cancelled
from schemas.models import Certification
from services.ledger.cassandra import CassandraLedger
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.test_damaged_bound_id import DamagedRows
from tests.contract.test_processor_handover import ENTRIES
from tests.contract.test_processor_races import Worker, uid
from tests.unit.test_orphans_withheld import withheld

ROW = "WHERE tenant_id = %s AND partition_key = %s AND kind = 'checkpoint' AND ref = %s"


class BetweenReads:
    """A worker's store whose next ``hold_request`` (``_settle_request``'s, after the
    effect's first lookup) first runs ``act``: what lands between the two reads."""

    def __init__(self, store) -> None:
        self._store = store
        self.act = None

    def __getattr__(self, name):
        return getattr(self._store, name)

    def hold_request(self, *args, **kwargs):
        if self.act is not None:
            act, self.act = self.act, None
            act()
        return self._store.hold_request(*args, **kwargs)


@pytest.fixture(params=["memory", "cassandra"])
def shared(request):
    """(the worker's store, another store on the same data, the ledger, damage(id))."""
    if request.param == "memory":
        store = DamagedRows()

        def damage_memory(response_id: str) -> None:
            store.damaged.add((TENANT, response_id))
        return store, store, MemoryLedger(), damage_memory
    session = request.getfixturevalue("ledger_session")

    def damage_cassandra(response_id: str) -> None:  # the row cannot be decoded
        session.execute(f"UPDATE turns SET mode = 'sideways' {ROW}",
                        (TENANT, response_id, response_id), timeout=30)

    def store():
        return CassandraCheckpointStore(session, StoreOptions(), timeout_s=30)
    return store(), store(), CassandraLedger(session, timeout_s=30), damage_cassandra


def _first_response(key: str, attempt: int):
    """A chain's first response of request ``key`` (its own partition) with one tool
    round, and its effect."""
    turn, (effect,) = make_tool_loop_turn(rounds=1, conversation_id=None, chain_root_id=None,
                                          expected_head_seq=None, idempotency_key=key,
                                          attempt=attempt)
    return turn, effect


@ENTRIES
@pytest.mark.parametrize("claimed", ["before_the_first_lookup", "between_the_reads"])
def test_a_late_effect_settled_on_a_damaged_holder_is_recorded_and_not_published(
        shared, entry, claimed, caplog):
    store, other_store, ledger, damage = shared
    key = uid("idem")
    first, late_effect = _first_response(key, attempt=1)
    retry, _ = _first_response(key, attempt=2)
    retry = retry.model_copy(update={"request_digest": first.request_digest})
    held = promotion_request(retry, Certification.CERTIFIED)
    worker = Worker(BetweenReads(store), ledger, entry)
    worker.feed(make_turn_cancelled(first))  # the request is cancelled
    if claimed == "before_the_first_lookup":  # the retry's batch in flight
        assert other_store.hold_request(TENANT, key, retry.response_id) == (
            ResponseClaim(TENANT, retry.response_id, retry.response_id, key, ""))

    def lands_damaged() -> None:  # the retry's batch (decided before the cancellation)
        assert isinstance(other_store.promote(held), Promoted)
        damage(retry.response_id)

    worker.store.act = lands_damaged
    before = withheld("late_effect")
    with caplog.at_level(logging.ERROR, logger="streams.request_facts"):
        handled = worker.handle(late_effect)
    assert worker.store.act is None  # the race ran
    assert (handled.kind, handled.outbound) == ("effect", ()), handled
    # The operator's typed signal (session 52): the line and the counter.
    assert any(r.getMessage().startswith("orphans withheld (late_effect): ")
               and late_effect.effect_id in r.getMessage() and "cannot be read" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert withheld("late_effect") == before + 1
    # Recorded all the same; a redelivery gets the same answer.
    assert late_effect.effect_id in {e.effect_id for e in ledger.effects_for(TENANT, key)}
    again = worker.handle(late_effect)
    assert (again.kind, again.outbound) == ("effect", ()), again
