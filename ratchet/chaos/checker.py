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
    # A request to the API left without an answer where no fault explains it; wait_ms
    # requests (nearly) never answered with a history; an orphan record whose reason,
    # effect_completed or output_digest contradicts what the rules and the workload
    # say; a run that did not end in time (a round sent again and again).
    "answer_missing", "waits_unanswered", "orphan_record_wrong", "run_deadline",
    # /status of a response against the oracle: promoted at its seq, or rejected with a
    # reason the rules give.
    "status_mismatch",
    # The damage phase (ratchet/chaos/damage.py): a read through a damaged turn answered
    # with a history that is not the verified one (or any history where only the typed
    # failure may come), or with another failure than the one the docs give; a history
    # the damage does not touch (another partition, a turn before it, a sibling branch)
    # answered otherwise than before; a /status of a damaged story against the docs.
    "damage_undetected", "damage_wrong_reason", "damage_leak", "damage_status_mismatch",
    # A turn sent on top of a damaged history decided otherwise than the docs allow.
    "damage_continuation_wrong",
    # Reads as another tenant of the workload (ratchet/chaos/crosstenant.py): of a
    # response's history, a Conversation's history, a /status, a wait_ms read.
    "cross_tenant_history", "cross_tenant_conversation", "cross_tenant_status",
    "cross_tenant_wait",
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
# A History field the observer did not record (a History built by hand, in tests):
# ``history_of`` records every one of them from every answer.
UNSEEN = "unseen"
# A request that got no answer is excused when it overlaps a fault window stretched by
# this much after the fault ended (the API reconnecting to a restarted Cassandra).
FAULT_GRACE_MS = 30_000
# wait_ms requests outside fault windows: with at least this many asked, fewer than
# this share answered with a history fails the run (``waits_unanswered``).
WAITS_MIN_ASKED = 20
WAITS_MIN_ANSWERED = 0.25


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
    # The Conversation's head beside ``head_seq`` (null in chain mode), and of a
    # certified answer what its checkpoint carries (``oracle.certificate_of``); UNSEEN
    # when not recorded (``history_of`` records both from every answer).
    conversation_head_seq: int | None | str = UNSEEN
    certificate: tuple | None | str = UNSEEN


@dataclass(frozen=True)
class Lost:
    """A request to the API that got no answer (a connection refused or reset, a 5xx,
    an answer the client could not trust) after its retries: which endpoint (``what``:
    history, conversation, foreign, other_fingerprint, wait), for whom, when (epoch ms:
    asked, given up) and the last error."""

    what: str
    tenant: str
    ident: str
    asked_ms: int
    ended_ms: int
    error: str


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
    # Requests that got no answer (``Lost``), and when faults were injected (epoch ms,
    # start and end of each, from the runner): a lost answer outside every window is
    # ``answer_missing``.
    lost: list[Lost] = field(default_factory=list)
    fault_windows: list[tuple[int, int]] = field(default_factory=list)
    # What ``fetch_histories`` asked, per endpoint (the keys of ``histories``,
    # ``conversations``, ``foreign``, ``other_fingerprint``): each needs an answer or a
    # ``Lost``.
    asked: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    # Every EffectOrphaned record: (tenant, effect id) -> [(reason, effect_completed,
    # output_digest), ...] in the order read.
    orphan_records: dict[tuple[str, str], list[tuple[str, bool | None, str | None]]] = field(
        default_factory=dict)
    # ``/status`` of every response sent, asked by its sender after the run:
    # (tenant, rid) -> (state, reason, seq).
    statuses: dict[tuple[str, str], tuple[str, str | None, int | None]] = field(
        default_factory=dict)
    # The damage phase (ratchet/chaos/damage.py): what was damaged (``Damage``) and every
    # answer after it (``DamageRead``).
    damages: list = field(default_factory=list)
    damage_reads: list = field(default_factory=list)
    # Turns sent on top of the damaged histories (``damage.Continuation``).
    continuations: list = field(default_factory=list)
    # Reads as another tenant of the workload (ratchet/chaos/crosstenant.py,
    # ``CrossRead``), and per (endpoint, tenant) the answer to an id nobody used:
    # (HTTP status, normalized body).
    cross_reads: list = field(default_factory=list)
    cross_baseline: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    kind: str
    story: str
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def check(expectations: list[Expectation], obs: Observations) -> list[Violation]:
    out = _invariants(obs) + _against_workload(expectations, obs) + _unanswered(obs)
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
        found = [_story_violations(exp, w, by_rid, first_at, obs)
                 + _records_of_world(exp, w, obs) for w in exp.worlds]
        out += min(found, key=len)
    return out + check_damage(expectations, obs) + check_cross_tenant(obs)


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
    sent.update({c.event_key: (c.sid, 1) for c in obs.continuations})
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


def _excused(lost: Lost, windows: list[tuple[int, int]]) -> bool:
    """A request lost while a fault was injected (or within FAULT_GRACE_MS after it)."""
    return any(lost.asked_ms <= end + FAULT_GRACE_MS and lost.ended_ms >= start
               for start, end in windows)


def _unanswered(obs: Observations) -> list[Violation]:
    """Requests to the API that got no answer where no fault explains it. Every request
    the observer makes ends in an answer or a ``Lost``; one asked after the run
    (``obs.asked``) with neither is lost too. The history of a response sent is judged
    by ``_story_violations`` ("no answer"), not here. And wait_ms requests outside the
    fault windows: (nearly) none answered with a history is a failure of read-your-
    writes, whatever each answer said."""
    out = []
    lost_keys = {(lost.what, lost.tenant, lost.ident) for lost in obs.lost}
    answered = {"history": obs.histories, "conversation": obs.conversations,
                "status": obs.statuses,
                "foreign": obs.foreign, "other_fingerprint": obs.other_fingerprint}
    for what, keys in sorted(obs.asked.items()):
        for tenant, ident in sorted(keys):
            if what != "history" and (tenant, ident) not in answered.get(what, {}) \
                    and (what, tenant, ident) not in lost_keys:
                out.append(Violation("answer_missing", tenant, f"{what} {ident}: asked, "
                                     f"neither answered nor lost"))
    if len(obs.asked.get("history", ())) >= 20:  # the observer ran: each kind was asked
        for what in ("other_fingerprint", "foreign"):
            if not obs.asked.get(what):
                out.append(Violation("answer_missing", "-", f"no {what} read was asked "
                                     f"beside {len(obs.asked['history'])} histories"))
    for lost in obs.lost:
        if lost.what != "history" and not _excused(lost, obs.fault_windows):
            out.append(Violation("answer_missing", lost.tenant, f"{lost.what} {lost.ident}: "
                                 f"no answer, no fault to explain it ({lost.error[:200]})"))
    lost_waits = [w for w in obs.lost if w.what == "wait"
                  and not _excused(w, obs.fault_windows)]
    waits = [w for w in obs.waits if not _excused(
        Lost("wait", w.tenant, w.response_id, w.asked_ms, w.asked_ms, ""), obs.fault_windows)]
    asked = len(waits) + len(lost_waits)
    histories = sum(1 for w in waits if w.history.outcome != "failure")
    if asked >= WAITS_MIN_ASKED and histories < WAITS_MIN_ANSWERED * asked:
        out.append(Violation("waits_unanswered", "-", f"{asked} wait_ms requests outside "
                             f"faults, {histories} answered with a history ({len(lost_waits)} "
                             f"without any answer): read-your-writes does not work"))
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
    heads = _final_heads(story, w)
    for sender, rid in per_rid:
        promo = w.promoted.get(rid) if sender == tenant else None
        head = _head_range(promo, heads)
        problem = _answer_problem(promo, rid, obs.histories.get((sender, rid)), heads=head)
        if problem:
            out.append(Violation("history_mismatch", sid, f"{rid}: {problem}"))
        other = obs.other_fingerprint.get((sender, rid))  # asked, unanswered: _unanswered
        problem = other and _answer_problem(promo, rid, other, OTHER_FINGERPRINT, heads=head)
        if problem:
            out.append(Violation("history_mismatch", sid, f"{rid} asked with another "
                                                          f"fingerprint: {problem}"))
    for (sender, rid), accs in per_rid.items():
        problem = _status_problem(w.promoted.get(rid) if sender == tenant else None,
                                  set().union(*accs), obs.statuses.get((sender, rid)))
        if problem:
            out.append(Violation("status_mismatch", sid, f"{rid}: {problem}"))
    if story.kind == "conversation" and w.head:
        head = next(p for p in w.promoted.values()
                    if p.conversation_id == story.key and p.seq == w.head)
        problem = _answer_problem(head, head.response_id,
                                  obs.conversations.get((tenant, story.key)),
                                  heads=(w.head, w.head))
        if problem:
            out.append(Violation("history_mismatch", sid, f"conversation {story.key} (head "
                                 f"{head.response_id}): {problem}"))
    for wait in obs.waits:
        if (wait.tenant, wait.response_id) not in per_rid:
            continue
        rid, got = wait.response_id, wait.history
        promo = w.promoted.get(rid) if wait.tenant == tenant else None
        if got.outcome == "failure" and promo is not None and got.reason == "NOT_PROMOTED":
            # Not promoted yet when asked is a right answer; after the promotion was
            # published, it is a stale read. Any other failure (an integrity failure,
            # EXPIRED, NOT_FOUND: "with wait_ms > 0 there is no 404", gateway-protocol.md
            # section 8) is wrong for a promoted response, and judged below.
            published = first_at.get((wait.tenant, rid))
            if published is not None and wait.asked_ms > published:
                out.append(Violation("stale_wait", sid, f"wait_ms answer for {rid}: "
                                     f"{_hist(got)}, asked {wait.asked_ms - published} ms "
                                     f"after its promotion was published"))
            continue
        # Asked while the run went on: the Conversation's head then was at least this
        # response's seq and at most the final head.
        head = _head_range(promo, heads)
        problem = _answer_problem(promo, rid, got, heads=head and (promo.seq, head[1]))
        if problem:
            out.append(Violation("history_mismatch", sid, f"wait_ms answer for {rid}: "
                                                          f"{problem}"))
    return out


def _records_of_world(exp: Expectation, w: World, obs: Observations) -> list[Violation]:
    """Each orphan record against what the rules and the workload say of its effect
    (gateway-protocol.md section 7, ``EffectOrphaned`` and "When to compensate"):

    - an effect of a request that stands promoted and that the promoted turn does not
      use is final: at least one record says ``ATTEMPT_SUPERSEDED``, whatever
      provisional ``TURN_REJECTED`` came before; an effect of a request neither promoted
      nor cancelled is never published with a final reason (a later attempt may still
      use it);
    - an effect whose outcome was recorded (a ``ToolEffect``, a completed claim) has a
      record with ``effect_completed`` true and the recorded output's digest; one no
      attempt recorded an outcome for has none with an ``output_digest``.

    Conflicted effects are judged by their ``EFFECT_CONFLICT`` records (one per
    execution) elsewhere."""
    story, out = exp.story, []
    for eid in sorted(w.orphans - w.conflicted):
        records = obs.orphan_records.get((story.tenant, eid))
        if not records:
            continue  # orphan_missing
        reasons = sorted({r[0] for r in records})
        key, _, output = w.effects.get(eid, (None, None, None))
        output = w.recorded.get(eid, output)
        settled = key is not None and key in w.keys
        if settled and eid not in w.used and "ATTEMPT_SUPERSEDED" not in reasons:
            out.append(Violation("orphan_record_wrong", story.sid, f"{eid}: its request "
                                 f"stands promoted without it (ATTEMPT_SUPERSEDED due), "
                                 f"published {reasons}"))
        elif not settled and key not in w.cancelled and set(reasons) & {
                "ATTEMPT_SUPERSEDED", "TURN_CANCELLED"}:
            out.append(Violation("orphan_record_wrong", story.sid, f"{eid}: its request is "
                                 f"not settled (neither promoted nor cancelled), published "
                                 f"with a final reason {reasons}"))
        if eid in w.no_outcome:
            digests = sorted({r[2] for r in records if r[2] is not None})
            if digests:
                out.append(Violation("orphan_record_wrong", story.sid, f"{eid}: no outcome "
                                     f"was recorded, published with output_digest {digests}"))
        elif output is not None and not any(r[1] is True and r[2] == output for r in records):
            out.append(Violation("orphan_record_wrong", story.sid, f"{eid}: its outcome was "
                                 f"recorded (output {output[:12]}), no record says "
                                 f"effect_completed true with that output_digest: "
                                 f"{[(r[0], r[1], (r[2] or '')[:12]) for r in records]}"))
    return out


def _status_problem(promo: Promo | None, wanted: set[Sig],
                    got: tuple[str, str | None, int | None] | None) -> str | None:
    """``/status`` of a response against the oracle (docs/gateway-protocol.md section 8):
    ``promoted`` with its seq when the oracle promoted it; otherwise never ``promoted``,
    and ``rejected`` with one of the reasons the oracle allows for it. ``unknown`` only
    for a response the oracle may reject ``CORRUPT`` (an event whose identity cannot be
    trusted records no status under it). Not asked, or no answer: ``_unanswered``."""
    if got is None:
        return None
    state, reason, seq = got
    if promo is not None:
        if state != "promoted" or seq != promo.seq:
            return f"status {state} {reason or ''} seq {seq}; promoted at seq {promo.seq}"
        return None
    reasons = {sig[1] for sig in wanted if sig[0] == "R"}
    if state == "promoted":
        return f"status promoted (seq {seq}); never promoted (expected {sorted(reasons)})"
    if state == "rejected" and reason not in reasons:
        return f"status rejected {reason}; expected one of {sorted(reasons)}"
    if state == "unknown" and "CORRUPT" not in reasons:
        return f"status unknown; a rejection was recorded ({sorted(reasons)})"
    if state not in ("rejected", "unknown"):
        return f"status {state!r}: not a state of the contract"
    return None


def _final_heads(story, w: World) -> dict[str, int]:
    """The head of every Conversation the story's turns were promoted on, at the end."""
    heads = {c: h[0] for c, h in w.other_heads.items()}
    if story.kind == "conversation":
        heads[story.key] = w.head
    return heads


def _head_range(promo: Promo | None, heads: dict[str, int]) -> tuple[int, int] | None:
    """The ``conversation_head_seq`` a history answer of ``promo`` must report, as a
    range (the final fetch: exactly the final head); None in chain mode (null)."""
    if promo is None or promo.conversation_id is None:
        return None
    final = heads.get(promo.conversation_id, promo.seq)
    return final, final


def _answer_problem(promo: Promo | None, rid: str, got: History | None,
                    fingerprint_hash: str | None = None, *, heads: tuple[int, int] | None
                    | str = UNSEEN, sent: bool = True) -> str | None:
    """What is wrong with ``got``, the history answer for ``rid`` (promoted as ``promo``,
    or never promoted: None) asked with ``fingerprint_hash`` (default: the workload's)
    by a tenant that sent it (``sent``) or not; None if it is right. ``heads``: the
    range its ``conversation_head_seq`` must lie in, None for null (chain mode), UNSEEN
    not to check it."""
    if got is None:
        return "no answer"
    if promo is None:
        # Rejected: the ledger recorded the rejection for this tenant, NOT_PROMOTED (409);
        # NOT_FOUND (404) is for an id this tenant never sent (gateway-protocol.md
        # section 8, the table of outcomes).
        want = "NOT_PROMOTED" if sent else "NOT_FOUND"
        if (got.outcome, got.reason) == ("failure", want):
            return None
        return f"{_hist(got)}, but it was never promoted (expected {want})"
    outcome, reason = promo.read_as if fingerprint_hash is None else promo.read(fingerprint_hash)
    wrong = []
    if (got.outcome, got.reason) != (outcome, reason):
        wrong.append(f"{_hist(got)} != {outcome}{'/' + reason if reason else ''}")
    elif got.outcome != "failure" and got.items != promo.items:
        wrong.append(f"{len(got.items)} items != the {len(promo.items)} promoted, in order")
    if got.outcome != "failure" and (got.response_id, got.head_seq) != (rid, promo.seq):
        wrong.append(f"names {got.response_id} at head_seq {got.head_seq}, expected "
                     f"{rid} at {promo.seq}")
    if got.outcome != "failure":
        wrong += _fields_problems(promo, got, outcome, heads)
    wrong += list(got.faults)
    return "; ".join(wrong) or None


def _fields_problems(promo: Promo, got: History, expected: str,
                     heads: tuple[int, int] | None | str) -> list[str]:
    """A history answer's fields beside its items: ``conversation_head_seq`` (the
    Conversation's head, null in chain mode) and, certified, the checkpoint's artifact,
    boundary proof and receipt against the promoted turn's (gateway-protocol.md section
    8, "History body")."""
    wrong = []
    chs = got.conversation_head_seq
    if chs != UNSEEN and heads != UNSEEN:
        if heads is None and chs is not None:
            wrong.append(f"conversation_head_seq {chs} in chain mode (null expected)")
        elif heads is not None and not (isinstance(chs, int)
                                        and heads[0] <= chs <= heads[1]):
            want = heads[0] if heads[0] == heads[1] else f"{heads[0]}..{heads[1]}"
            wrong.append(f"conversation_head_seq {chs}, expected {want}")
    if got.outcome == expected == "certified" and got.certificate != UNSEEN \
            and got.certificate != promo.certificate:
        wrong.append(f"checkpoint carries {_cert(got.certificate)}, the promoted turn "
                     f"{_cert(promo.certificate)}")
    return wrong


def _cert(cert) -> str:
    if not isinstance(cert, tuple):
        return repr(cert)
    artifact, proof, receipt = cert
    art = "no artifact" if artifact is None else (
        f"artifact {artifact[0]} ({artifact[2]} tokens, hash {str(artifact[1])[:12]})")
    return (f"{art}, {'no proof' if proof is None else 'proof ' + str(proof[4])[:12]}, "
            f"{'a' if receipt else 'no'} receipt")


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


# ------------------------------------------------------------------- damaged rows


def check_damage(expectations: list[Expectation], obs: Observations) -> list[Violation]:
    """The damage phase's answers (``obs.damage_reads``) against the docs
    (ratchet/chaos/damage.py says what each damage must read as): through a damaged
    turn, read from storage, exactly the damage's failure; through the cache, that
    failure or the promoted history exactly (never for the head's damage); every other
    history of the story, and of the undamaged stories read again, as before
    (``damage_leak``); ``/status`` as the docs give it."""
    from ratchet.chaos.damage import certain

    if not obs.damages and not obs.damage_reads:
        return []
    reads: dict[tuple[str, str, str, bool], object] = {}
    for r in obs.damage_reads:
        reads[(r.what, r.tenant, r.ident, r.cached)] = r.answer
    stories = {e.story.sid: e for e in expectations}
    out: list[Violation] = []
    damaged_keys: set[tuple[str, str, str, bool]] = set()
    for d in obs.damages:
        e = stories.get(d.sid)
        w = certain(e) if e is not None else None
        if w is None:
            continue
        heads = _final_heads(e.story, w)
        for rid, promo in sorted(w.promoted.items()):
            for cached in (True, False):
                key = ("history", d.tenant, rid, cached)
                damaged_keys.add(key)
                got = reads.get(key)
                if got is None:
                    continue  # never asked, or lost: answer_missing
                via = "through the cache" if cached else "with no-cache"
                if rid in d.through:
                    found = _through_problem(d, promo, rid, got, cached,
                                             _head_range(promo, heads))
                else:
                    problem = _answer_problem(promo, rid, got, heads=_head_range(promo, heads))
                    found = problem and ("damage_leak", f"not through the damaged turn, "
                                         f"changed: {problem}")
                if found:
                    out.append(Violation(found[0], d.sid, f"{rid} {via} after {d.kind} on "
                                         f"{d.response_id}: {found[1]}"))
            key = ("status", d.tenant, rid, False)
            damaged_keys.add(key)
            problem = _damaged_status_problem(d, promo, rid, reads.get(key))
            if problem:
                out.append(Violation("damage_status_mismatch", d.sid, f"{rid} after {d.kind} "
                                     f"on {d.response_id}: {problem}"))
        if d.conversation and w.head:
            head = next(p for p in w.promoted.values() if p.seq == w.head)
            for cached in (True, False):
                key = ("conversation", d.tenant, d.partition, cached)
                damaged_keys.add(key)
                got = reads.get(key)
                found = got is not None and _through_problem(d, head, head.response_id, got,
                                                             cached, (w.head, w.head))
                if found:
                    via = "through the cache" if cached else "with no-cache"
                    out.append(Violation(found[0], d.sid, f"conversation {d.partition} {via} "
                                         f"after {d.kind} on {d.response_id}: {found[1]}"))
    for r in obs.damage_reads:
        if r.what == "foreign" and (r.answer.outcome, r.answer.reason) != ("failure",
                                                                           "NOT_FOUND"):
            out.append(Violation("cross_tenant_history", r.tenant, f"damaged {r.ident} asked "
                                 f"as tenant {r.tenant}: {_hist(r.answer)}, expected "
                                 f"failure/NOT_FOUND"))
    out += _damage_controls(expectations, obs, reads, damaged_keys)
    return out + _continuations(obs, reads, stories)


def _continuations(obs: Observations, reads, stories) -> list[Violation]:
    """Each turn sent on a damaged history: decided as ``allowed``; promoted, its history
    read from storage fails like the history it extends (the cache may serve it whole:
    its prefix was verified before the damage, and an extension reads the new row
    alone, CONTRACT 5), its status ``promoted``; rejected, ``NOT_PROMOTED`` and
    ``rejected CORRUPT``."""
    from ratchet.chaos.damage import Damage

    seen: dict[tuple[str, str], set[Sig]] = defaultdict(set)
    for rec in (*obs.promoted, *obs.rejected):
        seen[(rec.tenant, rec.response_id)].add(rec.sig)
    out = []
    for c in obs.continuations:
        got = seen.get(c.event_key, set())
        if not got or got - c.allowed:
            out.append(Violation("damage_continuation_wrong", c.sid, f"{c.response_id} sent "
                                 f"on a history damaged by {c.kind}: {_fmt(got)}, expected "
                                 f"{_fmt(c.allowed)}"))
            continue
        promoted = any(sig[0] == "P" for sig in got)
        as_damage = Damage(c.sid, c.tenant, "", c.promo.conversation_id is not None, c.kind,
                           "", frozenset({c.response_id}))
        seq = c.promo.seq
        heads = None if c.promo.conversation_id is None else (seq, seq)
        for cached in (True, False):
            answer = reads.get(("history", c.tenant, c.response_id, cached))
            if answer is None:
                continue
            via = "through the cache" if cached else "with no-cache"
            if promoted:
                found = _through_problem(as_damage, c.promo, c.response_id, answer, cached,
                                         heads)
            elif (answer.outcome, answer.reason) != ("failure", "NOT_PROMOTED"):
                found = ("damage_wrong_reason", f"{_hist(answer)}, rejected: NOT_PROMOTED due")
            else:
                found = None
            if found:
                out.append(Violation(found[0], c.sid, f"{c.response_id} (sent after "
                                     f"{c.kind}) {via}: {found[1]}"))
        status = reads.get(("status", c.tenant, c.response_id, False))
        want = {("promoted", None, seq)} if promoted else {("rejected", "CORRUPT", None)}
        if c.kind == "head_unbacked" and promoted:
            want = {("error", "CORRUPT_HISTORY", None)}
        if status is not None and tuple(status) not in want:
            out.append(Violation("damage_status_mismatch", c.sid, f"{c.response_id} (sent "
                                 f"after {c.kind}): status {status}, expected {sorted(want)}"))
    return out


def _through_problem(d, promo: Promo, rid: str, got: History, cached: bool,
                     heads) -> tuple[str, str] | None:
    """(class, detail) of a read through damaged rows that is not what the docs give."""
    reasons = d.reasons(rid)
    want = "failure/" + "|".join(sorted(reasons))
    if got.outcome == "failure" and got.reason in reasons:
        return None
    if got.outcome != "failure":
        if cached and d.cache_may_hide:
            problem = _answer_problem(promo, rid, got, heads=heads)
            if problem is None:
                return None  # the verified history, served from memory (CONTRACT 5)
            return "damage_undetected", (f"{_hist(got)} from the cache is not the promoted "
                                         f"history ({problem}); expected it or {want}")
        return "damage_undetected", f"{_hist(got)} served; expected {want}"
    return "damage_wrong_reason", f"{_hist(got)}, expected {want}"


def _damaged_status_problem(d, promo: Promo, rid: str, got) -> str | None:
    """``/status`` after the damage (gateway-protocol.md section 8, "Status body"): the
    head's damage makes every response of the Conversation 500 CORRUPT_HISTORY; the
    damaged turn's own is ``promoted`` at its seq or 500 CORRUPT_HISTORY (a deleted
    turn's: 500 MISSING_HISTORY, its row is gone); any other ``promoted`` at its seq."""
    if got is None:
        return None
    promoted = ("promoted", None, promo.seq)
    corrupt = ("error", "CORRUPT_HISTORY", None)
    if d.kind == "head_unbacked":
        allowed = {corrupt}
    elif d.kind == "turn_deleted" and rid == d.response_id:
        allowed = {("error", "MISSING_HISTORY", None)}
    elif rid == d.response_id:
        allowed = {promoted, corrupt}
    else:
        allowed = {promoted}
    if tuple(got) in allowed:
        return None
    return f"status {got}, expected one of {sorted(allowed, key=str)}"


def _damage_controls(expectations, obs, reads, damaged_keys) -> list[Violation]:
    """Undamaged stories read again after the damage (``no-cache``): as before."""
    from ratchet.chaos.damage import certain

    promos: dict[tuple[str, str], tuple] = {}
    convs: dict[tuple[str, str], tuple] = {}
    for e in expectations:
        w = certain(e)
        if w is None:
            continue
        heads = _final_heads(e.story, w)
        for rid, p in w.promoted.items():
            promos[(e.story.tenant, rid)] = (e.story.sid, p, _head_range(p, heads))
        if e.story.kind == "conversation" and w.head:
            head = next(p for p in w.promoted.values() if p.seq == w.head)
            convs[(e.story.tenant, e.story.key)] = (e.story.sid, head, (w.head, w.head))
    out = []
    for key, got in reads.items():
        what, tenant, ident, cached = key
        if key in damaged_keys or what not in ("history", "conversation"):
            continue
        found = (promos if what == "history" else convs).get((tenant, ident))
        if found is None:
            continue
        sid, promo, heads = found
        problem = _answer_problem(promo, promo.response_id, got, heads=heads)
        if problem:
            out.append(Violation("damage_leak", sid, f"{what} {ident} of an undamaged "
                                 f"story, read after the damage: {problem}"))
    return out


# ------------------------------------------------------------ another tenant's reads


def check_cross_tenant(obs: Observations) -> list[Violation]:
    """Each read by a tenant of the workload of an id it never used
    (ratchet/chaos/crosstenant.py): the endpoint's answer for an unknown id, nothing of
    the history disclosed, the same body as for an id nobody used, and a ``wait_ms``
    read answered only after its wait."""
    from ratchet.chaos.crosstenant import DISCLOSING, EXPECTED, WAIT_MS, normalized

    out = []
    for r in obs.cross_reads:
        status, outcome, reason = EXPECTED[r.what]
        body = r.body or {}
        got = (r.http_status, body.get("state" if r.what == "status" else "outcome"),
               body.get("reason"))
        wrong = []
        if got != (status, outcome, reason):
            wrong.append(f"HTTP {got[0]} {got[1]}/{got[2]}, expected HTTP {status} "
                         f"{outcome}/{reason}")
        shown = [f for f in DISCLOSING if body.get(f) is not None]
        if shown:
            wrong.append(f"discloses {shown}")
        base = obs.cross_baseline.get((r.what, r.tenant))
        if base is not None and not wrong and base != (r.http_status,
                                                       normalized(r.body, r.ident)):
            wrong.append(f"another body than for an id nobody used: "
                         f"{normalized(r.body, r.ident)[:300]} != {base[1][:300]}")
        if r.what == "wait" and r.elapsed_ms < WAIT_MS * 0.9:
            wrong.append(f"answered after {r.elapsed_ms:.0f} ms of a {WAIT_MS} ms wait (an "
                         f"unknown id waits the whole time)")
        if wrong:
            out.append(Violation(f"cross_tenant_{r.what}", r.tenant, f"{r.ident} (of "
                                 f"{r.owner}) asked as {r.tenant}: {'; '.join(wrong)}"))
    return out
