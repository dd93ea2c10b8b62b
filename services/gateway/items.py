"""Typed item builders for gateways: one per type of the item catalogue.

Each returns an ``Item`` with canonical content and digest, in the shape the Responses
API gives that type; ``events.turn_completed`` accepts them beside plain dicts. They
are defined once, in ``schemas.items``; this module is where a gateway finds them.
"""

from schemas.items import (
    apply_patch_call,
    apply_patch_call_output,
    code_interpreter_call,
    compaction,
    computer_call,
    computer_call_output,
    custom_tool_call,
    custom_tool_call_output,
    file_search_call,
    from_responses,
    function_call,
    function_call_output,
    image_generation_call,
    local_shell_call,
    local_shell_call_output,
    mcp_approval_request,
    mcp_approval_response,
    mcp_call,
    mcp_list_tools,
    message,
    reasoning,
    shell_call,
    shell_call_output,
    web_search_call,
)

__all__ = [
    "apply_patch_call",
    "apply_patch_call_output",
    "code_interpreter_call",
    "compaction",
    "computer_call",
    "computer_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "file_search_call",
    "from_responses",
    "function_call",
    "function_call_output",
    "image_generation_call",
    "local_shell_call",
    "local_shell_call_output",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "mcp_list_tools",
    "message",
    "reasoning",
    "shell_call",
    "shell_call_output",
    "web_search_call",
]
