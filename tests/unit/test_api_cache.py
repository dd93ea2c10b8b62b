"""The API's verified-history cache (services/api/cache.py) on the in-memory store.

What is pinned (CONTRACT section 5): a history verified when it was LOADED is served
from memory afterwards: a chain-mode response hit reads nothing, a hit on a Conversation
(either endpoint) reads its head (one row, which must be backed), a history grown by new turns reads only the new rows and verifies them and
their lineage-digest link to the cached prefix. Rows changed after caching are caught
by whatever loads them (a no-cache read, an extension), while a plain hit keeps serving
the verified bytes. The same behaviours against real Cassandra rows live in
tests/e2e/test_http_cache.py.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace
from datetime import timedelta
from types import SimpleNamespace

import pytest

from ratchet.domain.history import Head, PromotionMode, VerifiedHistory
from ratchet.domain.plan import PromotionRequest
from schemas.items import message
from schemas.models import Certification
from services.api.cache import (
    ENTRY_OVERHEAD_BYTES,
    SIDE_ENTRY_OVERHEAD_BYTES,
    SIDE_MAP_SHARE,
    CachedHistory,
    HistoryCache,
)
from services.api.render import (
    RenderedHistory,
    history_json,
    history_outcome_body,
    render_history,
)
from services.api.service import RehydrationService
from tests.unit.test_api_http import (
    FP,
    NOW,
    OTHER_FP,
    Stack,
    two_turns,
    uid,
    undecodable_item,
)

NO_CACHE = {"Cache-Control": "no-cache"}


class CachingStack(Stack):
    """The unit Stack with the cache wired in, counting every storage read by kind."""

    def __init__(self, retention_s: int = 0, cache_bytes: int = 1 << 20,
                 fast_path: bool = True) -> None:
        super().__init__(retention_s, fast_path)
        self.cache = HistoryCache(cache_bytes)
        self.reads: dict[str, int] = {}
        for name in ("read_history", "read_turn", "read_head", "locate"):
            self._count(name)
        self.service = RehydrationService(
            self.store, self.ledger, self.waiters, clock=self.clock, cache=self.cache
        )
        self.client = self.client_of(self.service)

    def _count(self, name: str) -> None:
        method = getattr(self.store, name)

        def counted(*args, **kwargs):
            self.reads[name] = self.reads.get(name, 0) + 1
            return method(*args, **kwargs)

        setattr(self.store, name, counted)

    def reads_during(self, call) -> tuple[object, dict[str, int]]:
        before = dict(self.reads)
        result = call()
        return result, {k: v - before.get(k, 0) for k, v in self.reads.items() if v - before.get(k, 0)}

    def conversation(self, tenant: str, conv: str, fp: str = FP, **headers):
        return self.client.get(
            f"/v1/conversations/{conv}/history",
            params={"tenant_id": tenant, "fingerprint_hash": fp},
            headers=headers,
        )

    def fresh(self, tenant: str, rid: str):
        return self.client.get(
            f"/v1/responses/{rid}/history",
            params={"tenant_id": tenant, "fingerprint_hash": FP},
            headers=NO_CACHE,
        )

    def damage_item(self, tenant: str, conv: str, seq: int = 1) -> None:
        """Rewrite the first stored item of the turn at ``seq`` (its content no longer
        matches its digest), as a direct write to the store would."""
        partition = self.store._partitions[(tenant, conv)]
        rid = next(c.response_id for c in partition.checkpoints.values() if c.seq == seq)
        stored = partition.items[rid]
        contents = (b'{"x":1}', *stored.contents[1:])
        partition.items[rid] = replace(stored, contents=contents)

    def rewrite_checkpoint(self, tenant: str, partition_key: str, rid: str, **changes) -> None:
        partition = self.store._partitions[(tenant, partition_key)]
        partition.checkpoints[rid] = replace(partition.checkpoints[rid], **changes)

    def rewrite_head(self, tenant: str, partition_key: str, **changes) -> None:
        partition = self.store._partitions[(tenant, partition_key)]
        partition.head = replace(partition.head, **changes)

    def chain(self, tenant: str, root: str, rid: str, previous: str | None) -> str:
        key = uid("key")
        outcome = self.store.promote(
            PromotionRequest(
                tenant_id=tenant,
                partition_key=root,
                mode=PromotionMode.CHAIN,
                response_id=rid,
                idempotency_key=key,
                request_digest=key,
                items=(message(f"turn {rid}", item_id=uid("m")),),
                certification=Certification.LOGICAL_ONLY,
                fingerprint_hash=FP,
                previous_response_id=previous,
            )
        )
        assert type(outcome).__name__ == "Promoted", outcome
        return rid


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi"])
def stack(request) -> CachingStack:
    return CachingStack(fast_path=request.param)


def _conv_of(stack: CachingStack, tenant: str, rid: str) -> str:
    return stack.store._locate(tenant, rid)


def _third_turn(stack: CachingStack, tenant: str, conv: str) -> str:
    return stack.promote(tenant, conv, 2, (message("c", item_id=uid("m")),))


def turn_to_damage(load: str) -> tuple[CachingStack, str, str, str]:
    """A Conversation of two promoted turns on a new stack: (stack, tenant, conv, the
    turn a test damages). ``load == "extension"``: the second turn's history was read
    (its linked prefix cached) and the turn to damage is a third one, which the next
    read loads as an extension; else the second turn."""
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    if load != "extension":
        return stack, tenant, conv, rid
    assert stack.history(tenant, rid).status_code == 200  # linked prefix cached
    return stack, tenant, conv, _third_turn(stack, tenant, conv)


def test_a_chain_response_hit_reads_nothing_and_serves_the_same_bytes(stack):
    tenant, root = uid("tenant"), uid("resp")
    stack.chain(tenant, root, root, None)
    rid = stack.chain(tenant, root, uid("resp"), root)
    first, reads = stack.reads_during(lambda: stack.history(tenant, rid))
    assert first.status_code == 200 and reads.get("read_history") == 1
    second, reads = stack.reads_during(lambda: stack.history(tenant, rid))
    assert reads == {}, "a chain-mode response hit read the store"
    assert second.content == first.content
    assert (second.json()["head_seq"], second.json()["conversation_head_seq"]) == (2, None)


def test_a_conversation_response_hit_reads_only_the_head(stack):
    """The answer reports the Conversation's current head, which must be backed: one
    head read, the same one-row read as the Conversation endpoint's hit."""
    tenant, rid, ids = two_turns(stack)
    first, reads = stack.reads_during(lambda: stack.history(tenant, rid))
    assert first.status_code == 200 and reads.get("read_history") == 1
    second, reads = stack.reads_during(lambda: stack.history(tenant, rid))
    assert reads == {"read_head": 1}
    assert second.content == first.content
    assert [i["item_id"] for i in second.json()["items"]] == ids


def test_a_hit_whose_head_moved_backs_the_new_head_by_extension(stack):
    """The head names a turn not cached yet: it is loaded and verified (its row alone)
    before the cached response answers with it."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.history(tenant, rid)
    third = _third_turn(stack, tenant, conv)
    resp, reads = stack.reads_during(lambda: stack.history(tenant, rid))
    assert reads == {"read_head": 1, "read_turn": 1}
    assert (resp.json()["head_seq"], resp.json()["conversation_head_seq"]) == (2, 3)
    assert resp.content == stack.fresh(tenant, rid).content
    assert stack.cache.get(tenant, third) is not None


@pytest.mark.parametrize("cached", [True, False])
def test_a_head_no_checkpoint_backs_fails_on_a_cached_response_too(stack, cached):
    """CONTRACT section 5: an integrity failure on every endpoint, cached or not."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    if cached:
        assert stack.history(tenant, rid).status_code == 200
        assert stack.conversation(tenant, conv).status_code == 200
    partition = stack.store._partitions[(tenant, conv)]
    head = partition.head
    partition.head = replace(head, seq=head.seq + 2, response_id=uid("resp"))
    for resp in (
        stack.history(tenant, rid),
        stack.fresh(tenant, rid),
        stack.conversation(tenant, conv),
        stack.conversation(tenant, conv, **NO_CACHE),
    ):
        assert resp.status_code == 500, resp.text
        assert resp.json()["reason"] == "CORRUPT_HISTORY"


def test_a_conversation_hit_reads_only_the_head(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    first = stack.conversation(tenant, conv)
    assert first.status_code == 200
    hit, reads = stack.reads_during(lambda: stack.conversation(tenant, conv))
    assert reads == {"read_head": 1}
    assert hit.content == first.content == stack.history(tenant, rid).content


def test_a_row_changed_after_caching_is_caught_by_a_no_cache_read_not_by_a_hit(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    verified = stack.history(tenant, rid)
    stack.damage_item(tenant, conv)
    # The verified, promoted history keeps being served byte-identical from memory.
    assert stack.history(tenant, rid).content == verified.content
    assert stack.conversation(tenant, conv).content == verified.content
    # Whatever LOADS the rows verifies them.
    for resp in (stack.fresh(tenant, rid), stack.conversation(tenant, conv, **NO_CACHE)):
        assert resp.status_code == 500, resp.text
        assert resp.json()["reason"] == "CORRUPT_HISTORY" and resp.json()["items"] is None


def test_failures_are_never_cached(stack):
    tenant, rid, _ = two_turns(stack)
    stack.damage_item(tenant, _conv_of(stack, tenant, rid))
    for expected_reads in (1, 2):
        assert stack.history(tenant, rid).status_code == 500
        assert stack.reads["read_history"] == expected_reads
    assert len(stack.cache) == 0


def test_fingerprint_and_artifact_expiry_are_decided_per_request(stack):
    tenant, rid, ids = two_turns(stack)
    assert stack.history(tenant, rid).json()["outcome"] == "certified"
    other = stack.history(tenant, rid, fp=OTHER_FP).json()
    assert (other["outcome"], other["reason"]) == ("fallback", "FINGERPRINT_MISMATCH")
    assert [i["item_id"] for i in other["items"]] == ids and other["checkpoint"] is None
    stack.clock.now = NOW + timedelta(hours=2)  # artifacts expire after one hour
    expired = stack.history(tenant, rid).json()
    assert (expired["outcome"], expired["reason"]) == ("fallback", "ARTIFACT_EXPIRED")
    assert stack.reads["read_history"] == 1


def test_logical_expiry_is_decided_per_request():
    stack = CachingStack(retention_s=60)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    assert stack.history(tenant, rid).status_code == 200
    stack.clock.now = NOW + timedelta(seconds=61)
    resp = stack.history(tenant, rid)
    assert resp.status_code == 410 and resp.json()["reason"] == "EXPIRED"


def test_an_expired_cached_history_answers_expired_without_a_full_read():
    """Its stored expiry never changes, and the full read answers EXPIRED before any
    other rule of the response: a cached one answers the same, byte for byte, with no
    read (a Conversation endpoint: its head read only, which names the turn)."""
    stack = CachingStack(retention_s=60)
    tenant, conv, root = uid("tenant"), uid("conv"), uid("resp")
    rid = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    stack.chain(tenant, root, root, None)
    for response_id in (rid, root):
        assert stack.history(tenant, response_id).status_code == 200
    assert stack.conversation(tenant, conv).status_code == 200
    stack.clock.now = NOW + timedelta(seconds=61)
    for response_id in (rid, root):
        fresh = stack.fresh(tenant, response_id)
        assert fresh.status_code == 410 and fresh.json()["reason"] == "EXPIRED"
        for _ in range(2):
            cached, reads = stack.reads_during(lambda r=response_id: stack.history(tenant, r))
            assert reads == {}
            assert (cached.status_code, cached.content) == (410, fresh.content)
    fresh = stack.conversation(tenant, conv, **NO_CACHE)
    cached, reads = stack.reads_during(lambda: stack.conversation(tenant, conv))
    assert reads == {"read_head": 1}
    assert (cached.status_code, cached.content) == (410, fresh.content)


def test_a_cached_turn_under_a_head_too_large_to_cache_is_a_hit():
    """An outside review, session 36: a cached early turn of a Conversation whose head
    history is not cached (here larger than the whole cache) was never served from the
    cache: each request tried to back the head by extension, failed, and read the whole
    partition again. The full read that cached the turn verified the head backed by its
    checkpoint; the same head cells are backed still (rows are immutable): one head
    read, as for any Conversation response hit."""
    stack = CachingStack(cache_bytes=64 * 1024)
    tenant, conv = uid("tenant"), uid("conv")
    early = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    for seq in (1, 2):
        stack.promote(tenant, conv, seq, (message("x" * 40_000, item_id=uid("m")),))
    first, reads = stack.reads_during(lambda: stack.history(tenant, early))
    assert first.status_code == 200 and reads.get("read_history") == 1
    assert stack.cache.get(tenant, early) is not None
    for _ in range(3):
        again, reads = stack.reads_during(lambda: stack.history(tenant, early))
        assert reads == {"read_head": 1}
        assert again.content == first.content
    # A head that moved is not the one the read backed: backed by a read again.
    stack.promote(tenant, conv, 3, (message("b", item_id=uid("m")),))
    moved, reads = stack.reads_during(lambda: stack.history(tenant, early))
    assert moved.status_code == 200 and moved.json()["conversation_head_seq"] == 4
    assert reads.get("read_head") == 1 and reads != {"read_head": 1}


def test_a_head_rolled_back_is_caught_while_any_turn_of_it_is_cached():
    """An outside review of session 36's first side-map bound: the highest seq verified
    per partition was kept in a map bounded apart from the entries, and 700 other
    Conversations read evicted it while turn 1 stayed cached; a head then rolled back
    onto turn 1 was served 200 certified, a shortened history. What the cache knows
    of a partition now lives exactly as long as an entry of it."""
    stack = CachingStack(cache_bytes=4 << 20)
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    partition = stack.store._partitions[(tenant, conv)]
    first = next(c.response_id for c in partition.checkpoints.values() if c.seq == 1)
    for rid in (first, second):
        assert stack.history(tenant, rid).status_code == 200
    for _ in range(700):  # other traffic: one-turn Conversations of other tenants
        other, other_conv = uid("tenant"), uid("conv")
        rid = stack.promote(other, other_conv, 0, (message("a", item_id=uid("m")),))
        assert stack.history(other, rid).status_code == 200
    assert stack.cache.get(tenant, first) is not None
    partition.head = Head.of(partition.checkpoints[first])  # damage: turn 2 stands
    for answer in (stack.conversation(tenant, conv), stack.history(tenant, first)):
        assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY")


def test_a_new_turn_is_read_alone_and_appended_to_the_cached_prefix(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.conversation(tenant, conv).json()["head_seq"] == 2
    third = _third_turn(stack, tenant, conv)
    extended, reads = stack.reads_during(lambda: stack.conversation(tenant, conv))
    assert reads == {"read_head": 1, "read_turn": 1}  # the head, then only the new row
    body = extended.json()
    assert body["response_id"] == third and body["head_seq"] == 3 and len(body["items"]) == 7
    # Byte for byte what a full read of the same history answers.
    assert extended.content == stack.conversation(tenant, conv, **NO_CACHE).content
    # The new history is cached: the response endpoint reads only the head for it.
    hit, reads = stack.reads_during(lambda: stack.history(tenant, third))
    assert reads == {"read_head": 1} and hit.content == extended.content
    # The earlier response is still a hit: its own seq, and the Conversation's head now
    # (CONTRACT section 5), backed by the history just cached.
    old, reads = stack.reads_during(lambda: stack.history(tenant, rid))
    assert reads == {"read_head": 1}
    body = old.json()
    assert body["response_id"] == rid and len(body["items"]) == 6
    assert (body["head_seq"], body["conversation_head_seq"]) == (2, 3)


def test_the_response_endpoint_extends_too(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.history(tenant, rid)
    third = _third_turn(stack, tenant, conv)
    resp, reads = stack.reads_during(lambda: stack.history(tenant, third))
    assert resp.status_code == 200 and "read_history" not in reads and reads["read_turn"] == 1
    assert resp.content == stack.fresh(tenant, third).content


def test_a_partition_hint_spares_the_location_read(stack):
    """The gateway names the response's partition: the extension reads ONE row (no
    claim read first), and answers exactly what a full read answers."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.history(tenant, rid)
    third = _third_turn(stack, tenant, conv)
    resp, reads = stack.reads_during(lambda: stack.history(tenant, third, partition_key=conv))
    assert resp.status_code == 200 and reads == {"read_turn": 1}
    assert resp.content == stack.fresh(tenant, third).content


def test_a_wrong_partition_hint_is_not_trusted(stack):
    """A hint naming another partition (or none that exists) costs a read; the claim
    then locates the response, whose history is answered as without a hint."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    other_conv = uid("conv")  # another Conversation of the tenant, its history cached
    stack.history(tenant, stack.promote(tenant, other_conv, 0, (message("o", item_id=uid("m")),)))
    other_tenant, other, _ = two_turns(stack)
    stack.history(other_tenant, other)
    stack.history(tenant, rid)
    third = _third_turn(stack, tenant, conv)
    for hint in (other_conv, uid("conv"), _conv_of(stack, other_tenant, other)):
        stack.cache.discard(tenant, third)
        resp = stack.history(tenant, third, partition_key=hint)
        assert resp.status_code == 200 and resp.content == stack.fresh(tenant, third).content
    # An unknown response, or another tenant's, is NOT_FOUND whatever the hint says.
    assert stack.history(tenant, uid("resp"), partition_key=conv).status_code == 404
    assert stack.history(uid("tenant"), third, partition_key=conv).status_code == 404
    assert stack.history(tenant, third, partition_key="bad hint!").status_code == 422


def test_a_hinted_extension_still_verifies_the_row(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.history(tenant, rid)
    third = _third_turn(stack, tenant, conv)
    stack.damage_item(tenant, conv, seq=3)
    resp = stack.history(tenant, third, partition_key=conv)
    assert resp.status_code == 500 and resp.json()["reason"] == "CORRUPT_HISTORY"


def test_an_extension_verifies_the_new_row(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.conversation(tenant, conv)
    _third_turn(stack, tenant, conv)
    stack.damage_item(tenant, conv, seq=3)
    resp, reads = stack.reads_during(lambda: stack.conversation(tenant, conv))
    assert reads == {"read_head": 1, "read_turn": 1}
    assert resp.status_code == 500 and resp.json()["reason"] == "CORRUPT_HISTORY"
    assert stack.history(tenant, rid).status_code == 200  # the verified prefix stands


def test_an_extension_refuses_a_broken_lineage_link(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.conversation(tenant, conv)
    third = _third_turn(stack, tenant, conv)
    stack.rewrite_checkpoint(tenant, conv, third, lineage_digest="0" * 64)
    resp = stack.conversation(tenant, conv)
    assert resp.status_code == 500 and resp.json()["reason"] == "CORRUPT_HISTORY"
    # A full read refuses it the same way: replicas with and without the prefix agree.
    assert stack.conversation(tenant, conv, **NO_CACHE).json()["reason"] == "CORRUPT_HISTORY"


@pytest.mark.parametrize("cells", [{"item_count": 2}, {"lineage_digest": "00"}])
def test_head_cells_their_row_does_not_back_are_corrupt_on_every_path(stack, cells):
    """The cached paths take the head cells for backed when they name a cached turn at
    their seq; cells unlike that turn's own (damage: an outside review found them
    served certified) are CORRUPT_HISTORY there too, as on a full read."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.conversation(tenant, conv).json()["outcome"] == "certified"
    assert stack.history(tenant, rid).json()["outcome"] == "certified"  # cached now
    stack.rewrite_head(tenant, conv, **cells)
    for answer in (stack.conversation(tenant, conv), stack.history(tenant, rid),
                   stack.conversation(tenant, conv, **NO_CACHE)):
        assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY")


def test_a_lost_head_is_corrupt_not_an_unknown_conversation(stack):
    """A Conversation whose head cells are gone while its turns stand is damage, not
    NOT_FOUND (a gateway would begin it again), cached or not."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.conversation(tenant, conv).json()["outcome"] == "certified"
    stack.store._partitions[(tenant, conv)].head = None
    for answer in (stack.conversation(tenant, conv), stack.history(tenant, rid),
                   stack.conversation(tenant, conv, **NO_CACHE)):
        assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY")


def test_a_turn_without_a_lineage_digest_is_never_taken_as_a_link(stack):
    """Rows promoted before lineage digests existed: the extension cannot link them,
    so the history is read in full (and, unlinked, is never extended later)."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.conversation(tenant, conv)
    third = _third_turn(stack, tenant, conv)
    stack.rewrite_checkpoint(tenant, conv, third, lineage_digest=None)
    stack.rewrite_head(tenant, conv, lineage_digest=None)  # written with it, as it was
    resp, reads = stack.reads_during(lambda: stack.conversation(tenant, conv))
    assert resp.status_code == 200 and reads.get("read_history") == 1
    assert stack.cache.get(tenant, third).linked is False


def test_a_promotion_prewarms_the_cache(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.history(tenant, rid)
    third = _third_turn(stack, tenant, conv)
    warmed, reads = stack.reads_during(lambda: asyncio.run(stack.service.prewarm(tenant, conv, third)))
    assert warmed and reads == {"read_turn": 1}
    resp, reads = stack.reads_during(lambda: stack.history(tenant, third))
    assert reads == {"read_head": 1} and resp.status_code == 200
    assert (resp.json()["head_seq"], resp.json()["conversation_head_seq"]) == (3, 3)
    assert resp.content == stack.fresh(tenant, third).content


def test_prewarm_without_a_cached_parent_reads_at_most_one_row(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    third = _third_turn(stack, tenant, conv)
    warmed, reads = stack.reads_during(lambda: asyncio.run(stack.service.prewarm(tenant, conv, third)))
    assert not warmed and reads == {}  # nothing of this partition is cached


def test_chain_forks_share_their_cached_prefix(stack):
    tenant, root = uid("tenant"), uid("resp")
    stack.chain(tenant, root, root, None)
    parent = stack.chain(tenant, root, uid("resp"), root)
    stack.history(tenant, parent)
    for _ in range(2):  # two children of one parent: both extend the same prefix
        child = stack.chain(tenant, root, uid("resp"), parent)
        resp, reads = stack.reads_during(lambda child=child: stack.history(tenant, child))
        assert resp.status_code == 200 and "read_history" not in reads
        assert resp.json()["head_seq"] == 3 and len(resp.json()["items"]) == 3
        assert resp.content == stack.fresh(tenant, child).content


def test_cache_control_no_cache_reads_the_store(stack):
    tenant, rid, _ = two_turns(stack)
    stack.history(tenant, rid)
    resp, reads = stack.reads_during(lambda: stack.fresh(tenant, rid))
    assert resp.status_code == 200 and reads.get("read_history") == 1


def test_another_tenant_never_gets_a_cached_history(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200
    assert stack.conversation(tenant, conv).status_code == 200
    assert stack.history("someone-else", rid).status_code == 404
    assert stack.conversation("someone-else", conv).status_code == 404
    # The same ids promoted by another tenant: each tenant gets its own history.
    other = stack.promote("someone-else", conv, 0, (message("theirs", item_id=uid("m")),),
                          response_id=rid)
    theirs = stack.history("someone-else", other).json()
    assert len(theirs["items"]) == 1 and len(stack.history(tenant, rid).json()["items"]) == 6


def test_a_zero_byte_cache_is_off():
    stack = CachingStack(cache_bytes=0)
    tenant, rid, _ = two_turns(stack)
    stack.history(tenant, rid)
    stack.history(tenant, rid)
    assert stack.reads == {"read_history": 2}


# --- the spliced JSON body is pydantic's, byte for byte ----------------------------------


@pytest.mark.parametrize(
    ("certified", "fp", "later", "reason"),
    [
        (True, FP, False, None),
        (True, OTHER_FP, False, "FINGERPRINT_MISMATCH"),
        (True, FP, True, "ARTIFACT_EXPIRED"),
        (False, FP, False, "NOT_CERTIFIED"),
    ],
)
def test_spliced_body_equals_the_pydantic_body(certified, fp, later, reason):
    stack = Stack()
    tenant, conv = uid("tenant"), uid("conv")
    items = (
        message('héllo \u2028 "quoted" \\ </script> \x00\x1f\x7f\t\n\r\b\f', item_id=uid("m")),
        message("ünïcode ✓", role="assistant", item_id=uid("m")),
    )
    rid = stack.promote(tenant, conv, 0, items, certified=certified)
    now = NOW + timedelta(hours=2) if later else NOW
    history = stack.store.read_history(tenant, response_id=rid, now=NOW)
    assert isinstance(history, VerifiedHistory)
    expected, status = history_outcome_body(history, fp, now)
    assert status == 200 and expected.reason == reason
    rendered = render_history(history)
    from ratchet.domain.rehydration import fallback_reason

    spliced = history_json(rendered, history.checkpoint.seq, history.head_seq,
                           fallback_reason(history.checkpoint, fp, now))
    assert spliced == expected.model_dump_json().encode()


# --- the LRU bound ------------------------------------------------------------------------


def _entry(tenant: str, units: int) -> CachedHistory:
    """An entry weighing ``units`` x 100 bytes plus the fixed per-entry overhead."""
    rendered = RenderedHistory("r", b"x" * (100 * units), b"")
    return CachedHistory(tenant, "p", None, False, rendered)  # type: ignore[arg-type]


def test_the_cache_is_bounded_by_bytes_and_evicts_the_least_recently_used():
    unit = 100 + ENTRY_OVERHEAD_BYTES
    cache = HistoryCache(max_bytes=3 * unit)
    for name in ("a", "b", "c"):
        cache.put(name, _entry("t", 1))
    assert cache.get("t", "a") is not None  # a is now the most recently used
    cache.put("d", _entry("t", 1))
    assert cache.get("t", "b") is None  # b was the least recently used
    assert {n for n in "acd" if cache.get("t", n)} == {"a", "c", "d"}
    assert cache.nbytes == 3 * unit and len(cache) == 3
    cache.put("huge", _entry("t", 3 * unit))  # larger than the whole cache: not kept
    assert cache.get("t", "huge") is None and cache.nbytes == 3 * unit
    cache.put("a", _entry("t", 0))  # replacing an entry re-counts its bytes
    assert cache.nbytes == 3 * unit - 100
    cache.discard("t", "a")
    assert cache.nbytes == 2 * unit and cache.get("t", "a") is None
    assert cache.get("other-tenant", "c") is None  # keys are per tenant


def test_the_bound_is_shared_fairly_between_tenants():
    """CONTRACT section 5: served from memory "bounded, per tenant". Over the bound the
    tenant holding the most bytes gives up its least recently used entry: a busy
    tenant cycles through its own share and never pushes out a quieter tenant's
    histories while it holds more than that tenant."""
    unit = 100 + ENTRY_OVERHEAD_BYTES
    cache = HistoryCache(max_bytes=6 * unit)
    for name in ("q1", "q2"):
        cache.put(name, _entry("quiet", 1))
    for index in range(50):  # the busy tenant's traffic
        cache.put(f"b{index}", _entry("busy", 1))
    assert cache.get("quiet", "q1") and cache.get("quiet", "q2")
    assert [n for n in range(50) if cache.get("busy", f"b{n}")] == [46, 47, 48, 49]
    assert cache.nbytes == 6 * unit and len(cache) == 6
    cache.put("q3", _entry("quiet", 1))  # the quiet tenant grows: the larger one yields
    assert all(cache.get("quiet", n) for n in ("q1", "q2", "q3"))
    assert [n for n in range(50) if cache.get("busy", f"b{n}")] == [47, 48, 49]
    cache.put("q4", _entry("quiet", 1))  # now the quiet one is larger: its own oldest goes
    assert [n for n in ("q1", "q2", "q3", "q4") if cache.get("quiet", n)] == ["q2", "q3", "q4"]
    assert [n for n in range(50) if cache.get("busy", f"b{n}")] == [47, 48, 49]


@dataclass(frozen=True)
class _Weighing(CachedHistory):
    """An entry that weighs what it is told."""

    weighs: int = 0

    @property
    def nbytes(self) -> int:
        return self.weighs


class _ScanningShares:
    """The fair shares as first built: count and heaviest tenant found by scanning
    every tenant (O(tenants) per fill), the reference the heap must agree with."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.tenants = capacity, {}

    def weight(self) -> int:
        return sum(e.nbytes for entries in self.tenants.values() for e in entries.values())

    def put(self, response_id: str, entry: CachedHistory) -> None:
        entries = self.tenants.setdefault(entry.tenant_id, {})
        entries.pop(response_id, None)
        entries[response_id] = entry
        while self.weight() > self.capacity:
            heaviest = max(self.tenants.values(),
                           key=lambda es: sum(e.nbytes for e in es.values()))
            heaviest.pop(next(iter(heaviest)))
            self.tenants = {t: es for t, es in self.tenants.items() if es}

    def touch(self, tenant_id: str, response_id: str) -> None:
        entries = self.tenants.get(tenant_id, {})
        if response_id in entries:
            entries[response_id] = entries.pop(response_id)

    def pop(self, tenant_id: str, response_id: str) -> None:
        self.tenants.get(tenant_id, {}).pop(response_id, None)
        self.tenants = {t: es for t, es in self.tenants.items() if es}


def test_the_fair_shares_agree_with_scanning_every_tenant():
    """The cache keeps its count and finds its heaviest tenant without a pass over
    every tenant (an outside review, session 36: 14-19 ms a fill with 21 916 tenants):
    over random puts, reads and discards by 40 tenants, what it holds is what the
    scanning reference holds, entry for entry. Entries weigh random 48-bit numbers, so
    no two tenants are ever equally heavy: the reference's choice is the only right one."""
    rng = random.Random(36)
    cache = HistoryCache(max_bytes=60 * 2**47)
    reference = _ScanningShares(cache.max_bytes)
    for _ in range(30_000):
        tenant, rid = f"t{rng.randrange(40)}", f"r{rng.randrange(25)}"
        action = rng.random()
        if action < 0.7:
            entry = _Weighing(tenant, "p", None, False,  # type: ignore[arg-type]
                              RenderedHistory("r", b"", b""), rng.getrandbits(48))
            cache.put(rid, entry)
            reference.put(rid, entry)
        elif action < 0.9:
            found = cache.get(tenant, rid)
            reference.touch(tenant, rid)
            assert found is reference.tenants.get(tenant, {}).get(rid)
        else:
            cache.discard(tenant, rid)
            reference.pop(tenant, rid)
        assert cache.nbytes == reference.weight()
        assert len(cache) == sum(len(es) for es in reference.tenants.values())
    held = {(t, r) for t, es in reference.tenants.items() for r in es}
    assert held == {(t, r) for t in (f"t{n}" for n in range(40)) for r in
                    (f"r{n}" for n in range(25)) if cache.get(t, r) is not None}


def test_the_side_maps_are_bounded_by_bytes_not_by_count():
    """An outside review, session 36: locations and partitions were bounded at 100 000
    entries each whatever their ids' length (174 MiB with 200-character ids). Each
    side map now holds at most a sixteenth of the cache's bytes, the newest kept."""
    cache = HistoryCache(max_bytes=1 << 20)
    bound = (1 << 20) // SIDE_MAP_SHARE
    for n in range(20_000):
        tenant, rid = "t" * 100 + str(n % 7), f"resp_{n:06d}_" + "r" * 180
        cache.remember_location(tenant, rid, "p" * 200)
    counted = cache.side_nbytes
    assert bound - 1024 < counted <= bound  # one map full, newest first
    assert cache.location("t" * 100 + str(19_999 % 7), f"resp_{19_999:06d}_" + "r" * 180)
    assert cache.location("t" * 100 + "0", f"resp_{0:06d}_" + "r" * 180) is None
    per_entry = 100 + 1 + 188 + 200 + SIDE_ENTRY_OVERHEAD_BYTES
    assert counted // per_entry == bound // per_entry  # all of them counted alike


def test_an_entry_counts_the_receipt_proof_and_effect_ids_its_checkpoint_holds():
    entry = _entry("t", 1)
    checkpoint = SimpleNamespace(router_receipt="r" * 300, boundary_proof="p" * 200,
                                 accepted_effect_ids=("e" * 40, "f" * 60))
    held = CachedHistory("t", "p", checkpoint, False, entry.rendered)  # type: ignore[arg-type]
    assert held.nbytes == entry.nbytes + 600


def test_item_with_undecodable_bytes_is_not_cached(stack):
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (undecodable_item(),))
    for _ in range(2):
        assert stack.history(tenant, rid).json()["reason"] == "CORRUPT_HISTORY"
    assert stack.reads["read_history"] == 2 and len(stack.cache) == 0


def test_a_response_not_promoted_yet_costs_its_row_and_its_claim_only(stack):
    """A waiting request's first lookup, hinted: the row is absent and the claim names
    no partition (or that one), so it is not promoted: no full read after them. A
    recorded rejection still answers NOT_PROMOTED."""
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    stack.history(tenant, rid)  # the partition is extendable
    locates: list[tuple] = []
    locate = stack.store._locate
    stack.store._locate = lambda *args: locates.append(args) or locate(*args)
    pending = uid("resp")
    resp, reads = stack.reads_during(lambda: stack.history(tenant, pending, partition_key=conv))
    assert resp.status_code == 404 and resp.json()["reason"] == "NOT_FOUND"
    assert reads == {"read_turn": 1, "locate": 1} and locates == [(tenant, pending)]
    stack.ledger.mark_rejected(tenant, pending, "CONFLICT", "head moved")
    resp = stack.history(tenant, pending, partition_key=conv)
    assert resp.status_code == 409 and resp.json()["reason"] == "NOT_PROMOTED"
    assert "rejected: CONFLICT" in resp.json()["detail"]


def test_an_expired_and_damaged_turn_gets_one_answer_on_every_load():
    # Turn 2 lost an item AND is past its expiry. The full read checks expiry first
    # (EXPIRED, 410); an extension from the cached turn 1 must answer the same, or two
    # replicas (one with the prefix cached, one without) would disagree.
    stack = CachingStack(retention_s=60)
    tenant, conv = uid("tenant"), uid("conv")
    first = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    assert stack.history(tenant, first).status_code == 200  # the linked prefix, cached
    stack.clock.now = NOW + timedelta(seconds=30)
    second = stack.promote(tenant, conv, 1, (message("b", item_id=uid("m")),
                                              message("c", item_id=uid("m"))))
    partition = stack.store._partitions[(tenant, conv)]
    stored = partition.items[second]
    partition.items[second] = type(stored)(*(column[:-1] for column in (
        stored.seqs, stored.ids, stored.types, stored.roles, stored.call_ids,
        stored.contents, stored.digests, stored.formats)))
    stack.clock.now = NOW + timedelta(seconds=95)  # turn 2 expired at NOW + 90 s
    query = {"tenant_id": tenant, "fingerprint_hash": "0" * 64}
    cold = stack.client.get(f"/v1/responses/{second}/history", params=query, headers=NO_CACHE)
    extended = stack.client.get(f"/v1/responses/{second}/history",
                                params={**query, "partition_key": conv})
    assert (cold.status_code, cold.json()["reason"]) == (410, "EXPIRED")
    assert (extended.status_code, extended.json()["reason"]) == (410, "EXPIRED")


def test_a_no_cache_read_answers_with_the_cached_bytes_of_the_same_history():
    """A verified history never changes: a full read of a cached one renders the same
    JSON, and its answer holds the cache's bytes rather than a copy of its own (40
    ``no-cache`` clients that did not read an 8 MB answer each held their copy; an
    outside review, session 37)."""
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    assert stack.history(tenant, rid).status_code == 200  # cached now
    cached = stack.cache.get(tenant, rid).rendered.items_json
    answer, reads = stack.reads_during(lambda: asyncio.run(stack.service.response_history(
        tenant, rid, FP, 0, use_cache=False)))
    assert reads == {"read_history": 1}  # still a full read: the bytes are decided by it
    assert answer.parts[1] is cached
    assert stack.cache.get(tenant, rid).rendered.items_json is cached
    # a damaged row read by the bypass is not hidden by the sharing
    stack.damage_item(tenant, stack.cache.get(tenant, rid).partition_key)
    damaged = asyncio.run(stack.service.response_history(tenant, rid, FP, 0, use_cache=False))
    assert damaged.reason == "CORRUPT_HISTORY"


def test_a_parent_link_into_another_partition_gets_the_full_reads_answer(stack):
    """A row whose parent link names a response of another partition (damage: a
    response id lives in one partition per tenant) is never linked to that partition's
    cached history by an extension: both paths give the full read's answer. Found by a
    mutation review: dropping the extension's same-partition check passed every test
    (the extension then answered CORRUPT_HISTORY where the full read answers
    MISSING_HISTORY)."""
    tenant = uid("tenant")
    here, there = uid("resp"), uid("resp")
    stack.chain(tenant, here, here, None)
    stack.chain(tenant, there, there, None)
    child = stack.chain(tenant, here, uid("resp"), here)
    for rid in (here, there):  # both partitions hold a cached, linked history
        assert stack.history(tenant, rid).status_code == 200
    stack.rewrite_checkpoint(tenant, here, child, parent_response_id=there)
    full = stack.fresh(tenant, child)
    assert (full.status_code, full.json()["reason"]) == (500, "MISSING_HISTORY")
    extended = stack.history(tenant, child, partition_key=here)
    assert (extended.status_code, extended.json()["reason"]) == (500, "MISSING_HISTORY")


def _cache_counts(endpoint: str) -> dict[str, float]:
    from services.api import metrics

    return {result: metrics.HISTORY_CACHE.labels(endpoint, result)._value.get()
            for result in ("hit", "extended", "miss", "bypass")}


def _counted(endpoint: str, call) -> tuple[object, dict[str, float]]:
    before = _cache_counts(endpoint)
    result = call()
    after = _cache_counts(endpoint)
    return result, {k: v - before[k] for k, v in after.items() if v != before[k]}


def test_a_response_promoted_nowhere_counts_as_a_cache_miss(stack):
    """Every lookup counts once in ``ratchet_api_history_cache_total``: a response
    whose hint names a partition the cache can extend and which is promoted nowhere is
    answered from the claim's read, not the cache: a miss. Before, it counted nothing."""
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    assert stack.history(tenant, rid).status_code == 200  # the partition is extendable
    answer, counted = _counted("response", lambda: stack.history(
        tenant, uid("resp"), partition_key=conv))
    assert answer.status_code == 404
    assert counted == {"miss": 1}


def test_a_conversation_whose_head_went_back_counts_as_a_cache_miss():
    """A Conversation read whose head is behind a turn verified here reads in full
    (the head rolled back): a miss. Before, it counted nothing."""
    stack = CachingStack()
    tenant, second, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, second)
    partition = stack.store._partitions[(tenant, conv)]
    first = next(c.response_id for c in partition.checkpoints.values() if c.seq == 1)
    assert stack.history(tenant, second).status_code == 200
    partition.head = Head.of(partition.checkpoints[first])  # damage: turn 2 stands
    answer, counted = _counted("conversation", lambda: stack.conversation(tenant, conv))
    assert (answer.status_code, answer.json()["reason"]) == (500, "CORRUPT_HISTORY")
    assert counted == {"miss": 1}
