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

Two more roles write a claim and have its turn use it (``ClaimedRun``):

- ``contended``: attempt 1 claims and, while its tool runs (its lease live), attempts 2
  and 3 claim the same effect, one ``at_most_once``, one ``at_least_once`` (``variant``
  says which is attempt 2's): both must get ``IN_PROGRESS`` (rule 6) naming attempt 1
  with a ``wait_ms``, and once attempt 1 recorded its outcome, attempt 2 ``COMPLETED``
  with that output; the turn is attempt 2's, carrying the reused output. The tool runs
  once across all (a contender wrongly let in runs it, as a gateway would).
- ``conflicted``: attempt 1 claims, runs and records; attempt 2 claims the same place
  (subturn, tool, occurrence) with other arguments, while attempt 1 holds the lease
  (``variant`` ``live``) or after its completion: ``CONFLICT`` (rule 2) naming attempt
  1, with the stored claim's status and output (none yet while live). The turn is
  attempt 1's.

A ``ClaimProbe`` is a claim that must write nothing, made once the response it follows
is decided (the API's status endpoint; a decision other than the one awaited leaves the
probe unchecked, since the turn's own outcome is judged by the checker):

- ``promoted``: another attempt of a request that stands promoted (a Conversation's
  turn, a chain's child, or a chain's first response claimed by a retry under another
  response id, with ``response_id`` equal to its ``partition_key``): ``PROMOTED`` with
  the promoted ``existing_response_id`` and its ``existing_request_digest``;
  ``attempt``, ``lease_until``, ``status`` and ``output`` null (section 8, "First of
  all");
- ``cancelled``: attempt 2 of a request whose ``TurnCancelled`` was processed (its turn
  rejected ``CANCELLED``): the effect attempt 1 completed before the cancellation is
  ``COMPLETED`` with its recorded output (rule 3), a new one ``CANCELLED`` (rule 1).

Three checks fail the run (each a finding the producer logs, ``Finding``; the checker
reports it by its class):

- ``claim_answer_wrong``: an answer other than the rules give for the role;
- ``effect_executed_twice``: the harness's tool ran more than once for one effect
  (``runs`` per effect id; twice is allowed only for ``overtaken``, whose
  ``at_least_once`` takeover may run it again by design);
- ``claim_output_mismatch``: a ``COMPLETED`` (or ``CONFLICT``) answer whose output is
  not the one the completion recorded (ids aside: a reused output is re-keyed).

Waiting out a lease or a decision is the runner's ``sleep`` (a test advances a clock
instead).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from ratchet.chaos import recipes
from ratchet.domain.claims import effect_id_for_claim, rekey_output
from schemas.items import from_responses
from schemas.models import Item
from services.gateway.claims import (
    ClaimsLeftOpen,
    ClaimTakenOver,
    Effect,
    EffectClaims,
    EffectOutcomeUnknown,
    EffectPolicy,
)
from services.gateway.client import server_error
from services.gateway.errors import GatewayError, RehydrationUnavailable
from services.gateway.events import TurnIdentity, arguments_digest_of, tool_name_of

# The short lease of a slow or vanished attempt (the API's least is 100 ms), and how long
# after its claim's answer the next attempt claims: well past it on the API's clock.
SHORT_LEASE_MS = 150
LEASE_WAIT_S = 0.4
ROLES = ("run", "overtaken", "expired", "contended", "conflicted")
PROBE_ROLES = ("promoted", "cancelled")
# The roles whose claim is held by attempt 1 while the turn is attempt 2's.
_SECOND_ATTEMPT_ROLES = ("overtaken", "expired", "contended")
# How many runs of one effect's tool are allowed: one, but for an at_least_once takeover.
ALLOWED_RUNS = {"overtaken": 2}
# A contended holder's lease: far above anything the step waits for.
HOLDER_LEASE_MS = 120_000
# How long a probe waits for the decision it follows (then it is left unchecked).
PROBE_WAIT_S = 30.0
# The checks' classes (checker.py reports a finding by its class).
FINDING_KINDS = ("claim_answer_wrong", "effect_executed_twice", "claim_output_mismatch")


class ClaimAnswerWrong(AssertionError):
    """The claims API answered otherwise than its rules (gateway-protocol.md section 8).
    ``findings``: every ``Finding`` of the step that raised it."""

    def __init__(self, detail: str, findings: tuple[Finding, ...] = ()) -> None:
        super().__init__(detail)
        self.findings = findings


@dataclass(frozen=True)
class Finding:
    """One failed check of a claim step: ``kind`` one of ``FINDING_KINDS``."""

    kind: str
    tenant_id: str
    effect_id: str
    detail: str

    def logged(self) -> str:
        """The detail as the producer logs it: the checker reads the class back
        (``checker.claim_violation``)."""
        return f"[{self.kind}] {self.detail}"


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
    # ``conflicted``: ``live`` (attempt 2 claims while attempt 1's tool runs) or ""
    # (after attempt 1's completion); ``contended``: the contender's policy,
    # ``at_least_once`` or "" (``at_most_once``): a live lease is IN_PROGRESS for both.
    variant: str = ""

    @property
    def tenant_id(self) -> str:
        return self.identity.tenant_id

    @property
    def call_id(self) -> str:
        return str(self.call["call_id"])

    @property
    def recorded_digest(self) -> str:
        """The content digest of the output the claim's completion recorded: this
        attempt's item, but for ``contended``, whose holder (attempt 1) recorded its own
        (item id ``<effect id>:1``) and this attempt's turn carries it re-keyed (a CI
        chaos run's orphan of a rejected contended turn named attempt 1's digest, as it
        should; the oracle expected the turn's)."""
        if self.role != "contended":
            return self.output_digest
        return recipes.item_digest({"type": "function_call_output", "call_id": self.call_id,
                                    "output": self.output_text, "id": f"{self.effect_id}:1"})


def claimed_run(identity: TurnIdentity, idempotency_key: str, call: dict[str, Any],
                output_text: str, *, attempt: int = 1, subturn_index: int = 0,
                role: str = "run", variant: str = "") -> tuple[ClaimedRun, dict[str, Any]]:
    """The run, and the output item (a Responses dict) its turn carries: the one the
    library records (``Effect._output``: item id ``<effect id>:<attempt>``)."""
    if role not in ROLES or (role in _SECOND_ATTEMPT_ROLES and attempt < 2) or (
            role == "conflicted" and attempt != 1):
        raise ValueError(f"role {role!r} with attempt {attempt}")
    # The docs' recipes (ratchet/chaos/recipes.py), not the product's: the library's
    # claim must name the same effect id (``ClaimRunner`` asserts it).
    effect_id = recipes.claimed_effect_id(idempotency_key, subturn_index,
                                          recipes.tool_name(call), 0)
    item = {"type": "function_call_output", "call_id": call["call_id"],
            "output": output_text, "id": f"{effect_id}:{attempt}"}
    digest = recipes.item_digest(item)
    run = ClaimedRun(identity, idempotency_key, attempt, subturn_index, call, output_text,
                     effect_id, digest, role, variant)
    return run, item


def other_arguments(call: dict[str, Any]) -> dict[str, Any]:
    """``call`` regenerated by a retry: the same tool at the same place, other arguments
    (and its own call id)."""
    args = json.loads(call["arguments"])
    return {**call, "call_id": f"{call['call_id']}-again", "id": f"{call['id']}-again",
            "arguments": json.dumps({**args, "again": True})}


@dataclass(frozen=True)
class ProbeClaim:
    """One claim of a probe: the call at ``subturn_index`` (occurrence 0) and the state
    the rules give for it."""

    subturn_index: int
    call: dict[str, Any] = field(hash=False)
    expect: str  # PROMOTED, CANCELLED or COMPLETED
    effect_id: str = ""

    def __post_init__(self) -> None:
        if not self.effect_id:
            raise ValueError("effect_id is computed by probe_claim")


def probe_claim(idempotency_key: str, subturn_index: int, call: dict[str, Any],
                expect: str) -> ProbeClaim:
    return ProbeClaim(subturn_index, call, expect, effect_id_for_claim(
        idempotency_key, subturn_index, tool_name_of(call), 0))


@dataclass(frozen=True)
class ClaimProbe:
    """Claims of an attempt that must write nothing (``role`` in ``PROBE_ROLES``: module
    docstring), made once ``after`` (a response of the same tenant) is decided as
    ``after_state`` (``promoted`` or ``rejected``). Not an event: the oracle ignores
    it. ``existing_response_id`` / ``existing_request_digest``: what ``PROMOTED``
    must name."""

    identity: TurnIdentity  # the claiming attempt's (its partition_key, response_id)
    idempotency_key: str
    attempt: int
    claims: tuple[ProbeClaim, ...]
    role: str
    after: str
    after_state: str
    existing_response_id: str | None = None
    existing_request_digest: str | None = None

    def __post_init__(self) -> None:
        if self.role not in PROBE_ROLES or self.after_state not in ("promoted", "rejected"):
            raise ValueError(f"probe role {self.role!r} after {self.after_state!r}")

    @property
    def tenant_id(self) -> str:
        return self.identity.tenant_id

    @property
    def effect_id(self) -> str:
        return self.claims[0].effect_id


class ClaimRunner:
    """Runs ``ClaimedRun`` steps and ``ClaimProbe`` probes against the API at
    ``base_url`` (``transport``: an in-process app, for tests; ``sleep``: how a lease or
    a decision is waited out). ``runs`` counts the tool's runs per effect id;
    ``findings`` keeps every failed check (the producer drains it)."""

    def __init__(self, base_url: str, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._base_url, self._transport, self._sleep = base_url, transport, sleep
        self._claims: dict[tuple[str, str, int], EffectClaims] = {}
        self._http = httpx.Client(base_url=base_url, timeout=10.0, transport=transport)
        self.runs: Counter[str] = Counter()  # effect id -> runs of its tool
        # effect id -> the output its completion recorded (what COMPLETED must replay)
        self.recorded: dict[str, Item] = {}
        self.findings: list[Finding] = []
        self.unchecked: list[str] = []  # probes and contentions left unchecked, and why
        self._reported: set[tuple[str, str, str]] = set()  # findings made once
        self._done: set[tuple[str, str]] = set()  # (check, effect id) made once
        self._step_findings: list[Finding] = []

    @property
    def checked(self) -> frozenset[tuple[str, str]]:
        """The probes and conflicting claims made: (``promoted`` | ``cancelled`` |
        ``conflict``, effect id)."""
        return frozenset(self._done)

    @property
    def ran(self) -> int:
        """Tool runs of every effect together."""
        return sum(self.runs.values())

    def run(self, step: ClaimedRun | ClaimProbe) -> None:
        """Claim, run the tool if this attempt holds the claim, record its outcome (or,
        for a probe, claim and judge the answers). Raises the library's errors
        (``RehydrationUnavailable``: send the round again; a round sent again goes on
        where the last one stopped: each attempt keeps its token) and, after the step,
        ``ClaimAnswerWrong`` carrying the step's findings (also kept in ``findings``)."""
        self._step_findings = []
        try:
            if isinstance(step, ClaimProbe):
                self._probe(step)
            elif step.role == "overtaken":
                self._overtaken(step)
            elif step.role == "expired":
                self._expired(step)
            elif step.role == "contended":
                self._contended(step)
            elif step.role == "conflicted":
                self._conflicted(step)
            else:
                self._holder(step)
        except ClaimAnswerWrong as exc:
            if not exc.findings:
                self._find("claim_answer_wrong", step, str(exc))
        except AssertionError as exc:  # a harness check: never a mere refusal
            self._find("claim_answer_wrong", step, f"{type(exc).__name__}: {exc}")
        except GatewayError as exc:
            # The library's refusals (CONFLICT, CANCELLED, PROMOTED, LEASE_EXPIRED, ...):
            # wrong answers for the roles that expect none of them; for the first roles,
            # refusals as before (the producer logs them; a round sent again after its
            # turn was promoted is answered PROMOTED).
            if isinstance(exc, RehydrationUnavailable) or step.role in ("run", "overtaken",
                                                                        "expired"):
                raise
            self._find("claim_answer_wrong", step, f"{type(exc).__name__}: {exc}")
        except (KeyError, TypeError, ValueError) as exc:  # an answer the step cannot read
            self._find("claim_answer_wrong", step, f"unreadable answer: {exc!r:.300}")
        finally:
            self._count_runs(step)
        found = tuple(self._step_findings)
        if found:
            raise ClaimAnswerWrong("; ".join(f.logged() for f in found), found)

    # -- checks ----------------------------------------------------------------------------
    def _find(self, kind: str, step: ClaimedRun | ClaimProbe, detail: str,
              effect_id: str | None = None) -> None:
        eid = effect_id or step.effect_id
        once = (kind, eid, "" if kind != "claim_answer_wrong" else detail)
        if once in self._reported:
            return
        self._reported.add(once)
        finding = Finding(kind, step.tenant_id, eid, detail)
        self.findings.append(finding)
        self._step_findings.append(finding)

    def _count_runs(self, step: ClaimedRun | ClaimProbe) -> None:
        """``effect_executed_twice``: the tool ran more often than the role allows."""
        if isinstance(step, ClaimProbe):
            allowed = {c.effect_id: 1 for c in step.claims}
        else:
            allowed = {step.effect_id: ALLOWED_RUNS.get(step.role, 1)}
        for eid, most in allowed.items():
            if self.runs[eid] > most:
                self._find("effect_executed_twice", step, f"{eid}: the tool ran "
                           f"{self.runs[eid]} times (role {step.role}, at most {most})", eid)

    def _replayed(self, step: ClaimedRun | ClaimProbe, effect_id: str, got: Item | None,
                  state: str) -> None:
        """``claim_output_mismatch``: a COMPLETED (or CONFLICT) answer's output is not
        the one the completion recorded, ids aside (a reused output is re-keyed)."""
        recorded = self.recorded.get(effect_id)
        if recorded is None:
            return
        if got is None or _neutral(got) != _neutral(recorded):
            self._find("claim_output_mismatch", step, (
                f"{effect_id}: {state} answered output "
                f"{'none' if got is None else _show(got)}; the completion recorded "
                f"{_show(recorded)}"), effect_id)

    def _record(self, effect_id: str, effect: Effect) -> None:
        if effect.executed and effect.output is not None:
            self.recorded.setdefault(effect_id, effect.output)

    # -- library steps ---------------------------------------------------------------------
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

    def _tool(self, effect_id: str, text: str) -> Callable[[], str]:
        def tool() -> str:
            self.runs[effect_id] += 1
            return text
        return tool

    def _holder(self, step: ClaimedRun, policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE,
                fn: Callable[[], str] | None = None, lease_ms: int = 30_000) -> Effect:
        """The step's attempt claims, runs and records (or reuses a recorded outcome)."""
        effect = self._effect(step, step.attempt, policy, lease_ms)
        output = effect.run(fn or self._tool(step.effect_id, step.output_text))
        self._record(step.effect_id, effect)
        if effect.state == "COMPLETED" and not effect.executed:
            self._replayed(step, step.effect_id, output, "COMPLETED")
        if output.content_digest != step.output_digest:
            raise AssertionError(f"{step.effect_id}: recorded output {output.content_digest} "
                                 f"!= the turn's {step.output_digest}")
        return effect

    def _overtaken(self, step: ClaimedRun) -> None:
        first = self._effect(step, 1, EffectPolicy.AT_LEAST_ONCE, SHORT_LEASE_MS)
        second = self._effect(step, step.attempt, EffectPolicy.AT_LEAST_ONCE)

        def slow() -> str:
            """Attempt 1's tool outlives its lease; meanwhile attempt 2 takes over."""
            self.runs[step.effect_id] += 1
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
            self._replayed(step, step.effect_id, first.output, "COMPLETED")
            return
        # Attempt 1 claims again: the claim is completed, with attempt 2's output.
        output = first.run(self._tool(step.effect_id, "never run"))
        if first.state != "COMPLETED":
            raise ClaimAnswerWrong(f"{step.effect_id}: attempt 1 claiming again after the "
                                   f"takeover got {first.state}, not COMPLETED")
        self._replayed(step, step.effect_id, output, "COMPLETED")

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
            self.runs[step.effect_id] += 1
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

    def _contended(self, step: ClaimedRun) -> None:
        """Attempt 1 holds a live lease while attempt 2 claims with the step's policy and
        attempt 3 with the other (``IN_PROGRESS`` for both, rule 6: a takeover is for an
        expired lease only); then attempt 2 reuses attempt 1's recorded output
        (``COMPLETED``)."""
        holder = replace(step, attempt=1)
        policy = EffectPolicy.AT_LEAST_ONCE if step.variant == "at_least_once" \
            else EffectPolicy.AT_MOST_ONCE
        other = EffectPolicy.AT_MOST_ONCE if policy is EffectPolicy.AT_LEAST_ONCE \
            else EffectPolicy.AT_LEAST_ONCE
        contenders = ((step.attempt, policy, uuid.uuid4().hex),
                      (step.attempt + 1, other, uuid.uuid4().hex))

        def tool() -> str:
            self.runs[step.effect_id] += 1
            for attempt, pol, token in contenders:
                body = self._contend(step, attempt, step.call, token, "while attempt 1 "
                                     "holds a live lease", pol)
                if body is not None and (body["state"] != "IN_PROGRESS"
                                         or body.get("attempt") != 1
                                         or not 0 < (body.get("wait_ms") or 0) <= 30_000):
                    self._find("claim_answer_wrong", step, (
                        f"{step.effect_id}: attempt {attempt} ({pol.value}) claiming while "
                        f"attempt 1 holds a live lease got {_said(body)}; IN_PROGRESS "
                        f"(attempt 1, 0 < wait_ms <= 30000) expected"))
            return step.output_text

        first = self._effect(holder, 1, EffectPolicy.AT_MOST_ONCE, HOLDER_LEASE_MS)
        with contextlib.suppress(ClaimTakenOver):  # a contender wrongly let in: reported
            first.run(tool)
        self._record(step.effect_id, first)
        second = self._effect(step, step.attempt, policy)
        output = second.run(self._tool(step.effect_id, step.output_text))
        self._record(step.effect_id, second)
        if second.state != "COMPLETED":
            raise ClaimAnswerWrong(f"{step.effect_id}: attempt {step.attempt} claiming after "
                                   f"attempt 1 recorded its outcome got {second.state}; "
                                   f"COMPLETED expected")
        self._replayed(step, step.effect_id, output, "COMPLETED")
        if output.content_digest != step.output_digest:
            raise AssertionError(f"{step.effect_id}: reused output {output.content_digest} "
                                 f"!= the turn's {step.output_digest}")

    def _conflicted(self, step: ClaimedRun) -> None:
        """Attempt 1 claims, runs and records; attempt 2 asks the same place with other
        arguments, during attempt 1's run (``live``) or after it: ``CONFLICT`` (rule 2)."""
        live = step.variant == "live"

        def tool() -> str:
            self.runs[step.effect_id] += 1
            if live:
                self._conflict(step, live=True)
            return step.output_text

        with contextlib.suppress(ClaimTakenOver):  # a contender wrongly let in: reported
            self._holder(step, fn=tool)
        if not live and ("conflict", step.effect_id) not in self._done:
            self._conflict(step, live=False)

    def _conflict(self, step: ClaimedRun, live: bool) -> None:
        call = other_arguments(step.call)
        token = uuid.uuid4().hex
        when = "while attempt 1 runs it" if live else "after attempt 1 recorded its outcome"
        body = self._contend(step, 2, call, token, f"with other arguments {when}")
        if body is None:
            return
        self._done.add(("conflict", step.effect_id))
        wrong = body["state"] != "CONFLICT" or body.get("attempt") != 1 or (
            live and (body.get("status") is not None or body.get("output") is not None)) or (
            not live and body.get("status") != "succeeded")
        if wrong:
            self._find("claim_answer_wrong", step, (
                f"{step.effect_id}: attempt 2 claiming the same place with other arguments "
                f"{when} got {_said(body)}; CONFLICT (attempt 1"
                f"{', no outcome yet' if live else ', its recorded outcome'}) expected"))
        elif not live:
            self._replayed(step, step.effect_id, _item(body.get("output")), "CONFLICT")

    def _contend(self, step: ClaimedRun, attempt: int, call: dict[str, Any], token: str,
                 what: str, policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE
                 ) -> dict[str, Any] | None:
        """Another attempt's claim of the step's effect, raw (the library would wait or
        raise); one that was let in runs the tool and records its outcome, as a gateway
        would. None if the API could not be asked (left unchecked)."""
        try:
            body = self._post_claim(step.identity, step.idempotency_key, attempt,
                                    step.subturn_index, call, token, policy)
        except RehydrationUnavailable as exc:
            self.unchecked.append(f"{step.effect_id}: claim {what}: {exc!r:.200}")
            return None
        if body["state"] == "CLAIMED":
            self.runs[step.effect_id] += 1
            text = f"{step.output_text} (attempt {attempt}, let in)"
            output = from_responses({"type": "function_call_output", "call_id": call["call_id"],
                                     "output": text, "id": f"{step.effect_id}:{attempt}"},
                                    item_id=f"{step.effect_id}:{attempt}")
            with contextlib.suppress(GatewayError):
                self._post_complete(step.identity, step.idempotency_key, step.effect_id,
                                    token, output)
                self.recorded.setdefault(step.effect_id, output)
        return body

    # -- probes ----------------------------------------------------------------------------
    def _probe(self, probe: ClaimProbe) -> None:
        if (probe.role, probe.effect_id) in self._done or not self._await(probe):
            return
        for claim in probe.claims:
            body = self._post_claim(probe.identity, probe.idempotency_key, probe.attempt,
                                    claim.subturn_index, claim.call, uuid.uuid4().hex)
            want = claim.expect
            wrong = body["state"] != want
            if want == "PROMOTED":
                wrong = wrong or (body.get("existing_response_id"),
                                  body.get("existing_request_digest")) != (
                    probe.existing_response_id, probe.existing_request_digest) or any(
                    body.get(k) is not None for k in ("attempt", "lease_until", "status",
                                                      "output"))
                expected = (f"PROMOTED (existing_response_id {probe.existing_response_id}, "
                            f"existing_request_digest {probe.existing_request_digest}; "
                            f"attempt, lease_until, status and output null)")
            elif want == "COMPLETED":
                expected = "COMPLETED with the recorded output"
            else:
                expected = want
            if wrong:
                self._find("claim_answer_wrong", probe, (
                    f"{claim.effect_id}: attempt {probe.attempt} ({probe.role}: after "
                    f"{probe.after} was {probe.after_state}) got {_said(body)}; {expected} "
                    f"expected"), claim.effect_id)
            elif want == "COMPLETED":
                self._replayed(probe, claim.effect_id, _item(body.get("output")), "COMPLETED")
        self._done.add((probe.role, probe.effect_id))

    def _await(self, probe: ClaimProbe) -> bool:
        """Wait until ``probe.after`` is decided (its status); False (left unchecked)
        if it is decided otherwise than awaited or not within ``PROBE_WAIT_S``."""
        waited, pause, state = 0.0, 0.05, "unknown"
        while waited < PROBE_WAIT_S:
            try:
                resp = self._http.get(f"/v1/responses/{probe.after}/status",
                                      params={"tenant_id": probe.tenant_id})
                state = resp.json().get("state", "unknown") if resp.status_code == 200 \
                    else "unknown"
            except (httpx.HTTPError, ValueError):
                state = "unknown"
            if state != "unknown":
                break
            self._sleep(pause)
            waited += pause
            pause = min(pause * 2, 1.0)
        if state != probe.after_state:
            self.unchecked.append(f"{probe.effect_id}: {probe.role} probe: {probe.after} "
                                  f"is {state}, not {probe.after_state}")
            return False
        return True

    # -- raw HTTP (the library waits on IN_PROGRESS and hides the bodies) ---------------------
    def _post(self, path: str, payload: dict[str, Any]) -> httpx.Response:
        try:
            resp = self._http.post(path, json=payload)
        except httpx.HTTPError as exc:
            raise RehydrationUnavailable(f"{path}: {exc!r}") from exc
        if resp.status_code >= 500:
            # Typed as the library types it: a 500 saying it is not retryable (a damaged
            # claim row's ``CORRUPT_HISTORY``) is the step's finding, not an outage whose
            # round is sent again for as long as the run lasts (session 53).
            raise server_error(resp)
        return resp

    def _post_claim(self, identity: TurnIdentity, key: str, attempt: int, subturn: int,
                    call: dict[str, Any], token: str,
                    policy: EffectPolicy = EffectPolicy.AT_MOST_ONCE) -> dict[str, Any]:
        name = tool_name_of(call)
        resp = self._post("/v1/effects/claims", {
            "partition_key": identity.conversation_id or identity.chain_root_id,
            "tenant_id": identity.tenant_id, "idempotency_key": key, "attempt": attempt,
            "subturn_index": subturn, "tool_name": name, "occurrence": 0,
            "arguments_digest": arguments_digest_of(call), "call_id": call["call_id"],
            "token": token, "lease_ms": 30_000, "policy": policy.value,
            "effect_id": effect_id_for_claim(key, subturn, name, 0),
            "response_id": identity.response_id})
        if resp.status_code != 200:
            return {"state": f"HTTP {resp.status_code}", "detail": resp.text[:300]}
        return resp.json()

    def _post_complete(self, identity: TurnIdentity, key: str, effect_id: str, token: str,
                       output: Item) -> None:
        self._post(f"/v1/effects/claims/{effect_id}/complete", {
            "partition_key": identity.conversation_id or identity.chain_root_id,
            "tenant_id": identity.tenant_id, "idempotency_key": key, "token": token,
            "status": "succeeded",
            "output": {"item_id": output.item_id, "type": output.type, "role": output.role,
                       "call_id": output.call_id, "content": output.content.decode("utf-8"),
                       "content_digest": output.content_digest,
                       "format_version": output.format_version}})

    def close(self) -> None:
        """Every attempt's claims released; a claim left open (a gateway that "died"
        on purpose) is the run's to judge, not an error here."""
        for claims in self._claims.values():
            with contextlib.suppress(ClaimsLeftOpen):
                claims.close()
        self._http.close()


def _neutral(item: Item) -> str:
    """The output's digest with its ids set aside (a reused output is re-keyed)."""
    try:
        return rekey_output(item, call_id="-", item_id="-").content_digest
    except ValueError:
        return "unreadable:" + item.content_digest


def _show(item: Item) -> str:
    return repr(item.content.decode("utf-8", "replace")[:160])


def _said(body: dict[str, Any]) -> str:
    """An answer, briefly."""
    keep = ("state", "attempt", "lease_until", "wait_ms", "status", "existing_response_id",
            "existing_request_digest", "previous_attempt")
    said = ", ".join(f"{k}={body.get(k)}" for k in keep if body.get(k) is not None)
    if body.get("output") is not None:
        said += ", output=" + repr(str(body["output"].get("content", ""))[:80])
    return said or repr(body)[:200]


def _item(body: dict[str, Any] | None) -> Item | None:
    if not body:
        return None
    return Item(item_id=body["item_id"], type=body["type"], role=body.get("role"),
                call_id=body.get("call_id"), content=body["content"].encode("utf-8"),
                content_digest=body["content_digest"],
                format_version=body.get("format_version", 1))
