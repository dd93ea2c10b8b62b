"""The oracle: what each produced event must lead to, from the CONTRACT rules (section 4).

Written apart from ``ratchet/domain`` on purpose (it imports no ratchet code but the
event models): if the processor and the oracle disagree, one of them is wrong, and
the report shows the event. It replays one story's events in the order they were
sent. A step's ``race`` events may land in Kafka in any order, so the oracle keeps one
**world** per possible order; the checker accepts a story when some world matches.

An event whose acceptable outcomes hold several rejections (it breaks several rules and
the contract fixes no order between them) accepts any of them.

Outcome signatures:
- ``("P", seq, certification, idempotency_key, request_digest, item_count)``: promoted;
- ``("R", reason, existing_response_id)``: rejected (``existing_response_id`` only for
  ``DUPLICATE``, which must name the original response; else None).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
from dataclasses import dataclass, field

from ratchet.chaos.workload import RawRecord, Story
from schemas.models import ToolEffect, TurnCancelled, TurnCompleted

# The Responses item types the workload sends as known (CONTRACT 3); anything else is
# UNKNOWN_ITEM_TYPE. Listed here, not imported: the oracle must not share the code's list.
KNOWN_TYPES = frozenset({"message", "reasoning", "function_call", "function_call_output"})
NEVER_PROMOTED = frozenset({"failed", "cancelled", "in_progress", "queued"})

Sig = tuple


@dataclass(frozen=True)
class Promo:
    response_id: str
    key: str
    digest: str
    seq: int
    # The complete history, in order: (item_id, type, sha256 of content) per item.
    items: tuple[tuple[str, str, str], ...]
    certification: str
    artifact: bool = False  # a reusable token artifact (else a certified read is NO_ARTIFACT)
    # The lineage its outcome record must name (the promoted event's own fields).
    conversation_id: str | None = None
    previous_response_id: str | None = None

    @property
    def read_as(self) -> tuple[str, str | None]:
        """Outcome and reason of its history, asked with the workload's fingerprint
        before any expiry (CONTRACT 5)."""
        if self.certification != "certified":
            return "fallback", "NOT_CERTIFIED"
        return ("certified", None) if self.artifact else ("fallback", "NO_ARTIFACT")

    @property
    def sig(self) -> Sig:
        return ("P", self.seq, self.certification, self.key, self.digest, len(self.items))


@dataclass
class World:
    """One possible history of a story."""

    promoted: dict[str, Promo] = field(default_factory=dict)  # response id -> promotion
    keys: dict[str, Promo] = field(default_factory=dict)  # idempotency key -> promotion
    head: int = 0
    head_items: tuple[tuple[str, str, str], ...] = ()
    effects: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # id -> key, call, out
    cancelled: set[str] = field(default_factory=set)  # idempotency keys
    decided: dict[int, frozenset[Sig]] = field(default_factory=dict)  # event index -> outcomes
    orphans: set[str] = field(default_factory=set)  # effect ids that must be published orphaned
    used: set[str] = field(default_factory=set)  # effect ids of promoted turns: never undone

    def fork(self) -> World:
        return copy.deepcopy(self)


@dataclass
class Expectation:
    """All the worlds of one story (one unless it raced)."""

    story: Story
    worlds: list[World]
    dead_letters: list[RawRecord]


def expect(story: Story) -> Expectation:
    if story.kind == "garbage":
        return Expectation(story, [World()], [e for e in story.events if isinstance(e, RawRecord)])
    worlds = [World()]
    for step in story.steps:
        orders = [step.sends + step.race]
        if step.race:
            orders = [step.sends[:-1] + p for p in
                      itertools.permutations((step.sends[-1], *step.race))]
        nxt = []
        for world in worlds:
            for order in orders:
                w = world.fork() if len(orders) > 1 else world
                for index in order:
                    _apply(w, story, index)
                nxt.append(w)
        worlds = nxt
    return Expectation(story, worlds, [])


def _apply(w: World, story: Story, index: int) -> None:
    ev = story.events[index]
    if isinstance(ev, ToolEffect):
        # Deduplicated by effect id: the first record wins.
        w.effects.setdefault(ev.effect_id, (ev.idempotency_key, ev.call_id,
                                            ev.output.content_digest))
    elif isinstance(ev, TurnCancelled):
        if ev.idempotency_key not in w.keys:  # a cancel after completion changes nothing
            w.cancelled.add(ev.idempotency_key)
    elif isinstance(ev, TurnCompleted):
        if index in w.decided:  # the same event again: its outcome never flips
            return
        w.decided[index] = _decide(w, story, ev)


def _decide(w: World, story: Story, ev: TurnCompleted) -> frozenset[Sig]:
    bound = w.keys.get(ev.idempotency_key)
    if bound is not None and bound.digest == ev.request_digest:
        if bound.response_id == ev.response_id:
            return frozenset({bound.sig})  # a retry: the original outcome again
        return _reject("DUPLICATE", bound.response_id)
    reasons = _invalid(w, ev)
    if reasons:
        if "CANCELLED" in reasons:
            _orphan_all(w, ev.idempotency_key)
        return frozenset(("R", r, None) for r in reasons)
    if bound is not None:
        return _reject("IDEMPOTENCY_KEY_REUSED")
    if ev.response_id in w.promoted:
        return _reject("CONFLICT")  # a response id is never bound twice
    if story.kind == "conversation":
        if ev.expected_head_seq < w.head:
            return _reject("CONFLICT")
        if ev.expected_head_seq > w.head:
            return _reject("OUT_OF_ORDER")
        seq, prior = w.head + 1, w.head_items
    else:
        if ev.previous_response_id is None:
            seq, prior = 1, ()
        elif ev.previous_response_id in w.promoted:
            parent = w.promoted[ev.previous_response_id]
            seq, prior = parent.seq + 1, parent.items
        else:
            return _reject("PARENT_NOT_PROMOTED")
    items = prior + tuple((i.item_id, i.type, i.content_digest)
                          for i in (*ev.input_items, *ev.output_items))
    certified = ev.status == "completed" and not ev.effective_config.truncated
    artifact = certified and ev.token_artifact is not None and ev.boundary_proof is not None
    promo = Promo(ev.response_id, ev.idempotency_key, ev.request_digest, seq, items,
                  "certified" if certified else "logical_only", artifact,
                  ev.conversation_id, ev.previous_response_id)
    w.promoted[ev.response_id] = promo
    w.keys[ev.idempotency_key] = promo
    if story.kind == "conversation":
        w.head, w.head_items = seq, items
    used = set(ev.tool_effect_ids)
    w.used |= used
    w.orphans |= {eid for eid, (key, _, _) in w.effects.items()
                  if key == ev.idempotency_key and eid not in used}
    return frozenset({promo.sig})


def _invalid(w: World, ev: TurnCompleted) -> set[str]:
    """Every rule the turn itself breaks (any of them is an acceptable reason)."""
    reasons = set()
    if ev.status in NEVER_PROMOTED:
        reasons.add("NOT_PROMOTABLE_STATUS")
    items = (*ev.input_items, *ev.output_items)
    if any(i.type not in KNOWN_TYPES for i in items):
        reasons.add("UNKNOWN_ITEM_TYPE")
    if any(hashlib.sha256(i.content).hexdigest() != i.content_digest for i in items):
        reasons.add("CORRUPT")
    if ev.idempotency_key in w.cancelled:
        reasons.add("CANCELLED")
    recorded = {eid: v for eid, v in w.effects.items() if v[0] == ev.idempotency_key}
    if any(eid not in recorded for eid in ev.tool_effect_ids):
        reasons.add("MISSING_TOOL_EFFECT")
    outputs = {call: out for eid, (_, call, out) in recorded.items() if eid in ev.tool_effect_ids}
    for item in items:
        if item.type == "function_call_output" and item.call_id in outputs \
                and outputs[item.call_id] != item.content_digest:
            reasons |= {"MISSING_TOOL_EFFECT", "DUPLICATE_TOOL_EFFECT"}
    return reasons


def _orphan_all(w: World, key: str) -> None:
    w.orphans |= {eid for eid, (k, _, _) in w.effects.items() if k == key}


def _reject(reason: str, existing: str | None = None) -> frozenset[Sig]:
    return frozenset({("R", reason, existing)})
