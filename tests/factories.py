"""Test-data builders: valid events by default, break one thing with an override.

Everything here is re-exported from ``schemas.samples`` (shared with the benchmark and
``ratchet demo``) and ``schemas.items``, plus ``turn_rejected_for(reason)``: a minimal
TurnCompleted that ``validate_turn`` rejects with exactly that reason. Example::

    from tests.factories import NOW_MS, make_turn, message, function_call
    turn = make_turn(items=[function_call("c1", "get_weather", {"city": "Paris"}, item_id="fc1")])
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.items import (
    arguments_digest,
    effect_id_for,
    function_call,
    function_call_output,
    make_item,
    message,
    reasoning,
)
from schemas.models import (
    BoundaryProof,
    Item,
    RejectionReason,
    TurnCompleted,
)
from schemas.samples import (
    CONVERSATION,
    HOUR_MS,
    NOW_MS,
    TENANT,
    WEATHER_TOOL,
    make_artifact_and_proof,
    make_checkpoint_promoted,
    make_dead_letter,
    make_effect_orphaned,
    make_fingerprint,
    make_promotion_rejected,
    make_tool_effect,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
    new_id,
)

__all__ = [
    "CONVERSATION",
    "HOUR_MS",
    "NOW_MS",
    "REJECTING_TURNS",
    "TENANT",
    "WEATHER_TOOL",
    "arguments_digest",
    "effect_id_for",
    "function_call",
    "function_call_output",
    "make_artifact_and_proof",
    "make_checkpoint_promoted",
    "make_dead_letter",
    "make_effect_orphaned",
    "make_fingerprint",
    "make_promotion_rejected",
    "make_item",
    "make_tool_effect",
    "make_tool_loop_turn",
    "make_turn",
    "make_turn_cancelled",
    "message",
    "new_id",
    "reasoning",
    "tampered",
    "turn_rejected_for",
]


def tampered(item: Item, content: bytes = b'{"tampered":true}') -> Item:
    """``item`` with new content but its old digest (CORRUPT)."""
    return item.model_copy(update={"content": content})


def _corrupt() -> TurnCompleted:
    return make_turn(items=[tampered(message("hi", role="assistant", item_id="msg_c"))])


def _unpaired() -> TurnCompleted:
    call = function_call("call_x", "get_weather", {"city": "Paris"}, item_id="fc_x")
    answer = message("done", role="assistant", item_id="msg_x")
    return make_turn(items=[call, answer])  # call left open before a message


def _invalid_proof() -> TurnCompleted:
    turn = make_turn()
    assert turn.boundary_proof is not None
    proof: BoundaryProof = turn.boundary_proof
    return make_turn(
        boundary_proof=proof.model_copy(update={"fingerprint_hash": "f" * 64}),
        token_artifact=turn.token_artifact,
        fingerprint_hash=turn.fingerprint_hash,
    )


REJECTING_TURNS: dict[RejectionReason, Callable[[], TurnCompleted]] = {
    RejectionReason.NOT_PROMOTABLE_STATUS: lambda: make_turn(status="failed", certified=False),
    RejectionReason.UNSUPPORTED_FORMAT: lambda: make_turn(
        items=[
            make_item(
                "message",
                {"role": "assistant"},
                item_id="msg_v9",
                role="assistant",
                format_version=9,
            )
        ]
    ),
    RejectionReason.UNKNOWN_ITEM_TYPE: lambda: make_turn(
        items=[make_item("hologram", {"x": 1}, item_id="holo_1")]
    ),
    RejectionReason.CORRUPT: _corrupt,
    RejectionReason.INCOMPLETE_FINGERPRINT: lambda: make_turn(
        fingerprint=make_fingerprint(model_weights_revision=None)
    ),
    RejectionReason.UNPAIRED_TOOL_CALL: _unpaired,
    RejectionReason.INVALID_BOUNDARY_PROOF: _invalid_proof,
}
"""For each reason ``validate_turn`` can give: a builder of a minimal turn with exactly it."""


def turn_rejected_for(reason: RejectionReason) -> TurnCompleted:
    """A TurnCompleted that validate_turn(…, NOW_MS) rejects with ``reason`` only."""
    return REJECTING_TURNS[reason]()
