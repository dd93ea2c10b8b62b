"""The API's reads of a Conversation and a chain that share one partition key.

One tenant's Conversation ``X`` and its chain whose first response is ``X`` live in one
store partition (CONTRACT section 2; docs/gateway-protocol.md, "A Conversation and a
chain that share a key"): two histories. Every endpoint answers each with its own
items and seqs, cold, from the cache, and extended by new rows, whichever was promoted
first: the cache's per-partition facts (the highest Conversation seq, the backed head,
"extendable") and its locations never lend one history's turns or head to the other.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.test_api_cache import NO_CACHE, CachingStack, message, uid

ORDERS = ("chain_first", "conversation_first", "interleaved")


class Histories:
    def __init__(self, stack: CachingStack) -> None:
        self.stack = stack
        self.tenant, self.key = uid("tenant"), uid("shared")
        self.items: dict[str, list[str]] = {}  # response id -> its history's item ids
        self.conversation: list[str] = []  # the Conversation's responses, in order

    def turn(self) -> str:
        head = len(self.conversation)
        item = uid("m")
        rid = self.stack.promote(self.tenant, self.key, head, (message("v", item_id=item),))
        before = self.items[self.conversation[-1]] if self.conversation else []
        self.items[rid] = [*before, item]
        self.conversation.append(rid)
        return rid

    def chain(self, previous: str | None) -> str:
        rid = self.key if previous is None else uid("resp")
        self.stack.chain(self.tenant, self.key, rid, previous)
        stored = self.stack.store._partitions[(self.tenant, self.key)].items[rid]
        before = [] if previous is None else self.items[previous]
        self.items[rid] = [*before, *(i.item_id for i in stored.items())]
        return rid

    def check_response(self, rid: str, head_seq: int, **headers) -> None:
        resp = self.stack.history(self.tenant, rid, **headers)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["response_id"] == rid
        assert [i["item_id"] for i in body["items"]] == self.items[rid], (rid, body)
        assert body["head_seq"] == len(self.items[rid])
        if rid in self.conversation:
            assert body["conversation_head_seq"] == head_seq, body
        else:
            assert body.get("conversation_head_seq") is None, body

    def check_conversation(self, **headers) -> None:
        resp = self.stack.conversation(self.tenant, self.key, **headers)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        head = self.conversation[-1]
        assert (body["response_id"], body["head_seq"]) == (head, len(self.conversation))
        assert [i["item_id"] for i in body["items"]] == self.items[head], body

    def check_all(self) -> None:
        for headers in (NO_CACHE, {}, {}):  # cold, then cached (hit or extended)
            self.check_conversation(**headers)
            for rid in self.items:
                self.check_response(rid, len(self.conversation), **headers)
        for rid in self.items:
            status = self.stack.client.get(f"/v1/responses/{rid}/status",
                                           params={"tenant_id": self.tenant}).json()
            assert (status["state"], status["seq"]) == ("promoted", len(self.items[rid]))


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi"])
def stack(request) -> CachingStack:
    return CachingStack(fast_path=request.param)


@pytest.mark.parametrize("order", ORDERS)
def test_each_history_is_answered_as_its_own_cold_cached_and_extended(stack, order):
    h = Histories(stack)
    if order == "chain_first":
        y = h.chain(h.chain(None))
        h.turn()
        h.turn()
    elif order == "conversation_first":
        h.turn()
        h.turn()
        y = h.chain(h.chain(None))
    else:
        h.turn()
        root = h.chain(None)
        h.turn()
        y = h.chain(root)
    h.check_all()
    # Both grow while their prefixes are cached: each extension reads its own rows.
    h.turn()
    z = h.chain(y)
    h.chain(h.key)  # a fork of the root
    h.check_all()
    # The Conversation's head seq (3) is below the partition's highest chain seq (3)
    # and turn count (7): one more chain turn must not look like a head gone back.
    h.chain(z)
    h.check_all()


@pytest.mark.parametrize("damaged", ["chain", "conversation"])
def test_damage_to_one_history_never_fails_the_other(stack, damaged):
    """A turn's stored item rewritten (its digest no longer matches): its own history is
    CORRUPT_HISTORY on every endpoint; the other history of the partition reads as before,
    cold and cached."""
    h = Histories(stack)
    h.turn()
    root = h.chain(None)
    v2 = h.turn()
    y = h.chain(root)
    h.check_all()  # all cached
    rid = y if damaged == "chain" else v2
    stored = stack.store._partitions[(h.tenant, h.key)].items[rid]
    stack.store._partitions[(h.tenant, h.key)].items[rid] = replace(
        stored, contents=(b'{"x":1}', *stored.contents[1:]))
    broken = stack.fresh(h.tenant, rid)
    assert (broken.status_code, broken.json()["reason"]) == (500, "CORRUPT_HISTORY")
    if damaged == "conversation":
        conv = stack.conversation(h.tenant, h.key, **NO_CACHE)
        assert (conv.status_code, conv.json()["reason"]) == (500, "CORRUPT_HISTORY")
    for headers in (NO_CACHE, {}):
        if damaged == "chain":
            h.check_conversation(**headers)
            for other in h.conversation:
                h.check_response(other, len(h.conversation), **headers)
        else:
            h.check_response(root, 2, **headers)
            h.check_response(y, 2, **headers)
