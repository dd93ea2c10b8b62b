"""What a mutation review of the store's write path (session 44) found no test holding,
where one backend-free test can hold it: ``turn_size`` counts every byte the turn's row
stores (``services/store/base.py``; the guard keeps one Cassandra mutation under its
cap, docs/store.md "Size")."""

from __future__ import annotations

import dataclasses

from schemas.models import Item
from services.store.base import turn_size
from tests.contract.store_support import artifact, chain_turn, conversation_turn, uid


def _stored_bytes(request) -> int:
    """The bytes of the values the turn row holds, without any overhead."""
    size = len(request.response_id) + len(request.idempotency_key) + len(request.request_digest)
    if request.token_artifact is not None:
        size += len(request.token_artifact.to_json())
    for item in request.items:
        size += len(item.content) + len(item.content_digest) + len(item.item_id)
    return size


def test_every_stored_value_of_a_turn_counts_towards_its_size():
    turn = conversation_turn(uid("tenant"), uid("conv"), 0, n_items=3)
    assert turn_size(turn) >= _stored_bytes(turn) + 64 * len(turn.items)


def test_a_token_artifact_counts_towards_the_turn_size():
    turn = conversation_turn(uid("tenant"), uid("conv"), 0)
    bare = dataclasses.replace(turn, token_artifact=None)
    with_artifact = dataclasses.replace(turn, token_artifact=artifact())
    assert turn_size(with_artifact) - turn_size(bare) >= len(artifact().to_json())


def test_an_items_digest_counts_towards_the_turn_size():
    turn = chain_turn(uid("tenant"), uid("root"), uid("resp"), None, n_items=1)
    (item,) = turn.items
    longer = dataclasses.replace(turn, items=(Item(
        item_id=item.item_id, type=item.type, role=item.role, content=item.content,
        content_digest=item.content_digest + "0" * 100),))
    assert turn_size(longer) - turn_size(turn) == 100


def test_a_head_hint_never_goes_back():
    """``_Hints.put_head``: the store's own heads only move forward (an older head
    learnt late, from a read that raced a promotion, must not replace a newer one: the
    newer is what tells a head rolled back under the store, ``_check_not_behind``)."""
    from ratchet.domain.history import Head
    from services.store.hints import _Hints

    hints = _Hints(8)
    hints.put_head("p", Head(3, "resp_3", 6))
    hints.put_head("p", Head(2, "resp_2", 4))
    assert hints.get("p") == Head(3, "resp_3", 6)
    hints.put_head("p", Head(4, "resp_4", 8))
    assert hints.get("p") == Head(4, "resp_4", 8)


def test_a_promotion_teaches_the_hints_its_head_checkpoint_and_location():
    """``StoreHints.learn_promotion``: after a promotion the store knows the
    Conversation's head, the checkpoint a chain's next turn names as its parent, and
    where each response lives (no test pinned it; session 47 tried inlining its puts)."""
    from ratchet.domain.history import Head
    from ratchet.domain.plan import Promoted
    from services.store.memory import MemoryCheckpointStore

    store = MemoryCheckpointStore()
    conv = uid("conv")
    first = conversation_turn("t1", conv, 0)
    promoted = store.promote(first)
    assert isinstance(promoted, Promoted)
    hints = store._hints
    assert hints.head(conversation_turn("t1", conv, 1)) == Head.of(promoted.checkpoint)
    assert hints.partition("t1", first.response_id, None) == conv
    root = uid("resp")
    parent = store.promote(chain_turn("t1", root, root, None))
    assert isinstance(parent, Promoted)
    child = chain_turn("t1", root, uid("resp"), root)
    assert hints.parent(child) == parent.checkpoint
    assert hints.partition("t1", root, None) == root
    assert hints.partition("t2", root, None) is None  # another tenant's: never
