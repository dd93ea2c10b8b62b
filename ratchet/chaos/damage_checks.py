"""The checks of the damage phase (``ratchet/chaos/damage.py``) and of the reads as
another tenant (``ratchet/chaos/crosstenant.py``): what each answer must be by the docs.
"""

from __future__ import annotations

from collections import defaultdict

from ratchet.chaos.answers import answer_problem, final_heads, head_range, history_text, sigs_text
from ratchet.chaos.observations import History, Observations, Violation
from ratchet.chaos.oracle import Expectation, Promo, Sig


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
        heads = final_heads(e.story, w)
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
                                             head_range(promo, heads))
                else:
                    problem = answer_problem(promo, rid, got, heads=head_range(promo, heads))
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
                                 f"as tenant {r.tenant}: {history_text(r.answer)}, expected "
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
                                 f"on a history damaged by {c.kind}: {sigs_text(got)}, expected "
                                 f"{sigs_text(c.allowed)}"))
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
                found = ("damage_wrong_reason", f"{history_text(answer)}, rejected: NOT_PROMOTED due")
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
            problem = answer_problem(promo, rid, got, heads=heads)
            if problem is None:
                return None  # the verified history, served from memory (CONTRACT 5)
            return "damage_undetected", (f"{history_text(got)} from the cache is not the promoted "
                                         f"history ({problem}); expected it or {want}")
        return "damage_undetected", f"{history_text(got)} served; expected {want}"
    return "damage_wrong_reason", f"{history_text(got)}, expected {want}"


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
        heads = final_heads(e.story, w)
        for rid, p in w.promoted.items():
            promos[(e.story.tenant, rid)] = (e.story.sid, p, head_range(p, heads))
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
        problem = answer_problem(promo, promo.response_id, got, heads=heads)
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
