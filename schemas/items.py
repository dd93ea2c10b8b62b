"""Build ``Item``s the way gateways must: canonical JSON content + its sha256 digest.

``content`` is the Responses item object as canonical JSON, so the digest a gateway
computes, the digest ratchet verifies and the digest rehydration re-verifies are over
the same bytes.

``from_responses`` turns any Responses item dict (what the OpenAI SDK's
``model_dump()`` or agentic-api hold) into an ``Item``; the typed builders below make
one item of each type of the catalogue (``ratchet/domain/catalogue.py``) in the shape
the Responses API gives it, for tests, the demo and gateways that build items
themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.canonical import canonical_digest, canonical_json, sha256_hex
from schemas.models import Item


def from_responses(
    obj: Mapping[str, Any], *, item_id: str | None = None, format_version: int = 1
) -> Item:
    """One Responses item dict as an ``Item``.

    ``content`` is the canonical JSON of the dict with its ``id`` (the dict's own id,
    else ``item_id``); the record's ``role`` and ``call_id`` are the dict's, so they
    can never disagree with what the model sees. Raises ``ValueError`` for a dict
    without a string ``type``, without any id or with one that is not a string, or
    whose ``role`` or ``call_id`` is neither a string nor null (the processor compares
    the content's ``id``, ``role`` and ``call_id`` with the record's: ``CORRUPT``).
    """
    item_type = obj.get("type")
    if not isinstance(item_type, str) or not item_type:
        raise ValueError(f"item without a string 'type': {dict(obj)!r:.200}")
    own_id = obj.get("id") or item_id
    if not own_id:
        raise ValueError(f"{item_type} item without an id: {dict(obj)!r:.200}")
    if not isinstance(own_id, str):
        # the content would keep it beside a record id str(id): ratchet rejects CORRUPT
        raise ValueError(f"{item_type} item with an id that is not a string: {own_id!r:.100}")
    role, call_id = obj.get("role"), obj.get("call_id")
    for name, value in (("role", role), ("call_id", call_id)):
        if value is not None and not isinstance(value, str):
            # no record column can equal it: ratchet would reject the turn CORRUPT
            raise ValueError(f"{item_type} item with a {name} that is not a string: "
                             f"{value!r:.100}")
    content = canonical_json({**obj, "id": own_id})
    return Item(
        item_id=own_id,
        type=item_type,
        role=role,
        call_id=call_id,
        content=content,
        content_digest=sha256_hex(content),
        format_version=format_version,
    )


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


def custom_tool_call(call_id: str, name: str, input_text: str, *, item_id: str) -> Item:
    """A call of a custom (free-form text) tool; answered by ``custom_tool_call_output``."""
    return _item("custom_tool_call", item_id, call_id=call_id, name=name, input=input_text)


def custom_tool_call_output(call_id: str, output: str, *, item_id: str) -> Item:
    return _item("custom_tool_call_output", item_id, call_id=call_id, output=output)


def computer_call(call_id: str, action: Mapping[str, Any], *, item_id: str) -> Item:
    """A computer-use action (e.g. ``{"type": "click", "x": 1, "y": 2, "button": "left"}``)."""
    return _item("computer_call", item_id, call_id=call_id, action=dict(action),
                 pending_safety_checks=[], status="completed")


def computer_call_output(call_id: str, image_url: str, *, item_id: str) -> Item:
    """The screenshot taken after a ``computer_call``."""
    screenshot = {"type": "computer_screenshot", "image_url": image_url}
    return _item("computer_call_output", item_id, call_id=call_id, output=screenshot)


def local_shell_call(call_id: str, command: Sequence[str], *, item_id: str) -> Item:
    action = {"type": "exec", "command": list(command), "env": {}}
    return _item("local_shell_call", item_id, call_id=call_id, action=action,
                 status="completed")


def local_shell_call_output(call_id: str, output: str, *, item_id: str) -> Item:
    return _item("local_shell_call_output", item_id, call_id=call_id, output=output)


def shell_call(call_id: str, commands: Sequence[str], *, item_id: str) -> Item:
    return _item("shell_call", item_id, call_id=call_id, action={"commands": list(commands)},
                 status="completed")


def shell_call_output(call_id: str, stdout: str, *, exit_code: int = 0, item_id: str) -> Item:
    chunk = {"stdout": stdout, "stderr": "", "outcome": {"type": "exit", "exit_code": exit_code}}
    return _item("shell_call_output", item_id, call_id=call_id, output=[chunk])


def apply_patch_call(call_id: str, path: str, diff: str, *, item_id: str) -> Item:
    operation = {"type": "update_file", "path": path, "diff": diff}
    return _item("apply_patch_call", item_id, call_id=call_id, operation=operation,
                 status="completed")


def apply_patch_call_output(call_id: str, *, status: str = "completed", item_id: str) -> Item:
    return _item("apply_patch_call_output", item_id, call_id=call_id, status=status)


def web_search_call(query: str, *, item_id: str) -> Item:
    """A web search the provider ran; the call item is its whole record."""
    return _item("web_search_call", item_id, status="completed",
                 action={"type": "search", "query": query})


def file_search_call(queries: Sequence[str], results: Sequence[Mapping[str, Any]] = (), *,
                     item_id: str) -> Item:
    return _item("file_search_call", item_id, queries=list(queries), status="completed",
                 results=[dict(r) for r in results])


def code_interpreter_call(code: str, logs: str, *, container_id: str, item_id: str) -> Item:
    return _item("code_interpreter_call", item_id, code=code, container_id=container_id,
                 outputs=[{"type": "logs", "logs": logs}], status="completed")


def image_generation_call(result_base64: str, *, item_id: str) -> Item:
    return _item("image_generation_call", item_id, result=result_base64, status="completed")


def mcp_list_tools(server_label: str, tool_names: Sequence[str], *, item_id: str) -> Item:
    tools = [{"name": name, "input_schema": {"type": "object"}} for name in tool_names]
    return _item("mcp_list_tools", item_id, server_label=server_label, tools=tools)


def mcp_call(server_label: str, name: str, arguments: Mapping[str, Any], output: str, *,
             item_id: str, approval_request_id: str | None = None) -> Item:
    """A tool run on an MCP server; the item carries the output (no separate output item)."""
    return _item("mcp_call", item_id, server_label=server_label, name=name,
                 arguments=canonical_json(dict(arguments)).decode("utf-8"), output=output,
                 error=None, status="completed", approval_request_id=approval_request_id)


def mcp_approval_request(server_label: str, name: str, arguments: Mapping[str, Any], *,
                         item_id: str) -> Item:
    """Asks the client to approve an MCP tool run; answered by ``mcp_approval_response``."""
    return _item("mcp_approval_request", item_id, server_label=server_label, name=name,
                 arguments=canonical_json(dict(arguments)).decode("utf-8"))


def mcp_approval_response(approval_request_id: str, approve: bool, *, item_id: str) -> Item:
    return _item("mcp_approval_response", item_id, approval_request_id=approval_request_id,
                 approve=approve)


def compaction(encrypted_content: str, *, item_id: str) -> Item:
    """The opaque summary ``/responses/compact`` puts in place of earlier items."""
    return _item("compaction", item_id, encrypted_content=encrypted_content)


def _item(item_type: str, item_id: str, **fields: Any) -> Item:
    return from_responses({"type": item_type, **fields}, item_id=item_id)


def effect_id_for(idempotency_key: str, subturn_index: int, call_id: str) -> str:
    """A ToolEffect id that is the same for every retry of one request (CONTRACT 3)."""
    return "eff_" + canonical_digest([idempotency_key, subturn_index, call_id])[:32]


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    return canonical_digest(dict(arguments))
