"""Eight promoters race on one Conversation head for many rounds (real Cassandra)."""

from __future__ import annotations

import threading

import pytest

from ratchet.domain.history import VerifiedHistory
from ratchet.domain.plan import Conflict, Duplicate, Promoted
from services.store.cassandra import CassandraCheckpointStore
from tests.contract.store_support import conversation_turn, uid

pytestmark = pytest.mark.integration

WORKERS = 8
ROUNDS = 25


def test_one_promotion_per_seq_and_a_gap_free_history(cassandra_cluster, store_session):
    keyspace = store_session.keyspace
    sessions = [cassandra_cluster.connect(keyspace) for _ in range(2)]
    stores = [CassandraCheckpointStore(sessions[i % 2], timeout_s=30) for i in range(WORKERS)]
    tenant, conv = uid("tenant"), uid("conv")
    # Workers 0 and 1 send the same logical request each round (a gateway retry).
    requests = [[conversation_turn(tenant, conv, r) for _ in range(WORKERS)] for r in range(ROUNDS)]
    for r in range(ROUNDS):
        requests[r][1] = requests[r][0]
    outcomes: list[list[object]] = [[None] * WORKERS for _ in range(ROUNDS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(WORKERS)

    def work(worker: int) -> None:
        try:
            for r in range(ROUNDS):
                barrier.wait(timeout=60)
                outcomes[r][worker] = stores[worker].promote(requests[r][worker])
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    winners = []
    for r, results in enumerate(outcomes):
        promoted = [o for o in results if isinstance(o, Promoted)]
        assert len(promoted) == 1, (r, results)
        assert promoted[0].seq == r + 1
        assert all(isinstance(o, Promoted | Conflict | Duplicate) for o in results), results
        for o in results:
            if isinstance(o, Conflict):
                assert o.current_head_seq == r + 1
            if isinstance(o, Duplicate):  # only the twin of a winning request
                assert o.original == promoted[0].checkpoint
        winners.append(promoted[0].checkpoint)

    history = stores[0].read_history(tenant, conversation_id=conv)
    assert isinstance(history, VerifiedHistory), history
    assert history.head_seq == ROUNDS
    assert [c.response_id for c in history.lineage] == [w.response_id for w in winners]
    assert [c.first_item_seq for c in history.lineage] == list(range(1, 2 * ROUNDS, 2))
    for s in sessions:
        s.shutdown()
