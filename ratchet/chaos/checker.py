"""The checker: what was observed on the public surfaces against the oracle.

Observations come only from the output topics (promotions, rejections, orphaned
effects, dead letters) and the HTTP API (histories, ``wait_ms`` answers). Two kinds of
checks:

1. **Invariants of the observations alone** (no oracle needed): a response promoted
   with two different contents, an idempotency key promoted under two responses, a
   Conversation seq used twice or skipped, a chain response whose seq is not its
   parent's + 1, a rejection without a reason.
2. **Against the oracle**, per story, in the world (race order) that fits best: every
   turn decided, decided as the rules say (promotion, seq, certification, reason, the
   original response of a DUPLICATE), histories complete and in order by digest,
   orphaned effects published, undecodable records dead-lettered byte for byte.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from ratchet.chaos.oracle import Expectation, Sig, World
from schemas.models import TurnCompleted

VIOLATION_CLASSES = (
    "promotion_should_not_exist", "duplicate_promotion", "conflicting_outcome_records",
    "never_decided", "seq_gap", "seq_repeat", "wrong_reason", "rejection_without_reason",
    "valid_turn_rejected", "promotion_mismatch", "history_mismatch", "orphan_missing",
    "dead_letter_missing",
)


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
    """One HTTP history answer: outcome, reason, the items' content digests in order."""

    outcome: str
    reason: str | None
    digests: tuple[str, ...]


@dataclass
class Observations:
    promoted: list[Promoted] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    orphaned: set[tuple[str, str]] = field(default_factory=set)  # (tenant, effect id)
    dead_letters: set[tuple[bytes | None, bytes | None]] = field(default_factory=set)
    histories: dict[tuple[str, str], History] = field(default_factory=dict)  # (tenant, rid)
    conversations: dict[tuple[str, str], History] = field(default_factory=dict)
    waits: list[tuple[str, str, History]] = field(default_factory=list)  # wait_ms answers


@dataclass(frozen=True)
class Violation:
    kind: str
    story: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def check(expectations: list[Expectation], obs: Observations) -> list[Violation]:
    out = _invariants(obs)
    by_rid: dict[tuple[str, str], set[Sig]] = defaultdict(set)
    for rec in (*obs.promoted, *obs.rejected):
        by_rid[(rec.tenant, rec.response_id)].add(rec.sig)
    for exp in expectations:
        if exp.story.kind == "garbage":
            out += [Violation("dead_letter_missing", exp.story.sid, f"{r.label} key={r.key!r}")
                    for r in exp.dead_letters if (r.key, r.value) not in obs.dead_letters]
            continue
        found = [_story_violations(exp, w, by_rid, obs) for w in exp.worlds]
        out += min(found, key=len)
    return out


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


def _story_violations(exp: Expectation, w: World, by_rid, obs: Observations) -> list[Violation]:
    story, out = exp.story, []
    sid, tenant = story.sid, story.tenant
    per_rid: dict[str, list[frozenset[Sig]]] = defaultdict(list)
    for index, acceptable in w.decided.items():
        ev = story.events[index]
        assert isinstance(ev, TurnCompleted)
        per_rid[ev.response_id].append(acceptable)
    for rid, accs in per_rid.items():
        seen = by_rid.get((tenant, rid), set())
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
    for eid in sorted(w.orphans):
        if (tenant, eid) not in obs.orphaned:
            out.append(Violation("orphan_missing", sid, eid))
    for rid, promo in w.promoted.items():
        reusable = promo.certification == "certified" and promo.artifact
        want = ("certified" if reusable else "fallback", promo.items)
        got = obs.histories.get((tenant, rid))
        if got is None or (got.outcome, got.digests) != want:
            out.append(Violation("history_mismatch", sid, f"{rid}: {_hist(got)} != {want[0]} "
                                                          f"with {len(promo.items)} items"))
    if story.kind == "conversation" and w.head:
        got = obs.conversations.get((tenant, story.key))
        if got is None or got.digests != w.head_items:
            out.append(Violation("history_mismatch", sid, f"conversation {story.key}: "
                                 f"{_hist(got)} != head {w.head} with {len(w.head_items)} items"))
    for t, rid, got in obs.waits:
        if t == tenant and rid in w.promoted and got.digests != w.promoted[rid].items:
            out.append(Violation("history_mismatch", sid, f"wait_ms answer for {rid}: "
                                 f"{_hist(got)}"))
    return out


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
    return f"{h.outcome}{'/' + h.reason if h.reason else ''} with {len(h.digests)} items"
