"""The chaos harness's own digests, written from docs/gateway-protocol.md (sections 3-4).

The oracle must not borrow product code for what it predicts: if the product's
``fingerprint_hash`` or ``effect_id`` recipe drifted (a component left out of the hash,
an effect id that ignores the call), an oracle computing its expectations with the
product's functions would drift with it and pass. These are the recipes as the docs
state them, checked against the published vectors (``docs/vectors/``) by
``tests/unit/test_chaos_recipes.py``; the workload builds its events with the product's
gateway library (as a gateway would), and ``cross_check`` reports every place where
what the library computed is not what the docs say.

Nothing here imports ratchet code.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

# The 22 fields of the Fingerprint record, by their Avro names, in schema order
# (gateway-protocol.md section 4).
FINGERPRINT_FIELDS = (
    "fingerprint_version", "model_name", "model_weights_revision", "tokenizer_name",
    "tokenizer_revision", "renderer_name", "renderer_version", "chat_template_digest",
    "chat_template_args", "reasoning_parser", "reasoning_flags", "tool_parser",
    "instructions_digest", "tools_digest", "lora_name", "lora_revision",
    "multimodal_input_digests", "cache_salt_digest", "block_hash_format",
    "router_key_format", "block_size", "item_format_version",
)


def canonical(value: Any) -> bytes:
    """Canonical JSON (section 3): UTF-8, keys sorted by code point, no whitespace,
    explicit nulls, no NaN/Infinity; Python's escapes and float spelling are the
    documented ones."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint_hash(fingerprint: Any) -> str:
    """sha256 of the canonical JSON of ALL 22 fields (nulls and [] included). Takes a
    mapping or any object with the fields as attributes."""
    get = fingerprint.get if isinstance(fingerprint, dict) else (
        lambda name: getattr(fingerprint, name))
    fields = {}
    for name in FINGERPRINT_FIELDS:
        value = get(name)
        if isinstance(value, tuple):
            value = list(value)
        fields[name] = value
    return sha256_hex(canonical(fields))


def effect_id(idempotency_key: str, subturn_index: int, call_id: str) -> str:
    """An unclaimed effect: "eff_" + the first 32 hex of sha256(canonical JSON of
    [idempotency_key, subturn_index, call_id])."""
    return "eff_" + sha256_hex(canonical([idempotency_key, subturn_index, call_id]))[:32]


def claimed_effect_id(idempotency_key: str, subturn_index: int, tool_name: str,
                      occurrence: int) -> str:
    """A claimed effect (section 8): "eff_" + the first 32 hex of sha256(canonical JSON
    of ["claim", idempotency_key, subturn_index, tool_name, occurrence])."""
    return "eff_" + sha256_hex(canonical(["claim", idempotency_key, subturn_index,
                                          tool_name, occurrence]))[:32]


def tool_name(call: dict[str, Any]) -> str:
    """The call's ``name``, else its ``type`` without the ``_call`` suffix."""
    name = call.get("name")
    if isinstance(name, str) and name:
        return name
    kind = str(call.get("type", ""))
    return kind[: -len("_call")] if kind.endswith("_call") else kind


def item_digest(item: dict[str, Any]) -> str:
    """Item.content_digest of a Responses item (its canonical JSON, id and type in)."""
    return sha256_hex(canonical(item))


def cross_check(events: Iterable[Any]) -> list[str]:
    """What the product's gateway library computed otherwise than these recipes, for
    each event of the workload: a ``TurnCompleted``'s ``fingerprint_hash`` (and its
    artifact's and proof's), a ``ToolEffect``'s ``effect_id``, a claimed run's
    ``effect_id``. Duck-typed on the event's fields (no ratchet import)."""
    out = []
    for ev in events:
        fp = getattr(ev, "fingerprint", None)
        if fp is not None and hasattr(ev, "fingerprint_hash"):
            want = fingerprint_hash(fp)
            if ev.fingerprint_hash != want:
                out.append(f"{ev.response_id}: fingerprint_hash {ev.fingerprint_hash} != "
                           f"{want} (sha256 of all 22 components)")
        if hasattr(ev, "subturn_index") and hasattr(ev, "output") and hasattr(ev, "call_id"):
            want = effect_id(ev.idempotency_key, ev.subturn_index, ev.call_id)
            if ev.effect_id != want:
                out.append(f"effect of {ev.call_id}: effect_id {ev.effect_id} != {want} "
                           f"([key, subturn, call_id])")
        if hasattr(ev, "output_digest") and hasattr(ev, "call") and hasattr(ev, "role"):
            want = claimed_effect_id(ev.idempotency_key, ev.subturn_index,
                                     tool_name(ev.call), 0)
            if ev.effect_id != want:
                out.append(f"claim of {ev.call_id}: effect_id {ev.effect_id} != {want} "
                           f"([\"claim\", key, subturn, tool, occurrence])")
    return out
