"""``len(HistoryCache)`` crashes while another thread puts entries of other tenants.

Promised (services/api/cache.py ``HistoryCache``: "Thread-safe: lookups use it on the
event loop, multi-row extensions and conversation misses from the thread pool, the
pre-warmer from its own thread"). ``CachedHistories._cache_gauges`` calls
``len(self._cache)`` after every fill/extension, from the event loop and from the
thread pool at once.

Before its fix (found by an outside review, session 21): ``HistoryCache.__len__`` takes no lock and ``_FairShares.__len__`` (new
today) iterates ``self._tenants.values()``, a dict that ``put`` grows (a new tenant)
and shrinks (a tenant whose last entry is evicted) under the lock in another thread:
``RuntimeError: dictionary changed size during iteration`` escapes to the request
that was only updating a gauge (an untyped 500 after a verified read). Before today
``len`` was ``len(OrderedDict)``, atomic under the GIL.
"""

from __future__ import annotations

import sys
import threading

from services.api.cache import ENTRY_OVERHEAD_BYTES, CachedHistory, HistoryCache
from services.api.render import RenderedHistory


def _entry(tenant: str) -> CachedHistory:
    return CachedHistory(tenant, "p", None, False, RenderedHistory("r", b"x" * 100, b""))  # type: ignore[arg-type]


def test_len_while_other_threads_put_entries_of_new_tenants():
    cache = HistoryCache(max_bytes=300 * (100 + ENTRY_OVERHEAD_BYTES))
    for index in range(200):  # many tenants: iterating them takes a while
        cache.put(f"r{index}", _entry(f"warm{index}"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(offset: int) -> None:
        index = 0
        while not stop.is_set():
            cache.put(f"r{index}", _entry(f"t{offset}-{index}"))  # new tenant, evicts one
            index += 1

    def reader() -> None:
        try:
            for _ in range(20_000):
                len(cache)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        writers = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for thread in writers + readers:
            thread.start()
        for thread in readers:
            thread.join()
        stop.set()
        for thread in writers:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, f"len(cache) raised {errors[0]!r}"
