"""The item catalogue: every OpenAI Responses item type a gateway stores, in one table.

A turn's history is a list of Responses items (``Item.content`` is the item's canonical
JSON). ratchet promotes only items whose type it knows here; a type outside the table
is ``UNKNOWN_ITEM_TYPE`` (we never guess how an unknown item renders into tokens), and
an item whose content does not have its type's shape is ``CORRUPT``.

Each type has a **kind**, which decides its pairing rule (``validation.check_pairing``):

* ``message``, ``reasoning``, ``compaction``: stand alone (a reasoning item must be
  followed by another item);
* ``self_contained``: a built-in tool call that carries its own result (web search,
  file search, code interpreter, image generation, MCP list tools, MCP call);
* ``call`` -> ``output``: paired by ``call_id`` (function, custom tool, computer,
  local shell, shell, apply patch). call_ids are unique in the history, an output
  follows its call and has the call's output type, an unanswered call may only stay
  open at the end of the history (the client runs it);
* ``approval_request`` -> ``approval_response``: an MCP approval request is answered by
  a response naming the request's id in ``approval_request_id``; unanswered only at
  the end of the history.

The **shape** of a type is the few content fields identity and pairing rely on, each
with its JSON type; every other field is free (gateways and newer API versions add
fields). Every item's content is a JSON object whose ``type`` is the item's type and
whose ``id`` is the item's ``item_id``; the record's ``role`` and ``call_id`` mirror
the content's (absent in the content = null in the record), so the call_id pairing
checks is the one the model sees.

**Executed** types are the calls a gateway may run itself and record as a
``ToolEffect``: the effect's ``output`` is the type's ``effect_output`` item (the
call's output item; for ``mcp_call``, which carries its own result, the call item) and
its ``call_id`` is that item's :func:`effect_key`.

Types deliberately left out (a turn holding one is ``UNKNOWN_ITEM_TYPE``) are in
``NOT_STORED`` with the reason, which validation puts in the rejection detail.

Pure: imports only ``schemas`` and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from schemas.canonical import duplicate_key, parse_json
from schemas.models import Item


class Kind(StrEnum):
    """What an item is, as far as pairing is concerned."""

    MESSAGE = "message"
    REASONING = "reasoning"
    COMPACTION = "compaction"
    SELF_CONTAINED = "self_contained"
    CALL = "call"
    OUTPUT = "output"
    APPROVAL_REQUEST = "approval_request"
    APPROVAL_RESPONSE = "approval_response"


# JSON types of shape fields (what json.loads gives).
TEXT: tuple[type, ...] = (str,)
LIST: tuple[type, ...] = (list,)
OBJECT: tuple[type, ...] = (dict,)
BOOL: tuple[type, ...] = (bool,)
TEXT_OR_LIST: tuple[type, ...] = (str, list)


@dataclass(frozen=True, slots=True)
class ItemType:
    """One row of the catalogue.

    ``required``: (field, allowed JSON types) the content must carry.
    ``output_type``: for a ``call``, the type of the item that answers it.
    ``effect_output``: for an executed type, the item type a ``ToolEffect`` records.
    """

    name: str
    kind: Kind
    required: tuple[tuple[str, tuple[type, ...]], ...] = ()
    output_type: str | None = None
    effect_output: str | None = None

    @property
    def executed(self) -> bool:
        """A gateway may run this call itself and record it as a ``ToolEffect``."""
        return self.effect_output is not None


def _call(name: str, output: str, *required: tuple[str, tuple[type, ...]]) -> tuple[ItemType, ...]:
    """A call answered by ``output`` (both carry ``call_id``), executable by a gateway."""
    call_id = ("call_id", TEXT)
    return (
        ItemType(name, Kind.CALL, (call_id, *required), output_type=output, effect_output=output),
        ItemType(output, Kind.OUTPUT, (call_id,)),
    )


_TYPES: tuple[ItemType, ...] = (
    ItemType("message", Kind.MESSAGE, (("role", TEXT), ("content", TEXT_OR_LIST))),
    ItemType("reasoning", Kind.REASONING, (("summary", LIST),)),
    ItemType("compaction", Kind.COMPACTION, (("encrypted_content", TEXT),)),
    # built-in tools the provider runs; the call item holds the result
    ItemType("web_search_call", Kind.SELF_CONTAINED, (("status", TEXT),)),
    ItemType("file_search_call", Kind.SELF_CONTAINED, (("queries", LIST), ("status", TEXT))),
    ItemType("code_interpreter_call", Kind.SELF_CONTAINED, (("status", TEXT),)),
    ItemType("image_generation_call", Kind.SELF_CONTAINED, (("status", TEXT),)),
    ItemType("mcp_list_tools", Kind.SELF_CONTAINED, (("server_label", TEXT), ("tools", LIST))),
    ItemType(
        "mcp_call",
        Kind.SELF_CONTAINED,
        (("server_label", TEXT), ("name", TEXT), ("arguments", TEXT)),
        effect_output="mcp_call",
    ),
    # calls answered by an output item with the same call_id
    *_call("function_call", "function_call_output", ("name", TEXT), ("arguments", TEXT)),
    *_call("custom_tool_call", "custom_tool_call_output", ("name", TEXT), ("input", TEXT)),
    *_call("computer_call", "computer_call_output"),
    *_call("local_shell_call", "local_shell_call_output", ("action", OBJECT)),
    *_call("shell_call", "shell_call_output", ("action", OBJECT)),
    *_call("apply_patch_call", "apply_patch_call_output", ("operation", OBJECT)),
    # MCP approvals: the response names the request's id
    ItemType(
        "mcp_approval_request",
        Kind.APPROVAL_REQUEST,
        (("server_label", TEXT), ("name", TEXT), ("arguments", TEXT)),
    ),
    ItemType(
        "mcp_approval_response",
        Kind.APPROVAL_RESPONSE,
        (("approval_request_id", TEXT), ("approve", BOOL)),
    ),
)

CATALOGUE: dict[str, ItemType] = {t.name: t for t in _TYPES}
"""Item type name -> its row. The only list of item types ratchet promotes."""

KNOWN_ITEM_TYPES: frozenset[str] = frozenset(CATALOGUE)

EFFECT_OUTPUT_TYPES: frozenset[str] = frozenset(
    t.effect_output for t in _TYPES if t.effect_output is not None
)
"""Item types a ``ToolEffect`` may record as its ``output``."""

NOT_STORED: dict[str, str] = {
    "item_reference": "a reference to another item, not an item: a turn must carry the "
    "resolved item it points to",
    "tool_search_call": "its pairing is not settled (call_id optional, run by server or "
    "client); refused rather than promoted under a guessed rule",
    "tool_search_output": "its pairing is not settled (call_id optional, run by server or "
    "client); refused rather than promoted under a guessed rule",
    "configuration_update": "changes how later responses render (reasoning effort): "
    "execution configuration that belongs in the fingerprint, not in the history",
}
"""Responses item types ratchet refuses on purpose, with the reason (UNKNOWN_ITEM_TYPE)."""


def unknown_type_detail(item: Item) -> str:
    """The rejection detail for an item whose type is not in the catalogue."""
    why = NOT_STORED.get(item.type)
    suffix = f": {why}" if why else " (not in the item catalogue)"
    return f"item {item.item_id} has type {item.type!r}{suffix}"


def decode_content(item: Item) -> dict[str, Any] | None:
    """The item's content as a JSON object, or None when it is not one."""
    return json_object(item.content)


def json_object(content: bytes) -> dict[str, Any] | None:
    """``content`` (an item's stored bytes) as a JSON object, or None when it is not one."""
    try:
        value = parse_json(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _why_not_json(item: Item) -> str:
    """Why content that is not a JSON object is not JSON at all (a parse error, a
    number beyond a double's range), or "" when it is JSON (of another type). Asked on
    the rejection path only."""
    try:
        parse_json(item.content)
    except ValueError as exc:
        return f" ({exc})"
    return ""


def shape_problem(item: Item) -> str | None:
    """Why ``item``'s content does not have its (known) type's shape, or None.

    Checks: a JSON object with no key twice in one object, at any depth (a reader
    keeping the first of two ``type`` keys would read another item than ratchet);
    ``type`` and ``id`` equal the record's; the record's ``role`` and ``call_id``
    mirror the content's; every required field present with its JSON type; pairing
    keys (``call_id``, ``approval_request_id``) not empty.
    """
    entry = CATALOGUE[item.type]
    content = json_object(item.content)  # ``decode_content``, a call less per item
    if content is None:
        return f"item {item.item_id}: content is not a JSON object{_why_not_json(item)}"
    try:
        repeated = duplicate_key(item.content, content)
    except ValueError as exc:
        return f"item {item.item_id}: content cannot be read: {exc}"
    if repeated is not None:
        return f"item {item.item_id}: content has the key {repeated[:60]!r} twice in one object"
    if content.get("type") != item.type:
        return f"item {item.item_id}: content type {content.get('type')!r} != {item.type!r}"
    if content.get("id") != item.item_id:
        return f"item {item.item_id}: content id {content.get('id')!r} != item_id"
    for name, mirrored in (("role", item.role), ("call_id", item.call_id)):
        if content.get(name) != mirrored:
            return f"item {item.item_id}: {name} {mirrored!r} != content {name} " \
                   f"{content.get(name)!r}"
    for name, types in entry.required:
        value = content.get(name)
        if not isinstance(value, types) or (name in _KEY_FIELDS and not value):
            return f"{item.type} {item.item_id}: {name} missing or not {_type_names(types)}"
    return None


def approval_request_id(item: Item) -> str | None:
    """The request an ``mcp_approval_response`` answers (None if it cannot be read)."""
    content = decode_content(item)
    value = None if content is None else content.get("approval_request_id")
    return value if isinstance(value, str) and value else None


def effect_key(item: Item) -> str | None:
    """The key a ``ToolEffect.call_id`` names for an effect output item: the call_id of
    an output, the item id of an ``mcp_call`` (it has no call_id; its id names the run)."""
    if item.type == "mcp_call":
        return item.item_id
    return item.call_id


# Pairing keys: an empty string would pair with nothing, so it is no key at all.
_KEY_FIELDS = frozenset({"call_id", "approval_request_id"})


def _type_names(types: tuple[type, ...]) -> str:
    names = {str: "text", list: "a list", dict: "an object", bool: "a boolean"}
    return " or ".join(names[t] for t in types)
