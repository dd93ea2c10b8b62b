"""The read path's gaps a mutation review found (session 43): each test pins what
CONTRACT section 5 and docs/service.md promise where a single plausible defect in
``services/api/`` or ``services/store/`` passed every other fast test.

On the in-memory store, through HTTP (the fast path and FastAPI alike), with the
API's verified-history cache wired in (``CachingStack``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from schemas.items import message
from tests.unit.test_api_cache import NO_CACHE, CachingStack
from tests.unit.test_api_extension_race import blocking_reads_on_the_loop
from tests.unit.test_api_http import FP, uid


def outcome(resp) -> tuple:
    body = resp.json()
    return resp.status_code, body["outcome"], body["reason"]


@pytest.fixture(params=[True, False], ids=["fast-path", "fastapi"])
def stack(request) -> CachingStack:
    return CachingStack(fast_path=request.param)


def test_a_head_copied_from_another_conversation_backs_nothing_here(stack):
    """A Conversation's head rewritten to the cells of another Conversation's head (same
    tenant) names a turn of another partition: no checkpoint of this Conversation backs
    it, an integrity failure on every endpoint (CONTRACT section 5), never the other
    Conversation's history served from the cache because its entry matches the cells."""
    tenant, mine, other = uid("tenant"), uid("conv"), uid("conv")
    a1 = stack.promote(tenant, mine, 0, (message("mine", item_id=uid("m")),))
    stack.promote(tenant, other, 0, (message("other 1", item_id=uid("m")),))
    stack.promote(tenant, other, 1, (message("other 2", item_id=uid("m")),))
    assert stack.history(tenant, a1).status_code == 200  # a1 cached
    assert stack.conversation(tenant, other).status_code == 200  # the other head cached
    stolen = stack.store._partitions[(tenant, other)].head
    stack.store._partitions[(tenant, mine)].head = stolen

    cold = stack.conversation(tenant, mine, **NO_CACHE)
    assert outcome(cold) == (500, "failure", "CORRUPT_HISTORY")
    for resp in (stack.conversation(tenant, mine), stack.history(tenant, a1)):
        assert outcome(resp) == (500, "failure", "CORRUPT_HISTORY"), resp.json()


def test_a_lost_turn_past_a_cached_prefix_is_missing_history_with_a_right_hint(stack):
    """A promoted turn whose row is gone is 500 ``MISSING_HISTORY`` (docs/store.md rule
    1), also when its partition holds a cached linked prefix and the caller names that
    partition: the hinted one-row read finds nothing, the claim names the same
    partition, and ``turn_lost`` says promoted. Never 404 ``NOT_FOUND``."""
    tenant, conv = uid("tenant"), uid("conv")
    r1 = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    r2 = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    assert stack.history(tenant, r1).status_code == 200  # a linked prefix cached
    partition = stack.store._partitions[(tenant, conv)]
    del partition.checkpoints[r2]
    partition.items.pop(r2, None)
    for params in ({"partition_key": conv}, {}):
        answer = stack.history(tenant, r2, **params)
        assert outcome(answer) == (500, "failure", "MISSING_HISTORY"), params


def test_where_this_api_verified_a_response_comes_before_the_callers_hint(stack):
    """docs/service.md, "Partition hint": a response's partition is where this API
    verified it before, else the caller's hint. A response verified here whose entry was
    let go, asked for with a hint naming another partition, is read where it was
    verified (one row, extending its cached prefix), not by a full read of the hinted
    partition first."""
    tenant, conv, elsewhere = uid("tenant"), uid("conv"), uid("conv")
    r1 = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    r2 = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    stack.promote(tenant, elsewhere, 0, (message("other", item_id=uid("m")),))
    assert stack.history(tenant, r1).status_code == 200
    first = stack.history(tenant, r2)
    assert first.status_code == 200
    stack.cache.discard(tenant, r2)  # evicted; its location is still known
    again, reads = stack.reads_during(
        lambda: stack.history(tenant, r2, partition_key=elsewhere))
    assert (again.status_code, again.content) == (200, first.content)
    assert reads == {"read_turn": 1}, reads


def test_a_turn_below_its_conversations_head_is_extended_off_the_loop():
    """docs/service.md, "No thread-pool hop on lookups": only an extension that must
    read several rows one by one runs in the thread pool, never with the blocking driver
    on the event loop. A Conversation's turn one past a cached prefix, while the head
    has moved beyond it, needs the head's row too (the head must be backed): that read
    is made off the loop."""
    stack = CachingStack()
    tenant, conv = uid("tenant"), uid("conv")
    r1 = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    r2 = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    stack.promote(tenant, conv, 2, (message("three", item_id=uid("m")),))
    assert stack.history(tenant, r1).status_code == 200  # a linked prefix cached
    expected = stack.fresh(tenant, r2).content
    stack.cache.discard(tenant, r2)

    blocking_on_loop = blocking_reads_on_the_loop(stack.store)
    resp = stack.history(tenant, r2, partition_key=conv)
    assert (resp.status_code, resp.content) == (200, expected)
    assert blocking_on_loop == []


@pytest.mark.parametrize("cells", [{"lineage_digest": "0" * 64}, {"item_count": 99}],
                         ids=["lineage-digest", "item-count"])
def test_a_new_head_its_row_does_not_back_is_corrupt_on_the_conversation_extension(
        stack, cells):
    """CONTRACT section 5: a head that no verified checkpoint backs is an integrity
    failure on every endpoint. The Conversation endpoint, one turn past a cached
    prefix, extends it by the head's row: the head's cells must be that row's, else
    500 ``CORRUPT_HISTORY`` as the full read answers, not the row's history."""
    tenant, conv = uid("tenant"), uid("conv")
    r1 = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    assert stack.history(tenant, r1).status_code == 200  # a linked prefix cached
    stack.rewrite_head(tenant, conv, **cells)
    cold = stack.conversation(tenant, conv, **NO_CACHE)
    assert outcome(cold) == (500, "failure", "CORRUPT_HISTORY")
    for _ in range(2):
        assert outcome(stack.conversation(tenant, conv)) == (
            500, "failure", "CORRUPT_HISTORY")


def test_a_lost_head_is_corrupt_on_the_response_extension(stack):
    """A Conversation whose head cells are gone is damage (CORRUPT_HISTORY) on every
    path, also for a turn one past a cached prefix, which the response endpoint loads
    as an extension: the same typed failure as the full read, not an internal error."""
    tenant, conv = uid("tenant"), uid("conv")
    r1 = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    r2 = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    assert stack.history(tenant, r1).status_code == 200  # a linked prefix cached
    stack.store._partitions[(tenant, conv)].head = None
    assert outcome(stack.fresh(tenant, r2)) == (500, "failure", "CORRUPT_HISTORY")
    for params in ({}, {"partition_key": conv}):
        answer = stack.history(tenant, r2, **params)
        assert outcome(answer) == (500, "failure", "CORRUPT_HISTORY"), params


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
def test_a_lost_turn_is_never_answered_as_promoted_nowhere_when_the_budget_is_full(cached):
    """docs/service.md, "The answer budget": a read that would wait for room first looks
    whether the response was promoted anywhere; one promoted whose row is gone
    (``turn_lost``) was promoted: it waits for room like any promoted response, and its
    answer is 500 ``MISSING_HISTORY``, never the 404 of an unknown id."""
    from services.api import answer_budget
    from services.api.answer_budget import AnswerBudget, AnswersBusy
    from services.api.service import RehydrationService
    from tests.unit.test_api_http import FP, Stack

    stack = CachingStack() if cached else Stack()
    budget = AnswerBudget(1 << 20)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 cache=stack.cache if cached else None, answers=budget)
    tenant, conv = uid("tenant"), uid("conv")
    stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    lost = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    partition = stack.store._partitions[(tenant, conv)]
    del partition.checkpoints[lost]
    partition.items.pop(lost, None)

    async def run():
        blocker = await budget.reserve(("response", "other", "r"))
        budget.resize(blocker, 4 << 20)  # the budget full of another read
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
            for hint in (None, conv):
                with pytest.raises(AnswersBusy):
                    await service.response_history(tenant, lost, FP, 0, partition_key=hint)
        blocker.release()
        answer = await service.response_history(tenant, lost, FP, 0)
        assert (answer.status_code, answer.reason) == (500, "MISSING_HISTORY")
    asyncio.run(run())


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
def test_a_damaged_promoted_response_is_corrupt_whatever_the_ledger_recorded(cached):
    """The store is the truth (service.py): a response in the store is answered by its
    rows, whatever the ledger recorded for its id (a later turn reusing the id is
    rejected and recorded). Damaged rows are 500 ``CORRUPT_HISTORY``, never 409
    ``NOT_PROMOTED`` "rejected", which tells a gateway the turn was never promoted."""
    from tests.unit.test_api_http import Stack

    stack = CachingStack() if cached else Stack()
    tenant, conv = uid("tenant"), uid("conv")
    stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    rid = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    stack.ledger.mark_rejected(tenant, rid, "CONFLICT", "the id reused by another turn")
    partition = stack.store._partitions[(tenant, conv)]
    stored = partition.items[rid]
    partition.items[rid] = replace(stored, contents=(b'{"x":1}', *stored.contents[1:]))
    for params in ({}, {"partition_key": conv}):
        assert outcome(stack.history(tenant, rid, **params)) == (
            500, "failure", "CORRUPT_HISTORY"), params


def test_a_head_rolled_back_is_caught_whatever_order_the_turns_were_cached_in(stack):
    """A Conversation's head rolled back onto an earlier turn (damage: the later turns'
    rows stand) is never served as the shortened history (CONTRACT section 5): the
    highest seq verified stays the highest whichever turn was cached last. Here the
    later turn is cached first, then the earlier one."""
    from ratchet.domain.history import Head

    tenant, conv = uid("tenant"), uid("conv")
    first = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    second = stack.promote(tenant, conv, 1, (message("two", item_id=uid("m")),))
    assert stack.history(tenant, second).status_code == 200
    stack.cache.discard(tenant, first)  # cached by the extension? read it in full now
    assert stack.fresh(tenant, first).status_code == 200
    assert stack.cache.get(tenant, first) is not None
    partition = stack.store._partitions[(tenant, conv)]
    partition.head = Head.of(partition.checkpoints[first])  # damage: turn 2 stands
    cold = stack.conversation(tenant, conv, **NO_CACHE)
    assert outcome(cold) == (500, "failure", "CORRUPT_HISTORY")
    for answer in (stack.conversation(tenant, conv), stack.history(tenant, first)):
        assert outcome(answer) == (500, "failure", "CORRUPT_HISTORY")


def _cached(tenant: str, partition: str, linked: bool):
    from services.api.cache import CachedHistory
    from services.api.render import RenderedHistory

    rendered = RenderedHistory("r", b"[]", b"")
    return CachedHistory(tenant, partition, None, linked, rendered)  # type: ignore[arg-type]


def test_what_the_cache_knows_of_a_partition_lives_exactly_as_long_as_its_entries():
    """docs/service.md, "Verified-history cache": beside the entries, what the cache
    knows of a partition (a linked history was cached, ...) is kept per partition with
    an entry cached, and dropped with its last entry (the memory stays bounded by the
    entries). A partition whose only entries are not linked is not extendable; one
    that holds a linked history is, whatever was cached after it."""
    from services.api.cache import HistoryCache

    cache = HistoryCache(1 << 20)
    tenant = uid("tenant")
    cache.put("unlinked", _cached(tenant, "p1", linked=False))
    assert not cache.extendable(tenant, "p1")
    cache.put("linked", _cached(tenant, "p2", linked=True))
    cache.put("later", _cached(tenant, "p2", linked=False))
    assert cache.extendable(tenant, "p2")
    cache.discard(tenant, "later")
    assert cache.extendable(tenant, "p2")
    cache.discard(tenant, "linked")
    assert not cache.extendable(tenant, "p2")  # its last entry gone: nothing known
    cache.put("again", _cached(tenant, "p2", linked=False))
    assert not cache.extendable(tenant, "p2")


def test_a_turn_with_no_items_extends_a_cached_prefix_whole(stack):
    """A history is never shortened (CONTRACT section 5): a turn promoted with no items
    (the store accepts it) extends a cached prefix to that prefix's items, the same
    bytes a full read answers."""
    tenant, conv = uid("tenant"), uid("conv")
    r1 = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    assert stack.history(tenant, r1).status_code == 200  # a linked prefix cached
    r2 = stack.promote(tenant, conv, 1, ())
    extended, reads = stack.reads_during(lambda: stack.history(tenant, r2))
    assert "read_history" not in reads  # the extension answered
    assert extended.status_code == 200 and len(extended.json()["items"]) == 1
    assert extended.content == stack.fresh(tenant, r2).content


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "fastapi"])
def test_the_fast_path_leaves_what_fastapi_refuses_to_fastapi(fast_path):
    """docs/service.md, "No framework on the hot path": a history GET whose parameters
    all pass the routes' constraints is answered by the fast path; anything else is
    FastAPI's, with its answer. A HEAD (405: the routes are GET only) and a hint with a
    trailing newline (422: ``ID_PATTERN``'s ``$`` would take it under ``re.match``)."""
    from tests.unit.test_api_http import FP, Stack

    stack = Stack(fast_path=fast_path)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    params = {"tenant_id": tenant, "fingerprint_hash": FP}
    head = stack.client.request("HEAD", f"/v1/responses/{rid}/history", params=params)
    assert head.status_code == 405
    for bad in ({"partition_key": conv + "\n"}, {"tenant_id": tenant + "\n"}):
        resp = stack.history(tenant, rid, **{**params, **bad})
        assert (resp.status_code, resp.json()["error"]) == (422, "INVALID_REQUEST"), bad


def test_the_answer_budget_admits_reads_in_arrival_order():
    """docs/service.md, "The answer budget": a full read waits for room in arrival
    order: a small read arriving after a large one that waits waits behind it, even
    where it alone would fit, and ``has_room`` says so (a large read is never passed
    over by a stream of smaller ones)."""
    from services.api.answer_budget import AnswerBudget

    async def run():
        budget = AnswerBudget(10)
        budget.learn(("big",), 2)  # costs 4
        budget.learn(("small",), 1)  # costs 2
        blocker = await budget.reserve(("other",))
        budget.resize(blocker, 8)
        big = asyncio.ensure_future(budget.reserve(("big",), wait_s=5))
        await asyncio.sleep(0)
        assert not big.done()
        assert not budget.has_room(("small",))
        small = asyncio.ensure_future(budget.reserve(("small",), wait_s=5))
        await asyncio.sleep(0)
        assert not small.done(), "a small read passed over the large one waiting"
        blocker.release()
        (await big).release()
        (await small).release()
        assert budget.held == 0
    asyncio.run(run())


def test_a_chunked_body_one_byte_past_the_limit_is_refused_413():
    """docs/gateway-protocol.md, "Size limit": a body past ``RATCHET_API_MAX_BODY_BYTES``
    is refused 413 where it is read, by one byte too, when it comes without a declared
    length (counted as it arrives)."""
    import json

    from tests.unit.test_api_body_limit import api, claim, completion

    http = api(max_body_bytes=4096)
    effect_id, token = claim(http)
    small = json.dumps(completion(token, "")).encode()
    body = json.dumps(completion(token, "x" * (4097 - len(small)))).encode()
    assert len(body) == 4097

    def chunks():  # no Content-Length
        for at in range(0, len(body), 1000):
            yield body[at:at + 1000]

    refused = http.post(f"/v1/effects/claims/{effect_id}/complete", content=chunks(),
                        headers={"content-type": "application/json"})
    assert (refused.status_code, refused.json()["error"]) == (413, "INVALID_REQUEST")


@pytest.mark.parametrize("parts", [(b"a" * 5,), (b"a" * 3, b"b" * 5), (b"a" * 4, b"b" * 9)])
def test_an_answer_is_cut_in_slices_of_the_slice_size(parts):
    """docs/service.md, "Clients that do not read": an answer is written in slices of the
    slice size (the last one shorter), its bytes unchanged: a client that stops reading
    holds about one slice, so no slice is larger, whatever the parts' sizes."""
    from services.api.slow_readers import slices

    pieces = list(slices(parts, 4))
    assert b"".join(pieces) == b"".join(parts)
    assert all(len(piece) == 4 for piece in pieces[:-1]) and 0 < len(pieces[-1]) <= 4


def test_readiness_is_503_while_the_store_does_not_answer(monkeypatch):
    """docs/gateway-protocol.md, section 8: ``/healthz`` (readiness) is 503 when the store does not
    answer, so the API is taken out of service; liveness (``probe=live``) does not read
    the store and stays 200."""
    from tests.unit.test_api_http import Stack

    stack = Stack()

    def down(*args, **kwargs):
        raise ConnectionError("store down")

    monkeypatch.setattr(stack.store, "get_checkpoint", down)
    for params in ({}, {"probe": "ready"}):
        ready = stack.client.get("/healthz", params=params)
        assert (ready.status_code, ready.json()["status"], ready.json()["store"]) == (
            503, "degraded", False)
    assert stack.client.get("/healthz", params={"probe": "live"}).status_code == 200


def test_readiness_holds_when_the_probed_row_is_damaged():
    """Readiness asks whether the store answers, reading the checkpoint of response
    ``ratchet-healthz`` of tenant ``ratchet-healthz`` (ids a gateway may use too). Since
    session 49 a damaged row raises ``CorruptPartition`` from that lookup: the store
    answered, so ``/healthz`` stays 200; it was 503 (every replica out of service over
    one tenant's damaged row; found by an outside review)."""
    from services.store.base import CorruptPartition
    from tests.unit.test_api_http import Stack

    stack = Stack()
    probe = "ratchet-healthz"
    stack.promote(probe, uid("conv"), 0, (message("hi", item_id=uid("m")),), response_id=probe)
    (partition,) = (p for (tenant, _), p in stack.store._partitions.items() if tenant == probe)
    partition.checkpoints[probe] = replace(partition.checkpoints[probe],
                                           response_id=uid("resp"))  # filed under another
    with pytest.raises(CorruptPartition):
        stack.store.get_checkpoint(probe, probe)
    for params in ({}, {"probe": "ready"}):
        ready = stack.client.get("/healthz", params=params)
        assert (ready.status_code, ready.json()["store"]) == (200, True), ready.json()


def test_a_store_outage_is_never_read_as_no_checkpoint():
    """Fail closed: a store that does not answer raises ``StoreUnavailable`` (a damaged
    row raises ``CorruptPartition`` since session 49): read as "not promoted", a parent
    would be judged missing during an outage instead of the turn being retried."""
    from services.store.base import StoreOptions, StoreUnavailable
    from services.store.memory import MemoryCheckpointStore

    store = MemoryCheckpointStore(StoreOptions())

    def down(tenant_id, response_id):
        raise StoreUnavailable("store get_checkpoint: timed out", retryable=True)

    store._located_checkpoint = down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        store.get_checkpoint("t1", "resp_1")


def test_a_full_answer_budget_is_a_retryable_503_over_http():
    """docs/service.md, "The answer budget": no room within its wait is 503
    ``UNAVAILABLE``, ``retryable: true`` (not a 500 of the service)."""
    from services.api import answer_budget
    from services.api.answer_budget import AnswerBudget
    from services.api.service import RehydrationService
    from tests.unit.test_api_http import FP, Stack

    stack = Stack()
    budget = AnswerBudget(1 << 20)
    service = RehydrationService(stack.store, stack.ledger, stack.waiters, clock=stack.clock,
                                 answers=budget)
    client = stack.client_of(service)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    budget.held = 4 << 20  # the budget full of other reads
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(answer_budget, "ROOM_WAIT_S", 0.05)
        resp = client.get(f"/v1/responses/{rid}/history",
                          params={"tenant_id": tenant, "fingerprint_hash": FP})
    assert resp.status_code == 503
    assert (resp.json()["error"], resp.json()["retryable"]) == ("UNAVAILABLE", True)


def test_a_permanent_store_error_is_a_503_that_says_not_retryable(monkeypatch):
    """docs/gateway-protocol.md, section 8: a store error is 503 ``UNAVAILABLE`` with
    ``retryable`` as the store says (false for a refused statement: a missing schema)."""
    from services.store.base import StoreUnavailable
    from tests.unit.test_api_http import FP, Stack

    stack = Stack()

    def refused(*args, **kwargs):
        raise StoreUnavailable("store read_history: unconfigured table", retryable=False)

    monkeypatch.setattr(stack.store, "read_history", refused)
    resp = stack.client.get("/v1/conversations/conv_1/history",
                            params={"tenant_id": "t1", "fingerprint_hash": FP})
    assert resp.status_code == 503
    assert (resp.json()["error"], resp.json()["retryable"]) == ("UNAVAILABLE", False)


def test_cache_control_no_store_reads_the_store_like_no_cache():
    """docs/service.md: a ``Cache-Control`` with ``no-cache`` or ``no-store`` reads and
    verifies the whole history."""
    stack = CachingStack()
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("one", item_id=uid("m")),))
    assert stack.history(tenant, rid).status_code == 200  # cached
    for header in ("no-store", "max-age=0, No-Store"):
        resp, reads = stack.reads_during(lambda h=header: stack.client.get(
            f"/v1/responses/{rid}/history", headers={"Cache-Control": h},
            params={"tenant_id": tenant, "fingerprint_hash": FP}))
        assert resp.status_code == 200 and reads.get("read_history") == 1, (header, reads)


def test_a_completion_whose_digest_is_not_its_contents_is_refused_422():
    """docs/gateway-protocol.md, effect claims: an output is recorded only if it is one
    a turn could carry; a ``content_digest`` that is not the sha256 of ``content`` is
    422 ``INVALID_REQUEST`` and nothing is recorded."""
    from tests.unit.test_api_body_limit import api, claim, completion

    http = api()
    effect_id, token = claim(http)
    body = completion(token, "ok")
    body["output"]["content_digest"] = "0" * 64
    refused = http.post(f"/v1/effects/claims/{effect_id}/complete", json=body)
    assert (refused.status_code, refused.json()["error"]) == (422, "INVALID_REQUEST")
    done = http.post(f"/v1/effects/claims/{effect_id}/complete", json=completion(token, "ok"))
    assert done.json()["state"] == "COMPLETED"


def test_a_claim_naming_another_effect_id_is_refused_409():
    """docs/gateway-protocol.md, effect claims: ``effect_id`` in a claim's body is the
    key the caller computed; refused 409 ``EFFECT_KEY_MISMATCH`` if it differs from the
    server's (another occurrence's id here), nothing claimed."""
    import hashlib
    import uuid

    from tests.unit.test_api_body_limit import KEYS, api, claim

    http = api()
    effect_id, _ = claim(http)
    body = {**KEYS, "attempt": 1, "subturn_index": 0, "tool_name": "send_email",
            "occurrence": 1, "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
            "call_id": "call_1", "token": uuid.uuid4().hex, "lease_ms": 30_000,
            "policy": "at_most_once", "effect_id": effect_id}
    refused = http.post("/v1/effects/claims", json=body)
    assert (refused.status_code, refused.json()["error"]) == (409, "EFFECT_KEY_MISMATCH")
    del body["effect_id"]
    assert http.post("/v1/effects/claims", json=body).json()["state"] == "CLAIMED"
