"""Effect claims made through the HTTP API during a chaos run, as a gateway makes them.

A ``ClaimedRun`` is a step of a story that is not a Kafka event: a tool call claimed and
completed through ``POST /v1/effects/claims`` and ``.../complete``
(docs/gateway-protocol.md section 8) with ratchet's own gateway library
(``services.gateway.claims``), API only (no ``ToolEffect``). The producer runs it in
its round before the turns that follow it in the story are produced: the claim is
durable, and its request's facts marked, before its turn can be processed.

``ClaimRunner`` keeps one ``EffectClaims`` per request attempt, so a round sent again
after a failure (the API restarted, Cassandra paused) repeats the same claim with the
same token: ``CLAIMED`` again for its holder, or ``COMPLETED`` with the recorded output,
or ``PROMOTED`` when the round's turn was delivered and promoted although its send
failed (the library's ``RequestPromoted``: logged by the producer as a refusal, not a
wrong answer).
The tool itself is the run's fixed output text: what matters is that it runs at most
once and its outcome is recorded.

Two roles exercise the leases (rules 5-7 of the claims API), as one step each:

- ``overtaken``: attempt 1 claims ``at_least_once`` with a short lease and is slow. While
  its tool runs, the lease ends and attempt 2 takes the claim over, runs the tool and
  records its outcome; attempt 1's completion is then refused (``NOT_HOLDER``), and
  attempt 1 claiming again gets attempt 2's recorded output (``COMPLETED``). The turn
  (attempt 2's) carries that output: used, never orphaned.
- ``expired``: attempt 1 claims ``at_most_once`` with a short lease and its gateway dies
  inside the tool (no outcome). Attempt 2, after the lease, must get ``LEASE_EXPIRED``
  and not run the tool; its turn answers without it, so the claim is published orphaned
  with ``effect_completed`` false ("may or may not have run").

An answer other than the rules give is a ``ClaimAnswerWrong``: the producer logs it and
the checker reports it (``claim_answer_wrong``). Waiting out a lease is the runner's
``sleep`` (a test advances a clock instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ratchet.chaos import recipes
from services.gateway.claims import (
    ClaimTakenOver,
    Effect,
    EffectClaims,
    EffectOutcomeUnknown,
    EffectPolicy,
)
from services.gateway.events import TurnIdentity

# The short lease of a slow or vanished attempt (the API's least is 100 ms), and how long
# after its claim's answer the next attempt claims: well past it on the API's clock.
SHORT_LEASE_MS = 150
LEASE_WAIT_S = 0.4
ROLES = ("run", "overtaken", "expired")


class ClaimAnswerWrong(AssertionError):
    """The claims API answered otherwise than its rules (gateway-protocol.md section 8)."""


class _Escape(BaseException):
    """What attempt 2 raised inside attempt 1's tool, carried out of the library's
    ``run`` without recording anything for attempt 1 (an ``Exception`` would be recorded
    as attempt 1's failed outcome), then raised as itself."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _GatewayDied(BaseException):
    """Raised inside a tool to leave its claim without an outcome, as a crash would (a
    ``BaseException``: the library records nothing for it)."""


@dataclass(frozen=True)
class ClaimedRun:
    """One tool call of one attempt, claimed and completed through the API; ``role``:
    ``run`` (this attempt alone), ``overtaken`` or ``expired`` (an attempt 1 before it:
    module docstring). ``attempt`` is the attempt whose output the turn carries."""

    identity: TurnIdentity
    idempotency_key: str
    attempt: int
    subturn_index: int
    call: dict[str, Any] = field(hash=False)
    output_text: str
    effect_id: str
    output_digest: str  # the recorded output item's content digest
    role: str = "run"

    @property
    def tenant_id(self) -> str:
        return self.identity.tenant_id

    @property
    def call_id(self) -> str:
        return str(self.call["call_id"])


def claimed_run(identity: TurnIdentity, idempotency_key: str, call: dict[str, Any],
                output_text: str, *, attempt: int = 1, subturn_index: int = 0,
                role: str = "run") -> tuple[ClaimedRun, dict[str, Any]]:
    """The run, and the output item (a Responses dict) its turn carries: the one the
    library records (``Effect._output``: item id ``<effect id>:<attempt>``)."""
    if role not in ROLES or (role != "run" and attempt < 2):
        raise ValueError(f"role {role!r} with attempt {attempt}")
    # The docs' recipes (ratchet/chaos/recipes.py), not the product's: the library's
    # claim must name the same effect id (``ClaimRunner`` asserts it).
    effect_id = recipes.claimed_effect_id(idempotency_key, subturn_index,
                                          recipes.tool_name(call), 0)
    item = {"type": "function_call_output", "call_id": call["call_id"],
            "output": output_text, "id": f"{effect_id}:{attempt}"}
    digest = recipes.item_digest(item)
    run = ClaimedRun(identity, idempotency_key, attempt, subturn_index, call, output_text,
                     effect_id, digest, role)
    return run, item


class ClaimRunner:
    """Runs ``ClaimedRun`` steps against the API at ``base_url`` (``transport``: an
    in-process app, for tests; ``sleep``: how a lease is waited out)."""

    def __init__(self, base_url: str, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._base_url, self._transport, self._sleep = base_url, transport, sleep
        self._claims: dict[tuple[str, str, int], EffectClaims] = {}
        self.ran = 0  # tool runs (at most one per claim, but for a takeover's)

    def run(self, step: ClaimedRun) -> None:
        """Claim, run the tool if this attempt holds the claim, record its outcome.
        Raises the library's errors (``RehydrationUnavailable``: send the round again;
        a round sent again goes on where the last one stopped: each attempt keeps its
        token) and ``ClaimAnswerWrong``."""
        if step.role == "overtaken":
            self._overtaken(step)
        elif step.role == "expired":
            self._expired(step)
        else:
            self._holder(step)

    def _effect(self, step: ClaimedRun, attempt: int, policy: EffectPolicy,
                lease_ms: int = 30_000) -> Effect:
        """Attempt ``attempt``'s effect of the step's call (the same object each time)."""
        key = (step.tenant_id, step.idempotency_key, attempt)
        claims = self._claims.get(key)
        if claims is None:
            claims = self._claims[key] = EffectClaims(
                self._base_url, step.identity, idempotency_key=step.idempotency_key,
                attempt=attempt, default_policy=policy, lease_ms=lease_ms,
                transport=self._transport)
        with claims.effect(step.call, subturn_index=step.subturn_index, occurrence=0) as effect:
            if effect.effect_id != step.effect_id:
                raise AssertionError(f"claim key {effect.effect_id} != {step.effect_id}")
            return effect

    def _tool(self, text: str) -> Callable[[], str]:
        def tool() -> str:
            self.ran += 1
            return text
        return tool

    def _holder(self, step: ClaimedRun, policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE) -> None:
        """The step's attempt claims, runs and records (or reuses a recorded outcome)."""
        effect = self._effect(step, step.attempt, policy)
        output = effect.run(self._tool(step.output_text))
        if output.content_digest != step.output_digest:
            raise AssertionError(f"{step.effect_id}: recorded output {output.content_digest} "
                                 f"!= the turn's {step.output_digest}")

    def _overtaken(self, step: ClaimedRun) -> None:
        first = self._effect(step, 1, EffectPolicy.AT_LEAST_ONCE, SHORT_LEASE_MS)
        second = self._effect(step, step.attempt, EffectPolicy.AT_LEAST_ONCE)

        def slow() -> str:
            """Attempt 1's tool outlives its lease; meanwhile attempt 2 takes over."""
            self.ran += 1
            self._sleep(LEASE_WAIT_S)
            self._taker(step, second, inside=True)
            return step.output_text + " (attempt 1, late)"

        try:
            first.run(slow)
        except _Escape as escaped:
            raise escaped.cause from None
        except ClaimTakenOver:
            pass  # NOT_HOLDER: the outcome is attempt 2's
        except EffectOutcomeUnknown:
            # A round sent again after attempt 2 failed inside attempt 1's tool: attempt
            # 1's run was interrupted (nothing recorded); attempt 2 goes on.
            self._taker(step, second)
            return
        else:
            if first.state != "COMPLETED":  # recorded while another attempt held it
                raise ClaimAnswerWrong(f"{step.effect_id}: attempt 1's completion after "
                                       f"its lease was taken over was accepted")
            return
        # Attempt 1 claims again: the claim is completed, with attempt 2's output.
        first.run(self._tool("never run"))
        if first.state != "COMPLETED":
            raise ClaimAnswerWrong(f"{step.effect_id}: attempt 1 claiming again after the "
                                   f"takeover got {first.state}, not COMPLETED")

    def _taker(self, step: ClaimedRun, second: Effect, inside: bool = False) -> None:
        """Attempt 2 takes the claim over and records its outcome; ``inside`` attempt
        1's tool, whatever it raises leaves as an ``_Escape``."""
        try:
            self._holder(step, EffectPolicy.AT_LEAST_ONCE)
        except Exception as exc:
            if inside:
                raise _Escape(exc) from exc
            raise
        if second.state != "CLAIMED" or not second.executed or second.previous_attempt != 1:
            raise ClaimAnswerWrong(f"{step.effect_id}: attempt {step.attempt} "
                                   f"(at_least_once) after attempt 1's lease ended got "
                                   f"{second.state} (previous_attempt "
                                   f"{second.previous_attempt}), not a takeover of attempt 1")

    def _expired(self, step: ClaimedRun) -> None:
        first = self._effect(step, 1, EffectPolicy.AT_MOST_ONCE, SHORT_LEASE_MS)

        def dies() -> str:
            self.ran += 1
            raise _GatewayDied

        try:
            first.run(dies)
            raise ClaimAnswerWrong(f"{step.effect_id}: attempt 1's first claim got "
                                   f"{first.state}, not CLAIMED")
        except _GatewayDied:
            self._sleep(LEASE_WAIT_S)
        except EffectOutcomeUnknown:
            pass  # a round sent again: attempt 1 died in the last one
        second = self._effect(step, step.attempt, EffectPolicy.AT_MOST_ONCE)

        def must_not_run() -> str:
            raise ClaimAnswerWrong(f"{step.effect_id}: attempt {step.attempt} "
                                   f"(at_most_once) got {second.state} for a claim whose "
                                   f"holder vanished; LEASE_EXPIRED expected")

        try:
            second.run(must_not_run)
        except EffectOutcomeUnknown:
            return  # LEASE_EXPIRED: not run
        raise ClaimAnswerWrong(f"{step.effect_id}: attempt {step.attempt} (at_most_once) "
                               f"got {second.state}; LEASE_EXPIRED expected")

    def close(self) -> None:
        for claims in self._claims.values():
            claims.close()
