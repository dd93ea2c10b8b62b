"""Builders: Responses-style item dicts -> ``TurnCompleted`` / ``ToolEffect`` / ``TurnCancelled``.

A gateway holds items as the OpenAI Responses API shapes them (plain dicts)::

    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    {"type": "reasoning", "summary": [...]}
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {...}}
    {"type": "mcp_call", "id": "mcp_1", "server_label": "docs", "name": "search", ...}

Every type of the item catalogue (``ratchet/domain/catalogue.py``) is accepted, as a
dict or as an ``Item`` made by the typed builders of ``services.gateway.items``.

These builders do the parts every gateway must do identically, so that what ratchet
verifies and what rehydration returns are the same bytes:

- ``content`` = canonical JSON of the item (sorted keys, no whitespace, UTF-8) with its
  ``id`` filled in; ``content_digest`` = sha256 of those bytes;
- an item without ``id`` gets ``<response_id>:<in|out>:<position>`` (stable across
  retries of one request, unique in the history);
- ``fingerprint_hash`` is computed from the ``Fingerprint`` (build it with
  ``ratchet.domain.fingerprint.build_fingerprint``); effective instructions and tools
  digests are taken from it, so the two can never disagree;
- ``request_digest`` = canonical digest of the logical request (the Responses create
  body without transport noise), the same for every retry;
- ``effect_id`` = ``schemas.items.effect_id_for(idempotency_key, subturn, call_id)``;
- the partition key (CONTRACT section 2) is the event's ``partition_key`` property,
  ``schemas.keys.partition_key``: ``conversation_id`` in Conversation mode, else
  ``chain_root_id`` (a chain's first response is its own root).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from ratchet.domain.catalogue import CATALOGUE, shape_problem
from ratchet.domain.fingerprint import fingerprint_hash
from schemas.canonical import canonical_digest, canonical_json, duplicate_key, parse_json
from schemas.ids import unservable_id
from schemas.items import arguments_digest, effect_id_for, from_responses
from schemas.keys import partition_key
from schemas.models import (
    BoundaryProof,
    EffectiveConfig,
    Fingerprint,
    Item,
    RouterReceipt,
    StreamInfo,
    Subturn,
    TokenArtifact,
    ToolEffect,
    ToolEffectStatus,
    TurnCancelled,
    TurnCompleted,
    TurnStatus,
)
from services.gateway.errors import (
    ChainRootUnknown,
    InvalidGatewayEvent,
    InvalidGatewayItem,
    UnservableId,
)

ITEM_FORMAT_VERSION = 1

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class TurnIdentity:
    """Where a turn sits. Conversation mode: ``conversation_id`` + ``expected_head_seq``
    (the head you rehydrated from, 0 for a new Conversation), no
    ``previous_response_id``. Chain mode: ``chain_root_id`` (+ ``previous_response_id``
    after the first response). Every id must match the API's id pattern
    (``schemas/ids.py``), else ``UnservableId``."""

    tenant_id: str
    response_id: str
    conversation_id: str | None = None
    expected_head_seq: int | None = None
    chain_root_id: str | None = None
    previous_response_id: str | None = None

    def __post_init__(self) -> None:
        if (self.conversation_id is None) == (self.chain_root_id is None):
            raise InvalidGatewayEvent("give exactly one of conversation_id or chain_root_id")
        if self.conversation_id is not None and self.expected_head_seq is None:
            raise InvalidGatewayEvent("Conversation mode needs expected_head_seq (0 for a new "
                                      "one)")
        if self.conversation_id is not None and self.previous_response_id is not None:
            raise InvalidGatewayEvent("Conversation mode continues the Conversation's head: "
                                      "previous_response_id must be None")
        for name in ("tenant_id", "response_id", "conversation_id", "chain_root_id",
                     "previous_response_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InvalidGatewayEvent(f"{name} is {type(value).__name__}, not a string")
        head = self.expected_head_seq
        if head is not None and (not isinstance(head, int) or isinstance(head, bool)):
            raise InvalidGatewayEvent(f"expected_head_seq {head!r} is not an integer")
        problem = unservable_id(self)
        if problem:
            raise UnservableId(problem)

    def common_fields(self, produced_at: int) -> dict:
        """The fields every gateway event carries (CONTRACT section 3), a fresh event id."""
        return {
            "event_id": str(uuid.uuid4()),
            "tenant_id": self.tenant_id,
            "conversation_id": self.conversation_id,
            "chain_root_id": self.chain_root_id,
            "response_id": self.response_id,
            "produced_at": produced_at,
        }

    @classmethod
    def conversation(
        cls, tenant_id: str, conversation_id: str, response_id: str, expected_head_seq: int
    ) -> TurnIdentity:
        return cls(
            tenant_id,
            response_id,
            conversation_id=conversation_id,
            expected_head_seq=expected_head_seq,
        )

    @classmethod
    def chain(
        cls,
        tenant_id: str,
        response_id: str,
        previous_response_id: str | None = None,
        chain_root_id: str | None = None,
    ) -> TurnIdentity:
        """The first response of a chain is its own root."""
        root = chain_root_id or (response_id if previous_response_id is None else None)
        if root is None:  # a MissingChainRoot and a ValueError too
            raise ChainRootUnknown(response_id, previous_response_id or "")
        return cls(
            tenant_id, response_id, chain_root_id=root, previous_response_id=previous_response_id
        )

    @property
    def partition_key(self) -> str:
        return partition_key(self)


def _built(builder: Callable[P, R]) -> Callable[P, R]:
    """``builder``, with the model's refusal of an argument typed: pydantic's
    ``ValidationError`` becomes ``InvalidGatewayEvent`` (its text kept)."""

    @functools.wraps(builder)
    def build(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return builder(*args, **kwargs)
        except ValidationError as exc:
            raise InvalidGatewayEvent(f"{builder.__name__}: {exc}") from exc

    return build


def now_ms() -> int:
    return int(time.time() * 1000)


def to_item(
    obj: Mapping[str, Any], *, default_id: str, format_version: int = ITEM_FORMAT_VERSION
) -> Item:
    """One Responses item dict as a ratchet ``Item`` (canonical content + digest)."""
    _need_mapping(obj, "an item")
    try:
        return from_responses(obj, item_id=default_id, format_version=format_version)
    except (ValueError, TypeError) as exc:  # TypeError: a value JSON has no form for
        raise InvalidGatewayItem(str(exc)) from None


def _need_mapping(obj: object, what: str) -> None:
    """``InvalidGatewayItem`` unless ``obj`` is a dict (a ``Mapping``): an SDK's item
    object left an ``AttributeError`` before session 44."""
    if not isinstance(obj, Mapping):
        raise InvalidGatewayItem(
            f"{what} is a Responses item dict, not {type(obj).__name__}"
            + (" (an SDK object: pass its .model_dump())"
               if hasattr(obj, "model_dump") else ""))


def to_items(
    objs: Sequence[Mapping[str, Any] | Item], *, response_id: str, side: str
) -> tuple[Item, ...]:
    """Dicts become Items (ids default to ``<response_id>:<side>:<position>``); Items
    built with ``services.gateway.items`` pass through unchanged."""
    return tuple(
        obj if isinstance(obj, Item) else to_item(obj, default_id=f"{response_id}:{side}:{i}")
        for i, obj in enumerate(objs)
    )


def request_digest(request: Mapping[str, Any]) -> str:
    """Digest of the logical request: identical for every retry of it. A request that is
    not a JSON object with a canonical form (a NaN, a value JSON has no form for) is
    ``InvalidGatewayEvent``."""
    if not isinstance(request, Mapping):
        raise InvalidGatewayEvent(f"request is {type(request).__name__}, not the Responses "
                                  "create body (a dict)")
    try:
        return canonical_digest(dict(request))
    except (ValueError, TypeError) as exc:
        raise InvalidGatewayEvent(f"request has no canonical JSON: {exc}") from None


@_built
def turn_completed(
    identity: TurnIdentity,
    *,
    idempotency_key: str,
    request: Mapping[str, Any],
    input_items: Sequence[Mapping[str, Any] | Item],
    output_items: Sequence[Mapping[str, Any] | Item],
    fingerprint: Fingerprint,
    attempt: int = 1,
    status: TurnStatus | str = TurnStatus.COMPLETED,
    incomplete_reason: str | None = None,
    tool_choice: str | None = "auto",
    truncation: str = "disabled",
    truncated: bool = False,
    token_artifact: TokenArtifact | None = None,
    router_receipt: RouterReceipt | None = None,
    boundary_proof: BoundaryProof | None = None,
    subturns: Sequence[Subturn] = (),
    tool_effect_ids: Sequence[str] = (),
    streamed: bool = False,
    client_disconnected: bool = False,
    expires_at: int | None = None,
    gateway_id: str | None = None,
) -> TurnCompleted:
    """The event asking ratchet to promote this turn (``input_items`` are the items
    this turn ADDS, not the rehydrated history)."""
    if not isinstance(fingerprint, Fingerprint):
        raise InvalidGatewayEvent(f"fingerprint is {type(fingerprint).__name__}, not a "
                                  "Fingerprint (ratchet.domain.fingerprint.build_fingerprint)")
    produced = now_ms()
    return TurnCompleted(
        **identity.common_fields(produced),
        idempotency_key=idempotency_key,
        request_digest=request_digest(request),
        attempt=attempt,
        previous_response_id=identity.previous_response_id,
        expected_head_seq=identity.expected_head_seq if identity.conversation_id else None,
        status=status,
        incomplete_reason=incomplete_reason,
        input_items=to_items(input_items, response_id=identity.response_id, side="in"),
        output_items=to_items(output_items, response_id=identity.response_id, side="out"),
        effective_config=EffectiveConfig(
            instructions_digest=fingerprint.instructions_digest or "",
            tools_digest=fingerprint.tools_digest or "",
            tool_choice=tool_choice,
            truncation=truncation,
            truncated=truncated,
        ),
        fingerprint=fingerprint,
        fingerprint_hash=fingerprint_hash(fingerprint),
        boundary_proof=boundary_proof,
        token_artifact=token_artifact,
        router_receipt=router_receipt,
        subturns=tuple(subturns),
        tool_effect_ids=tuple(tool_effect_ids),
        stream=StreamInfo(streamed=streamed, client_disconnected=client_disconnected),
        expires_at=expires_at,
        gateway_id=gateway_id,
    )


@_built
def tool_effect(
    identity: TurnIdentity,
    *,
    idempotency_key: str,
    subturn_index: int,
    call: Mapping[str, Any],
    output: Mapping[str, Any] | None = None,
    attempt: int = 1,
    succeeded: bool = True,
    effect_id: str | None = None,
) -> ToolEffect:
    """The record of one executed gateway tool call (publish it BEFORE the turn).

    ``call`` is the call item of an executed type of the catalogue (function, custom
    tool, computer, local shell, shell, apply patch, MCP) and ``output`` the item it
    produced: the call type's output item with the same ``call_id``, or nothing for an
    ``mcp_call``, which carries its own output (its ``id`` is then the effect's
    ``call_id``). The same call in a retry of the request gets the same ``effect_id``.
    ``effect_id``: a claimed effect's id (``services/gateway/claims.py``), which replaces
    the call-id recipe so the claim and its record are one effect.
    """
    _need_mapping(call, "call")
    if output is not None:
        _need_mapping(output, "output")
    call_type = call.get("type")
    entry = CATALOGUE.get(call_type) if isinstance(call_type, str) else None
    if entry is None or entry.effect_output is None:
        raise InvalidGatewayItem(f"{call_type!r} is not a call a gateway executes")
    carries_output = entry.effect_output == call_type  # mcp_call
    if output is None and carries_output:
        output = call
    if output is None or output.get("type") != entry.effect_output:
        raise InvalidGatewayItem(f"a {call_type} effect's output must be a {entry.effect_output}")
    key = output.get("id") if carries_output else output.get("call_id")
    if not isinstance(key, str) or not key:
        raise InvalidGatewayItem(f"a {call_type} effect needs the {entry.effect_output}'s "
                                 + ("id" if carries_output else "call_id"))
    if not carries_output and call.get("call_id") != key:
        raise InvalidGatewayItem("call and output must carry the same string call_id")
    effect_id = effect_id or effect_id_for(idempotency_key, subturn_index, key)
    output_item = to_item(output, default_id=f"{effect_id}:output")
    problem = shape_problem(output_item)
    if problem:
        raise InvalidGatewayItem(problem)
    produced = now_ms()
    return ToolEffect(
        **identity.common_fields(produced),
        effect_id=effect_id,
        idempotency_key=idempotency_key,
        attempt=attempt,
        subturn_index=subturn_index,
        call_id=key,
        tool_name=tool_name_of(call),
        arguments_digest=arguments_digest_of(call),
        status=ToolEffectStatus.SUCCEEDED if succeeded else ToolEffectStatus.FAILED,
        output=output_item,
        executed_at=produced,
    )


def tool_name_of(call: Mapping[str, Any]) -> str:
    """The tool a call item runs: its ``name``, else its type without ``_call``."""
    return str(call.get("name") or str(call.get("type", "")).removesuffix("_call"))


def arguments_digest_of(call: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of what the call asks (its arguments/input/action)."""
    return arguments_digest(_arguments(call.get(_ARGUMENTS.get(str(call.get("type")),
                                                               "arguments"))))


@_built
def turn_cancelled(identity: TurnIdentity, *, idempotency_key: str) -> TurnCancelled:
    produced = now_ms()
    return TurnCancelled(
        **identity.common_fields(produced),
        idempotency_key=idempotency_key,
        cancelled_at=produced,
    )


# Where each executed call type keeps what it was asked to do (default: "arguments").
_ARGUMENTS = {
    "custom_tool_call": "input",
    "computer_call": "action",
    "local_shell_call": "action",
    "shell_call": "action",
    "apply_patch_call": "operation",
}


def _arguments(raw: Any) -> dict[str, Any]:
    """Responses carries ``arguments`` as JSON text; digest the parsed object.

    Parsed as the protocol defines it for every implementation (docs/gateway-protocol.md
    section 4): strict JSON (no ``NaN``/``Infinity``), integers exact and apart from
    floats; text that is not JSON, holds a key twice in one object (parsers disagree on
    which one wins: section 3 refuses it), or whose value has no canonical form (a
    number beyond a double, an integer of more than 4 300 digits, a lone surrogate), is
    ``{"__raw__": text}``, never an error."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if isinstance(raw, str) and raw:
        try:
            data = raw.encode("utf-8")
            value = parse_json(data)
            canonical_json(value)  # has a canonical form
            if duplicate_key(data, value) is not None:
                return {"__raw__": raw}
        except ValueError:
            return {"__raw__": raw}
        return value if isinstance(value, dict) else {"__value__": value}
    return {}
