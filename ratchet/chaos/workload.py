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

from ratchet.samples import make_artifact_and_proof, make_fingerprint
from schemas.models import (
    BoundaryProof,
    GatewayEvent,
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
WORDS = ("lyon", "rain", "train", "budget", "museum", "cheese", "river", "hotel", "map",
         "ticket", "bike", "wine", "bridge", "market", "opera", "sunday")
FINGERPRINT = make_fingerprint()


@dataclass(frozen=True)
class RawRecord:
    """Bytes produced as they are (not a gateway event): must end in a dead letter."""

    key: bytes
    value: bytes | None
    label: str


Event = GatewayEvent | RawRecord


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
    key = f"conv-{sid}" if kind == "conversation" else f"resp-{sid}-0"
    story = Story(index, sid, kind, tenant, key, path)
    (_conversation if kind == "conversation" else _chain)(story, rng)
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
             extra_output: tuple[dict, ...] = ()) -> TurnCompleted:
        rid = identity.response_id
        out: list[dict[str, Any]] = []
        if reasoning:
            out.append({"type": "reasoning", "id": f"rs-{rid}",
                        "summary": [{"type": "summary_text", "text": "thinking"}]})
        for call, result in tools:
            out += [call, result]
        out += list(extra_output)
        out.append({"type": "message", "role": "assistant", "id": f"msg-{rid}",
                    "content": [{"type": "output_text", "text": f"re: {request_text}"}]})
        user = {"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": request_text}]}
        certified = status == "completed"
        artifact: TokenArtifact | None = None
        proof: BoundaryProof | None = None
        fp_hash = _fp_hash()
        if certified:
            artifact, proof = make_artifact_and_proof(fp_hash, now_ms=now_ms())
            artifact = artifact.model_copy(update={"artifact_id": f"art-{rid}-{attempt}"})
        return turn_completed(
            identity, idempotency_key=key,
            # The logical request: the same for every retry of it (not the head, not the id).
            request={"model": FINGERPRINT.model_name, "input": request_text,
                     "scope": self.story.key},
            input_items=[user], output_items=out, fingerprint=FINGERPRINT, attempt=attempt,
            status=status,
            incomplete_reason="max_output_tokens" if status == "incomplete" else None,
            token_artifact=artifact, boundary_proof=proof, tool_effect_ids=effect_ids,
            gateway_id="chaos",
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


_FP_HASH: list[str] = []


def _fp_hash() -> str:
    if not _FP_HASH:
        from ratchet.domain.fingerprint import fingerprint_hash  # the gateway's helper

        _FP_HASH.append(fingerprint_hash(FINGERPRINT))
    return _FP_HASH[0]


def corrupt(turn: TurnCompleted) -> TurnCompleted:
    """One output item's bytes changed after its digest was computed."""
    item = turn.output_items[0]
    bad = item.model_copy(update={"content": item.content.replace(b"re: ", b"RE: ", 1) + b" "})
    return turn.model_copy(update={"output_items": (bad, *turn.output_items[1:])})


CONVERSATION_STEPS = {
    # scenario -> weight
    "normal": 30, "incomplete": 5, "not_promotable": 5, "corrupt": 3, "unknown_type": 3,
    "redelivery": 6, "gateway_retry": 5, "duplicate": 4, "key_reused": 4, "stale_head": 4,
    "ahead_of_head": 3, "cancel_before": 4, "cancel_after": 3, "race": 5, "tool_loop": 8,
    "orphan_retry": 4, "missing_effect": 3, "response_id_reused": 2,
}
# Chains whose first response is retried under another response id, racing it.
ROOT_RETRY_RATE = 0.1

CHAIN_STEPS = {
    "child": 30, "fork": 10, "incomplete": 5, "not_promotable": 5, "orphan_parent": 4,
    "redelivery": 6, "duplicate": 4, "corrupt": 3, "cancel_before": 4, "tool_loop": 6,
}


def _conversation(story: Story, rng: random.Random) -> None:
    gw = _Gateway(story, rng)
    head = 0
    promoted: list[tuple[str, str, str, int]] = []  # (rid, key, request text, event index)
    plain: list[tuple[str, str, str, int]] = []  # the promoted turns without tools
    last = None  # index of the last TurnCompleted
    names, weights = zip(*CONVERSATION_STEPS.items(), strict=True)
    for n in range(rng.randint(3, 10)):
        scenario = "normal" if n == 0 else rng.choices(names, weights)[0]
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
        elif scenario in ("tool_loop", "orphan_retry", "missing_effect"):
            last, ok = _tool_turn(story, gw, scenario, ident, key, text, rng)
            if ok:
                promoted.append((rid, key, text, last))
                head += 1
        elif scenario == "response_id_reused":
            prid, _, _, _ = rng.choice(promoted)
            last = story.add(scenario, gw.turn(gw.identity(prid, head), key, text))[0]
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


def _chain(story: Story, rng: random.Random) -> None:
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
    else:
        last = story.add("root", first)[0]
    sent.append((root, key, text, last))
    dead: list[str] = []  # rejected responses: children of these lack a parent
    names, weights = zip(*CHAIN_STEPS.items(), strict=True)
    for _ in range(rng.randint(2, 8)):
        scenario = rng.choices(names, weights)[0]
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
        elif scenario == "tool_loop":
            last, _ = _tool_turn(story, gw, scenario, ident, key, text, rng)
        nodes.append(rid)
        children[parent] = children.get(parent, 0) + 1
        sent.append((rid, key, text, last))


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
