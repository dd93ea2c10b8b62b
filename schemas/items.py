"""Build ``Item``s the way gateways must: canonical JSON content + its sha256 digest.

``content`` is the Responses item object as canonical JSON, so the digest a gateway
computes, the digest ratchet verifies and the digest rehydration re-verifies are over
the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.canonical import canonical_digest, canonical_json, sha256_hex
from schemas.models import Item


def make_item(
    item_type: str,
    payload: Mapping[str, Any],
    *,
    item_id: str,
    role: str | None = None,
    call_id: str | None = None,
    format_version: int = 1,
) -> Item:
    """An item whose content is ``{"id", "type", **payload}`` as canonical JSON."""
    content = canonical_json({"id": item_id, "type": item_type, **payload})
    return Item(
        item_id=item_id,
        type=item_type,
        role=role,
        call_id=call_id,
        content=content,
        content_digest=sha256_hex(content),
        format_version=format_version,
    )


def message(text: str, *, role: str = "user", item_id: str) -> Item:
    text_type = "output_text" if role == "assistant" else "input_text"
    payload = {"role": role, "content": [{"type": text_type, "text": text}]}
    return make_item("message", payload, item_id=item_id, role=role)


def function_call(call_id: str, name: str, arguments: Mapping[str, Any], *, item_id: str) -> Item:
    """A tool call; ``arguments`` are stored as canonical JSON text, as Responses does."""
    payload = {
        "call_id": call_id,
        "name": name,
        "arguments": canonical_json(dict(arguments)).decode("utf-8"),
    }
    return make_item("function_call", payload, item_id=item_id, call_id=call_id)


def function_call_output(call_id: str, output: str, *, item_id: str) -> Item:
    return make_item(
        "function_call_output",
        {"call_id": call_id, "output": output},
        item_id=item_id,
        call_id=call_id,
    )


def reasoning(summary: str, *, item_id: str) -> Item:
    payload = {"summary": [{"type": "summary_text", "text": summary}]}
    return make_item("reasoning", payload, item_id=item_id)


def effect_id_for(idempotency_key: str, subturn_index: int, call_id: str) -> str:
    """A ToolEffect id that is the same for every retry of one request (CONTRACT 3)."""
    return "eff_" + canonical_digest([idempotency_key, subturn_index, call_id])[:32]


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    return canonical_digest(dict(arguments))
