"""The processor's tail cache on the Cassandra backends (no Kafka): a second store on
the same keyspace plays the other worker that moves a head behind our cache's back.
The same scenarios run on the in-memory backends in ``tests/unit/test_tail_cache.py``.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from ratchet.domain.plan import Promoted
from ratchet.domain.promotion import promotion_request
from ratchet.domain.validation import EMPTY_PAIRING
from ratchet.samples import NOW_MS, TENANT
from schemas.items import function_call, function_call_output, message
from schemas.models import Certification, RejectionReason
from services.ledger.cassandra import CassandraLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from streams.processor import PromotionProcessor
from streams.tail_cache import Tail
from tests.unit.test_processor_rules import TOPICS, Harness, PickleCodec
from tests.unit.test_processor_rules import turn as _turn

pytestmark = pytest.mark.integration
R = RejectionReason


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def turn(conv: str, head: int, **kw):
    kw.setdefault("response_id", uid("resp"))
    kw.setdefault("idempotency_key", uid("idem"))
    return _turn(conv, head, **kw)


def msg(text: str = "ok", role: str = "assistant"):
    return message(text, role=role, item_id=uid("msg"))


@pytest.fixture(scope="module")
def session(settings, cassandra_cluster):
    return cassandra_cluster.connect(settings.keyspace)


@pytest.fixture
def h(session) -> Harness:
    h = Harness()
    h.store = CassandraCheckpointStore(session, StoreOptions(), timeout_s=30)
    h.ledger = CassandraLedger(session, timeout_s=30)
    h.processor = PromotionProcessor(h.store, h.ledger, PickleCodec(), TOPICS,
                                     clock_ms=lambda: NOW_MS)
    return h


@pytest.fixture
def other_worker(session) -> CassandraCheckpointStore:
    return CassandraCheckpointStore(session, StoreOptions(), timeout_s=30)


def test_cached_turns_promote_and_read_back(h):
    conv = uid("conv")
    turns = [turn(conv, head) for head in range(4)]
    assert [h.outcome(t).seq for t in turns] == [1, 2, 3, 4]
    assert h.processor.cache_hits == 3
    history = h.store.read_history(TENANT, response_id=turns[-1].response_id)
    assert [c.response_id for c in history.lineage] == [t.response_id for t in turns]


def test_head_moved_by_another_worker_gives_the_fresh_verdict(h, other_worker):
    conv = uid("conv")
    call = function_call("c_client", "lookup", {}, item_id=uid("fc"))
    assert h.outcome(turn(conv, 0, items=[call])).seq == 1
    answer = function_call_output("c_client", "{}", item_id=uid("fco"))
    moved = turn(conv, 1, input_items=[answer], items=[msg()])
    assert isinstance(other_worker.promote(promotion_request(moved, Certification.CERTIFIED)),
                      Promoted)
    stale = turn(conv, 1, input_items=[msg("hi", role="user")])
    out = h.outcome(stale)
    assert out.reason is R.CONFLICT and out.head_seq == 2
    assert h.processor.cache_rechecks == 1
    assert h.outcome(turn(conv, 2)).seq == 3


def test_a_wrong_head_entry_never_makes_a_wrong_promotion(h):
    conv = uid("conv")
    call = function_call("c_dup", "lookup", {}, item_id=uid("fc"))
    answer = function_call_output("c_dup", "{}", item_id=uid("fco"))
    first = turn(conv, 0, items=[call, answer, msg()])
    assert h.outcome(first).seq == 1
    cp = h.store.get_checkpoint(TENANT, first.response_id)
    h.processor.tails.learn(Tail(replace(cp, response_id=uid("resp_bogus")), EMPTY_PAIRING))
    reuse = turn(conv, 1, items=[function_call("c_dup", "lookup", {}, item_id=uid("fc"))])
    assert h.outcome(reuse).reason is R.UNPAIRED_TOOL_CALL
    assert h.store.head(TENANT, conv).seq == 1
    assert h.store.get_checkpoint(TENANT, reuse.response_id) is None
