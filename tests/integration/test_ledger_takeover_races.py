"""A takeover decided on a claim that changed before its conditional write landed
(``services/ledger/cassandra.py``): the holder renewed its lease, completed, or the
request was cancelled meanwhile. The takeover's conditions (the holder's token AND
lease, not completed, not cancelled) refuse it, and the taker is answered from what
won; never ``CLAIMED`` beside a live holder or over a recorded outcome, which would run
the side effect twice (a mutation review of the write path, session 44: each condition
could be dropped with every test passing; the memory ledger decides and writes under
one lock, so only Cassandra has the race)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ratchet.domain.claims import ClaimState, EffectPolicy
from services.ledger.base import Cancellation
from services.ledger.cassandra import CassandraLedger
from tests.contract.store_support import migrated_keyspace, uid
from tests.contract.test_ledger_contract import LEASE, NOW, claim_request, output_for
from tests.integration.flaky_session import query

pytestmark = pytest.mark.integration

TAKE_OVER = query("SET attempt = ?, call_id = ?, claim_token = ?")


@pytest.fixture(scope="module")
def ledger_session(cassandra_cluster, settings):
    yield from migrated_keyspace(cassandra_cluster, settings, "ledger_race")


class _RacedSession:
    """Delegates to ``real``; runs ``meanwhile`` once, just before the first statement
    that ``match``es is sent (then sends it)."""

    def __init__(self, real, match: Callable[[Any], bool], meanwhile: Callable[[], object]):
        self._real, self._match, self._meanwhile = real, match, meanwhile

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _before(self, statement) -> None:
        if self._meanwhile is not None and self._match(statement):
            meanwhile, self._meanwhile = self._meanwhile, None
            meanwhile()

    def execute(self, statement, *args, **kwargs):
        self._before(statement)
        return self._real.execute(statement, *args, **kwargs)

    def execute_async(self, statement, *args, **kwargs):
        self._before(statement)
        return self._real.execute_async(statement, *args, **kwargs)


@pytest.mark.parametrize("meanwhile, answered", [
    ("renewed", ClaimState.IN_PROGRESS),
    ("completed", ClaimState.COMPLETED),
    ("cancelled", ClaimState.CANCELLED),
])
def test_a_takeover_raced_by_the_holder_or_a_cancellation_is_refused(
        ledger_session, meanwhile, answered):
    healthy = CassandraLedger(ledger_session, timeout_s=30)
    tenant, key = uid("tenant"), uid("key")
    holder = claim_request(tenant, key, policy=EffectPolicy.AT_LEAST_ONCE)
    assert healthy.claim_effect(holder, NOW).state is ClaimState.CLAIMED
    later = NOW + 2 * LEASE  # the holder's lease ran out

    def race() -> None:
        if meanwhile == "renewed":  # the holder's claim call re-sent: its lease renewed
            assert healthy.claim_effect(holder, later).state is ClaimState.CLAIMED
        elif meanwhile == "completed":
            healthy.complete_claim(tenant, key, holder.effect_id, holder.token, "completed",
                                   output_for(holder), later)
        else:
            healthy.record_cancellation(Cancellation(tenant, key, uid("resp"), later))

    taker = claim_request(tenant, key, attempt=2, policy=EffectPolicy.AT_LEAST_ONCE)
    raced = CassandraLedger(_RacedSession(ledger_session, TAKE_OVER, race), timeout_s=30)
    answer = raced.claim_effect(taker, later + 1)
    assert answer.state is answered, answer
    stored = healthy.claim(tenant, key, holder.effect_id)
    assert (stored.token, stored.takeovers) == (holder.token, 0)
