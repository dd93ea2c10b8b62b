"""The knobs every store backend shares (``StoreOptions``), in a module of their own so
that the store's parts (``backend.py`` and what it serves) read them without importing
the facade, ``base.py``, which re-exports them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from services.store.request_checks import DEFAULT_MAX_TURN_BYTES


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class StoreOptions:
    """Knobs shared by every backend.

    ``hint_capacity``: how many heads, checkpoints and response locations the store
    remembers (each, LRU) to plan a promotion without reading first and to read a
    response's history without the location lookup. Hints are never trusted: every
    write re-checks them as conditions and every read verifies the partition. 0
    turns them off (every promotion with a head or a parent then reads first).
    """

    logical_retention_s: int = 0
    max_turn_bytes: int = DEFAULT_MAX_TURN_BYTES
    clock: Callable[[], datetime] = field(default=_utc_now)
    hint_capacity: int = 4096
