"""The status endpoint answers a damaged Conversation head as the history endpoints do.

CONTRACT 5: "A head that no verified checkpoint backs is an integrity failure on every
endpoint". Both history endpoints answered 500 ``CORRUPT_HISTORY`` for such a head while
``/status`` of a response of the same Conversation answered 200 ``promoted`` (an outside
review, session 32: a gateway in Node, from the docs). The status read now checks the
head of a Conversation response's partition: present, at or beyond the response, and a
checkpoint's own cells."""

from __future__ import annotations

from ratchet.domain.history import Head
from tests.unit.test_api_cache import CachingStack, _conv_of, _third_turn, two_turns


def _status(stack, tenant, rid):
    return stack.client.get(f"/v1/responses/{rid}/status", params={"tenant_id": tenant})


def _three_turns(stack):
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    third = _third_turn(stack, tenant, conv)
    partition = stack.store._partitions[(tenant, conv)]
    first = next(c.response_id for c in partition.checkpoints.values() if c.seq == 1)
    return tenant, conv, (first, second, third), partition


def test_a_healthy_conversation_is_promoted_with_each_seq():
    stack = CachingStack()
    tenant, _, rids, _ = _three_turns(stack)
    for seq, rid in enumerate(rids, start=1):
        body = _status(stack, tenant, rid).json()
        assert (body["state"], body["seq"]) == ("promoted", seq)


def test_head_cells_no_checkpoint_backs_are_corrupt_for_every_response():
    stack = CachingStack()
    tenant, conv, rids, _ = _three_turns(stack)
    stack.rewrite_head(tenant, conv, lineage_digest="0" * 64)
    for rid in rids:
        answer = _status(stack, tenant, rid)
        assert (answer.status_code, answer.json()["error"]) == (500, "CORRUPT_HISTORY"), rid
    assert stack.conversation(tenant, conv).json()["reason"] == "CORRUPT_HISTORY"


def test_a_lost_head_is_corrupt():
    stack = CachingStack()
    tenant, _, rids, partition = _three_turns(stack)
    partition.head = None
    answer = _status(stack, tenant, rids[0])
    assert (answer.status_code, answer.json()["error"]) == (500, "CORRUPT_HISTORY")


def test_a_head_rolled_back_below_a_response_is_corrupt_for_it():
    """Rolled back onto turn 2 (its own cells: backed): turn 3 stands beyond it."""
    stack = CachingStack()
    tenant, _, (first, second, third), partition = _three_turns(stack)
    partition.head = Head.of(partition.checkpoints[second])
    answer = _status(stack, tenant, third)
    assert (answer.status_code, answer.json()["error"]) == (500, "CORRUPT_HISTORY")


def test_a_chain_response_has_no_head_to_check():
    stack = CachingStack()
    root = stack.chain("tenant-chain", "resp-root", "resp-root", None)
    child = stack.chain("tenant-chain", root, "resp-child", root)
    body = _status(stack, "tenant-chain", child).json()
    assert (body["state"], body["seq"]) == ("promoted", 2)


def test_a_head_read_one_commit_behind_is_looked_at_again():
    """Reads at read consistency may straddle a promotion still committing: a head one
    turn behind the response just promoted is read again at SERIAL, not a 500 (a third
    outside review, session 32)."""
    stack = CachingStack()
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    lagging = stack.store.read_head(tenant, conv)
    third = _third_turn(stack, tenant, conv)
    real, calls = stack.store.read_head, []

    def lag_once(t, p):
        calls.append(p)
        return lagging if len(calls) == 1 else real(t, p)

    stack.store.read_head = lag_once
    body = _status(stack, tenant, third).json()
    assert (body["state"], body["seq"]) == ("promoted", 3)


def test_a_head_row_not_visible_yet_is_looked_at_again():
    stack = CachingStack()
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    third = _third_turn(stack, tenant, conv)
    real, missed = stack.store.read_checkpoint, []

    def not_yet(t, rid):
        if rid == third and not missed:
            missed.append(rid)
            return None
        return real(t, rid)

    stack.store.read_checkpoint = not_yet
    body = _status(stack, tenant, second).json()
    assert (body["state"], body["seq"]) == ("promoted", 2)
