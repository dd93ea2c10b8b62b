"""A bounded least-recently-used map: the one eviction rule of the in-process caches.

Used by the store's hints (``services/store/hints.py``), the worker's tail cache
(``streams/tail_cache.py``) and the API's history cache (``services/api/cache.py``,
bounded by bytes through ``weigh``). Not thread-safe on purpose: each cache holds its
own lock, often around several maps at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


def _one(_value: object) -> int:
    return 1


class Lru:
    """Entries weighing at most ``capacity`` in total; the least recently read or
    written goes first. Each entry weighs ``weigh(value)``: 1 by default (a count).

    ``capacity <= 0`` keeps nothing (a cache turned off).
    """

    def __init__(self, capacity: int, weigh: Callable[[object], int] = _one) -> None:
        self.capacity = capacity
        self._weigh = weigh
        # A count (the default weigh) adds 1 without calling ``_one``: the store's hints
        # and the tail cache put 5 entries per promoted turn.
        self._counts = weigh is _one
        self.weight = 0  # the total weight of the entries held
        self._entries: OrderedDict[Hashable, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> object | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def peek(self, key: Hashable) -> object | None:
        """The value, without making it recently used."""
        return self._entries.get(key)

    def put(self, key: Hashable, value: object) -> None:
        if self.capacity <= 0:
            return
        old = self._entries.pop(key, None)  # ``pop``, inline: every promotion puts 4-5
        if self._counts:
            if old is None:
                self.weight += 1
            self._entries[key] = value
            while self.weight > self.capacity:
                self._entries.popitem(last=False)
                self.weight -= 1
            return
        if old is not None:
            self.weight -= self._weigh(old)
        self._entries[key] = value
        self.weight += self._weigh(value)
        while self.weight > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self.weight -= self._weigh(evicted)

    def pop(self, key: Hashable) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.weight -= self._weigh(old)

    def pop_oldest(self) -> object | None:
        """Remove and return the least recently used entry (None: empty)."""
        if not self._entries:
            return None
        _, value = self._entries.popitem(last=False)
        self.weight -= self._weigh(value)
        return value
