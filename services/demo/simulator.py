"""A scripted gateway: what a Responses-API server does around ratchet, in a few calls.

It builds turns from Responses-style item dicts with the gateway library, publishes
them (effects first), flushes (delivery errors raise), and rehydrates through the HTTP
client. The token artifact and boundary proof are simulated (a real gateway gets them
from its inference engine); everything else is what a real gateway would send.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.domain.fingerprint import fingerprint_hash
from ratchet.samples import make_artifact_and_proof, make_fingerprint
from schemas.models import Fingerprint, ToolEffect, TurnCompleted
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
        input_items: Sequence[Json],
        output_items: Sequence[Json],
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
                "input": list(input_items),
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
        function_call: Json,
        output: Json,
        attempt: int = 1,
    ) -> ToolEffect:
        return tool_effect(
            identity,
            idempotency_key=idempotency_key,
            subturn_index=subturn,
            call=function_call,
            output=output,
            attempt=attempt,
        )

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
