"""Effect claims made through the HTTP API during a chaos run, as a gateway makes them.

A ``ClaimedRun`` is a step of a story that is not a Kafka event: a tool call claimed and
completed through ``POST /v1/effects/claims`` and ``.../complete``
(docs/gateway-protocol.md section 8) with ratchet's own gateway library
(``services.gateway.claims``), API only (no ``ToolEffect``). The producer runs it in
its round before the turns that follow it in the story are produced: the claim is
durable, and its request's facts marked, before its turn can be processed.

``ClaimRunner`` keeps one ``EffectClaims`` per request attempt, so a round sent again
after a failure (the API restarted, Cassandra paused) repeats the same claim with the
same token: ``CLAIMED`` again for its holder, or ``COMPLETED`` with the recorded output.
The tool itself is the run's fixed output text: what matters is that it runs at most
once and its outcome is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from ratchet.domain.claims import effect_id_for_claim
from schemas.items import from_responses
from services.gateway.claims import EffectClaims, EffectPolicy
from services.gateway.events import TurnIdentity, tool_name_of


@dataclass(frozen=True)
class ClaimedRun:
    """One tool call of one attempt, claimed and completed through the API."""

    identity: TurnIdentity
    idempotency_key: str
    attempt: int
    subturn_index: int
    call: dict[str, Any] = field(hash=False)
    output_text: str
    effect_id: str
    output_digest: str  # the recorded output item's content digest

    @property
    def tenant_id(self) -> str:
        return self.identity.tenant_id

    @property
    def call_id(self) -> str:
        return str(self.call["call_id"])


def claimed_run(identity: TurnIdentity, idempotency_key: str, call: dict[str, Any],
                output_text: str, *, attempt: int = 1,
                subturn_index: int = 0) -> tuple[ClaimedRun, dict[str, Any]]:
    """The run, and the output item (a Responses dict) its turn carries: the one the
    library records (``Effect._output``: item id ``<effect id>:<attempt>``)."""
    effect_id = effect_id_for_claim(idempotency_key, subturn_index, tool_name_of(call), 0)
    item = {"type": "function_call_output", "call_id": call["call_id"],
            "output": output_text, "id": f"{effect_id}:{attempt}"}
    digest = from_responses(item, item_id=item["id"]).content_digest
    run = ClaimedRun(identity, idempotency_key, attempt, subturn_index, call, output_text,
                     effect_id, digest)
    return run, item


class ClaimRunner:
    """Runs ``ClaimedRun`` steps against the API at ``base_url`` (``transport``: an
    in-process app, for tests)."""

    def __init__(self, base_url: str, transport: httpx.BaseTransport | None = None) -> None:
        self._base_url, self._transport = base_url, transport
        self._claims: dict[tuple[str, str, int], EffectClaims] = {}
        self.ran = 0  # tool runs (at most one per claim)

    def run(self, step: ClaimedRun) -> None:
        """Claim, run the tool if this attempt holds the claim, record its outcome.
        Raises the library's errors (``RehydrationUnavailable``: send the round again)."""
        key = (step.tenant_id, step.idempotency_key, step.attempt)
        claims = self._claims.get(key)
        if claims is None:
            claims = self._claims[key] = EffectClaims(
                self._base_url, step.identity, idempotency_key=step.idempotency_key,
                attempt=step.attempt, default_policy=EffectPolicy.AT_MOST_ONCE,
                transport=self._transport)
        with claims.effect(step.call, subturn_index=step.subturn_index, occurrence=0) as effect:
            if effect.effect_id != step.effect_id:
                raise AssertionError(f"claim key {effect.effect_id} != {step.effect_id}")

            def tool() -> str:
                self.ran += 1
                return step.output_text

            output = effect.run(tool)
        if output.content_digest != step.output_digest:
            raise AssertionError(f"{step.effect_id}: recorded output {output.content_digest} "
                                 f"!= the turn's {step.output_digest}")

    def close(self) -> None:
        for claims in self._claims.values():
            claims.close()
