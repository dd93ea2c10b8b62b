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
from schemas.canonical import is_sha256_hex
from schemas.canonical import json_containers as _python_containers
from schemas.limits import MAX_EVENT_CONTAINERS, MAX_ITEM_CONTAINERS
from schemas.models import Item, ToolEffect, TurnCompleted


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


# What a ToolEffect's fields may hold. Each orphan of the effect carries ``tool_name``,
# ``call_id`` and ``arguments_digest``, and each small turn of its request that leaves
# it unused orphans it again: unbounded, 60 effects with 4 MB names made every 1.7 KB
# failed turn publish 240 MB (an outside review, session 34). The claims API already
# holds a claim's fields to these bounds.
_MAX_TOOL_NAME_CHARS = 128
_MAX_CALL_ID_CHARS = 200  # an id's longest (schemas/ids.py)


def effect_field_problem(effect: ToolEffect) -> str | None:
    """Why one of the effect's fields is out of its bound, or None: the processor
    dead-letters such an effect (``streams/request_facts.py``), the gateway library
    refuses to produce it."""
    if not 1 <= len(effect.tool_name) <= _MAX_TOOL_NAME_CHARS:
        return f"tool_name of {len(effect.tool_name)} characters (1 to {_MAX_TOOL_NAME_CHARS})"
    if not 1 <= len(effect.call_id) <= _MAX_CALL_ID_CHARS:
        return f"call_id of {len(effect.call_id)} characters (1 to {_MAX_CALL_ID_CHARS})"
    if not is_sha256_hex(effect.arguments_digest):
        shown = effect.arguments_digest[:80]
        return f"arguments_digest {shown!r} is not a sha256 hex digest (64 of 0-9 a-f)"
    return None
