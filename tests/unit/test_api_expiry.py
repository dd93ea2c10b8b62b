"""Logical expiry through the HTTP API (docs/gateway-protocol.md, "Logical expiry"), on
the in-memory store, with and without the API's verified-history cache.

What is pinned: expiry is decided per response, against the API's clock, on every read:
a response's history answers 410 ``EXPIRED`` from the instant of ITS OWN expiry on
(one microsecond before it: 200), whatever the expiries of its ancestors; the
Conversation endpoint answers by its head's; ``/status`` ignores expiry. Every path
answers alike: the plain read, a cold read through the cache, a cached hit, an
extension of a cached prefix, ``Cache-Control: no-cache``, ``wait_ms``. An outside
review of expiry and time, session 42.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from ratchet.domain.history import PromotionMode, StoredTokenArtifact
from ratchet.domain.plan import PromotionRequest
from schemas.canonical import canonical_json_text as canonical_json
from schemas.items import message
from schemas.models import Certification
from services.api.cache import SIDE_MAP_SHARE, HistoryCache
from tests.contract.store_support import binding_proof, stored_receipt
from tests.unit.test_api_cache import NO_CACHE, CachingStack
from tests.unit.test_api_http import FP, NOW, Stack, uid

EARLY = NOW + timedelta(seconds=10)  # the expiry of the turn that expires
LATE = NOW + timedelta(seconds=20)  # when the tests read


def promote(stack: Stack, tenant: str, partition: str, mode: str, *,
            head: int | None = None, previous: str | None = None,
            expires: datetime | None = None, reuse_ends: dict[str, datetime] | None = None,
            ) -> str:
    """One certified turn whose logical expiry is ``expires``; its artifact, proof and
    receipt reusable for a day unless ``reuse_ends`` names their ends; a chain's first
    response is the partition's own id."""
    ends = {name: NOW + timedelta(days=1) for name in ("artifact", "proof", "receipt")}
    ends.update(reuse_ends or {})
    proof = json.loads(binding_proof(FP))
    proof["expires_at"] = _ms(ends["proof"])
    rid = partition if mode == "chain" and previous is None else uid("resp")
    key = uid("key")
    outcome = stack.store.promote(PromotionRequest(
        tenant_id=tenant, partition_key=partition,
        mode=PromotionMode.CONVERSATION if mode == "conversation" else PromotionMode.CHAIN,
        response_id=rid, idempotency_key=key,
        request_digest=hashlib.sha256(key.encode()).hexdigest(),
        items=(message(f"turn {rid}", item_id=uid("m")),),
        certification=Certification.CERTIFIED, fingerprint_hash=FP,
        expected_head_seq=head, previous_response_id=previous,
        token_artifact=StoredTokenArtifact(uid("art"), "th", 42, 40, FP, ends["artifact"]),
        router_receipt=stored_receipt(expires_at=_ms(ends["receipt"])),
        boundary_proof=canonical_json(proof),
        expires_at=expires,
    ))
    assert type(outcome).__name__ == "Promoted", outcome
    return rid


def _ms(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def two(stack: Stack, mode: str, first: datetime | None,
        second: datetime | None) -> tuple[str, str, str, str]:
    """Two turns (a Conversation, or a chain root and its child) expiring at ``first``
    and ``second``: (tenant, partition, first id, second id)."""
    tenant, partition = uid("tenant"), uid("conv" if mode == "conversation" else "resp")
    if mode == "conversation":
        r1 = promote(stack, tenant, partition, mode, head=0, expires=first)
        r2 = promote(stack, tenant, partition, mode, head=1, expires=second)
    else:
        r1 = promote(stack, tenant, partition, mode, expires=first)
        r2 = promote(stack, tenant, partition, mode, previous=r1, expires=second)
    return tenant, partition, r1, r2


def answer(resp) -> tuple:
    body = resp.json()
    return (resp.status_code, body["outcome"], body["reason"], body["head_seq"],
            body["conversation_head_seq"], None if body["items"] is None else len(body["items"]))


class Reader:
    def __init__(self, stack: Stack, tenant: str, headers: dict[str, str]) -> None:
        self.stack, self.tenant, self.headers = stack, tenant, headers

    def response(self, rid: str, **params):
        return self.stack.client.get(
            f"/v1/responses/{rid}/history", headers=self.headers,
            params={"tenant_id": self.tenant, "fingerprint_hash": FP, **params})

    def conversation(self, conv: str):
        return self.stack.client.get(
            f"/v1/conversations/{conv}/history", headers=self.headers,
            params={"tenant_id": self.tenant, "fingerprint_hash": FP})

    def status(self, rid: str) -> dict:
        return self.stack.client.get(f"/v1/responses/{rid}/status",
                                     params={"tenant_id": self.tenant}).json()


PATHS = ["uncached", "cold", "warm", "no-cache", "warm-no-cache"]


def stack_for(path: str) -> Stack:
    return Stack() if path == "uncached" else CachingStack()


def warm(stack: Stack, tenant: str, partition: str, mode: str, *rids: str) -> None:
    """Read every history before the expiry (the cache holds them, the second one an
    extension of the first)."""
    plain = Reader(stack, tenant, {})
    for rid in rids:
        assert plain.response(rid).status_code == 200
    if mode == "conversation":
        assert plain.conversation(partition).status_code == 200


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_an_expired_ancestor_leaves_its_descendants_history_whole(mode, path):
    """The first turn expired, the second did not: the second's history is served 200,
    complete (the expired turn's items included), on every endpoint and path; the first
    answers 410; ``/status`` says both are promoted."""
    stack = stack_for(path)
    tenant, partition, r1, r2 = two(stack, mode, EARLY, None)
    if path.startswith("warm"):
        warm(stack, tenant, partition, mode, r1, r2)
    stack.clock.now = LATE
    read = Reader(stack, tenant, NO_CACHE if path.endswith("no-cache") else {})
    conversation_head = 2 if mode == "conversation" else None
    for _ in range(2):  # the second time from whatever the first left cached
        assert answer(read.response(r1)) == (410, "failure", "EXPIRED", None, None, None)
        assert answer(read.response(r2)) == (200, "certified", None, 2, conversation_head, 2)
        assert answer(read.response(r1, wait_ms=50))[:3] == (410, "failure", "EXPIRED")
        assert answer(read.response(r2, wait_ms=50)) == answer(read.response(r2))
        if mode == "conversation":
            assert answer(read.conversation(partition)) == answer(read.response(r2))
    assert [read.status(r)["state"] for r in (r1, r2)] == ["promoted", "promoted"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_an_expired_head_leaves_its_ancestors_served(mode, path):
    """The second turn (a Conversation's head) expired, the first did not: the first's
    history is served 200 (a Conversation's still reporting the current head, 2), the
    second's and the Conversation endpoint answer 410."""
    stack = stack_for(path)
    tenant, partition, r1, r2 = two(stack, mode, None, EARLY)
    if path.startswith("warm"):
        warm(stack, tenant, partition, mode, r1, r2)
    stack.clock.now = LATE
    read = Reader(stack, tenant, NO_CACHE if path.endswith("no-cache") else {})
    conversation_head = 2 if mode == "conversation" else None
    for _ in range(2):
        assert answer(read.response(r1)) == (200, "certified", None, 1, conversation_head, 1)
        assert answer(read.response(r2)) == (410, "failure", "EXPIRED", None, None, None)
        assert answer(read.response(r1, wait_ms=50)) == answer(read.response(r1))
        assert answer(read.response(r2, wait_ms=50))[:3] == (410, "failure", "EXPIRED")
        if mode == "conversation":
            assert answer(read.conversation(partition)) == (
                410, "failure", "EXPIRED", None, None, None)
    assert [read.status(r)["seq"] for r in (r1, r2)] == [1, 2]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("before, expired", [
    (timedelta(microseconds=1), False),  # still the millisecond before
    (timedelta(milliseconds=1), False),
    (timedelta(0), True),  # the instant itself
    (-timedelta(microseconds=1), True),
])
def test_expiry_starts_at_its_instant_on_every_path(path, before, expired):
    stack = stack_for(path)
    tenant, partition, r1, r2 = two(stack, "conversation", None, EARLY)
    if path.startswith("warm"):
        warm(stack, tenant, partition, "conversation", r1, r2)
    stack.clock.now = EARLY - before
    read = Reader(stack, tenant, NO_CACHE if path.endswith("no-cache") else {})
    for resp in (read.response(r2), read.conversation(partition), read.response(r2)):
        assert resp.status_code == (410 if expired else 200), resp.json()


def test_an_expired_response_answers_expired_before_its_damaged_head():
    """The rules' order (docs/store.md, "Verification"): a response's own expiry is
    decided before its lineage and its Conversation's head, so an expired response under
    a damaged head answers 410 ``EXPIRED`` while ``/status`` (which ignores expiry) and
    the unexpired head answer ``CORRUPT_HISTORY`` (500)."""
    stack = CachingStack()
    tenant, conv, r1, r2 = two(stack, "conversation", EARLY, None)
    stack.rewrite_head(tenant, conv, lineage_digest="0" * 64)
    stack.clock.now = LATE
    for headers in ({}, NO_CACHE):
        read = Reader(stack, tenant, headers)
        assert answer(read.response(r1))[:3] == (410, "failure", "EXPIRED")
        assert answer(read.response(r2))[:3] == (500, "failure", "CORRUPT_HISTORY")
        assert answer(read.conversation(conv))[:3] == (500, "failure", "CORRUPT_HISTORY")
        assert read.status(r1)["error"] == "CORRUPT_HISTORY"


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("record", ["artifact", "proof", "receipt"])
def test_reuse_ends_at_the_first_expiry_of_artifact_proof_and_receipt(path, record):
    """``ARTIFACT_EXPIRED`` from the instant the artifact, its proof or its receipt
    expires (one microsecond before: certified), decided per request on every path,
    while the history itself (no logical expiry) is served whole."""
    stack = stack_for(path)
    tenant, conv = uid("tenant"), uid("conv")
    ends = {record: EARLY + timedelta(milliseconds=7)}
    promote(stack, tenant, conv, "conversation", head=0)
    r2 = promote(stack, tenant, conv, "conversation", head=1, reuse_ends=ends)
    if path.startswith("warm"):
        warm(stack, tenant, conv, "conversation", r2)
    read = Reader(stack, tenant, NO_CACHE if path.endswith("no-cache") else {})
    for now, outcome, reason in ((ends[record] - timedelta(microseconds=1), "certified", None),
                                 (ends[record], "fallback", "ARTIFACT_EXPIRED"),
                                 (LATE, "fallback", "ARTIFACT_EXPIRED")):
        stack.clock.now = now
        for resp in (read.response(r2), read.conversation(conv)):
            assert answer(resp) == (200, outcome, reason, 2, 2, 2), now


@pytest.mark.parametrize("path", ["uncached", "cold", "warm"])
def test_a_wait_for_an_expired_response_is_answered_at_once(path):
    """docs/gateway-protocol.md, ``wait_ms``: a response already decided is answered at
    once, exactly as the plain read, 410 included (nothing is waited for)."""
    stack = stack_for(path)
    tenant, partition, r1, r2 = two(stack, "chain", EARLY, None)
    if path == "warm":
        warm(stack, tenant, partition, "chain", r1, r2)
    stack.clock.now = LATE
    read = Reader(stack, tenant, {})
    start = time.monotonic()
    assert answer(read.response(r1, wait_ms=5000))[:3] == (410, "failure", "EXPIRED")
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_a_response_that_expired_before_it_was_cached_is_read_once(mode):
    """An outside review, session 42: a cached history past its expiry answered 410 with
    no read (session 36), but one first read after its expiry was a full partition read
    on every request (failures are never cached). The full read's 410 is remembered
    with the response's location (its expiry never changes, and it is the full read's
    first answer after the row's own damage and tenant): later requests answer the same
    bytes with no read (the Conversation endpoint: its head read, which must name that
    very turn); ``no-cache`` reads in full; a turn on top renews the Conversation."""
    stack = CachingStack()
    tenant, partition, r1, r2 = two(stack, mode, None, EARLY)
    stack.clock.now = LATE
    read, fresh = Reader(stack, tenant, {}), Reader(stack, tenant, NO_CACHE)
    first, reads = stack.reads_during(lambda: read.response(r2))
    assert first.status_code == 410 and reads.get("read_history") == 1
    for _ in range(2):
        again, reads = stack.reads_during(lambda: read.response(r2))
        assert (again.status_code, again.content, reads) == (410, first.content, {})
    bypass, reads = stack.reads_during(lambda: fresh.response(r2))
    assert (bypass.content, reads.get("read_history")) == (first.content, 1)
    if mode == "chain":
        return
    whole, reads = stack.reads_during(lambda: read.conversation(partition))
    assert whole.status_code == 410 and reads == {"read_head": 1}
    assert whole.content == fresh.conversation(partition).content
    promote(stack, tenant, partition, mode, head=2)
    renewed = read.conversation(partition)
    assert answer(renewed) == (200, "certified", None, 3, 3, 3)
    assert read.response(r2).status_code == 410


def test_remembered_expiries_stay_within_the_locations_bound():
    """They are kept with the locations, in their bound (a sixteenth of the cache's),
    counted by the text they hold; a location remembered again keeps its expiry."""
    cache = HistoryCache(64 * 1024)
    bound = cache.max_bytes // SIDE_MAP_SHARE
    stack = CachingStack()
    tenant, conv, r1, r2 = two(stack, "conversation", None, EARLY)
    stack.clock.now = LATE
    checkpoint = stack.store.get_checkpoint(tenant, r2)
    cache.remember_expired(tenant, checkpoint)
    cache.remember_location(tenant, r2, conv)
    known = cache.expired(tenant, r2)
    assert (known.partition_key, known.expires_at, known.head.seq) == (conv, EARLY, 2)
    assert cache.location(tenant, r2) == conv
    for n in range(500):
        cache.remember_expired(tenant, replace(checkpoint, response_id=f"resp_{n:06d}"))
    assert 0 < cache.side_nbytes <= bound
    assert cache.expired(tenant, "resp_000499") is not None
    assert cache.expired(tenant, r2) is None  # the oldest went first
