"""Valid sample events with correct digests, fingerprints, artifacts and proofs.

The one home of event builders, for tests, the benchmark and ``ratchet demo`` (item
builders - ``message``, ``function_call`` ... - are in ``schemas.items``). Every builder returns a VALID event by
default; pass keyword overrides (any field of the model) to break exactly one thing::

    turn = make_turn()                                   # certified, conversation mode
    turn = make_turn(status="incomplete")                # logical_only
    turn = make_turn(output_items=[...], fingerprint_hash="0" * 64)   # CORRUPT
    turn, effects = make_tool_loop_turn(rounds=3, total_items=20)

Overrides are applied last and re-validated by pydantic. When you override
``fingerprint`` (and not ``fingerprint_hash``) the hash, artifact and proof follow it.
``turn_rejected_for(reason)`` gives a minimal turn ``validate_turn`` rejects with
exactly that reason.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ratchet.domain.fingerprint import build_fingerprint, fingerprint_hash
from schemas.canonical import canonical_digest
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
    Certification,
    CheckpointPromoted,
    DeadLetter,
    DeadLetterReason,
    EffectiveConfig,
    EffectOrphaned,
    Fingerprint,
    Item,
    OrphanReason,
    PromotionRejected,
    RejectionReason,
    StreamInfo,
    Subturn,
    TokenArtifact,
    ToolEffect,
    ToolEffectStatus,
    TurnCancelled,
    TurnCompleted,
    TurnStatus,
)

NOW_MS = 1_750_000_000_000
"""A fixed "now" so that sample events are deterministic; pass it to validate_turn."""
HOUR_MS = 3_600_000
TENANT = "tenant-1"
CONVERSATION = "conv_1"

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """``new_id("resp") -> "resp_000001"``: unique within the process, readable in logs."""
    return f"{prefix}_{next(_ids):06d}"


def make_fingerprint(**overrides: Any) -> Fingerprint:
    """A complete fingerprint (vLLM-like deployment); overrides go to build_fingerprint."""
    inputs: dict[str, Any] = {
        "model_name": "openai/gpt-oss-20b",
        "model_weights_revision": "6cee5e81ee83917806bbde320786a8fb61efebee",
        "tokenizer_name": "openai/gpt-oss-20b",
        "tokenizer_revision": "6cee5e81ee83917806bbde320786a8fb61efebee",
        "renderer_name": "harmony",
        "renderer_version": "0.0.4",
        "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
        "chat_template_args": {"enable_thinking": True},
        "reasoning_parser": "openai_gptoss",
        "reasoning_flags": {"effort": "medium"},
        "tool_parser": "openai",
        "instructions": "You are a helpful assistant.",
        "tools": [WEATHER_TOOL],
        "block_hash_format": "sha256-cbor-v1",
        "router_key_format": "prefix-blocks-v1",
        "block_size": 16,
    }
    inputs.update(overrides)
    return build_fingerprint(**inputs)


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def make_artifact_and_proof(
    fp_hash: str, *, prefix_count: int = 120, append_count: int = 80, now_ms: int = NOW_MS
) -> tuple[TokenArtifact, BoundaryProof]:
    """A token artifact and a boundary proof consistent with each other and ``fp_hash``."""
    combined = prefix_count + append_count
    combined_hash = canonical_digest(["tokens", fp_hash, combined])
    artifact = TokenArtifact(
        artifact_id=new_id("art"),
        token_hash=combined_hash,
        token_count=combined,
        safe_append_boundary=combined,
        fingerprint_hash=fp_hash,
        expires_at=now_ms + HOUR_MS,
    )
    proof = BoundaryProof(
        prefix_hash=canonical_digest(["prefix", fp_hash, prefix_count]),
        prefix_count=prefix_count,
        append_hash=canonical_digest(["append", fp_hash, append_count]),
        append_count=append_count,
        combined_hash=combined_hash,
        combined_count=combined,
        boundary_kind="message_end",
        fingerprint_hash=fp_hash,
        expires_at=now_ms + HOUR_MS,
    )
    return artifact, proof


def make_turn(
    items: Sequence[Item] | None = None,
    *,
    input_items: Sequence[Item] | None = None,
    status: TurnStatus | str = TurnStatus.COMPLETED,
    certified: bool = True,
    fingerprint: Fingerprint | None = None,
    now_ms: int = NOW_MS,
    **overrides: Any,
) -> TurnCompleted:
    """A valid TurnCompleted in Conversation mode (new conversation, expected_head_seq 0).

    ``items`` are the OUTPUT items (default: one assistant message); ``input_items``
    default to one user message. ``certified=False`` leaves out artifact and proof.
    For chain mode pass ``conversation_id=None, chain_root_id=..., expected_head_seq=None``.
    """
    fingerprint = fingerprint or make_fingerprint()
    fp_hash = overrides.pop("fingerprint_hash", None) or fingerprint_hash(fingerprint)
    response_id = overrides.pop("response_id", None) or new_id("resp")
    if input_items is None:
        input_items = [message("What's the weather in Paris?", item_id=new_id("msg"))]
    if items is None:
        items = [message("Sunny, 24 C.", role="assistant", item_id=new_id("msg"))]
    artifact, proof = make_artifact_and_proof(fp_hash, now_ms=now_ms) if certified else (None, None)
    idempotency_key = overrides.pop("idempotency_key", None) or new_id("idem")
    fields: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "tenant_id": TENANT,
        "conversation_id": CONVERSATION,
        "chain_root_id": None,
        "response_id": response_id,
        "produced_at": now_ms,
        "idempotency_key": idempotency_key,
        "request_digest": canonical_digest(["request", idempotency_key]),
        "attempt": 1,
        "previous_response_id": None,
        "expected_head_seq": 0,
        "status": status,
        "incomplete_reason": "max_output_tokens" if status == TurnStatus.INCOMPLETE else None,
        "input_items": tuple(input_items),
        "output_items": tuple(items),
        "effective_config": EffectiveConfig(
            instructions_digest=fingerprint.instructions_digest or "",
            tools_digest=fingerprint.tools_digest or "",
            tool_choice="auto",
            truncation="disabled",
            truncated=False,
        ),
        "fingerprint": fingerprint,
        "fingerprint_hash": fp_hash,
        "boundary_proof": proof,
        "token_artifact": artifact,
        "router_receipt": None,
        "subturns": (),
        "tool_effect_ids": (),
        "stream": StreamInfo(streamed=True, client_disconnected=False),
        "expires_at": None,
    }
    fields.update(overrides)
    return TurnCompleted(**fields)


def make_tool_effect(
    call_id: str,
    output: str | Item = '{"temperature_c": 24}',
    *,
    idempotency_key: str,
    subturn_index: int = 0,
    tool_name: str = "get_weather",
    arguments: dict[str, Any] | None = None,
    now_ms: int = NOW_MS,
    **overrides: Any,
) -> ToolEffect:
    """A succeeded ToolEffect whose effect_id follows ``effect_id_for``."""
    output_item = (
        output
        if isinstance(output, Item)
        else function_call_output(call_id, output, item_id=new_id("fco"))
    )
    fields: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "tenant_id": TENANT,
        "conversation_id": CONVERSATION,
        "chain_root_id": None,
        "response_id": new_id("resp"),
        "produced_at": now_ms,
        "effect_id": effect_id_for(idempotency_key, subturn_index, call_id),
        "idempotency_key": idempotency_key,
        "attempt": 1,
        "subturn_index": subturn_index,
        "call_id": call_id,
        "tool_name": tool_name,
        "arguments_digest": arguments_digest(arguments or {"city": "Paris"}),
        "status": ToolEffectStatus.SUCCEEDED,
        "output": output_item,
        "executed_at": now_ms,
    }
    fields.update(overrides)
    return ToolEffect(**fields)


def make_turn_cancelled(
    turn: TurnCompleted, *, now_ms: int = NOW_MS, **overrides: Any
) -> TurnCancelled:
    """The cancellation of ``turn`` (same keys and ids)."""
    fields: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "tenant_id": turn.tenant_id,
        "conversation_id": turn.conversation_id,
        "chain_root_id": turn.chain_root_id,
        "response_id": turn.response_id,
        "produced_at": now_ms,
        "idempotency_key": turn.idempotency_key,
        "cancelled_at": now_ms,
    }
    fields.update(overrides)
    return TurnCancelled(**fields)


def make_tool_loop_turn(
    rounds: int = 3, total_items: int = 20, *, now_ms: int = NOW_MS, **overrides: Any
) -> tuple[TurnCompleted, list[ToolEffect]]:
    """A certified turn in which the gateway ran ``rounds`` tool rounds, + its effects.

    Output: per round reasoning, function_call, function_call_output; then reasoning and
    the final assistant message. The input holds earlier chat messages, padded so the
    turn has ``total_items`` items. The effects are published before the turn.
    """
    response_id = overrides.pop("response_id", None) or new_id("resp")
    idempotency_key = overrides.pop("idempotency_key", None) or new_id("idem")
    # The effects travel in the turn's partition, as a gateway sends them.
    where = {k: overrides[k] for k in ("conversation_id", "chain_root_id", "tenant_id")
             if k in overrides}
    output: list[Item] = []
    effects: list[ToolEffect] = []
    subturns: list[Subturn] = []
    for index in range(rounds):
        call_id = f"call_{response_id}_{index}"
        result = f'{{"temperature_c": {20 + index}}}'
        output += [
            reasoning(f"I need the weather, round {index}.", item_id=new_id("rs")),
            function_call(call_id, "get_weather", {"city": "Paris"}, item_id=new_id("fc")),
        ]
        effect = make_tool_effect(
            call_id,
            result,
            idempotency_key=idempotency_key,
            subturn_index=index,
            response_id=response_id,
            now_ms=now_ms,
            **where,
        )
        output.append(effect.output)
        effects.append(effect)
        subturns.append(
            Subturn(
                index=index, ephemeral_artifact_ref=new_id("eph"), effect_ids=(effect.effect_id,)
            )
        )
    output += [
        reasoning("I have everything.", item_id=new_id("rs")),
        message("Sunny all day.", role="assistant", item_id=new_id("msg")),
    ]
    history_len = max(1, total_items - len(output))
    input_items = [
        message(f"message {i}", role="user" if i % 2 == 0 else "assistant", item_id=new_id("msg"))
        for i in range(history_len - 1)
    ] + [message("What's the weather in Paris?", item_id=new_id("msg"))]
    turn = make_turn(
        output,
        input_items=input_items,
        response_id=response_id,
        idempotency_key=idempotency_key,
        subturns=tuple(subturns),
        tool_effect_ids=tuple(e.effect_id for e in effects),
        now_ms=now_ms,
        **overrides,
    )
    return turn, effects


def _outcome_header(turn: TurnCompleted | None, now_ms: int) -> dict[str, Any]:
    turn = turn or make_turn()
    return {
        "event_id": str(uuid.uuid4()),
        "tenant_id": turn.tenant_id,
        "conversation_id": turn.conversation_id,
        "chain_root_id": turn.chain_root_id,
        "response_id": turn.response_id,
        "produced_at": now_ms,
        "partition_key": turn.partition_key,
    }


def make_checkpoint_promoted(
    turn: TurnCompleted | None = None, *, seq: int = 1, now_ms: int = NOW_MS, **overrides: Any
) -> CheckpointPromoted:
    """The CheckpointPromoted a processor would publish for ``turn`` (default: a new one)."""
    turn = turn or make_turn()
    artifact = turn.token_artifact
    fields: dict[str, Any] = _outcome_header(turn, now_ms) | {
        "idempotency_key": turn.idempotency_key,
        "request_digest": turn.request_digest,
        "attempt": turn.attempt,
        "previous_response_id": turn.previous_response_id,
        "seq": seq,
        # CONTRACT 5: completed and untruncated is certified, with or without an artifact.
        "certification": Certification.CERTIFIED
        if turn.status == "completed" and not turn.effective_config.truncated
        else Certification.LOGICAL_ONLY,
        "fingerprint_hash": turn.fingerprint_hash,
        "artifact_id": artifact.artifact_id if artifact else None,
        "artifact_expires_at": artifact.expires_at if artifact else None,
        "item_count": len(turn.items),
        "promoted_at": now_ms,
        "expires_at": turn.expires_at,
    }
    fields.update(overrides)
    return CheckpointPromoted(**fields)


def make_promotion_rejected(
    turn: TurnCompleted | None = None,
    reason: RejectionReason = RejectionReason.CONFLICT,
    *,
    now_ms: int = NOW_MS,
    **overrides: Any,
) -> PromotionRejected:
    turn = turn or make_turn()
    fields: dict[str, Any] = _outcome_header(turn, now_ms) | {
        "idempotency_key": turn.idempotency_key,
        "request_digest": turn.request_digest,
        "attempt": turn.attempt,
        "reason": reason,
        "detail": f"sample {reason.value}",
        "head_seq": None,
        "existing_response_id": None,
    }
    fields.update(overrides)
    return PromotionRejected(**fields)


def make_effect_orphaned(
    effect: ToolEffect | None = None,
    reason: OrphanReason = OrphanReason.ATTEMPT_SUPERSEDED,
    *,
    now_ms: int = NOW_MS,
    **overrides: Any,
) -> EffectOrphaned:
    effect = effect or make_tool_effect("call_sample", idempotency_key=new_id("idem"))
    fields: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "tenant_id": effect.tenant_id,
        "conversation_id": effect.conversation_id,
        "chain_root_id": effect.chain_root_id,
        "response_id": effect.response_id,
        "produced_at": now_ms,
        "partition_key": effect.partition_key,
        "effect_id": effect.effect_id,
        "idempotency_key": effect.idempotency_key,
        "attempt": effect.attempt,
        "subturn_index": effect.subturn_index,
        "tool_name": effect.tool_name,
        "call_id": effect.call_id,
        "arguments_digest": effect.arguments_digest,
        "output_digest": effect.output.content_digest,
        "reason": reason,
        "rejection_reason": None,
        "detail": None,
        "orphaned_at": now_ms,
    }
    fields.update(overrides)
    return EffectOrphaned(**fields)


def make_dead_letter(*, now_ms: int = NOW_MS, **overrides: Any) -> DeadLetter:
    fields: dict[str, Any] = {
        "key": b"conv_1",
        "value": b"\x01not-confluent-framed",
        "error": "BAD_MAGIC_BYTE at ratchet.gateway-events[0]@1: magic byte 1, expected 0",
        "reason": DeadLetterReason.BAD_MAGIC_BYTE,
        "source_topic": "ratchet.gateway-events",
        "source_partition": 0,
        "source_offset": 1,
        "schema_id": None,
        "dead_lettered_at": now_ms,
    }
    fields.update(overrides)
    return DeadLetter(**fields)


# --- turns that break exactly one rule -----------------------------------------------


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
