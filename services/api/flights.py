"""Concurrent full reads of one history share one read (single flight).

Why: N requests for the same history that the cache does not hold yet (N woken by one
promotion, N cold reads of one Conversation after a restart) each read and verified it
from Cassandra: N full reads for one answer (left open in session 43).

How: one asyncio future per key (the running read, a ``Task``); a request for a key
whose read has not begun joins it, and every request that joined gets its result, or
its exception (never kept: the next request reads again). A request for a key whose
read began before it arrived does not take that read's answer: it may predate a
promotion the request was told of (a waiter woken by its decision would read "not
found" again and sleep to its deadline). Such requests share the NEXT read, which
begins when the running one ends: at most two reads per burst, each begun after every
request it answers arrived (linearizable). A request cancelled leaves the read to the
others. One event loop's (the API's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from ratchet.metric_children import child
from services.api import metrics

T = TypeVar("T")


class _Flight(Generic[T]):
    def __init__(self, previous: _Flight[T] | None) -> None:
        self.previous = previous
        self.begun = False
        self.task: asyncio.Future[T] | None = None


class SingleFlight(Generic[T]):
    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._flights: dict[Hashable, _Flight[T]] = {}  # the latest read of each key

    def __len__(self) -> int:
        return len(self._flights)

    async def run(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``'s result, shared with the other requests for ``key`` that joined."""
        flight = self._flights.get(key)
        if flight is None or flight.begun:
            flight = _Flight(flight)
            self._flights[key] = flight
            flight.task = asyncio.ensure_future(self._fly(key, flight, read))
            flight.task.add_done_callback(_retrieved)
            child(metrics.SHARED_READS, self._kind, "read").inc()
        else:
            child(metrics.SHARED_READS, self._kind, "joined").inc()
        assert flight.task is not None
        return await asyncio.shield(flight.task)

    async def _fly(self, key: Hashable, flight: _Flight[T],
                   read: Callable[[], Awaitable[T]]) -> T:
        try:
            previous, flight.previous = flight.previous, None
            if previous is not None and previous.task is not None:
                await asyncio.wait([previous.task])  # its end, whatever it was
            flight.begun = True
            return await read()
        finally:
            if self._flights.get(key) is flight:
                del self._flights[key]


def _retrieved(task: asyncio.Future) -> None:
    """Every request that joined may have been cancelled: the read's exception is theirs
    to see, not the loop's "never retrieved" log."""
    if not task.cancelled():
        task.exception()
