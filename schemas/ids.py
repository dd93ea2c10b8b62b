"""The ids the HTTP API serves: ONE pattern for the API's parameters and for the ids a
turn may carry, so the two cannot drift.

Ids are opaque strings chosen by gateways; the API bounds them (alphabet and length) so
a request line stays small. A turn whose ``response_id`` (or tenant, Conversation, chain
root, parent) the API refuses with 422 names a history nobody could ever read: the
processor rejects such a turn ``CORRUPT`` (``ratchet.domain.validation``) and the gateway
library refuses to produce it (``services.gateway``). Fail closed, before the store.
"""

from __future__ import annotations

import re
from typing import Any

ID_PATTERN = (r"^(?:[A-Za-z0-9_:\-][A-Za-z0-9._:\-]{0,199}"
              r"|\.[A-Za-z0-9_:\-][A-Za-z0-9._:\-]{0,198}"
              r"|\.\.[A-Za-z0-9._:\-]{1,198})$")
"""1 to 200 of ``A-Z a-z 0-9 . _ : -``, except ``.`` and ``..``: as a path segment those
are dot segments, which HTTP clients remove (RFC 3986, 5.2.4), so such a history could
not be asked for. Three alternatives (a first character that is not a dot; a dot then
one that is not; two dots then anything), not a lookahead: published in the OpenAPI
document and checked by FastAPI's Rust regex, which has none (``$`` is the very end)."""

# fullmatch: Python's "$" would also match before a final newline.
_ID = re.compile(ID_PATTERN)

SERVED_ID_FIELDS = (
    "tenant_id",
    "response_id",
    "conversation_id",
    "chain_root_id",
    "previous_response_id",
)
"""Fields of a gateway event the API takes in a path or query (history, status,
``partition_key`` hint) to serve the turn; each must match ``ID_PATTERN`` when set."""

KEY_ID_FIELDS = (
    "idempotency_key",
    "event_id",
    "effect_id",
)
"""Other ids of a gateway event that key stored rows (a request's facts, decisions,
effects; the claims API takes the same ids under the same pattern). Bounded like the
served ones: an id the store could not key (Cassandra refuses a key above 64 KiB) would
otherwise stall its partition on a write that can never succeed."""

_SHOWN = 60  # characters of an offending id quoted in a detail


def is_servable_id(value: str) -> bool:
    """``value`` matches ``ID_PATTERN`` (the API would take it)."""
    return _ID.fullmatch(value) is not None


def unservable_id(event: Any) -> str | None:
    """Why one of ``event``'s ids (``SERVED_ID_FIELDS`` and ``KEY_ID_FIELDS``; null or
    absent ones aside) could never be served by the API or key a stored row, or None.
    Works for any gateway event or ``TurnIdentity``."""
    for name in SERVED_ID_FIELDS + KEY_ID_FIELDS:
        value = getattr(event, name, None)
        if value is not None and not is_servable_id(value):
            shown = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
            return (f"{name} {shown!r} ({len(value)} characters) does not match the API's "
                    f"id pattern {ID_PATTERN}: the API could never serve it")
    return None
