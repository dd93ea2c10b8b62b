"""The checker: what was observed on the public surfaces against the oracle.

Observations come only from the output topics (promotions, rejections, orphaned
effects, dead letters) and the HTTP API (histories, ``wait_ms`` answers). Two kinds of
checks:

1. **Invariants of the observations alone** (no oracle needed): a response promoted
   with two different contents, an idempotency key promoted under two responses, a
   Conversation seq used twice or skipped, a chain response whose seq is not its
   parent's + 1, a rejection without a reason, an answer to another tenant that is not
   ``NOT_FOUND``.
2. **Against the workload**: an outcome record for a response nobody sent (or under
   another tenant), a dead letter of a record that was not undecodable, an event
   without its own outcome record (a retry or a redelivery answered by nobody).
3. **Against the oracle**, per story, in the world (race order) that fits best: every
   turn decided, decided as the rules say (promotion, seq, certification, lineage,
   reason, the original response of a DUPLICATE); every history answer (the response
   endpoint, the Conversation endpoint, ``wait_ms``) with the outcome and reason the
   rules give, the response's id and seq, and the complete history in order (item ids,
   types and digests recomputed from the returned content); a failure for every
   response never promoted; no ``wait_ms`` answer "not promoted" asked after the
   promotion was published; orphaned effects published, and none that a promoted turn
   used published with a final reason; undecodable records dead-lettered byte for byte.

Not checked here: the order of outcome records within a partition (the reader does not
keep offsets), and the rules the workload never exercises (docs/chaos.md).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from ratchet.chaos.oracle import Expectation, Promo, Sig, World
from schemas.models import TurnCompleted

VIOLATION_CLASSES = (
    "promotion_should_not_exist", "duplicate_promotion", "conflicting_outcome_records",
    "never_decided", "seq_gap", "seq_repeat", "wrong_reason", "rejection_without_reason",
    "valid_turn_rejected", "promotion_mismatch", "history_mismatch", "orphan_missing",
    "dead_letter_missing", "outcome_missing", "unexpected_outcome", "unexpected_dead_letter",
    "orphan_of_used_effect", "stale_wait", "tenant_leak", "orphan_said_completed",
    "claim_answer_wrong", "effect_executed_twice", "claim_output_mismatch",
)
# The classes of the claim checks the producers make (``ratchet/chaos/claims.py``,
# ``Finding.logged``: the class tag first in the logged detail).
CLAIM_CLASSES = ("claim_answer_wrong", "effect_executed_twice", "claim_output_mismatch")

# Orphan reasons that tell the gateway to compensate (docs/gateway-protocol.md, "When to
# compensate"): an effect a promoted turn used must never carry one.
FINAL_ORPHAN_REASONS = frozenset({"ATTEMPT_SUPERSEDED", "TURN_CANCELLED", "EFFECT_CONFLICT"})
# The fingerprint hash some histories are asked with besides the workload's: a model
# nobody deployed.
OTHER_FINGERPRINT = "f" * 64
# What a history answer for a response that was never promoted may say.
NEVER_PROMOTED_REASONS = frozenset({"NOT_PROMOTED", "NOT_FOUND"})


@dataclass(frozen=True)
class Promoted:
    tenant: str
    response_id: str
    conversation_id: str | None
    previous_response_id: str | None
    seq: int
    certification: str
    key: str
    digest: str
    item_count: int
    at_ms: int  # when the record was appended to its topic

    @property
    def sig(self) -> Sig:
        return ("P", self.seq, self.certification, self.key, self.digest, self.item_count)


@dataclass(frozen=True)
class Rejected:
    tenant: str
    response_id: str
    reason: str | None
    existing_response_id: str | None
    at_ms: int

    @property
    def sig(self) -> Sig:
        existing = self.existing_response_id if self.reason == "DUPLICATE" else None
        return ("R", self.reason, existing)


@dataclass(frozen=True)
class History:
    """One HTTP history answer: outcome, reason, the items in order as (item_id, type,
    sha256 recomputed from the returned content), the response it names and its
    ``head_seq``, and ``faults``: what the answer contradicts in itself (an item's
    digest field that is not its content's, a checkpoint of another seq or
    fingerprint, a certified answer without an artifact)."""

    outcome: str
    reason: str | None
    items: tuple[tuple[str, str, str], ...]
    response_id: str | None = None
    head_seq: int | None = None
    faults: tuple[str, ...] = ()


@dataclass(frozen=True)
class Wait:
    """One ``wait_ms`` answer, failures included, and when (epoch ms) it was asked."""

    tenant: str
    response_id: str
    history: History
    asked_ms: int


@dataclass
class Observations:
    promoted: list[Promoted] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    orphaned: set[tuple[str, str]] = field(default_factory=set)  # (tenant, effect id)
    # Orphans published with a reason in FINAL_ORPHAN_REASONS, but EFFECT_CONFLICT.
    final_orphans: set[tuple[str, str]] = field(default_factory=set)
    # EFFECT_CONFLICT orphans (tenant, effect id, output digest): each names one
    # execution of the effect id by its output, which may be another than the one a
    # promoted turn used (the tool ran again after the promotion).
    conflict_orphans: set[tuple[str, str, str]] = field(default_factory=set)
    # Orphans published with ``effect_completed`` true (an outcome was recorded).
    completed_orphans: set[tuple[str, str]] = field(default_factory=set)
    # Claims answered otherwise than the claims API's rules, as the producer saw them
    # (tenant, effect id, what was answered): ``ratchet/chaos/claims.py``.
    claim_answers_wrong: list[tuple[str, str, str]] = field(default_factory=list)
    dead_letters: set[tuple[bytes | None, bytes | None]] = field(default_factory=set)
    histories: dict[tuple[str, str], History] = field(default_factory=dict)  # (tenant, rid)
    conversations: dict[tuple[str, str], History] = field(default_factory=dict)
    waits: list[Wait] = field(default_factory=list)
    # Histories asked with a tenant that never sent the response: (tenant asked, rid).
    foreign: dict[tuple[str, str], History] = field(default_factory=dict)
    # Histories asked with another fingerprint than the workload's (OTHER_FINGERPRINT):
    # a fingerprint change invalidates reuse, never the history (CONTRACT 5).
    other_fingerprint: dict[tuple[str, str], History] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    kind: str
    story: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def check(expectations: list[Expectation], obs: Observations) -> list[Violation]:
    out = _invariants(obs) + _against_workload(expectations, obs)
    by_rid: dict[tuple[str, str], set[Sig]] = defaultdict(set)
    first_at: dict[tuple[str, str], int] = {}
    for rec in (*obs.promoted, *obs.rejected):
        by_rid[(rec.tenant, rec.response_id)].add(rec.sig)
    for p in obs.promoted:
        key = (p.tenant, p.response_id)
        first_at[key] = min(first_at.get(key, p.at_ms), p.at_ms)
    for exp in expectations:
        if exp.story.kind == "garbage":
            out += [Violation("dead_letter_missing", exp.story.sid, f"{r.label} key={r.key!r}")
                    for r in exp.dead_letters if (r.key, r.value) not in obs.dead_letters]
            continue
        found = [_story_violations(exp, w, by_rid, first_at, obs) for w in exp.worlds]
        out += min(found, key=len)
    return out


def sends_per_response(exp: Expectation) -> dict[tuple[str, str], int]:
    """How many times the story's TurnCompleted events of each (tenant, response id)
    are sent (a redelivery or a retry is a send of its own): each send gets its own
    outcome. A story's events are its tenant's but for a turn sent by another tenant
    on its Conversation (``TENANT_MISMATCH``)."""
    sends: dict[tuple[str, str], int] = defaultdict(int)
    for step in exp.story.steps:
        for index in (*step.sends, *step.race):
            ev = exp.story.events[index]
            if isinstance(ev, TurnCompleted):
                sends[(ev.tenant_id, ev.response_id)] += 1
    return sends


def _against_workload(expectations: list[Expectation], obs: Observations) -> list[Violation]:
    out = []
    sent = {key: (e.story.sid, n)
            for e in expectations for key, n in sends_per_response(e).items()}
    records: dict[tuple[str, str], int] = defaultdict(int)
    for rec in (*obs.promoted, *obs.rejected):
        records[(rec.tenant, rec.response_id)] += 1
    for key, n in sorted(records.items()):
        if key not in sent:
            out.append(Violation("unexpected_outcome", "-", f"{n} outcome record(s) for "
                                 f"{key[1]} of tenant {key[0]}, which no event carries"))
    for (tenant, rid), (sid, n) in sorted(sent.items()):
        if 0 < records[(tenant, rid)] < n:
            out.append(Violation("outcome_missing", sid, f"{rid}: {n} events sent, "
                                 f"{records[(tenant, rid)]} outcome records"))
    garbage = {(r.key, r.value) for e in expectations for r in e.dead_letters}
    for key, value in obs.dead_letters - garbage:
        out.append(Violation("unexpected_dead_letter", "-", f"key={key!r} value="
                             f"{(value or b'')[:60]!r} is not an undecodable record"))
    out += [claim_violation(tenant, eid, detail)
            for tenant, eid, detail in obs.claim_answers_wrong]
    for (tenant, rid), h in sorted(obs.foreign.items()):
        if (h.outcome, h.reason) != ("failure", "NOT_FOUND"):
            out.append(Violation("tenant_leak", "-", f"{rid} asked as tenant {tenant}: "
                                 f"{_hist(h)}, expected failure/NOT_FOUND"))
    return out


def claim_violation(tenant: str, effect_id: str, detail: str) -> Violation:
    """A claim check a producer logged: its class is the detail's tag
    (``[effect_executed_twice] ...``), ``claim_answer_wrong`` without one."""
    kind = "claim_answer_wrong"
    if detail.startswith("["):
        tag, _, rest = detail[1:].partition("] ")
        if tag in CLAIM_CLASSES:
            kind, detail = tag, rest
    named = detail if detail.startswith(f"{effect_id}:") else f"{effect_id}: {detail}"
    return Violation(kind, tenant, named)


# ------------------------------------------------------------------------ invariants


def _invariants(obs: Observations) -> list[Violation]:
    out = []
    for rec in obs.rejected:
        if not rec.reason:
            out.append(Violation("rejection_without_reason", "-", rec.response_id))
    sigs: dict[tuple[str, str], set[Sig]] = defaultdict(set)
    by_key: dict[tuple[str, str], set[str]] = defaultdict(set)
    seqs: dict[tuple[str, str], dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    first: dict[tuple[str, str], Promoted] = {}
    for p in obs.promoted:
        sigs[(p.tenant, p.response_id)].add(p.sig)
        by_key[(p.tenant, p.key)].add(p.response_id)
        first.setdefault((p.tenant, p.response_id), p)
        if p.conversation_id:
            seqs[(p.tenant, p.conversation_id)][p.seq].add(p.response_id)
    for (_, rid), s in sigs.items():
        if len(s) > 1:
            out.append(Violation("conflicting_outcome_records", rid, f"{sorted(map(str, s))}"))
    for (_, key), rids in by_key.items():
        if len(rids) > 1:
            out.append(Violation("duplicate_promotion", key, f"key promoted as {sorted(rids)}"))
    for (_, conv), at in seqs.items():
        for seq, rids in at.items():
            if len(rids) > 1:
                out.append(Violation("seq_repeat", conv, f"seq {seq}: {sorted(rids)}"))
        missing = sorted(set(range(1, max(at) + 1)) - set(at))
        if missing:
            out.append(Violation("seq_gap", conv, f"seqs {missing} missing below {max(at)}"))
    for (tenant, _), p in first.items():
        if p.conversation_id:
            continue
        parent = first.get((tenant, p.previous_response_id)) if p.previous_response_id else None
        want = 1 if p.previous_response_id is None else parent.seq + 1 if parent else None
        if want is not None and p.seq != want:
            out.append(Violation("seq_gap", p.response_id, f"chain seq {p.seq}, expected {want}"))
    return out


# ----------------------------------------------------------------------- oracle-based


def _story_violations(exp: Expectation, w: World, by_rid, first_at,
                      obs: Observations) -> list[Violation]:
    story, out = exp.story, []
    sid, tenant = story.sid, story.tenant
    # Keyed by (tenant, response id): a turn another tenant sent on the story's
    # Conversation is that tenant's (its outcome, its history).
    per_rid: dict[tuple[str, str], list[frozenset[Sig]]] = defaultdict(list)
    for index, acceptable in w.decided.items():
        ev = story.events[index]
        assert isinstance(ev, TurnCompleted)
        per_rid[(ev.tenant_id, ev.response_id)].append(acceptable)
    for (sender, rid), accs in per_rid.items():
        seen = by_rid.get((sender, rid), set())
        if not seen:
            out.append(Violation("never_decided", sid, f"{rid}: expected {_fmt(accs[0])}"))
            continue
        wanted = set().union(*accs)
        for acc in accs:
            if not acc & seen:
                out.append(Violation(_classify(acc, seen), sid,
                                     f"{rid}: expected {_fmt(acc)}, observed {_fmt(seen)}"))
        for sig in seen - wanted:
            if not any(v.detail.startswith(f"{rid}:") for v in out):
                kind = "promotion_should_not_exist" if sig[0] == "P" else "wrong_reason"
                out.append(Violation(kind, sid, f"{rid}: unexpected {_fmt({sig})}, "
                                                f"expected {_fmt(wanted)}"))
    for p in obs.promoted:
        promo = w.promoted.get(p.response_id) if p.tenant == tenant else None
        if promo is not None and (p.conversation_id, p.previous_response_id) != (
                promo.conversation_id, promo.previous_response_id):
            out.append(Violation("promotion_mismatch", sid, f"{p.response_id}: published "
                                 f"with conversation {p.conversation_id!r}, parent "
                                 f"{p.previous_response_id!r}; sent with "
                                 f"{promo.conversation_id!r}, {promo.previous_response_id!r}"))
    for eid in sorted(w.orphans):
        if (tenant, eid) not in obs.orphaned:
            out.append(Violation("orphan_missing", sid, eid))
    for eid in sorted(w.orphans & w.no_outcome):
        if (tenant, eid) in obs.completed_orphans:
            out.append(Violation("orphan_said_completed", sid, f"{eid}: no attempt may "
                                 f"record an outcome for it (LEASE_EXPIRED under "
                                 f"at_most_once), published with effect_completed true"))
    for eid in sorted(w.used):
        used_output = w.effects.get(eid, (None, None, None))[2]
        if (tenant, eid) in obs.final_orphans or (
                (tenant, eid, used_output) in obs.conflict_orphans):
            out.append(Violation("orphan_of_used_effect", sid, f"{eid}: used by a promoted "
                                 f"turn, published orphaned with a reason to compensate"))
    for sender, rid in per_rid:
        promo = w.promoted.get(rid) if sender == tenant else None
        problem = _answer_problem(promo, rid, obs.histories.get((sender, rid)))
        if problem:
            out.append(Violation("history_mismatch", sid, f"{rid}: {problem}"))
        other = obs.other_fingerprint.get((sender, rid))
        problem = other and _answer_problem(promo, rid, other, OTHER_FINGERPRINT)
        if problem:
            out.append(Violation("history_mismatch", sid, f"{rid} asked with another "
                                                          f"fingerprint: {problem}"))
    if story.kind == "conversation" and w.head:
        head = next(p for p in w.promoted.values()
                    if p.conversation_id == story.key and p.seq == w.head)
        problem = _answer_problem(head, head.response_id,
                                  obs.conversations.get((tenant, story.key)))
        if problem:
            out.append(Violation("history_mismatch", sid, f"conversation {story.key} (head "
                                 f"{head.response_id}): {problem}"))
    for wait in obs.waits:
        if (wait.tenant, wait.response_id) not in per_rid:
            continue
        rid, got = wait.response_id, wait.history
        promo = w.promoted.get(rid) if wait.tenant == tenant else None
        if got.outcome == "failure" and promo is not None \
                and got.reason in NEVER_PROMOTED_REASONS:
            # Not promoted yet when asked is a right answer; after the promotion was
            # published, it is a stale read. Any other failure (an integrity failure,
            # EXPIRED) is wrong for a promoted response, and judged below.
            published = first_at.get((wait.tenant, rid))
            if published is not None and wait.asked_ms > published:
                out.append(Violation("stale_wait", sid, f"wait_ms answer for {rid}: "
                                     f"{_hist(got)}, asked {wait.asked_ms - published} ms "
                                     f"after its promotion was published"))
            continue
        problem = _answer_problem(promo, rid, got)
        if problem:
            out.append(Violation("history_mismatch", sid, f"wait_ms answer for {rid}: "
                                                          f"{problem}"))
    return out


def _answer_problem(promo: Promo | None, rid: str, got: History | None,
                    fingerprint_hash: str | None = None) -> str | None:
    """What is wrong with ``got``, the history answer for ``rid`` (promoted as ``promo``,
    or never promoted: None) asked with ``fingerprint_hash`` (default: the workload's);
    None if it is right."""
    if got is None:
        return "no answer"
    if promo is None:
        if got.outcome == "failure" and got.reason in NEVER_PROMOTED_REASONS:
            return None
        return f"{_hist(got)}, but it was never promoted (expected NOT_PROMOTED or NOT_FOUND)"
    outcome, reason = promo.read_as if fingerprint_hash is None else promo.read(fingerprint_hash)
    wrong = []
    if (got.outcome, got.reason) != (outcome, reason):
        wrong.append(f"{_hist(got)} != {outcome}{'/' + reason if reason else ''}")
    elif got.outcome != "failure" and got.items != promo.items:
        wrong.append(f"{len(got.items)} items != the {len(promo.items)} promoted, in order")
    if got.outcome != "failure" and (got.response_id, got.head_seq) != (rid, promo.seq):
        wrong.append(f"names {got.response_id} at head_seq {got.head_seq}, expected "
                     f"{rid} at {promo.seq}")
    wrong += list(got.faults)
    return "; ".join(wrong) or None


def _classify(acceptable: frozenset[Sig], seen: set[Sig]) -> str:
    wanted_promotion = any(s[0] == "P" for s in acceptable)
    seen_promotion = any(s[0] == "P" for s in seen)
    if wanted_promotion:
        return "promotion_mismatch" if seen_promotion else "valid_turn_rejected"
    return "promotion_should_not_exist" if seen_promotion and not any(
        s[0] == "R" for s in seen) else "wrong_reason"


def _fmt(sigs) -> str:
    parts = []
    for s in sorted(sigs, key=str):
        if s[0] == "P":
            parts.append(f"promoted(seq={s[1]}, {s[2]}, items={s[5]})")
        else:
            parts.append(f"rejected({s[1]}{', original=' + s[2] if s[2] else ''})")
    return " | ".join(parts) or "nothing"


def _hist(h: History | None) -> str:
    if h is None:
        return "no answer"
    return f"{h.outcome}{'/' + h.reason if h.reason else ''} with {len(h.items)} items"
