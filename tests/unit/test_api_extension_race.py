"""A one-row extension on the event loop never reads storage with the blocking driver
there, even when another thread evicts its cached parent at that moment
(services/api/response_reader.py, ``_extend_from``: "on the event loop when the row alone links
to a cached prefix, else in the thread pool, which reads the rows in between").

Before (an outside review, session 43): the parent was looked up for the choice, then
again inside the extension, which was allowed ``MAX_EXTENSION_ROWS``; evicted in
between (a thread-pool extension or Conversation read filling the cache), the
extension went on to read the parent's row, and the rows before it, with the blocking
``read_turn`` on the event loop, stalling every request meanwhile. The answer was
right; the loop was not. The eviction is forced here at that moment: the cache's
second look-up of the parent in the request finds it gone."""

from __future__ import annotations

import asyncio

from tests.unit.test_api_cache import CachingStack
from tests.unit.test_api_http import uid


def test_a_parent_evicted_during_a_one_row_extension_is_not_read_on_the_loop():
    stack = CachingStack()
    tenant, root = uid("tenant"), uid("root")
    first = stack.chain(tenant, root, root, None)  # a chain root is its own key
    second = stack.chain(tenant, root, uid("resp"), first)
    third = stack.chain(tenant, root, uid("resp"), second)
    assert stack.history(tenant, second).status_code == 200  # cached, linked
    expected = stack.fresh(tenant, third).content
    stack.cache.discard(tenant, third)  # the fresh read cached it: a miss again

    blocking_on_loop = blocking_reads_on_the_loop(stack.store)

    cache_get = stack.cache.get
    looks = []

    def get(tenant_id, response_id):
        if response_id == second:
            looks.append(response_id)
            if len(looks) == 2:  # another thread evicts it right now
                stack.cache.discard(tenant_id, response_id)
        return cache_get(tenant_id, response_id)

    stack.cache.get = get
    resp = stack.history(tenant, third, partition_key=root)
    assert len(looks) >= 2, "the scenario did not reach the extension"
    assert resp.status_code == 200 and resp.content == expected
    assert blocking_on_loop == []


def blocking_reads_on_the_loop(store) -> list[tuple]:
    """Watches ``store``'s row reads: the list fills with the arguments of every read
    made with the blocking driver on an event loop (the async driver's read is given
    the same rows and never blocks)."""
    blocking_on_loop: list[tuple] = []
    read_turn = store.read_turn

    def watched_read_turn(*args):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # a worker thread: where the blocking driver belongs
        else:
            blocking_on_loop.append(args)
        return read_turn(*args)

    async def read_turn_async(*args):  # the async driver's read: never blocks
        return read_turn(*args)

    store.read_turn = watched_read_turn
    store.read_turn_async = read_turn_async
    return blocking_on_loop
