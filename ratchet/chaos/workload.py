"""The chaos workload: stories generated from a seed, the same in every process.

A **story** is what one gateway does on one partition key: a Conversation, a response
chain, or a run of undecodable records. It is a list of **steps**; a step is sent in
order by one producer, and a step's ``race`` events are sent at the same time by a
second producer (two gateways continuing one head): their order in Kafka is open.

Each story is drawn from its own ``random.Random(f"{seed}:{index}")``, so a producer
process regenerates exactly its share and the oracle regenerates everything, without
passing events around. Only ``event_id`` and timestamps differ between processes.
Ids carry the run ``tag`` so runs never collide on shared servers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from ratchet.chaos import recipes
from ratchet.chaos.claims import ClaimedRun, ClaimProbe, claimed_run, probe_claim
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
from services.gateway.events import (
    TurnIdentity,
    now_ms,
    tool_effect,
    turn_cancelled,
    turn_completed,
)

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


@dataclass
class Workload:
    seed: int
    tag: str
    stories: list[Story]

    @property
    def turns(self) -> int:
        return sum(s.turn_count for s in self.stories)


def generate(seed: int, turns: int, tag: str) -> Workload:
    """Stories until at least ``turns`` TurnCompleted sends; about 1 story in 25 is garbage."""
    stories: list[Story] = []
    total = 0
    index = 0
    while total < turns:
        story = build_story(seed, tag, index)
        stories.append(story)
        total += story.turn_count
        index += 1
    return Workload(seed, tag, stories)


def build_story(seed: int, tag: str, index: int) -> Story:
    rng = random.Random(f"{seed}:{index}")
    kind = rng.choices(["conversation", "chain", "garbage"], [60, 36, 4])[0]
    sid = f"{tag}-{index}"
    tenant = f"ten-{tag}-{index % 7}"
    path = "raw" if rng.random() < 0.3 else "gateway"
    if kind == "garbage":
        story = Story(index, sid, kind, tenant, f"dl-{sid}", "raw")
        _garbage(story, rng)
        return story
    if index % LARGE_EVERY == LARGE_AT:
        # A story with one large turn sends it as raw bytes: a gateway library that
        # refuses it before producing would stall the producer's round, while the
        # processor's refusal is an outcome the checker reports.
        path = "raw"
    key = f"conv-{sid}" if kind == "conversation" else f"resp-{sid}-0"
    story = Story(index, sid, kind, tenant, key, path)
    # The claims' contention roles draw from a stream of their own: the story's other
    # steps draw what they drew without them (their response ids, keys and heads shift).
    claims = random.Random(f"{seed}:{index}:claims")
    (_conversation if kind == "conversation" else _chain)(story, rng, claims)
    return story


# ------------------------------------------------------------------------ builders


class _Gateway:
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
        fp_hash = _fp_hash(fingerprint)
        if certified and with_artifact:
            artifact, proof = make_artifact_and_proof(fp_hash, now_ms=now_ms())
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


_FP_HASH: dict[Fingerprint, str] = {}


def _fp_hash(fingerprint: Fingerprint = FINGERPRINT) -> str:
    """The harness's own recipe (ratchet/chaos/recipes.py), not the product's: a
    product hash that drifted from the docs then disagrees with every turn's."""
    if fingerprint not in _FP_HASH:
        _FP_HASH[fingerprint] = recipes.fingerprint_hash(fingerprint)
    return _FP_HASH[fingerprint]


def workload_fp_hash() -> str:
    """The fingerprint hash the checker asks histories with (the workload's model)."""
    return _fp_hash(FINGERPRINT)


def corrupt(turn: TurnCompleted) -> TurnCompleted:
    """One output item's bytes changed after its digest was computed."""
    item = turn.output_items[0]
    bad = item.model_copy(update={"content": item.content.replace(b"re: ", b"RE: ", 1) + b" "})
    return turn.model_copy(update={"output_items": (bad, *turn.output_items[1:])})


def _broken(gw: _Gateway, how: str, ident: TurnIdentity, key: str, text: str) -> TurnCompleted:
    """A turn that breaks one rule of its own: a fingerprint that is not an identity, an
    item format this version does not know, or a boundary proof that proves nothing."""
    if how == "bad_fingerprint":
        return gw.turn(ident, key, text, fingerprint=MUTABLE_REVISION)
    turn = gw.turn(ident, key, text)
    if how == "unsupported_format":
        item = turn.output_items[-1].model_copy(update={"format_version": 7})
        return turn.model_copy(update={"output_items": (*turn.output_items[:-1], item)})
    proof, artifact = turn.boundary_proof, turn.token_artifact
    which = gw.rng.choice(BAD_PROOFS)
    other = _fp_hash(REDEPLOYED)
    if which == "other_fingerprint":
        return turn.model_copy(update={"boundary_proof": proof.model_copy(
            update={"fingerprint_hash": other})})
    if which == "counts":
        return turn.model_copy(update={"boundary_proof": proof.model_copy(
            update={"prefix_count": proof.prefix_count + 1})})
    return turn.model_copy(update={"token_artifact": artifact.model_copy(
        update={"fingerprint_hash": other})})


def _unpaired(gw: _Gateway, how: str, ident: TurnIdentity, key: str, text: str,
              calls: list[str]) -> TurnCompleted:
    """A turn whose items break pairing with the history they extend (CONTRACT 4)."""
    rid = ident.response_id
    call, result = gw.tool_call(rid, 0)
    if how == "output_without_call":
        return gw.turn(ident, key, text, extra_output=(result,))
    if how == "call_left_open":  # an unanswered call, then the assistant's message
        return gw.turn(ident, key, text, extra_output=(call,))
    if how == "reasoning_last":
        last = {"type": "reasoning", "id": f"rs-{rid}-last",
                "summary": [{"type": "summary_text", "text": "and then"}]}
        return gw.turn(ident, key, text, tail=(last,))
    # A call id the history already holds (or, with none yet, one used twice here).
    reused = calls[-1] if calls else call["call_id"]
    call2 = {**call, "id": f"fc-{rid}-r", "call_id": reused}
    result2 = {**result, "id": f"fco-{rid}-r", "call_id": reused}
    tools = [(call2, result2)] if calls else [(call, result), (call2, result2)]
    return gw.turn(ident, key, text, tools=tools)


CONVERSATION_STEPS = {
    # scenario -> weight
    "normal": 30, "incomplete": 5, "not_promotable": 5, "corrupt": 3, "unknown_type": 3,
    "redelivery": 6, "gateway_retry": 5, "duplicate": 4, "key_reused": 4, "stale_head": 4,
    "ahead_of_head": 3, "cancel_before": 4, "cancel_after": 3, "race": 5, "tool_loop": 8,
    "orphan_retry": 4, "missing_effect": 3, "response_id_reused": 2,
    # Rules a turn breaks by itself, and its pairing with the history it extends.
    "bad_fingerprint": 2, "unsupported_format": 2, "bad_proof": 2, "unpaired": 4,
    # Valid turns the rules must let through: a redeployed model, a client tool answered
    # by the next turn, a response id another tenant uses too.
    "redeployed": 3, "client_tool": 3, "foreign_rid": 2,
    # An effect recorded twice with different outputs; a response id raced on two
    # Conversations of one tenant (other partitions: either may bind it).
    "effect_conflict": 2, "rid_elsewhere": 2,
    # Another tenant's turn on this Conversation (TENANT_MISMATCH).
    "foreign_tenant": 2,
    # A tool turn produced before its effects (used if it carries their output).
    "late_effect": 2,
    # A turn whose logical expiry has passed when it is sent: promoted, read EXPIRED.
    "expired": 2,
    # A tool claimed and completed through the claims API (no ToolEffect), then its
    # turn; or an attempt's claim left behind by the attempt that was promoted.
    "claimed": 3, "claim_abandoned": 2,
    # A slow attempt's lease taken over by the next (at_least_once); a vanished attempt's
    # lease expired under at_most_once, the next attempt answering without the tool.
    "claim_takeover": 2, "claim_expired": 2,
    # Coverage of the contract beyond function calls (ratchet/chaos/workload.py, end):
    # item types of the catalogue with their pairing rules, a completed turn without a
    # token artifact (NO_ARTIFACT), a truncated one (NOT_CERTIFIED), router receipts,
    # gateway-tool rounds (subturns, ephemeral artifacts), and expiries a few seconds
    # after the send (ARTIFACT_EXPIRED, EXPIRED; ratchet/chaos/timed.py).
    **{"catalogue": 5, "catalogue_client": 2, "catalogue_unpaired": 3, "no_artifact": 3,
       "truncated": 3, "receipt": 3, "subturns": 3, "expiring": 3},
}
# Chains whose first response is retried under another response id, racing it.
ROOT_RETRY_RATE = 0.1

CHAIN_STEPS = {
    "child": 30, "fork": 10, "incomplete": 5, "not_promotable": 5, "orphan_parent": 4,
    "redelivery": 6, "duplicate": 4, "corrupt": 3, "cancel_before": 4, "tool_loop": 6,
    "unpaired": 3, "bad_proof": 2, "redeployed": 2, "foreign_parent": 2, "late_effect": 2,
    "expired": 2, "claimed": 3,
    **{"catalogue": 4, "no_artifact": 2, "truncated": 2, "receipt": 2, "expiring": 2},
}
# How long before it is sent an ``expired`` turn's logical expiry passed.
EXPIRED_AGO_MS = 60_000
UNPAIRED_KINDS = ("output_without_call", "call_left_open", "reasoning_last", "call_id_reused")
BAD_PROOFS = ("other_fingerprint", "counts", "artifact_other_fingerprint")


def _conversation(story: Story, rng: random.Random,
                  claims: random.Random | None = None) -> None:
    gw = _Gateway(story, rng)
    head = 0
    promoted: list[tuple[str, str, str, int]] = []  # (rid, key, request text, event index)
    plain: list[tuple[str, str, str, int]] = []  # the promoted turns without tools
    calls: list[str] = []  # call ids of promoted tool turns (one to reuse: UNPAIRED)
    last = None  # index of the last TurnCompleted
    names, weights = zip(*CONVERSATION_STEPS.items(), strict=True)
    for n in range(rng.randint(3, 10)):
        if claims is not None and n and claims.random() < CLAIM_ROLE_RATE:
            role = claims.choice(CONVERSATION_CLAIM_ROLES)
            head += _claim_role(story, gw, claims, role, gw.identity(gw.rid(), head))
        scenario = "normal" if n == 0 else rng.choices(names, weights)[0]
        if n == 1 and story.index % LARGE_EVERY == LARGE_AT:
            scenario = "large"
        rid, key, text = gw.rid(), gw.key(), gw.text()
        ident = gw.identity(rid, head)
        if scenario == "normal" or (scenario == "gateway_retry" and not plain) or (
                scenario in ("redelivery", "duplicate",
                                                 "key_reused", "response_id_reused",
                                                 "cancel_after") and not promoted):
            turn = gw.turn(ident, key, text, reasoning=rng.random() < 0.3)
            last = story.add("normal", turn)[0]
            promoted.append((rid, key, text, last))
            plain.append(promoted[-1])
            head += 1
        elif scenario == "incomplete":
            last = story.add(scenario, gw.turn(ident, key, text, status="incomplete"))[0]
            promoted.append((rid, key, text, last))
            plain.append(promoted[-1])
            head += 1
        elif scenario == "not_promotable":
            status = rng.choice(["failed", "in_progress", "queued", "cancelled"])
            last = story.add(f"status_{status}", gw.turn(ident, key, text, status=status))[0]
        elif scenario == "corrupt":
            last = story.add(scenario, corrupt(gw.turn(ident, key, text)))[0]
        elif scenario == "unknown_type":
            odd = {"type": UNKNOWN_TYPE, "id": f"odd-{rid}", "data": text}
            last = story.add(scenario, gw.turn(ident, key, text, extra_output=(odd,)))[0]
        elif scenario == "redelivery":
            story.resend(scenario, last if last is not None else promoted[-1][3])
        elif scenario == "gateway_retry":
            # The same request (key, digest, response id) sent again as a new event.
            prid, pkey, ptext, pidx = plain[-1]
            orig = story.events[pidx]
            again = gw.turn(gw.identity(prid, orig.expected_head_seq), pkey, ptext, attempt=2,
                            status=orig.status, reasoning=len(orig.output_items) > 1)
            story.add(scenario, again)
        elif scenario == "duplicate":
            _, pkey, ptext, _ = rng.choice(promoted)
            last = story.add(scenario, gw.turn(ident, pkey, ptext, attempt=2))[0]
        elif scenario == "key_reused":
            _, pkey, _, _ = rng.choice(promoted)
            last = story.add(scenario, gw.turn(ident, pkey, text + " again"))[0]
        elif scenario == "stale_head" and head >= 1:
            stale = gw.identity(rid, rng.randint(0, head - 1))
            last = story.add(scenario, gw.turn(stale, key, text))[0]
        elif scenario == "ahead_of_head":
            ahead = gw.identity(rid, head + rng.randint(1, 3))
            last = story.add(scenario, gw.turn(ahead, key, text))[0]
        elif scenario == "cancel_before":
            cancel = turn_cancelled(ident, idempotency_key=key)
            last = story.add(scenario, cancel, gw.turn(ident, key, text))[1]
        elif scenario == "cancel_after":
            prid, pkey, _, pidx = promoted[-1]
            orig = story.events[pidx]
            cancel = turn_cancelled(gw.identity(prid, orig.expected_head_seq), idempotency_key=pkey)
            story.add(scenario, cancel)
            story.resend("redelivery_after_cancel", pidx)
        elif scenario == "race":
            other_rid, other_key = gw.rid(), gw.key()
            a = gw.turn(ident, key, text)
            b = gw.turn(gw.identity(other_rid, head), other_key, text + " (other gateway)")
            last = story.add(scenario, a, race=(b,))[0]
            head += 1  # exactly one of the two wins
        elif scenario in ("tool_loop", "orphan_retry", "missing_effect", "effect_conflict",
                          "late_effect", "claimed", "claim_abandoned", "claim_takeover",
                          "claim_expired"):
            last, ok = _tool_turn(story, gw, scenario, ident, key, text, rng)
            if ok:
                promoted.append((rid, key, text, last))
                calls.append(f"call-{rid}-0")
                head += 1
        elif scenario == "response_id_reused":
            prid, _, _, _ = rng.choice(promoted)
            last = story.add(scenario, gw.turn(gw.identity(prid, head), key, text))[0]
        elif scenario in ("bad_fingerprint", "unsupported_format", "bad_proof"):
            last = story.add(scenario, _broken(gw, scenario, ident, key, text))[0]
        elif scenario == "unpaired":
            how = rng.choice(UNPAIRED_KINDS)
            last = story.add(f"unpaired_{how}", _unpaired(gw, how, ident, key, text, calls))[0]
        elif scenario == "redeployed":
            last = story.add(scenario, gw.turn(ident, key, text, fingerprint=REDEPLOYED))[0]
            promoted.append((rid, key, text, last))
            head += 1
        elif scenario == "client_tool":
            # The model calls a tool the client runs: the turn ends with the open call,
            # and the next turn starts with its output (CONTRACT 4, pairing).
            call, result = gw.tool_call(rid, 0)
            asked = gw.turn(ident, key, text, extra_output=(call,), final_message=False)
            last = story.add(scenario, asked)[0]
            promoted.append((rid, key, text, last))
            head += 1
            rid2, key2, text2 = gw.rid(), gw.key(), gw.text()
            answer = {**result, "id": f"fco-{rid2}-0"}
            last = story.add("client_tool_answer", gw.turn(gw.identity(rid2, head), key2, text2,
                                                           inputs=(answer,)))[0]
            promoted.append((rid2, key2, text2, last))
            head += 1
        elif scenario == "expired":
            # Expiry is per response (gateway-protocol.md section 8, "Logical expiry"):
            # promoted, its own reads answer EXPIRED, the next turn's history is whole.
            last = story.add(scenario, gw.turn(ident, key, text,
                                               expires_at=now_ms() - EXPIRED_AGO_MS))[0]
            promoted.append((rid, key, text, last))
            head += 1
        elif scenario == "foreign_rid":
            # The first response id of the story before, which is another tenant's: a
            # response id is bound once per tenant, so this one is free here.
            prev = f"{story.sid.rsplit('-', 1)[0]}-{story.index - 1}"
            ident = gw.identity(f"resp-{prev}-0", head)
            last = story.add(scenario, gw.turn(ident, key, text))[0]
            promoted.append((ident.response_id, key, text, last))
            head += 1
        elif scenario == "foreign_tenant":
            # The Conversation id is guessable; the tenant that promoted its first turn
            # owns it, and another tenant's turn on it (at its head, a fresh key and
            # response id) is refused before anything else is looked at.
            other = TurnIdentity.conversation(f"{story.tenant}-other", story.key, rid, head)
            last = story.add(scenario, gw.turn(other, key, text))[0]
        elif scenario == "rid_elsewhere":
            other = TurnIdentity.conversation(story.tenant, f"{story.key}-x{n}", rid, 0)
            a = gw.turn(ident, key, text)
            b = gw.turn(other, gw.key(), text + " (elsewhere)")
            last = story.add(scenario, a, race=(b,))[0]
            promoted.append((rid, key, text, last))
            head += 1  # in the order that sends it first; the oracle has both orders
        elif scenario in COVERAGE_SCENARIOS:
            for last, ok, said in _coverage(story, gw, scenario, ident, key, text, head):
                if ok:
                    promoted.append((story.events[last].response_id,
                                     story.events[last].idempotency_key, said, last))
                    head += 1
        else:  # stale_head at head 0: a normal turn instead
            last = story.add("normal", gw.turn(ident, key, text))[0]
            promoted.append((rid, key, text, last))
            head += 1


def _tool_turn(story: Story, gw: _Gateway, scenario: str, ident: TurnIdentity, key: str,
               text: str, rng: random.Random) -> tuple[int, bool]:
    """A gateway tool loop. Returns (index of the turn, whether it should promote)."""
    rid = ident.response_id
    if scenario == "missing_effect":
        call, result = gw.tool_call(rid, 0)
        never_sent = gw.effect(ident, key, 0, call, result)
        turn = gw.turn(ident, key, text, tools=[(call, result)], effect_ids=(never_sent.effect_id,))
        return story.add(scenario, turn)[0], False
    if scenario == "effect_conflict":
        # The tool ran twice under one effect id with different outputs (a gateway bug):
        # the effect is conflicted, the turn listing it never promotes, and the effect
        # is published orphaned for compensation.
        call, result = gw.tool_call(rid, 0)
        first = gw.effect(ident, key, 0, call, result)
        again = gw.effect(ident, key, 0, call, {**result, "output": result["output"] + "!"})
        assert again.effect_id == first.effect_id
        turn = gw.turn(ident, key, text, tools=[(call, result)], effect_ids=(first.effect_id,))
        return story.add(scenario, first, again, turn)[-1], False
    if scenario in ("claimed", "claim_abandoned"):
        call, result = gw.tool_call(rid, 0)
        run, item = claimed_run(ident, key, call, result["output"])
        if scenario == "claimed":
            # Claimed and completed through the API before the turn, which lists it and
            # carries its recorded output: used, never orphaned.
            turn = gw.turn(ident, key, text, tools=[(call, item)], effect_ids=(run.effect_id,))
            return story.add(scenario, run, turn)[-1], True
        # Attempt 1 claimed the tool and recorded its outcome, then its gateway died;
        # attempt 2 answered without the tool: the claim is orphaned by the promotion
        # (ATTEMPT_SUPERSEDED, effect_completed true).
        return story.add(scenario, run, gw.turn(ident, key, text, attempt=2))[-1], True
    if scenario == "claim_takeover":
        # Attempt 1 held the claim past its lease; attempt 2 took it over, ran the tool
        # and recorded the outcome its turn carries (ratchet/chaos/claims.py): used.
        call, result = gw.tool_call(rid, 0)
        run, item = claimed_run(ident, key, call, result["output"], attempt=2,
                                role="overtaken")
        turn = gw.turn(ident, key, text, attempt=2, tools=[(call, item)],
                       effect_ids=(run.effect_id,))
        return story.add(scenario, run, turn)[-1], True
    if scenario == "claim_expired":
        # Attempt 1 vanished inside the tool (no outcome); attempt 2 got LEASE_EXPIRED
        # (at_most_once) and answered without it: the claim is orphaned, "may or may
        # not have run" (effect_completed false).
        call, result = gw.tool_call(rid, 0)
        run, _ = claimed_run(ident, key, call, result["output"], attempt=2, role="expired")
        return story.add(scenario, run, gw.turn(ident, key, text, attempt=2))[-1], True
    if scenario == "late_effect":
        # The gateway produced the turn before its tools' ToolEffects (allowed, not
        # advised): the turn lists none. Each effect, recorded after the promotion, is
        # used if the turn carries its output under its call (never orphaned), else
        # orphaned ATTEMPT_SUPERSEDED (here: the tool ran again and answered otherwise).
        tools = [gw.tool_call(rid, n) for n in range(rng.randint(1, 2))]
        turn = gw.turn(ident, key, text, tools=tools, reasoning=rng.random() < 0.5)
        outputs = [r if rng.random() < 0.7 else {**r, "output": r["output"] + " (ran again)"}
                   for _, r in tools]
        effects = [gw.effect(ident, key, n, c, out)
                   for n, ((c, _), out) in enumerate(zip(tools, outputs, strict=True))]
        return story.add(scenario, turn, *effects)[0], True
    attempt = 1
    if scenario == "orphan_retry":
        # Attempt 1 ran a tool, then the gateway died; attempt 2 called another tool.
        call, result = gw.tool_call(rid, 90)
        story.add("orphan_attempt", gw.effect(ident, key, 0, call, result, attempt=1))
        attempt = 2
    tools = [gw.tool_call(rid, n) for n in range(rng.randint(1, 2))]
    effects = [gw.effect(ident, key, n, c, r, attempt=attempt) for n, (c, r) in enumerate(tools)]
    turn = gw.turn(ident, key, text, attempt=attempt, tools=tools,
                   effect_ids=tuple(e.effect_id for e in effects), reasoning=rng.random() < 0.5)
    idx = story.add(scenario, *effects, turn)
    if rng.random() < 0.4:  # an effect delivered twice: deduplicated, not a conflict
        story.events.append(effects[0])
        story.steps.insert(len(story.steps) - 1, Step((len(story.events) - 1,)))
        story.labels.insert(len(story.labels) - 1, "effect_redelivery")
    return idx[-1], True


def _chain(story: Story, rng: random.Random, claims: random.Random | None = None) -> None:
    gw = _Gateway(story, rng)
    root = gw.rid()
    assert root == story.key
    key, text = gw.key(), gw.text()
    nodes: list[str] = [root]  # responses that should be promoted
    children: dict[str, int] = {}
    sent: list[tuple[str, str, str, int]] = []  # (rid, key, text, event index) of promotable
    first = gw.turn(gw.identity(root), key, text)
    if rng.random() < ROOT_RETRY_RATE:
        # A gateway retry of the first response under another response id: its own
        # partition, so no order holds between the two (either may claim the request;
        # the other is DUPLICATE naming it, and the root's children then have no parent).
        retry = gw.turn(gw.identity(gw.rid()), key, text, attempt=2)
        last = story.add("root_retry", first, race=(retry,))[0]
        claims = None  # the root raced its retry: no response of the chain is sure
    else:
        last = story.add("root", first)[0]
        if claims is not None and claims.random() < ROOT_PROBE_RATE:
            _root_probe(story, gw, claims, first)
    sent.append((root, key, text, last))
    dead: list[str] = []  # rejected responses: children of these lack a parent
    names, weights = zip(*CHAIN_STEPS.items(), strict=True)
    for n in range(rng.randint(2, 8)):
        if claims is not None and claims.random() < CLAIM_ROLE_RATE:
            ident = gw.identity(gw.rid(), parent=nodes[-1])
            _claim_role(story, gw, claims, claims.choice(CHAIN_CLAIM_ROLES), ident)
        scenario = rng.choices(names, weights)[0]
        if n == 0 and story.index % LARGE_EVERY == LARGE_AT:
            scenario = "large"
        rid, key, text = gw.rid(), gw.key(), gw.text()
        if scenario == "fork":
            parent = rng.choice([n for n in nodes if children.get(n)] or nodes)
        elif scenario == "orphan_parent":
            parent = rng.choice(dead) if dead and rng.random() < 0.5 else f"never-{rid}"
        else:
            parent = rng.choice(nodes[-3:])
        ident = gw.identity(rid, parent=parent)
        if scenario in ("child", "fork"):
            last = story.add(scenario, gw.turn(ident, key, text, reasoning=rng.random() < 0.3))[0]
        elif scenario == "incomplete":
            last = story.add(scenario, gw.turn(ident, key, text, status="incomplete"))[0]
        elif scenario == "not_promotable":
            status = rng.choice(["failed", "in_progress"])
            last = story.add(f"status_{status}", gw.turn(ident, key, text, status=status))[0]
            dead.append(rid)
            continue
        elif scenario == "orphan_parent":
            last = story.add(scenario, gw.turn(ident, key, text))[0]
            dead.append(rid)
            continue
        elif scenario == "redelivery":
            story.resend(scenario, last)
            continue
        elif scenario == "duplicate":
            # Of a continued turn: the retry shares its partition, so Kafka orders the
            # two (the first response's retries race it: ``root_retry`` above).
            continued = [s for s in sent if story.events[s[3]].previous_response_id]
            if not continued:
                continue
            _, pkey, ptext, pidx = rng.choice(continued)
            prev = story.events[pidx].previous_response_id
            dup = gw.identity(rid, parent=prev)
            last = story.add(scenario, gw.turn(dup, pkey, ptext, attempt=2))[0]
            continue
        elif scenario == "corrupt":
            last = story.add(scenario, corrupt(gw.turn(ident, key, text)))[0]
            dead.append(rid)
            continue
        elif scenario == "cancel_before":
            cancel = turn_cancelled(ident, idempotency_key=key)
            last = story.add(scenario, cancel, gw.turn(ident, key, text))[1]
            dead.append(rid)
            continue
        elif scenario in ("tool_loop", "late_effect", "claimed"):
            last, _ = _tool_turn(story, gw, scenario, ident, key, text, rng)
        elif scenario == "redeployed":
            last = story.add(scenario, gw.turn(ident, key, text, fingerprint=REDEPLOYED))[0]
        elif scenario in COVERAGE_SCENARIOS:
            (last, ok, _), = _coverage(story, gw, scenario, ident, key, text, None)
            if not ok:
                dead.append(rid)
                continue
        elif scenario == "expired":
            last = story.add(scenario, gw.turn(ident, key, text,
                                               expires_at=now_ms() - EXPIRED_AGO_MS))[0]
        elif scenario == "foreign_parent":
            # Another tenant's child of one of this chain's responses (ids are
            # guessable): the parent is not in that tenant's partition, and the tenant
            # that promoted it owns it (TENANT_MISMATCH; never promoted:
            # PARENT_NOT_PROMOTED). Its chain_root_id is the story's Kafka key: ordered
            # after the parent's own turn.
            other = TurnIdentity.chain(f"{story.tenant}-other", rid, previous_response_id=parent,
                                       chain_root_id=story.key)
            last = story.add(scenario, gw.turn(other, key, text))[0]
            continue
        elif scenario in ("unpaired", "bad_proof"):
            turn = (_unpaired(gw, rng.choice(UNPAIRED_KINDS), ident, key, text, [])
                    if scenario == "unpaired" else _broken(gw, scenario, ident, key, text))
            last = story.add(scenario, turn)[0]
            dead.append(rid)
            continue
        nodes.append(rid)
        children[parent] = children.get(parent, 0) + 1
        sent.append((rid, key, text, last))


# ------------------------------------------------------------ claims' contention roles

# Per step of a story (a Conversation's after its first turn, a chain's): the chance of
# one of these roles (ratchet/chaos/claims.py), each a new request of its own.
CLAIM_ROLE_RATE = 0.07
CONVERSATION_CLAIM_ROLES = ("claim_contended", "claim_conflict", "claim_promoted",
                            "claim_cancelled")
CHAIN_CLAIM_ROLES = ("claim_contended", "claim_conflict", "claim_promoted")
# A chain whose first response is not raced: the chance that a retry of the first
# response, under another response id, claims once it is promoted.
ROOT_PROBE_RATE = 0.25


def _claim_call(rid: str, rng: random.Random, n: int = 0) -> tuple[dict, dict]:
    """``_Gateway.tool_call`` drawn from ``rng`` (the claims' stream)."""
    city = rng.choice(WORDS)
    call = {"type": "function_call", "id": f"fc-{rid}-{n}", "call_id": f"call-{rid}-{n}",
            "name": "get_weather", "arguments": json.dumps({"city": city})}
    result = {"type": "function_call_output", "id": f"fco-{rid}-{n}",
              "call_id": call["call_id"], "output": f"{rng.randint(-5, 35)} C in {city}"}
    return call, result


def _claim_role(story: Story, gw: _Gateway, rng: random.Random, role: str,
                ident: TurnIdentity) -> int:
    """One claims role on a new request at ``ident`` (a Conversation's head, or a child
    of a chain's promoted response). Returns 1 if its turn is promoted, else 0.

    - ``claim_contended``: attempt 1 holds the claim while attempt 2 claims
      (IN_PROGRESS), then reuses its output (COMPLETED); attempt 2's turn carries it.
    - ``claim_conflict``: attempt 2 claims attempt 1's place with other arguments
      (CONFLICT), during attempt 1's run (``claim_conflict_live``) or after; attempt 1's
      turn carries its output.
    - ``claim_promoted``: a plain turn, then attempt 2 of its request claims once it
      stands promoted (PROMOTED, naming it and its request digest).
    - ``claim_cancelled``: attempt 1 claims and records a tool, then the request is
      cancelled and attempt 1's turn is rejected CANCELLED (the claim orphaned
      TURN_CANCELLED); attempt 2 then claims that tool (COMPLETED, the recorded output)
      and a new one (CANCELLED)."""
    rid, key = ident.response_id, gw.key()
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6)))
    call, result = _claim_call(rid, rng)
    if role == "claim_contended":
        run, item = claimed_run(ident, key, call, result["output"], attempt=2,
                                role="contended",
                                variant=rng.choice(("at_least_once", "")))
        turn = gw.turn(ident, key, text, attempt=2, tools=[(call, item)],
                       effect_ids=(run.effect_id,))
        story.add(role, run, turn)
        return 1
    if role == "claim_conflict":
        variant = rng.choice(("live", ""))
        run, item = claimed_run(ident, key, call, result["output"], role="conflicted",
                                variant=variant)
        turn = gw.turn(ident, key, text, tools=[(call, item)], effect_ids=(run.effect_id,))
        story.add(f"{role}_live" if variant else role, run, turn)
        return 1
    if role == "claim_promoted":
        turn = gw.turn(ident, key, text)
        story.add(role, turn)
        story.add("claim_promoted_probe", ClaimProbe(
            ident, key, 2, (probe_claim(key, 0, call, "PROMOTED"),), "promoted", rid,
            "promoted", rid, turn.request_digest))
        return 1
    if role != "claim_cancelled":
        raise ValueError(role)
    run, item = claimed_run(ident, key, call, result["output"])
    turn = gw.turn(ident, key, text, tools=[(call, item)], effect_ids=(run.effect_id,))
    story.add(role, run, turn_cancelled(ident, idempotency_key=key), turn)
    other, _ = _claim_call(rid, rng, 1)
    story.add("claim_cancelled_probe", ClaimProbe(
        ident, key, 2, (probe_claim(key, 0, call, "COMPLETED"),
                        probe_claim(key, 1, other, "CANCELLED")), "cancelled", rid, "rejected"))
    return 0


def _root_probe(story: Story, gw: _Gateway, rng: random.Random,
                first: TurnCompleted) -> None:
    """A retry of the chain's first request under another response id (its own
    partition, ``response_id`` = ``partition_key``) claims once the first response is
    promoted: PROMOTED, naming it (gateway-protocol.md section 8, "for a chain's first
    response")."""
    retry = TurnIdentity.chain(story.tenant, gw.rid())
    call, _ = _claim_call(retry.response_id, rng)
    story.add("claim_promoted_root", ClaimProbe(
        retry, first.idempotency_key, 2,
        (probe_claim(first.idempotency_key, 0, call, "PROMOTED"),), "promoted",
        first.response_id, "promoted", first.response_id, first.request_digest))


def _garbage(story: Story, rng: random.Random) -> None:
    """Undecodable records (each must become a dead letter, keyed and byte for byte)."""
    key = story.key.encode()
    for n in range(rng.randint(1, 4)):
        label = rng.choice(["bad_magic", "unknown_schema_id", "short_header", "null_value"])
        body = f"chaos {story.sid} {n}".encode()
        value = {
            "bad_magic": b"\x07" + body,
            "unknown_schema_id": b"\x00" + (2_000_000_000 + story.index).to_bytes(4, "big") + body,
            "short_header": b"\x00\x00",
            "null_value": None,
        }[label]
        story.add(label, RawRecord(key, value, label))


# ------------------------------------------------------------------- coverage turns
#
# Turns the contract defines an outcome for beyond the function-call tool loop: each
# builder returns [(event index of a TurnCompleted, whether it promotes)] and the oracle
# (ratchet/chaos/oracle.py) predicts the outcome and every read from the event alone.

COVERAGE_SCENARIOS = frozenset({"catalogue", "catalogue_client", "catalogue_unpaired",
                                "no_artifact", "truncated", "receipt", "subturns",
                                "expiring", "large"})
# Item groups of the catalogue (contracts.md section 7, docs/gateway-protocol.md section
# 5): self-contained items, and calls with the output of their own type.
SELF_CONTAINED = ("web_search", "file_search", "code_interpreter", "image_generation",
                  "mcp_list_tools", "mcp_call", "compaction")
CALL_KINDS = ("custom_tool", "computer", "local_shell", "shell", "apply_patch")
CLIENT_KINDS = (*CALL_KINDS, "mcp_approval")
UNPAIRED_CATALOGUE = ("wrong_output_type", "approval_unknown", "open_call_then_message",
                      "call_id_across_types", "approval_twice")
# How long after its send a timed turn's receipt, artifact or logical expiry passes.
TIMED_MS = 3000
TIMED_KINDS = ("receipt", "artifact", "logical")
# One story in LARGE_EVERY (at index LARGE_AT) sends a turn of about LARGE_BYTES of items
# (the contract promises 8 MiB; this is enough to catch a lowered bound, cheaply).
LARGE_EVERY, LARGE_AT, LARGE_BYTES = 40, 7, 1 << 20


def catalogue_call(rid: str, kind: str, n: int, rng: random.Random) -> dict:
    """The call (or approval request) of a ``CLIENT_KINDS`` group."""
    p, word = f"{rid}-{kind}-{n}", rng.choice(WORDS)
    cid = f"call-{p}"
    return {
        "custom_tool": {"type": "custom_tool_call", "id": f"ct-{p}", "call_id": cid,
                        "name": "grep", "input": word},
        "computer": {"type": "computer_call", "id": f"cc-{p}", "call_id": cid,
                     "action": {"type": "click", "x": 3, "y": 4, "button": "left"},
                     "pending_safety_checks": [], "status": "completed"},
        "local_shell": {"type": "local_shell_call", "id": f"ls-{p}", "call_id": cid,
                        "action": {"type": "exec", "command": ["ls", word], "env": {}},
                        "status": "completed"},
        "shell": {"type": "shell_call", "id": f"sh-{p}", "call_id": cid,
                  "action": {"commands": [f"grep {word}"]}, "status": "completed"},
        "apply_patch": {"type": "apply_patch_call", "id": f"ap-{p}", "call_id": cid,
                        "operation": {"type": "update_file", "path": f"{word}.txt",
                                      "diff": f"-{word}\n+{word}!"},
                        "status": "completed"},
        "mcp_approval": {"type": "mcp_approval_request", "id": f"ar-{p}",
                         "server_label": "docs", "name": "delete",
                         "arguments": json.dumps({"what": word})},
    }[kind]


def catalogue_answer(call: dict, rid: str, rng: random.Random) -> dict:
    """The item answering ``call`` (its type's output, or the approval response)."""
    if call["type"] == "mcp_approval_request":
        return {"type": "mcp_approval_response", "id": f"resp-of-{call['id']}-{rid}",
                "approval_request_id": call["id"], "approve": rng.random() < 0.5}
    out = {"type": call["type"] + "_output", "id": f"out-{call['id']}-{rid}",
           "call_id": call["call_id"]}
    if call["type"] == "computer_call":
        out["output"] = {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA=="}
    elif call["type"] == "shell_call":
        out["output"] = [{"stdout": "ok", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
    else:
        out["output"] = f"done: {rng.choice(WORDS)}"
    return out


def catalogue_items(rid: str, kind: str, n: int, rng: random.Random) -> list[dict]:
    """One group of items of ``kind`` (a self-contained item, or a call and its answer)."""
    if kind in CLIENT_KINDS:
        call = catalogue_call(rid, kind, n, rng)
        return [call, catalogue_answer(call, rid, rng)]
    p, word = f"{rid}-{kind}-{n}", rng.choice(WORDS)
    return [{
        "web_search": {"type": "web_search_call", "id": f"ws-{p}", "status": "completed",
                       "action": {"type": "search", "query": word}},
        "file_search": {"type": "file_search_call", "id": f"fs-{p}", "status": "completed",
                        "queries": [word], "results": None},
        "code_interpreter": {"type": "code_interpreter_call", "id": f"ci-{p}",
                             "status": "completed", "code": f"print({word!r})",
                             "container_id": "cntr-chaos", "outputs": [{"type": "logs",
                                                                        "logs": word}]},
        "image_generation": {"type": "image_generation_call", "id": f"ig-{p}",
                             "status": "completed", "result": "aGVsbG8="},
        "mcp_list_tools": {"type": "mcp_list_tools", "id": f"ml-{p}", "server_label": "docs",
                           "tools": [{"name": "search", "input_schema": {"type": "object"}}]},
        "mcp_call": {"type": "mcp_call", "id": f"mc-{p}", "server_label": "docs",
                     "name": "search", "arguments": json.dumps({"q": word}), "output": word},
        "compaction": {"type": "compaction", "id": f"cp-{p}",
                       "encrypted_content": f"gAAAA-chaos-{word}"},
    }[kind]]


def _unpaired_catalogue(rid: str, how: str, rng: random.Random) -> list[dict]:
    """Output items that break one pairing rule of the catalogue (UNPAIRED_TOOL_CALL)."""
    if how == "wrong_output_type":  # a custom tool's output answering a function call
        call = {"type": "function_call", "id": f"fc-{rid}-w", "call_id": f"call-{rid}-w",
                "name": "get_weather", "arguments": "{}"}
        return [call, {"type": "custom_tool_call_output", "id": f"cto-{rid}-w",
                       "call_id": call["call_id"], "output": "sunny"}]
    if how == "approval_unknown":  # a response to a request nobody made
        return [{"type": "mcp_approval_response", "id": f"arr-{rid}-u",
                 "approval_request_id": f"ar-never-{rid}", "approve": True}]
    if how == "open_call_then_message":  # an open call, then the assistant's message
        return [catalogue_call(rid, rng.choice(CLIENT_KINDS), 0, rng)]
    if how == "approval_twice":  # one request answered twice
        call = catalogue_call(rid, "mcp_approval", 0, rng)
        answer = catalogue_answer(call, rid, rng)
        return [call, answer, {**answer, "id": answer["id"] + "-again"}]
    # One call id used by two call types.
    first = catalogue_items(rid, "custom_tool", 0, rng)
    second = catalogue_items(rid, "local_shell", 1, rng)
    cid = first[0]["call_id"]
    return first + [{**second[0], "call_id": cid}, {**second[1], "call_id": cid}]


def _large_output(rid: str, rng: random.Random) -> tuple[dict, ...]:
    """About ``LARGE_BYTES`` of assistant messages (16 items)."""
    size = LARGE_BYTES // 16
    out = []
    for n in range(16):
        words, total = [], 0
        while total < size:
            w = rng.choice(WORDS)
            words.append(w)
            total += len(w) + 1
        out.append({"type": "message", "role": "assistant", "id": f"big-{rid}-{n}",
                    "content": [{"type": "output_text", "text": " ".join(words)}]})
    return tuple(out)


def _coverage(story: Story, gw: _Gateway, scenario: str, ident: TurnIdentity, key: str,
              text: str, head: int | None) -> list[tuple[int, bool, str]]:
    """Build one coverage scenario; ``head`` is the Conversation's (None in a chain).
    Returns (event index, whether it promotes, its request text) per turn."""
    rng, rid = gw.rng, ident.response_id
    if scenario == "catalogue":
        kinds = rng.sample((*SELF_CONTAINED, *CLIENT_KINDS), rng.randint(2, 4))
        items = [i for n, k in enumerate(kinds) for i in catalogue_items(rid, k, n, rng)]
        turn = gw.turn(ident, key, text, extra_output=tuple(items),
                       reasoning=rng.random() < 0.3)
        return [(story.add(scenario, turn)[0], True, text)]
    if scenario == "catalogue_client":
        # The model calls a tool the client runs (or asks an approval): the turn ends
        # with the open call, the next turn starts with its answer.
        kind = rng.choice(CLIENT_KINDS)
        call = catalogue_call(rid, kind, 0, rng)
        asked = story.add(scenario, gw.turn(ident, key, text, extra_output=(call,),
                                            final_message=False))[0]
        rid2, key2, text2 = gw.rid(), gw.key(), gw.text()
        answer = catalogue_answer(call, rid2, rng)
        nxt = gw.turn(gw.identity(rid2, head + 1), key2, text2, inputs=(answer,))
        return [(asked, True, text), (story.add(f"{scenario}_answer", nxt)[0], True, text2)]
    if scenario == "catalogue_unpaired":
        how = rng.choice(UNPAIRED_CATALOGUE)
        turn = gw.turn(ident, key, text, extra_output=tuple(_unpaired_catalogue(rid, how, rng)))
        return [(story.add(f"unpaired_{how}", turn)[0], False, text)]
    if scenario == "no_artifact":
        # Completed and certified, with no token artifact to reuse: reads fall back
        # NO_ARTIFACT with the whole history.
        return [(story.add(scenario, gw.turn(ident, key, text, with_artifact=False))[0], True, text)]
    if scenario == "truncated":
        # truncation=auto and the history was truncated: promoted logical_only.
        return [(story.add(scenario, gw.turn(ident, key, text, truncated=True))[0], True, text)]
    if scenario == "receipt":
        return [(story.add(scenario, gw.turn(ident, key, text, receipt=True))[0], True, text)]
    if scenario == "subturns":
        # Two gateway-tool rounds, each with its ephemeral artifact (never promoted) and
        # its effect, listed by its subturn only (the union of the lists is what counts).
        tools = [gw.tool_call(rid, n) for n in range(2)]
        effects = [gw.effect(ident, key, n, c, r) for n, (c, r) in enumerate(tools)]
        rounds = tuple(Subturn(index=n, ephemeral_artifact_ref=f"eph-{rid}-{n}",
                               effect_ids=(e.effect_id,)) for n, e in enumerate(effects))
        turn = gw.turn(ident, key, text, tools=tools, subturns=rounds)
        return [(story.add(scenario, *effects, turn)[-1], True, text)]
    if scenario == "expiring":
        what = rng.choice(TIMED_KINDS)
        turn = gw.turn(ident, key, text, receipt=what == "receipt")
        index = story.add(f"expiring_{what}", turn)[0]
        story.timed[index] = (what, TIMED_MS)
        return [(index, True, text)]
    assert scenario == "large"
    turn = gw.turn(ident, key, text, extra_output=_large_output(rid, rng))
    return [(story.add(scenario, turn)[0], True, text)]
