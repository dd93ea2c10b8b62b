"""A scripted gateway: what a Responses-API server does around ratchet, in a few calls.

It builds turns from Responses-style item dicts with the gateway library, publishes
them (effects first), flushes (delivery errors raise), and rehydrates through the HTTP
client. The token artifact and boundary proof are simulated (a real gateway gets them
from its inference engine); everything else is what a real gateway would send.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.samples import make_artifact_and_proof, make_fingerprint
from schemas.models import Fingerprint, Item, ToolEffect, TurnCompleted
from services.gateway.claims import EffectClaims
from services.gateway.client import Outcome, RehydrationClient
from services.gateway.events import TurnIdentity, now_ms, tool_effect, turn_completed
from services.gateway.producer import GatewayProducer

Json = Mapping[str, Any]


def uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": uid("msg"),
        "content": [{"type": "output_text", "text": text}],
    }


def call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": uid("fc"),
        "call_id": uid("call"),
        "name": name,
        "arguments": arguments,
    }


def output_of(function_call: Json, output: str) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "id": uid("fco"),
        "call_id": function_call["call_id"],
        "output": output,
    }


def reasoning(text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": uid("rs"),
        "summary": [{"type": "summary_text", "text": text}],
    }


def web_search(query: str) -> dict[str, Any]:
    """A web search the provider ran (the item is its whole record)."""
    return {"type": "web_search_call", "id": uid("ws"), "status": "completed",
            "action": {"type": "search", "query": query}}


def mcp_list_tools(server_label: str, names: Sequence[str]) -> dict[str, Any]:
    tools = [{"name": name, "input_schema": {"type": "object"}} for name in names]
    return {"type": "mcp_list_tools", "id": uid("mcpl"), "server_label": server_label,
            "tools": tools}


def mcp_call(server_label: str, name: str, arguments: str, output: str) -> dict[str, Any]:
    """An MCP tool the gateway ran; the item carries its output."""
    return {"type": "mcp_call", "id": uid("mcp"), "server_label": server_label, "name": name,
            "arguments": arguments, "output": output, "error": None, "status": "completed"}


def custom_call(name: str, text: str) -> dict[str, Any]:
    """A custom (free-form text) tool call."""
    return {"type": "custom_tool_call", "id": uid("ctc"), "call_id": uid("call"),
            "name": name, "input": text}


def custom_output_of(custom_tool_call: Json, output: str) -> dict[str, Any]:
    return {"type": "custom_tool_call_output", "id": uid("ctco"),
            "call_id": custom_tool_call["call_id"], "output": output}


def _as_json(item: Json | Item) -> Json:
    """An input item as the Responses request carries it (typed builders give Items)."""
    return json.loads(item.content) if isinstance(item, Item) else item


@dataclass
class SimulatedGateway:
    producer: GatewayProducer
    client: RehydrationClient
    tenant_id: str = field(default_factory=lambda: uid("tenant"))
    fingerprint: Fingerprint = field(default_factory=make_fingerprint)

    @property
    def fingerprint_hash(self) -> str:
        return fingerprint_hash(self.fingerprint)

    def turn(
        self,
        identity: TurnIdentity,
        input_items: Sequence[Json | Item],
        output_items: Sequence[Json | Item],
        *,
        idempotency_key: str | None = None,
        attempt: int = 1,
        certified: bool = True,
        artifact_ttl_ms: int = 3_600_000,
        **kwargs: Any,
    ) -> TurnCompleted:
        fp_hash = self.fingerprint_hash
        artifact = proof = None
        if certified:
            # Expiry is "now + ttl": build with a shifted now, as samples count from it.
            artifact, proof = make_artifact_and_proof(
                fp_hash, now_ms=now_ms() + artifact_ttl_ms - 3_600_000
            )
        return turn_completed(
            identity,
            idempotency_key=idempotency_key or uid("idem"),
            request={
                "model": self.fingerprint.model_name,
                "input": [_as_json(i) for i in input_items],
                "conversation": identity.conversation_id,
                "previous_response_id": identity.previous_response_id,
            },
            input_items=input_items,
            output_items=output_items,
            fingerprint=self.fingerprint,
            attempt=attempt,
            token_artifact=artifact,
            boundary_proof=proof,
            **kwargs,
        )

    def effect(
        self,
        identity: TurnIdentity,
        idempotency_key: str,
        subturn: int,
        tool_call: Json,
        output: Json | None = None,
        attempt: int = 1,
    ) -> ToolEffect:
        """The record of a tool this gateway ran (``output`` None: an mcp_call)."""
        return tool_effect(
            identity,
            idempotency_key=idempotency_key,
            subturn_index=subturn,
            call=tool_call,
            output=output,
            attempt=attempt,
        )

    def claims(self, identity: TurnIdentity, idempotency_key: str, attempt: int) -> EffectClaims:
        """Claim-before-execute for one attempt, against the API this gateway reads from;
        outcomes are also published as ``ToolEffect`` through this gateway's producer."""
        return EffectClaims(self.client.base_url, identity, idempotency_key=idempotency_key,
                            attempt=attempt, producer=self.producer)

    def publish(
        self, turn: TurnCompleted | None = None, effects: Sequence[ToolEffect] = (), *others: Any
    ) -> None:
        """Publish effects, then the turn (if any), then other events; flush (raises)."""
        if turn is not None:
            self.producer.send_turn(turn, effects)
        else:
            for effect in effects:
                self.producer.send(effect)
        for event in others:
            self.producer.send(event)
        self.producer.flush()

    def rehydrate(
        self, response_id: str, wait_ms: int = 0, fingerprint_hash: str | None = None
    ) -> Outcome:
        return self.client.response_history(
            self.tenant_id, response_id, fingerprint_hash or self.fingerprint_hash, wait_ms
        )

    def conversation(self, conversation_id: str, fingerprint_hash: str | None = None) -> Outcome:
        return self.client.conversation_history(
            self.tenant_id, conversation_id, fingerprint_hash or self.fingerprint_hash
        )
