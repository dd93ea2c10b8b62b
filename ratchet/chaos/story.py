"""A chaos story and the gateway that builds its events.

A **story** is what one gateway does on one partition key: a Conversation, a response
chain, or a run of undecodable records. It is a list of **steps**; a step is sent in
order by one producer, and a step's ``race`` events are sent at the same time by a
second producer (two gateways continuing one head): their order in Kafka is open.
``StoryGateway`` builds a story's events with the gateway library, its ids drawn from
the story. What stories a run holds is ``ratchet.chaos.workload``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from ratchet.chaos import recipes
from ratchet.chaos.claims import ClaimedRun, ClaimProbe
from ratchet.samples import make_artifact_and_proof, make_fingerprint
from schemas.models import (
    BoundaryProof,
    Fingerprint,
    GatewayEvent,
    RouterReceipt,
    Subturn,
    TokenArtifact,
    TurnCompleted,
)
from services.gateway.events import TurnIdentity, now_ms, tool_effect, turn_completed

UNKNOWN_TYPE = "x_chaos_unknown_item"
# How long after the workload is built its token artifacts and boundary proofs stay
# reusable: far longer than a run may last (the runner refuses a run whose deadline is
# not well inside it). They expired an hour after it, so a run longer than that read
# correct ARTIFACT_EXPIRED fallbacks where the oracle expected certified (an outside
# review, 2026-12-06).
REUSE_TTL_MS = 7 * 24 * 3600 * 1000
WORDS = ("lyon", "rain", "train", "budget", "museum", "cheese", "river", "hotel", "map",
         "ticket", "bike", "wine", "bridge", "market", "opera", "sunday")
FINGERPRINT = make_fingerprint()
# A redeployed model (another weights revision): its turns promote, and a read with the
# workload's fingerprint is FINGERPRINT_MISMATCH (CONTRACT 5: reuse invalid, history not).
REDEPLOYED = make_fingerprint(model_weights_revision="0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c")
# Not an identity: a mutable branch name as the weights revision (INCOMPLETE_FINGERPRINT).
MUTABLE_REVISION = make_fingerprint(model_weights_revision="main")


@dataclass(frozen=True)
class RawRecord:
    """Bytes produced as they are (not a gateway event): must end in a dead letter."""

    key: bytes
    value: bytes | None
    label: str


# A ClaimedRun or a ClaimProbe is not produced: the producer makes it through the claims
# API (the oracle ignores a probe: it writes nothing).
Event = GatewayEvent | RawRecord | ClaimedRun | ClaimProbe


@dataclass(frozen=True)
class Step:
    sends: tuple[int, ...]  # indices into Story.events, produced in this order
    race: tuple[int, ...] = ()  # produced concurrently by another producer


@dataclass
class Story:
    index: int
    sid: str
    kind: str  # conversation | chain | garbage
    tenant: str
    key: str  # partition key
    path: str  # gateway | raw (how its events reach Kafka)
    events: list[Event] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # scenario label per step
    # Turns whose expiry the producer stamps at send time (event index -> (what expires:
    # ``receipt``, ``artifact`` or ``logical``, ms after the send)): ratchet/chaos/timed.py.
    timed: dict[int, tuple[str, int]] = field(default_factory=dict)

    def add(self, label: str, *events: Event, race: tuple[Event, ...] = ()) -> list[int]:
        idx = []
        for ev in (*events, *race):
            self.events.append(ev)
            idx.append(len(self.events) - 1)
        self.steps.append(Step(tuple(idx[: len(events)]), tuple(idx[len(events):])))
        self.labels.append(label)
        return idx

    def resend(self, label: str, index: int) -> None:
        self.steps.append(Step((index,)))
        self.labels.append(label)

    @property
    def turn_count(self) -> int:
        return sum(1 for s in self.steps for i in (*s.sends, *s.race)
                   if isinstance(self.events[i], TurnCompleted))


class StoryGateway:
    """Builds the events of one story with the gateway library (ids from the story)."""

    def __init__(self, story: Story, rng: random.Random) -> None:
        self.story, self.rng = story, rng
        self.n_resp = 0
        self.n_key = 0

    def rid(self) -> str:
        self.n_resp += 1
        return f"resp-{self.story.sid}-{self.n_resp - 1}"

    def key(self) -> str:
        self.n_key += 1
        return f"idem-{self.story.sid}-{self.n_key}"

    def text(self) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(2, 8)))

    def identity(self, rid: str, head: int | None = None, parent: str | None = None):
        s = self.story
        if s.kind == "conversation":
            return TurnIdentity.conversation(s.tenant, s.key, rid, head or 0)
        # A chain's first response is its own root (CONTRACT 2): a retry of the root's
        # request under another response id is its own partition, not the story's.
        root = s.key if parent is not None else None
        return TurnIdentity.chain(s.tenant, rid, previous_response_id=parent, chain_root_id=root)

    def turn(self, identity: TurnIdentity, key: str, request_text: str, *, attempt: int = 1,
             status: str = "completed", tools: list[tuple[dict, dict]] = (),
             effect_ids: tuple[str, ...] = (), reasoning: bool = False,
             extra_output: tuple[dict, ...] = (), inputs: tuple[dict, ...] = (),
             final_message: bool = True, tail: tuple[dict, ...] = (),
             fingerprint: Fingerprint = FINGERPRINT,
             expires_at: int | None = None, with_artifact: bool = True,
             receipt: bool = False, truncated: bool = False,
             subturns: tuple[Subturn, ...] = ()) -> TurnCompleted:
        """``inputs`` come before the user's message (a client tool's output);
        ``final_message`` False ends the output with its last call (a client tool);
        ``tail`` follows the assistant's message (items that break pairing there)."""
        rid = identity.response_id
        out: list[dict[str, Any]] = []
        if reasoning:
            out.append({"type": "reasoning", "id": f"rs-{rid}",
                        "summary": [{"type": "summary_text", "text": "thinking"}]})
        for call, result in tools:
            out += [call, result]
        out += list(extra_output)
        if final_message:
            out.append({"type": "message", "role": "assistant", "id": f"msg-{rid}",
                        "content": [{"type": "output_text", "text": f"re: {request_text}"}]})
        out += list(tail)
        user = {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": request_text}]}
        certified = status == "completed"
        artifact: TokenArtifact | None = None
        proof: BoundaryProof | None = None
        hashed = fp_hash(fingerprint)
        if certified and with_artifact:
            artifact, proof = make_artifact_and_proof(hashed, now_ms=now_ms())
            # Reusable for longer than any run (REUSE_TTL_MS): the oracle judges an
            # expiry that passes while the run reads only for the timed turns, which
            # stamp their own at the send (ratchet/chaos/timed.py).
            reusable_until = now_ms() + REUSE_TTL_MS
            artifact = artifact.model_copy(update={"artifact_id": f"art-{rid}-{attempt}",
                                                   "expires_at": reusable_until})
            proof = proof.model_copy(update={"expires_at": reusable_until})
        router_receipt = RouterReceipt(
            receipt_id=f"rcpt-{rid}-{attempt}", router_key_format=fingerprint.router_key_format,
            covered_tokens=artifact.token_count, expires_at=artifact.expires_at,
            issuer="chaos-router") if receipt and artifact is not None else None
        return turn_completed(
            identity, idempotency_key=key,
            # The logical request: the same for every retry of it (not the head, not the id).
            request={"model": FINGERPRINT.model_name, "input": request_text,
                     "scope": self.story.key},
            input_items=[*inputs, user], output_items=out, fingerprint=fingerprint,
            attempt=attempt, status=status,
            incomplete_reason="max_output_tokens" if status == "incomplete" else None,
            token_artifact=artifact, boundary_proof=proof, tool_effect_ids=effect_ids,
            gateway_id="chaos", expires_at=expires_at, router_receipt=router_receipt,
            truncation="auto" if truncated else "disabled", truncated=truncated,
            subturns=subturns,
        )

    def tool_call(self, rid: str, n: int) -> tuple[dict, dict]:
        city = self.rng.choice(WORDS)
        call = {"type": "function_call", "id": f"fc-{rid}-{n}", "call_id": f"call-{rid}-{n}",
                "name": "get_weather", "arguments": json.dumps({"city": city})}
        result = {"type": "function_call_output", "id": f"fco-{rid}-{n}",
                  "call_id": call["call_id"], "output": f"{self.rng.randint(-5, 35)} C in {city}"}
        return call, result

    def effect(self, identity: TurnIdentity, key: str, subturn: int, call: dict, result: dict,
               attempt: int = 1):
        return tool_effect(identity, idempotency_key=key, subturn_index=subturn, call=call,
                           output=result, attempt=attempt)


_FP_HASHES: dict[Fingerprint, str] = {}


def fp_hash(fingerprint: Fingerprint = FINGERPRINT) -> str:
    """The harness's own recipe (ratchet/chaos/recipes.py), not the product's: a
    product hash that drifted from the docs then disagrees with every turn's."""
    if fingerprint not in _FP_HASHES:
        _FP_HASHES[fingerprint] = recipes.fingerprint_hash(fingerprint)
    return _FP_HASHES[fingerprint]


def workload_fp_hash() -> str:
    """The fingerprint hash the checker asks histories with (the workload's model)."""
    return fp_hash(FINGERPRINT)
