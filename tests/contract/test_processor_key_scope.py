"""One idempotency key used in two Conversations names two requests
(docs/gateway-protocol.md, section 1): a cancellation or a tool effect of one is never
a fact of the other. Found by an outside review (session 21): a cancellation in one
Conversation orphaned the other's live effect TURN_CANCELLED, and a promotion in one
orphaned the effects the other's promoted turn used. In-memory backends, both entry
points; each test failed before its fix (the Cassandra ledger's scopes:
tests/contract/test_ledger_contract.py)."""

from __future__ import annotations

import pytest

from ratchet.samples import make_tool_loop_turn, make_turn, make_turn_cancelled
from schemas.models import CheckpointPromoted, EffectOrphaned
from schemas.models import RejectionReason as R
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.test_processor_races import Worker, uid

ENTRIES = pytest.mark.parametrize("entry", ["handle", "handle_async"])


@ENTRIES
def test_a_cancellation_in_one_conversation_never_cancels_another(entry):
    worker = Worker(MemoryCheckpointStore(StoreOptions()), MemoryLedger(), entry)
    key = uid("idem")
    c1 = make_turn(conversation_id=uid("conv"), expected_head_seq=0, idempotency_key=key)
    worker.feed(make_turn_cancelled(c1))
    assert worker.outcome(c1).reason is R.CANCELLED
    # Another Conversation, another request that happens to use the same key.
    c2, effects = make_tool_loop_turn(rounds=1, conversation_id=uid("conv"),
                                      expected_head_seq=0, idempotency_key=key,
                                      response_id=uid("resp"))
    orphaned = [o.model for e in effects for o in worker.handle(e).outbound
                if isinstance(o.model, EffectOrphaned)]
    assert orphaned == [], [(o.effect_id, o.reason) for o in orphaned]
    out = worker.outcome(c2)
    assert isinstance(out, CheckpointPromoted), (out.reason, out.detail)


@ENTRIES
def test_a_promotion_in_one_conversation_never_orphans_another_ones_effects(entry):
    worker = Worker(MemoryCheckpointStore(StoreOptions()), MemoryLedger(), entry)
    key = uid("idem")
    used = {}
    for name in ("c1", "c2"):
        turn, effects = make_tool_loop_turn(rounds=1, conversation_id=uid("conv"),
                                            expected_head_seq=0, idempotency_key=key,
                                            response_id=uid("resp"))
        worker.feed(*effects)
        handled = worker.handle(turn)
        assert isinstance(handled.outbound[0].model, CheckpointPromoted), name
        orphaned = [o.model.effect_id for o in handled.outbound[1:]
                    if isinstance(o.model, EffectOrphaned)]
        assert orphaned == [], (name, orphaned, used)
        used[name] = [e.effect_id for e in effects]
