"""The API's verified-history cache (services/api/cache.py) on the in-memory store.

The stamp source here derives each turn row's "write timestamps" from a digest of the
row as stored, so ANY change to a stored row changes its stamp: exactly what Cassandra's
write timestamps give the real ``CassandraStamps`` for any CQL write. The same
behaviours against real Cassandra rows live in tests/e2e/test_http_cache.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from ratchet.domain.history import VerifiedHistory
from schemas.items import message
from services.api.app import create_app
from services.api.cache import CachedHistory, HistoryCache
from services.api.render import history_json, history_outcome_body, render_history
from services.api.service import RehydrationService
from services.store.stamps import PartitionStamp
from tests.unit.test_api_http import (
    FP,
    NOW,
    OTHER_FP,
    Stack,
    two_turns,
    uid,
    undecodable_item,
)


class MemoryStamps:
    """``CassandraStamps`` over the in-memory store: a row's stamp is a digest of it."""

    def __init__(self, store) -> None:
        self.store = store
        self.stamps = 0

    async def stamp(self, tenant_id: str, partition_key: str) -> PartitionStamp | None:
        self.stamps += 1
        snapshot = self.store._load_partition(tenant_id, partition_key)
        if snapshot is None:
            return None
        rows = {
            ref: (
                checkpoint.seq,
                checkpoint.mode.value,
                hashlib.sha256(repr((checkpoint, snapshot.items.get(ref))).encode()).hexdigest(),
            )
            for ref, checkpoint in snapshot.checkpoints.items()
        }
        return PartitionStamp(partition_key=partition_key, head=snapshot.head, rows=rows)

    async def locate(self, tenant_id: str, response_id: str) -> str | None:
        return self.store._locate(tenant_id, response_id)


class CachingStack(Stack):
    """The unit Stack with the cache wired in, counting full store reads."""

    def __init__(self, retention_s: int = 0, cache_bytes: int = 1 << 20) -> None:
        super().__init__(retention_s)
        self.cache = HistoryCache(cache_bytes)
        self.stamps = MemoryStamps(self.store)
        self.reads = 0
        read = self.store.read_history

        def counted(*args, **kwargs):
            self.reads += 1
            return read(*args, **kwargs)

        self.store.read_history = counted  # type: ignore[method-assign]
        service = RehydrationService(
            self.store,
            self.ledger,
            self.waiters,
            clock=self.clock,
            cache=self.cache,
            stamps=self.stamps,  # type: ignore[arg-type]
        )
        self.client = TestClient(create_app(service, lambda: True), raise_server_exceptions=False)

    def conversation(self, tenant: str, conv: str, fp: str = FP, **headers):
        return self.client.get(
            f"/v1/conversations/{conv}/history",
            params={"tenant_id": tenant, "fingerprint_hash": fp},
            headers=headers,
        )

    def damage_first_item(self, tenant: str, conv: str) -> None:
        """Rewrite the first stored item of the first turn (content no longer matches
        its digest), as a direct write to the store would."""
        partition = self.store._partitions[(tenant, conv)]
        first = min(partition.checkpoints.values(), key=lambda c: c.seq).response_id
        stored = list(partition.items[first])
        bad = stored[0].item.model_copy(update={"content": b'{"x":1}'})
        stored[0] = replace(stored[0], item=bad)
        partition.items[first] = tuple(stored)


@pytest.fixture
def stack() -> CachingStack:
    return CachingStack()


def _conv_of(stack: CachingStack, tenant: str, rid: str) -> str:
    return stack.store._locate(tenant, rid)


def test_a_second_lookup_is_served_from_the_cache_with_the_same_body(stack):
    tenant, rid, ids = two_turns(stack)
    first = stack.history(tenant, rid)
    assert first.status_code == 200 and stack.reads == 1
    second = stack.history(tenant, rid)
    assert stack.reads == 1, "the second lookup read the store"
    assert second.content == first.content
    assert [i["item_id"] for i in second.json()["items"]] == ids

    conv = _conv_of(stack, tenant, rid)
    by_conversation = stack.conversation(tenant, conv)
    assert stack.reads == 1  # the head is the cached response
    assert by_conversation.content == first.content


def test_a_row_changed_after_verification_is_seen_by_the_next_hit(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200
    assert stack.history(tenant, rid).status_code == 200 and stack.reads == 1  # a hit

    stack.damage_first_item(tenant, conv)
    for resp in (stack.history(tenant, rid), stack.conversation(tenant, conv)):
        assert resp.status_code == 500, resp.text
        assert resp.json()["reason"] == "CORRUPT_HISTORY" and resp.json()["items"] is None
    assert stack.reads == 3  # both went to the store
    assert len(stack.cache) == 0  # the stale entry is gone and no failure was cached


def test_failures_are_never_cached(stack):
    tenant, rid, _ = two_turns(stack)
    stack.damage_first_item(tenant, _conv_of(stack, tenant, rid))
    for expected_reads in (1, 2):
        assert stack.history(tenant, rid).status_code == 500
        assert stack.reads == expected_reads
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
    assert stack.reads == 1


def test_logical_expiry_is_decided_per_request():
    stack = CachingStack(retention_s=60)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    assert stack.history(tenant, rid).status_code == 200
    stack.clock.now = NOW + timedelta(seconds=61)
    resp = stack.history(tenant, rid)
    assert resp.status_code == 410 and resp.json()["reason"] == "EXPIRED"


def test_a_new_turn_moves_the_conversation_and_the_reported_head_seq(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.conversation(tenant, conv).json()["head_seq"] == 2
    third = stack.promote(tenant, conv, 2, (message("c", item_id=uid("m")),))
    body = stack.conversation(tenant, conv).json()
    assert body["response_id"] == third and body["head_seq"] == 3 and len(body["items"]) == 7
    # The earlier response is still a hit: its own seq, and the Conversation's head now.
    reads = stack.reads
    old = stack.history(tenant, rid).json()
    assert old["response_id"] == rid and len(old["items"]) == 6
    assert (old["head_seq"], old["conversation_head_seq"]) == (2, 3)
    assert stack.reads == reads


def test_cache_control_no_cache_reads_the_store(stack):
    tenant, rid, _ = two_turns(stack)
    stack.history(tenant, rid)
    resp = stack.client.get(
        f"/v1/responses/{rid}/history",
        params={"tenant_id": tenant, "fingerprint_hash": FP},
        headers={"Cache-Control": "no-cache"},
    )
    assert resp.status_code == 200 and stack.reads == 2


def test_another_tenant_never_gets_a_cached_history(stack):
    tenant, rid, _ = two_turns(stack)
    assert stack.history(tenant, rid).status_code == 200
    assert stack.history("someone-else", rid).status_code == 404


def test_a_zero_byte_cache_is_off():
    stack = CachingStack(cache_bytes=0)
    tenant, rid, _ = two_turns(stack)
    stack.history(tenant, rid)
    stack.history(tenant, rid)
    assert stack.reads == 2 and stack.stamps.stamps == 0


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
        message('héllo \u2028 "quoted" \\ </script>', item_id=uid("m")),
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


def _entry(tenant: str, nbytes: int) -> CachedHistory:
    return CachedHistory(
        tenant_id=tenant,
        partition_key="p",
        checkpoint=None,  # type: ignore[arg-type]
        lineage_stamps=(),
        rendered=None,  # type: ignore[arg-type]
        nbytes=nbytes,
    )


def test_the_cache_is_bounded_by_bytes_and_evicts_the_least_recently_used():
    cache = HistoryCache(max_bytes=300)
    for name in ("a", "b", "c"):
        cache.put(name, _entry("t", 100))
    assert cache.get("t", "a") is not None  # a is now the most recently used
    cache.put("d", _entry("t", 100))
    assert cache.get("t", "b") is None  # b was the least recently used
    assert {n for n in "acd" if cache.get("t", n)} == {"a", "c", "d"}
    assert cache.nbytes == 300 and len(cache) == 3
    cache.put("huge", _entry("t", 301))  # larger than the whole cache: not kept
    assert cache.get("t", "huge") is None and cache.nbytes == 300
    cache.put("a", _entry("t", 50))  # replacing an entry re-counts its bytes
    assert cache.nbytes == 250
    cache.discard("t", "a")
    assert cache.nbytes == 200 and cache.get("t", "a") is None


def test_item_with_undecodable_bytes_is_not_cached(stack):
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (undecodable_item(),))
    for _ in range(2):
        assert stack.history(tenant, rid).json()["reason"] == "CORRUPT_HISTORY"
    assert stack.reads == 2 and len(stack.cache) == 0


def test_a_stamp_of_another_partition_never_covers_a_history(stack):
    """The store may find a response elsewhere than the partition the API stamped (its
    hint was wrong); such a history must not be cached with that stamp."""
    import asyncio

    from services.api.cache import lineage_stamps

    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    history = stack.store.read_history(tenant, response_id=rid, now=NOW)
    stamp = asyncio.run(stack.stamps.stamp(tenant, conv))
    assert lineage_stamps(history, stamp) is not None
    elsewhere = replace(stamp, partition_key="another-conversation")
    assert lineage_stamps(history, elsewhere) is None
