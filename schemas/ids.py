"""The ids the HTTP API serves: ONE pattern for the API's parameters and for the ids a
turn may carry, so the two cannot drift.

Ids are opaque strings chosen by gateways; the API bounds them (alphabet and length) so
a request line stays small. A turn whose ``response_id`` (or tenant, Conversation, chain
root, parent) the API refuses with 422 names a history nobody could ever read: the
processor rejects such a turn ``CORRUPT`` (``ratchet.domain.validation``) and the gateway
library refuses to produce it (``services.gateway``). Fail closed, before the store.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable
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
_ID_FIELDS = SERVED_ID_FIELDS + KEY_ID_FIELDS
_MATCH = _ID.fullmatch


def is_servable_id(value: str) -> bool:
    """``value`` matches ``ID_PATTERN`` (the API would take it)."""
    return _ID.fullmatch(value) is not None


def unservable_id(event: Any) -> str | None:
    """Why one of ``event``'s ids (``SERVED_ID_FIELDS`` and ``KEY_ID_FIELDS``; null or
    absent ones aside) could never be served by the API or key a stored row, or None.
    Works for any gateway event or ``TurnIdentity``."""
    global _last
    last = _last
    if last[0] is event:
        return last[1]
    read = _ids_reader(type(event))
    names: tuple[str, ...] = _ID_FIELDS
    values: tuple[Any, ...] | None = None
    if read is not None:
        try:
            names, values = read[0], read[1](event)
        except AttributeError:
            # A model that lacks a field of its class (built by ``model_construct``),
            # or a property that raises: read name by name, as an absent id (the
            # getter's AttributeError escaped to the caller; an outside review,
            # session 46).
            names = _ID_FIELDS
    if values is None:  # not a model whose attributes its class fixes: ask each name
        values = tuple([getattr(event, name, None) for name in names])
    answer = None
    for name, value in zip(names, values, strict=True):
        if value is not None and _MATCH(value) is None:
            shown = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
            answer = (f"{name} {shown!r} ({len(value)} characters) does not match the "
                      f"API's id pattern {ID_PATTERN}: the API could never serve it")
            break
    if read is not None and read[2]:
        _last = (event, answer)
    return answer


# The last frozen event asked about and its answer: a turn is asked twice (the
# processor's identity check decides its path, then validation's rule), ~3 us and 7
# calls each. Its answer cannot change (a frozen model's ids are fixed), and the event
# is held here, so no other object can take its identity. One tuple, swapped whole:
# safe between the worker's loop and its thread.
_last: tuple[Any, str | None] = (object(), None)


@functools.cache
def _ids_reader(
    cls: type,
) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], bool] | None:
    """For a pydantic model class that allows no extra attributes: the id names it has
    (fields, or class attributes such as properties) and one getter of all their
    values, and whether the class is frozen. Asked twice per turn (the processor's
    identity check, then validation), a ``getattr`` with a default per name cost a pydantic ``__getattr__`` and its
    exception for every name the model lacks. None for any other class."""
    fields = getattr(cls, "model_fields", None)
    config = getattr(cls, "model_config", None)
    if not isinstance(fields, dict) or not isinstance(config, dict) \
            or config.get("extra") == "allow":
        return None
    names = tuple(name for name in _ID_FIELDS if name in fields or hasattr(cls, name))
    if len(names) < 2:  # attrgetter of one name gives the value, not a tuple
        return None
    # Frozen (its ids fixed once built): its answer may be remembered (``_last``).
    return names, operator.attrgetter(*names), config.get("frozen") is True
