"""The chaos workload: stories generated from a seed, the same in every process.

A **story** (``ratchet.chaos.story``) is what one gateway does on one partition key: a
Conversation, a response chain, or a run of undecodable records; this module draws
which stories a run holds and what each one does. The coverage turns are
``ratchet.chaos.coverage``.

Each story is drawn from its own ``random.Random(f"{seed}:{index}")``, so a producer
process regenerates exactly its share and the oracle regenerates everything, without
passing events around. Only ``event_id`` and timestamps differ between processes.
Ids carry the run ``tag`` so runs never collide on shared servers.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from ratchet.chaos.claims import ClaimProbe, claimed_run, probe_claim
from ratchet.chaos.coverage import COVERAGE_SCENARIOS, LARGE_AT, LARGE_EVERY, coverage_turns
from ratchet.chaos.story import (
    MUTABLE_REVISION,
    REDEPLOYED,
    UNKNOWN_TYPE,
    WORDS,
    RawRecord,
    Step,
    Story,
    StoryGateway,
    fp_hash,
)
from schemas.models import TurnCompleted
from services.gateway.events import TurnIdentity, now_ms, turn_cancelled


@dataclass
class Workload:
    seed: int
    tag: str
    stories: list[Story]

    @property
    def turns(self) -> int:
        return sum(s.turn_count for s in self.stories)

    @property
    def shared_keys(self) -> list[tuple[Story, Story]]:
        """(Conversation story, chain story) pairs of one tenant and one partition key
        (``shared_key_partner``; a partner beyond the last story was not generated)."""
        chains = {(s.tenant, s.key): s for s in self.stories if s.kind == "chain"}
        return [(s, chains[(s.tenant, s.key)]) for s in self.stories
                if s.kind == "conversation" and (s.tenant, s.key) in chains]


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


# A Conversation whose id is the first response id of a chain of its tenant
# (docs/store.md, "Two histories in one partition"): one Kafka key, one store partition,
# two histories. A Conversation story's partner is the story ``SHARED_KEY_STRIDE``
# indices on (same tenant: ``index % 7``), after it when ``index // 7`` is even, else
# before it, so the chain's first turn is sent after the Conversation's or before it
# (the producers interleave the two: their Kafka order is open, and the oracle needs
# none, each story's outcomes being what they are without the other). The direction
# rule gives each chain at most one partner. Drawn from a stream of its own
# (``<seed>:<index>:shared``): every other draw of the story is what it was without it.
SHARED_KEY_RATE = 0.25  # of the Conversation stories whose partner is a chain
SHARED_KEY_STRIDE = 7


def _kind(rng: random.Random) -> str:
    """A story's kind: its stream's first draw."""
    return rng.choices(["conversation", "chain", "garbage"], [60, 36, 4])[0]


def shared_key_partner(seed: int, index: int) -> int | None:
    """The index of the chain story whose first response id is the id of Conversation
    story ``index``'s Conversation, or None (not a Conversation story, or not drawn)."""
    if _kind(random.Random(f"{seed}:{index}")) != "conversation":
        return None
    step = SHARED_KEY_STRIDE if (index // SHARED_KEY_STRIDE) % 2 == 0 else -SHARED_KEY_STRIDE
    partner = index + step
    if partner < 0 or _kind(random.Random(f"{seed}:{partner}")) != "chain":
        return None
    if random.Random(f"{seed}:{index}:shared").random() >= SHARED_KEY_RATE:
        return None
    return partner


def chain_root_id(tag: str, index: int) -> str:
    """The first response id of chain story ``index`` (its partition key)."""
    return f"resp-{tag}-{index}-0"


def build_story(seed: int, tag: str, index: int) -> Story:
    rng = random.Random(f"{seed}:{index}")
    kind = _kind(rng)
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
    if kind == "chain":
        key = chain_root_id(tag, index)
    else:
        partner = shared_key_partner(seed, index)
        key = f"conv-{sid}" if partner is None else chain_root_id(tag, partner)
    story = Story(index, sid, kind, tenant, key, path)
    # The claims' contention roles draw from a stream of their own: the story's other
    # steps draw what they drew without them (their response ids, keys and heads shift).
    claims = random.Random(f"{seed}:{index}:claims")
    (_conversation if kind == "conversation" else _chain)(story, rng, claims)
    return story


def corrupt(turn: TurnCompleted) -> TurnCompleted:
    """One output item's bytes changed after its digest was computed."""
    item = turn.output_items[0]
    bad = item.model_copy(update={"content": item.content.replace(b"re: ", b"RE: ", 1) + b" "})
    return turn.model_copy(update={"output_items": (bad, *turn.output_items[1:])})


def _broken(gw: StoryGateway, how: str, ident: TurnIdentity, key: str, text: str) -> TurnCompleted:
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
    other = fp_hash(REDEPLOYED)
    if which == "other_fingerprint":
        return turn.model_copy(update={"boundary_proof": proof.model_copy(
            update={"fingerprint_hash": other})})
    if which == "counts":
        return turn.model_copy(update={"boundary_proof": proof.model_copy(
            update={"prefix_count": proof.prefix_count + 1})})
    return turn.model_copy(update={"token_artifact": artifact.model_copy(
        update={"fingerprint_hash": other})})


def _unpaired(gw: StoryGateway, how: str, ident: TurnIdentity, key: str, text: str,
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
    # Coverage of the contract beyond function calls (ratchet/chaos/coverage.py):
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
    gw = StoryGateway(story, rng)
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
            for last, ok, said in coverage_turns(story, gw, scenario, ident, key, text, head):
                if ok:
                    promoted.append((story.events[last].response_id,
                                     story.events[last].idempotency_key, said, last))
                    head += 1
        else:  # stale_head at head 0: a normal turn instead
            last = story.add("normal", gw.turn(ident, key, text))[0]
            promoted.append((rid, key, text, last))
            head += 1


def _tool_turn(story: Story, gw: StoryGateway, scenario: str, ident: TurnIdentity, key: str,
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
    gw = StoryGateway(story, rng)
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
            (last, ok, _), = coverage_turns(story, gw, scenario, ident, key, text, None)
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
    """``StoryGateway.tool_call`` drawn from ``rng`` (the claims' stream)."""
    city = rng.choice(WORDS)
    call = {"type": "function_call", "id": f"fc-{rid}-{n}", "call_id": f"call-{rid}-{n}",
            "name": "get_weather", "arguments": json.dumps({"city": city})}
    result = {"type": "function_call_output", "id": f"fco-{rid}-{n}",
              "call_id": call["call_id"], "output": f"{rng.randint(-5, 35)} C in {city}"}
    return call, result


def _claim_role(story: Story, gw: StoryGateway, rng: random.Random, role: str,
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


def _root_probe(story: Story, gw: StoryGateway, rng: random.Random,
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
