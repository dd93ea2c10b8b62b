"""Python models mirroring the ``.avsc`` files in this folder (the source of truth).

``tests/unit/test_model_schema_drift.py`` fails if a model and its schema drift apart.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict

# Item types this version of ratchet knows how to render and verify. Anything else is
# UNKNOWN_ITEM_TYPE: we never guess how an unknown item renders into tokens.
KNOWN_ITEM_TYPES = frozenset({"message", "function_call", "function_call_output", "reasoning"})
# Item encodings this version can decode; anything else is UNSUPPORTED_FORMAT.
SUPPORTED_FORMAT_VERSIONS = frozenset({1})


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Item(Frozen):
    """One model-visible item of a Responses history (``content`` is canonical JSON)."""

    item_id: str
    type: str
    role: str | None = None
    call_id: str | None = None
    content: bytes
    content_digest: str
    format_version: int = 1

    def digest_ok(self) -> bool:
        return sha256_hex(self.content) == self.content_digest
