"""The bounds of one gateway event beyond its size (schemas/limits.py), as the processor
and the gateway library apply them (docs/gateway-protocol.md, "Size limit").

- ``MAX_EVENT_ELEMENTS``: array items and map entries of the Avro body. The processor
  counts them in the body before decoding (``schemas.avro``); the gateway library
  (``services.gateway.producer``) from the model it is about to encode
  (``elements_of``): ratchet's own schema, the same count.
- ``MAX_ITEM_CONTAINERS`` / ``MAX_EVENT_CONTAINERS``: arrays and objects of the items'
  contents, counted in the text before any content is parsed (``container_problem``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ratchet.speedups import SPEEDUPS
from schemas.canonical import json_containers as _python_containers
from schemas.limits import MAX_EVENT_CONTAINERS, MAX_ITEM_CONTAINERS
from schemas.models import Item, TurnCompleted


def elements_of(turn: TurnCompleted) -> int:
    """The array items and map entries of ``turn``'s Avro body (ratchet's schema)."""
    return (len(turn.input_items) + len(turn.output_items) + len(turn.tool_effect_ids)
            + len(turn.fingerprint.multimodal_input_digests) + len(turn.subturns)
            + sum(len(subturn.effect_ids) for subturn in turn.subturns))


def _containers(content: bytes, most: int) -> int:
    if SPEEDUPS is not None:
        return SPEEDUPS.json_containers(content, most)
    return _python_containers(content, most)


def container_problem(items: Sequence[Item]) -> str | None:
    """Why the contents of ``items`` hold too many arrays and objects (one item's, or
    all of them together), else None. Counted in the text, before anything is parsed:
    C scans ~1 GB/s (~5 us for a 20-item turn); the Python twin costs a regex over each
    item's strings (~130 us), so without C it runs only when the brackets alone, in
    strings or not (a bound from above: ``bytes.count``, ~6 us), could exceed a bound."""
    if SPEEDUPS is None:
        rough = [item.content.count(b"[") + item.content.count(b"{") for item in items]
        if max(rough, default=0) <= MAX_ITEM_CONTAINERS and sum(rough) <= MAX_EVENT_CONTAINERS:
            return None
    total = 0
    for item in items:
        found = _containers(item.content, MAX_ITEM_CONTAINERS)
        if found > MAX_ITEM_CONTAINERS:
            return (f"item {item.item_id}: content holds more than {MAX_ITEM_CONTAINERS} "
                    "arrays and objects")
        total += found
        if total > MAX_EVENT_CONTAINERS:
            return (f"the items' contents hold more than {MAX_EVENT_CONTAINERS} arrays "
                    "and objects in all")
    return None
