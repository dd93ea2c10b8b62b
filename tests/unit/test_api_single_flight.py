"""Concurrent full reads of one history share one read (services/api/flights.py),
session 44.

N requests for a response the cache does not hold yet each read and verified its
history from the store (left open in session 43). Now requests whose read has not begun
share it, an error reaches each of them and is not kept, and a request that arrives
after a read began does not take that read's answer (a promotion it was told of may
have come after it): it shares the next read. The store's full read is gated: it reads
at once (the snapshot) and answers when the test opens the gate, as a Cassandra round
trip would; ``read_history`` counts the store's full reads."""

from __future__ import annotations

import asyncio

import pytest

from services.store.base import StoreUnavailable
from services.store.hints import _Hints
from tests.unit.test_api_cache import CachingStack
from tests.unit.test_api_http import FP, message, uid

N = 10


class Gated:
    """The store's full reads answer when ``gate`` opens; ``fail`` makes them raise."""

    def __init__(self, stack: CachingStack) -> None:
        self.gate = asyncio.Event()
        self.fail: Exception | None = None
        real = stack.store.read_history_async

        async def gated(*args, **kwargs):
            result = await real(*args, **kwargs)  # read now: this is its snapshot
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return result

        stack.store.read_history_async = gated


async def _progress() -> None:
    """Lets every started request run up to where it waits (no wall clock)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _history(stack: CachingStack, tenant: str, rid: str):
    return stack.service.response_history(tenant, rid, FP, 0)


def test_concurrent_cold_reads_of_one_response_share_one_store_read():
    """Ten requests for a response not cached yet, the first of them cancelled (its
    client left) once the read is under way: one store read answers the nine others."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))

    async def run():
        gated = Gated(stack)
        before = stack.reads.get("read_history", 0)
        requests = [asyncio.ensure_future(_history(stack, tenant, rid)) for _ in range(N)]
        await _progress()
        requests[0].cancel()
        await _progress()
        gated.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await requests[0]
        answers = await asyncio.gather(*requests[1:])
        return answers, stack.reads.get("read_history", 0) - before

    answers, reads = asyncio.run(run())
    assert {a.outcome for a in answers} == {"certified"}
    assert len({a.payload for a in answers}) == 1
    assert reads <= 2, f"{N} concurrent cold reads made {reads} store reads"


def test_a_failed_shared_read_fails_every_request_that_shared_it_and_is_not_kept():
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))

    async def run():
        gated = Gated(stack)
        gated.fail = StoreUnavailable("cassandra timed out", retryable=True)
        before = stack.reads.get("read_history", 0)
        requests = [asyncio.ensure_future(_history(stack, tenant, rid)) for _ in range(N)]
        await _progress()
        gated.gate.set()
        results = await asyncio.gather(*requests, return_exceptions=True)
        shared = stack.reads.get("read_history", 0) - before
        gated.fail = None
        again = await _history(stack, tenant, rid)  # read again: the failure is not kept
        return results, shared, again, stack.reads.get("read_history", 0) - before

    results, shared, again, reads = asyncio.run(run())
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert shared == 1, f"{N} concurrent reads made {shared} store reads"
    assert again.outcome == "certified" and reads == 2


def test_a_request_after_a_read_began_shares_the_next_read_not_that_ones_answer():
    """A read began before the response was promoted (it finds nothing); two requests
    arrive after the promotion: they are answered from one read begun after them
    (certified), never from the read that began before (a woken waiter would read "not
    found" again and sleep to its deadline)."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = "resp_" + uid("r")

    async def run():
        gated = Gated(stack)
        before = stack.reads.get("read_history", 0)
        early = asyncio.ensure_future(_history(stack, tenant, rid))
        await _progress()  # its read began: nothing promoted
        stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),),
                      response_id=rid)
        late = [asyncio.ensure_future(_history(stack, tenant, rid)) for _ in range(2)]
        await _progress()
        gated.gate.set()
        return (await early, await asyncio.gather(*late),
                stack.reads.get("read_history", 0) - before)

    early, late, reads = asyncio.run(run())
    assert early.reason == "NOT_FOUND"
    assert [a.outcome for a in late] == ["certified", "certified"]
    assert reads == 2, f"3 requests made {reads} store reads (one began before two)"


def test_concurrent_cold_reads_of_one_conversation_share_at_most_two_store_reads():
    """The same on the Conversation endpoint. Each request first tries an extension
    in the thread pool, so some may come back after the first read began: those share
    the next read (at most two in all, where each request read once)."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    for seq in range(3):
        stack.promote(tenant, conv, seq, (message(f"turn {seq}", item_id=uid("msg")),))

    async def run():
        gated = Gated(stack)
        before = stack.reads.get("read_history", 0)
        requests = [asyncio.ensure_future(stack.service.conversation_history(tenant, conv, FP))
                    for _ in range(N)]
        await _progress()
        gated.gate.set()
        answers = await asyncio.gather(*requests)
        return answers, stack.reads.get("read_history", 0) - before

    answers, reads = asyncio.run(run())
    assert {a.outcome for a in answers} == {"certified"}
    assert len({a.payload for a in answers}) == 1
    assert reads <= 2, f"{N} concurrent cold reads made {reads} store reads"


def test_a_request_whose_hint_differs_does_not_take_another_hints_read():
    """A response promoted before migration 007 has no claim: only a request naming its
    partition (``partition_key``) finds it. A request without the hint and one with it,
    concurrent: each is answered by a read made with its own hint (keyed by the hint
    too), so the hinted one is certified, not the unhinted read's 404."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))
    del stack.store._claims[(tenant, rid)]  # as before migration 007
    stack.store._location_hints = _Hints(64)  # another replica's store: it saw nothing

    async def run():
        gated = Gated(stack)
        unhinted = asyncio.ensure_future(_history(stack, tenant, rid))
        hinted = asyncio.ensure_future(
            stack.service.response_history(tenant, rid, FP, 0, partition_key=conv))
        await _progress()
        gated.gate.set()
        return await unhinted, await hinted

    unhinted, hinted = asyncio.run(run())
    assert unhinted.status_code == 404
    assert hinted.outcome == "certified", hinted
