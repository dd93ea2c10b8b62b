"""A bounded least-recently-used map: the one eviction rule of the in-process caches.

Used by the store's hints (``services/store/base.py``) and the worker's tail cache
(``streams/tail_cache.py``). Not thread-safe on purpose: each cache holds its own lock,
often around several maps at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class Lru:
    """At most ``capacity`` entries; the least recently read or written goes first.

    ``capacity <= 0`` keeps nothing (a cache turned off).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, object] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> object | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: object) -> None:
        if self.capacity <= 0:
            return
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def pop(self, key: Hashable) -> None:
        self._entries.pop(key, None)
