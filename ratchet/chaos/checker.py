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

from ratchet.chaos.answers import (
    answer_problem,
    classify,
    final_heads,
    head_range,
    history_text,
    sigs_text,
    status_problem,
)
from ratchet.chaos.damage_checks import check_cross_tenant, check_damage
from ratchet.chaos.observations import (
    OTHER_FINGERPRINT,
    Lost,
    Observations,
    Promoted,
    Violation,
)
from ratchet.chaos.oracle import Expectation, Sig, World
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
    # The harness's own (ratchet/chaos/observe.py): its output reader died, or read a
    # record past that it could not decode. Not a CONTRACT rule: what it did not see.
    "observer_died", "observer_unread",
)
# The classes of the claim checks the producers make (``ratchet/chaos/claims.py``,
# ``Finding.logged``: the class tag first in the logged detail).
CLAIM_CLASSES = ("claim_answer_wrong", "effect_executed_twice", "claim_output_mismatch")


# A request that got no answer is excused when it overlaps a fault window stretched by
# this much after the fault ended (the API reconnecting to a restarted Cassandra).
FAULT_GRACE_MS = 30_000
# wait_ms requests outside fault windows: with at least this many asked, fewer than
# this share answered with a history fails the run (``waits_unanswered``).
WAITS_MIN_ASKED = 20
WAITS_MIN_ANSWERED = 0.25


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
                                 f"{history_text(h)}, expected failure/NOT_FOUND"))
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
            out.append(Violation("never_decided", sid, f"{rid}: expected {sigs_text(accs[0])}"))
            continue
        wanted = set().union(*accs)
        for acc in accs:
            if not acc & seen:
                out.append(Violation(classify(acc, seen), sid,
                                     f"{rid}: expected {sigs_text(acc)}, observed {sigs_text(seen)}"))
        for sig in seen - wanted:
            if not any(v.detail.startswith(f"{rid}:") for v in out):
                kind = "promotion_should_not_exist" if sig[0] == "P" else "wrong_reason"
                out.append(Violation(kind, sid, f"{rid}: unexpected {sigs_text({sig})}, "
                                                f"expected {sigs_text(wanted)}"))
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
    heads = final_heads(story, w)
    for sender, rid in per_rid:
        promo = w.promoted.get(rid) if sender == tenant else None
        head = head_range(promo, heads)
        problem = answer_problem(promo, rid, obs.histories.get((sender, rid)), heads=head)
        if problem:
            out.append(Violation("history_mismatch", sid, f"{rid}: {problem}"))
        other = obs.other_fingerprint.get((sender, rid))  # asked, unanswered: _unanswered
        problem = other and answer_problem(promo, rid, other, OTHER_FINGERPRINT, heads=head)
        if problem:
            out.append(Violation("history_mismatch", sid, f"{rid} asked with another "
                                                          f"fingerprint: {problem}"))
    for (sender, rid), accs in per_rid.items():
        problem = status_problem(w.promoted.get(rid) if sender == tenant else None,
                                  set().union(*accs), obs.statuses.get((sender, rid)))
        if problem:
            out.append(Violation("status_mismatch", sid, f"{rid}: {problem}"))
    if story.kind == "conversation" and w.head:
        head = next(p for p in w.promoted.values()
                    if p.conversation_id == story.key and p.seq == w.head)
        problem = answer_problem(head, head.response_id,
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
                                     f"{history_text(got)}, asked {wait.asked_ms - published} ms "
                                     f"after its promotion was published"))
            continue
        # Asked while the run went on: the Conversation's head then was at least this
        # response's seq and at most the final head.
        head = head_range(promo, heads)
        problem = answer_problem(promo, rid, got, heads=head and (promo.seq, head[1]))
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
