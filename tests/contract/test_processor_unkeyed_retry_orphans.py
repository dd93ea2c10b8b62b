"""Promise (docs/gateway-protocol.md s.7, "A retry of a promoted request": "no rejection
of an attempt of a promoted request (DUPLICATE, IDEMPOTENCY_KEY_REUSED, a failed retry,
...) ever orphans an effect the promoted turn used"; s.6 ToolEffect: "an effect the
promoted turn uses is never orphaned").

What happens: continuation X1 of chain X (request K) is promoted using effect E. A retry
of the same request under another response id whose event lost its ``chain_root_id`` (a continued chain turn
without root: PARENT_NOT_PROMOTED, ``_on_unkeyed_turn``) reads the request's effects in
the chains scope ('' -- since the request-scope change, effects are no longer keyed to
the partition it cannot name), but ``promoted_request`` answers None for it
(MissingChainRoot), so E -- live, used by the promoted X1 -- is published
EffectOrphaned TURN_REJECTED."""
import pytest

from ratchet.samples import make_tool_loop_turn, make_turn
from schemas.models import CheckpointPromoted, EffectOrphaned, PromotionRejected
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.test_processor_races import Worker, uid


@pytest.mark.parametrize("entry", ["handle", "handle_async"])
def test_unkeyed_retry_never_orphans_effect_the_promotion_used(entry):
    w = Worker(MemoryCheckpointStore(StoreOptions()), MemoryLedger(), entry)
    root = make_turn(conversation_id=None, chain_root_id=None, expected_head_seq=None)
    assert isinstance(w.outcome(root), CheckpointPromoted)
    key = uid("idem")
    x1, effects = make_tool_loop_turn(rounds=1, conversation_id=None,
                                      chain_root_id=root.response_id,
                                      previous_response_id=root.response_id,
                                      expected_head_seq=None, idempotency_key=key)
    w.feed(*effects)
    assert isinstance(w.outcome(x1), CheckpointPromoted)
    retry = x1.model_copy(update={"event_id": uid("ev"), "attempt": 2, "chain_root_id": None,
                                 "response_id": uid("resp")})
    out = [o.model for o in w.handle(retry).outbound]
    assert isinstance(out[0], PromotionRejected), type(out[0])
    orphaned = {m.effect_id: m.reason for m in out if isinstance(m, EffectOrphaned)}
    used = {e.effect_id for e in effects}
    assert not (set(orphaned) & used), f"live effects of promoted {x1.response_id} orphaned: {orphaned}"
