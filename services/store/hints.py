"""The store's hints: facts it saw (heads, checkpoints, response locations), kept
bounded to plan a promotion without reading first (the fast path of
``CheckpointStore.promote``) and to read a response's history without the location
lookup. Never truth: every write re-checks them as conditions and every read verifies
the partition (``StoreOptions.hint_capacity``)."""

from __future__ import annotations

import threading
from collections.abc import Hashable

from ratchet.domain.history import Head
from ratchet.lru import Lru


class _Hints:
    """A bounded, thread-safe LRU map of facts this store saw: hints, never truth."""

    def __init__(self, capacity: int) -> None:
        self._lru = Lru(capacity)
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> object | None:
        with self._lock:
            return self._lru.get(key)

    def put(self, key: Hashable, value: object) -> None:
        with self._lock:
            self._lru.put(key, value)

    def put_head(self, key: Hashable, head: Head) -> None:
        """Heads only move forward: never replace a newer head by an older one."""
        with self._lock:
            known = self._lru.get(key)
            if isinstance(known, Head) and known.seq > head.seq:
                return
            self._lru.put(key, head)
