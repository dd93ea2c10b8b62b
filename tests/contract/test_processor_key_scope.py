"""One idempotency key used in two Conversations names two requests
(docs/gateway-protocol.md, section 6, "The request's scope"): a cancellation or a tool
effect of one is never a fact of the other, and a cancellation of a chain's request
cancels it whichever response id it names. Found by two outside reviews (session 21):
a cancellation in one Conversation orphaned the other's live effect TURN_CANCELLED, a
promotion in one orphaned the effects the other's promoted turn used, and the first
scope rule (by partition key and response id) missed cancellations naming another id.
In-memory backends, both entry points; each test failed before its fix (the Cassandra
ledger's scopes: tests/contract/test_ledger_contract.py)."""

from __future__ import annotations

import pytest

from ratchet.samples import make_tool_effect, make_tool_loop_turn, make_turn, make_turn_cancelled
from schemas.models import CheckpointPromoted, EffectOrphaned, PromotionRejected
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


# A TurnCancelled's scope is derived from its ``response_id`` (schemas/keys.py
# ``request_scope``: FIRST_OF_CHAIN_SCOPE only when the partition key equals the
# response id), although the docs say the cancellation's ``response_id`` "is recorded
# but never compared, so a cancellation naming any response id (another attempt's, or
# one never produced) cancels every turn of the request" (docs/gateway-protocol.md
# section 6, TurnCancelled; section 7 "The first response of a chain": "A cancellation
# of such a request, whichever attempt's partition key it carries (or an id never
# produced), cancels every attempt processed after it"). CONTRACT 4: "A response
# cancelled before its completion is processed is never promoted."
#
# What happens instead:
# (a) a chain's first response R1 (its own partition key); a TurnCancelled keyed R1
#     (chain_root_id=R1, which is its partition key) naming another response id gets
#     scope "R1" (a chain-continuation scope), while R1's turn reads scope "" (first
#     of chain): R1 is PROMOTED after its cancellation.
# (b) a continued chain turn (root R): a TurnCancelled keyed R, chain_root_id=R, naming
#     the root's response id R (any id, per the docs) gets scope "" : the continuation is
#     PROMOTED after its cancellation, and the cancellation instead cancels an unrelated
#     request: the first response of another chain using the same key (leak).

def _worker(entry):
    return Worker(MemoryCheckpointStore(StoreOptions()), MemoryLedger(), entry)


def _first(**kw):
    return make_turn(conversation_id=None, chain_root_id=None, expected_head_seq=None,
                     response_id=kw.pop("response_id", None) or uid("resp"), **kw)


@ENTRIES
def test_first_response_cancel_naming_another_response_id_cancels(entry):
    w = _worker(entry)
    r1 = _first(idempotency_key=uid("idem"))
    # Keyed by R1 (its partition key: chain_root_id = R1 = its own root), naming an id
    # never produced (or the other attempt's): "cancels every turn of the request".
    cancel = make_turn_cancelled(r1, chain_root_id=r1.response_id,
                                 response_id=uid("resp_never"))
    assert cancel.partition_key == r1.partition_key
    w.feed(cancel)
    out = w.outcome(r1)
    assert isinstance(out, PromotionRejected) and out.reason is R.CANCELLED, (
        f"cancelled first response published {type(out).__name__}")


@ENTRIES
def test_continued_chain_cancel_naming_root_id_cancels_its_request(entry):
    w = _worker(entry)
    root = _first(idempotency_key=uid("idem"))
    assert isinstance(w.outcome(root), CheckpointPromoted)
    key = uid("idem")
    child = make_turn(conversation_id=None, chain_root_id=root.response_id,
                      previous_response_id=root.response_id, expected_head_seq=None,
                      idempotency_key=key, response_id=uid("resp"))
    # The child's request cancelled, on the child's key, naming "any response id".
    cancel = make_turn_cancelled(child, response_id=root.response_id)
    assert cancel.partition_key == child.partition_key
    w.feed(cancel)
    out = w.outcome(child)
    assert isinstance(out, PromotionRejected) and out.reason is R.CANCELLED, (
        f"cancelled chain continuation published {type(out).__name__}")


# A cancellation whose ``response_id`` names a promoted response of the SAME key in
# ANOTHER scope is thrown away (``RequestFacts._cancelled_after_promotion`` looks up
# ``store.get_checkpoint(cancel.response_id)`` and compares only the idempotency key, not
# the scope/partition), so the cancelled request is promoted.
#
# Docs (gateway-protocol.md section 6, "The request's scope"): the same key in another
# Conversation "is another request, with its own tool effects, cancellation, duplicates
# and outcomes: a cancellation in one never cancels the other" and, TurnCancelled: "its
# ``response_id`` is recorded but never compared, so a cancellation naming any response
# id ... cancels every turn of the request. Processed before a TurnCompleted of the
# request, that turn is rejected CANCELLED". CONTRACT 4: "A response cancelled before its
# completion is processed is never promoted." Here Conversation B's promotion (another
# request) makes Conversation A's cancellation count as "after the request's promotion".

@pytest.mark.parametrize("entry", ["handle", "handle_async"])
def test_cancel_naming_another_conversations_promoted_response_still_cancels(entry):
    w = Worker(MemoryCheckpointStore(StoreOptions()), MemoryLedger(), entry)
    key = uid("idem")
    in_b = make_turn(conversation_id=uid("convB"), expected_head_seq=0, idempotency_key=key,
                     response_id=uid("resp"))
    assert isinstance(w.outcome(in_b), CheckpointPromoted)
    in_a = make_turn(conversation_id=uid("convA"), expected_head_seq=0, idempotency_key=key,
                     response_id=uid("resp"))
    # A's request cancelled (on A's key), naming "any response id": here B's.
    w.feed(make_turn_cancelled(in_a, response_id=in_b.response_id))
    out = w.outcome(in_a)
    assert isinstance(out, PromotionRejected) and out.reason is R.CANCELLED, (
        f"cancelled request in Conversation A published {type(out).__name__}")


# A late ToolEffect of a cancelled Conversation request whose ``response_id`` equals
# its ``conversation_id`` (ids are opaque: nothing forbids it) is treated as an effect of
# a chain's FIRST response (``RequestFacts._cancelled_request_orphan`` and
# ``CheckpointStore.promoted_key`` test ``partition_key == response_id`` instead of
# ``request_scope``): it takes the key's first-of-chain request claim (``hold_request``)
# and marks that response rejected, so an unrelated request -- the first response of a
# chain using the same key, another scope -- is rejected CONFLICT ("request ... is bound
# to response ..., which was not promoted").
#
# docs/gateway-protocol.md section 6 "The request's scope": "The same key in another
# Conversation or chain is another request, with its own tool effects, cancellation,
# duplicates and outcomes: a cancellation in one never cancels the other". Only effect ids
# and effect claims are shared by key; the request claim is not listed.

@pytest.mark.parametrize("entry", ["handle", "handle_async"])
def test_a_conversation_cancellation_never_binds_a_chain_request(entry):
    w = Worker(MemoryCheckpointStore(StoreOptions()), MemoryLedger(), entry)
    key, conv = uid("idem"), uid("c")
    turn = make_turn(conversation_id=conv, expected_head_seq=0, idempotency_key=key,
                     response_id=conv)
    w.feed(make_turn_cancelled(turn))
    w.outcome(turn)  # CANCELLED
    late = make_tool_effect("call_1", idempotency_key=key, conversation_id=conv,
                            response_id=conv)
    out = [o.model for o in w.handle(late).outbound]
    assert [type(m) for m in out] == [EffectOrphaned]
    # Another request that happens to use the key: a chain's first response.
    first = make_turn(conversation_id=None, expected_head_seq=None, idempotency_key=key,
                      response_id=uid("resp"))
    res = w.outcome(first)
    assert isinstance(res, CheckpointPromoted), (res.reason, res.detail)
