"""The chaos harness's damage phase and its reads as another tenant (docs/chaos.md,
"Damaged rows" and "Reads as another tenant"): the plan, the damaged cells, and each
check failing on a wrong answer and passing on the right one. No servers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import pytest

from ratchet.chaos import crosstenant, damage
from ratchet.chaos.answers import final_heads, head_range
from ratchet.chaos.checker import check
from ratchet.chaos.crosstenant import CrossRead, normalized
from ratchet.chaos.damage import Damage, DamageRead
from ratchet.chaos.damage_checks import check_cross_tenant, check_damage
from ratchet.chaos.observations import History, Observations
from ratchet.chaos.oracle import expect
from ratchet.chaos.workload import generate
from services.store.rows import decode_turn_items, encode_turn_items
from tests.unit.test_chaos_observe_gaps import complete, full


@pytest.fixture(scope="module")
def expectations():
    return [expect(s) for s in generate(seed=7, turns=800, tag="unit").stories]


@pytest.fixture(scope="module")
def damages(expectations):
    return damage.plan(expectations, 7)


def _stories(expectations):
    return {e.story.sid: e for e in expectations}


def faithful_damage(expectations, damages) -> Observations:
    """What a correct API answers after the damage: through a damaged turn, the failure
    from storage and the verified history from the cache (the head's damage: the
    failure everywhere); every other history as promoted; statuses as the docs say."""
    obs = Observations(damages=list(damages))
    stories = _stories(expectations)
    reads = obs.damage_reads
    for d in damages:
        e = stories[d.sid]
        w = e.worlds[0]
        heads = final_heads(e.story, w)
        for rid, p in sorted(w.promoted.items()):
            head = head_range(p, heads)
            right = full(p, None if head is None else head[0])
            fail = History("failure", d.reason, ())
            through = rid in d.through
            reads.append(DamageRead("history", d.tenant, rid, False, fail if through else right))
            cached = fail if through and not d.cache_may_hide else right
            reads.append(DamageRead("history", d.tenant, rid, True, cached))
            status = (("error", "CORRUPT_HISTORY", None) if d.kind == "head_unbacked"
                      else ("error", "MISSING_HISTORY", None)
                      if d.kind == "turn_deleted" and rid == d.response_id
                      else ("promoted", None, p.seq))
            reads.append(DamageRead("status", d.tenant, rid, False, status))
        if d.conversation:
            head = next(p for p in w.promoted.values() if p.seq == w.head)
            fail = History("failure", d.reason, ())
            reads.append(DamageRead("conversation", d.tenant, d.partition, False, fail))
            reads.append(DamageRead("conversation", d.tenant, d.partition, True,
                                    fail if not d.cache_may_hide else full(head, w.head)))
        reads.append(DamageRead("foreign", "ten-unit-x", d.response_id, False,
                                History("failure", "NOT_FOUND", ())))
    for e in damage.controls(expectations, damages):
        w = e.worlds[0]
        heads = final_heads(e.story, w)
        for rid, p in sorted(w.promoted.items()):
            head = head_range(p, heads)
            reads.append(DamageRead("history", e.story.tenant, rid, False,
                                    full(p, None if head is None else head[0])))
        if e.story.kind == "conversation":
            head = next(p for p in w.promoted.values() if p.seq == w.head)
            reads.append(DamageRead("conversation", e.story.tenant, e.story.key, False,
                                    full(head, w.head)))
    return obs


def _kinds(violations) -> set[str]:
    return {v.kind for v in violations}


def _replace(obs: Observations, pick, answer) -> Observations:
    """``obs`` with the first damage read ``pick`` accepts answered ``answer``."""
    reads = list(obs.damage_reads)
    n = next(i for i, r in enumerate(reads) if pick(r))
    reads[n] = dataclasses.replace(reads[n], answer=answer)
    return dataclasses.replace(obs, damage_reads=reads)


def _damage(damages, kind: str, conversation: bool | None = None) -> Damage:
    return next(d for d in damages if d.kind == kind
                and (conversation is None or d.conversation is conversation))


# --- the plan -----------------------------------------------------------------------


def test_the_plan_damages_every_kind_in_both_modes_and_only_certain_stories(
        expectations, damages):
    assert damages == damage.plan(expectations, 7)  # seeded
    assert {d.kind for d in damages if d.conversation} == set(damage.CONVERSATION_KINDS)
    assert {d.kind for d in damages if not d.conversation} == set(damage.CHAIN_KINDS)
    stories = _stories(expectations)
    for d in damages:
        w = damage.certain(stories[d.sid])
        assert w is not None and d.response_id in w.promoted
        assert d.through <= set(w.promoted)
        target = w.promoted[d.response_id]
        if d.kind == "head_unbacked":
            assert target.seq == w.head and d.through == set(w.promoted)
        elif d.conversation:
            # A middle turn: the turns before it stay readable.
            assert 1 < target.seq < w.head
            assert d.through == {r for r, p in w.promoted.items() if p.seq >= target.seq}
        else:
            assert d.through == damage.descendants(w, d.response_id)
            assert len(d.through) >= 2  # the damaged turn has a child


def test_damaged_cells_read_as_their_kinds_say():
    def item(n):
        content = json.dumps({"type": "message", "role": "user", "n": n}).encode()
        return (n, f"i{n}", "message", "user", None, content,
                hashlib.sha256(content).hexdigest(), 1)

    records = [item(n) for n in (5, 6, 7)]
    rng = random.Random(0)
    with pytest.raises(ValueError):
        decode_turn_items(damage.damaged_cell("items_garbage", records, rng))
    dropped = decode_turn_items(encode_turn_items(damage.damaged_cell("item_dropped",
                                                                       records, rng)))
    assert [r[1] for r in dropped] == ["i5", "i6"]
    swapped = damage.damaged_cell("items_swapped", records, rng)
    assert [(r[0], r[1]) for r in swapped] == [(5, "i6"), (6, "i5"), (7, "i7")]
    altered = damage.damaged_cell("content_altered", records, rng)[0]
    assert json.loads(altered[5]) == json.loads(records[0][5])
    assert hashlib.sha256(altered[5]).hexdigest() != altered[6] == records[0][6]


# --- the damage checks ----------------------------------------------------------------


def test_the_faithful_damage_answers_pass(expectations, damages):
    obs = faithful_damage(expectations, damages)
    assert check_damage(expectations, obs) == []
    whole = complete(expectations)
    whole.damages, whole.damage_reads = obs.damages, obs.damage_reads
    assert check(expectations, whole) == []


def test_the_failure_from_the_cache_passes_too(expectations, damages):
    d = _damage(damages, "items_garbage", conversation=True)
    rid = sorted(d.through)[0]
    obs = _replace(faithful_damage(expectations, damages),
                   lambda r: (r.what, r.ident, r.cached) == ("history", rid, True),
                   History("failure", d.reason, ()))
    assert check_damage(expectations, obs) == []


@pytest.mark.parametrize("kind", ["items_garbage", "item_dropped", "items_swapped",
                                  "content_altered"])
def test_a_damaged_history_served_from_storage_is_reported(expectations, damages, kind):
    d = _damage(damages, kind)
    w = _stories(expectations)[d.sid].worlds[0]
    rid = max(d.through, key=lambda r: w.promoted[r].seq)
    faithful = faithful_damage(expectations, damages)
    served = next(r.answer for r in faithful.damage_reads
                  if (r.what, r.ident, r.cached) == ("history", rid, True))
    obs = _replace(faithful, lambda r: (r.what, r.ident, r.cached) == ("history", rid, False),
                   served)  # the API served it without checking the damaged rows
    assert _kinds(check_damage(expectations, obs)) == {"damage_undetected"}


def test_a_cached_answer_that_is_not_the_verified_history_is_reported(expectations, damages):
    d = _damage(damages, "item_dropped", conversation=True)
    rid = sorted(d.through)[0]
    faithful = faithful_damage(expectations, damages)
    served = next(r.answer for r in faithful.damage_reads
                  if (r.what, r.ident, r.cached) == ("history", rid, True))
    shortened = dataclasses.replace(served, items=served.items[:-1])
    obs = _replace(faithful, lambda r: (r.what, r.ident, r.cached) == ("history", rid, True),
                   shortened)
    assert _kinds(check_damage(expectations, obs)) == {"damage_undetected"}


def test_another_failure_reason_is_reported(expectations, damages):
    d = _damage(damages, "item_dropped")
    rid = sorted(d.through)[0]
    obs = _replace(faithful_damage(expectations, damages),
                   lambda r: (r.what, r.ident, r.cached) == ("history", rid, False),
                   History("failure", "CORRUPT_HISTORY", ()))  # MISSING_HISTORY is due
    assert _kinds(check_damage(expectations, obs)) == {"damage_wrong_reason"}


def test_a_head_no_checkpoint_backs_may_not_be_hidden_by_the_cache(expectations, damages):
    d = _damage(damages, "head_unbacked")
    w = _stories(expectations)[d.sid].worlds[0]
    head = next(p for p in w.promoted.values() if p.seq == w.head)
    obs = _replace(faithful_damage(expectations, damages),
                   lambda r: (r.what, r.ident, r.cached) == ("conversation", d.partition, True),
                   full(head, w.head))
    assert _kinds(check_damage(expectations, obs)) == {"damage_undetected"}


def test_a_turn_before_the_damage_that_fails_is_a_leak(expectations, damages):
    d = _damage(damages, "items_garbage", conversation=True)
    w = _stories(expectations)[d.sid].worlds[0]
    before = next(r for r in sorted(w.promoted) if r not in d.through)
    obs = _replace(faithful_damage(expectations, damages),
                   lambda r: (r.what, r.ident, r.cached) == ("history", before, False),
                   History("failure", "CORRUPT_HISTORY", ()))
    assert _kinds(check_damage(expectations, obs)) == {"damage_leak"}


def test_an_undamaged_story_that_changed_after_the_damage_is_a_leak(expectations, damages):
    control = damage.controls(expectations, damages)[0]
    rid = sorted(control.worlds[0].promoted)[0]
    obs = _replace(faithful_damage(expectations, damages),
                   lambda r: (r.what, r.tenant, r.ident) == ("history", control.story.tenant,
                                                             rid),
                   History("failure", "CORRUPT_HISTORY", ()))
    assert _kinds(check_damage(expectations, obs)) == {"damage_leak"}


def test_statuses_after_the_damage(expectations, damages):
    head = _damage(damages, "head_unbacked")
    rid = sorted(head.through)[0]
    w = _stories(expectations)[head.sid].worlds[0]
    obs = _replace(faithful_damage(expectations, damages),
                   lambda r: (r.what, r.ident) == ("status", rid),
                   ("promoted", None, w.promoted[rid].seq))
    assert _kinds(check_damage(expectations, obs)) == {"damage_status_mismatch"}
    items = _damage(damages, "items_garbage", conversation=False)
    faithful = faithful_damage(expectations, damages)
    # The damaged turn's own status: promoted, or 500 CORRUPT_HISTORY; never unknown.
    for answer, kinds in ((("error", "CORRUPT_HISTORY", None), set()),
                          (("unknown", None, None), {"damage_status_mismatch"})):
        obs = _replace(faithful, lambda r: (r.what, r.ident) == ("status", items.response_id),
                       answer)
        assert _kinds(check_damage(expectations, obs)) == kinds


def test_a_damaged_history_asked_as_another_tenant_is_not_found(expectations, damages):
    obs = _replace(faithful_damage(expectations, damages), lambda r: r.what == "foreign",
                   History("failure", "CORRUPT_HISTORY", ()))
    assert _kinds(check_damage(expectations, obs)) == {"cross_tenant_history"}


# --- reads as another tenant ------------------------------------------------------------


def test_the_foreign_tenant_never_used_the_id(expectations):
    used = crosstenant.used_ids(expectations)
    pick = crosstenant.foreign_picker(expectations)
    shared = [(e.story.tenant, ev.response_id) for e in expectations for ev in e.story.events
              if getattr(ev, "response_id", None)
              and sum(ev.response_id in ids for ids in used.values()) > 1]
    assert shared  # the workload has response ids two tenants use
    for owner, ident in shared:
        other = pick(owner, ident)
        assert other != owner and (other is None or ident not in used[other])
    responses = sorted({(e.story.tenant, r) for e in expectations for r in
                        (e.worlds[0].promoted if e.worlds else ())})
    convs = sorted({(e.story.tenant, e.story.key) for e in expectations
                    if e.story.kind == "conversation"})
    todo = crosstenant.jobs(expectations, responses, convs)
    assert {what for what, *_ in todo} == set(crosstenant.EXPECTED)
    assert all(ident not in used.get(tenant, ()) for _, _, tenant, ident in todo)


def _body(what: str, ident: str) -> dict:
    if what == "status":
        return {"response_id": ident, "state": "unknown", "reason": None, "seq": None,
                "existing_response_id": None}
    reason = "NOT_PROMOTED" if what == "wait" else "NOT_FOUND"
    return {"outcome": "failure", "reason": reason, "head_seq": None,
            "conversation_head_seq": None,
            "response_id": ident if what == "wait" else None, "items": None,
            "checkpoint": None, "detail": f"nothing for {ident}"}


def _cross(what: str, **change) -> Observations:
    status = crosstenant.EXPECTED[what][0]
    obs = Observations()
    obs.cross_baseline[(what, "ten-b")] = (status, normalized(_body(what, "never"), "never"))
    read = CrossRead(what, "ten-a", "ten-b", "resp-1", status, _body(what, "resp-1"),
                     crosstenant.WAIT_MS + 5.0)
    obs.cross_reads.append(dataclasses.replace(read, **change))
    return obs


@pytest.mark.parametrize("what", sorted(crosstenant.EXPECTED))
def test_the_answer_for_an_unknown_id_passes(what):
    assert check_cross_tenant(_cross(what)) == []


def test_another_tenants_history_disclosed_is_reported():
    leaked = {**_body("history", "resp-1"), "outcome": "certified", "reason": None,
              "head_seq": 2, "items": [{"item_id": "i1"}]}
    assert _kinds(check_cross_tenant(_cross("history", http_status=200, body=leaked))) == {
        "cross_tenant_history"}


def test_another_tenants_conversation_read_is_reported():
    corrupt = {**_body("conversation", "c"), "reason": "CORRUPT_HISTORY"}
    assert _kinds(check_cross_tenant(_cross("conversation", http_status=500,
                                            body=corrupt))) == {"cross_tenant_conversation"}
    # The right status and reason, but another body than an unknown id's: it tells.
    told = {**_body("conversation", "resp-1"), "detail": "owned by another tenant"}
    assert _kinds(check_cross_tenant(_cross("conversation", body=told))) == {
        "cross_tenant_conversation"}


def test_another_tenants_status_is_reported():
    promoted = {**_body("status", "resp-1"), "state": "promoted", "seq": 3}
    assert _kinds(check_cross_tenant(_cross("status", body=promoted))) == {
        "cross_tenant_status"}


def test_a_wait_answered_before_its_time_is_reported():
    assert _kinds(check_cross_tenant(_cross("wait", elapsed_ms=12.0))) == {
        "cross_tenant_wait"}
    rejected = {**_body("wait", "resp-1"), "detail": "rejected: TENANT_MISMATCH"}
    assert _kinds(check_cross_tenant(_cross("wait", body=rejected))) == {"cross_tenant_wait"}


def test_a_deleted_turns_own_reads(expectations, damages):
    """Its descendants read MISSING_HISTORY (faithful_damage), and so do its own reads
    from storage (docs/store.md rule 1: promoted, its row gone), never NOT_FOUND (an
    unknown id) nor a history; its /status is 500 MISSING_HISTORY, never ``unknown``."""
    d = _damage(damages, "turn_deleted", conversation=True)
    faithful = faithful_damage(expectations, damages)

    def own(r):
        return (r.what, r.ident, r.cached) == ("history", d.response_id, False)

    served = next(r.answer for r in faithful.damage_reads
                  if (r.what, r.ident, r.cached) == ("history", d.response_id, True))
    for answer, kinds in ((History("failure", "MISSING_HISTORY", ()), set()),
                          (History("failure", "NOT_FOUND", ()), {"damage_wrong_reason"}),
                          (History("failure", "CORRUPT_HISTORY", ()), {"damage_wrong_reason"}),
                          (History("failure", "EXPIRED", ()), {"damage_wrong_reason"}),
                          (served, {"damage_undetected"})):
        assert _kinds(check_damage(expectations, _replace(faithful, own, answer))) == kinds

    def status(r):
        return (r.what, r.ident) == ("status", d.response_id)

    for answer, kinds in ((("error", "MISSING_HISTORY", None), set()),
                          (("unknown", None, None), {"damage_status_mismatch"}),
                          (("error", "CORRUPT_HISTORY", None), {"damage_status_mismatch"}),
                          (("promoted", None, 2), {"damage_status_mismatch"}),
                          (("rejected", "CONFLICT", None), {"damage_status_mismatch"})):
        assert _kinds(check_damage(expectations, _replace(faithful, status, answer))) == kinds
    # A descendant answered NOT_FOUND: MISSING_HISTORY is due (docs/store.md rule 3).
    child = next(r for r in sorted(d.through) if r != d.response_id)
    obs = _replace(faithful, lambda r: (r.what, r.ident, r.cached) == ("history", child, False),
                   History("failure", "NOT_FOUND", ()))
    assert _kinds(check_damage(expectations, obs)) == {"damage_wrong_reason"}


# --- turns sent on damaged histories -----------------------------------------------------


def _continued(expectations, damages, kind: str, outcome: str):
    """The faithful observation of the continuation of ``kind``'s damage, decided
    ``outcome`` (promoted, or rejected CORRUPT)."""
    from ratchet.chaos.observations import Promoted, Rejected

    c = next(c for c, _ in damage.continuations(expectations, damages) if c.kind == kind)
    obs = faithful_damage(expectations, damages)
    obs.continuations = [c]
    p = c.promo
    if outcome == "promoted":
        obs.promoted.append(Promoted(c.tenant, c.response_id, p.conversation_id,
                                     p.previous_response_id, *p.sig[1:], at_ms=0))
        heads = None if p.conversation_id is None else p.seq
        reads = [("history", True, full(p, heads)),
                 ("history", False, History("failure", c.reason, ())),
                 ("status", False, ("promoted", None, p.seq))]
    else:
        obs.rejected.append(Rejected(c.tenant, c.response_id, "CORRUPT", None, 0))
        reads = [("history", True, History("failure", "NOT_PROMOTED", ())),
                 ("history", False, History("failure", "NOT_PROMOTED", ())),
                 ("status", False, ("rejected", "CORRUPT", None))]
    obs.damage_reads += [DamageRead(what, c.tenant, c.response_id, cached, answer)
                         for what, cached, answer in reads]
    return c, obs


@pytest.mark.parametrize("kind", ["items_garbage", "turn_deleted", "head_unbacked"])
def test_a_continuation_decided_as_the_docs_allow_passes(expectations, damages, kind):
    for outcome in ("promoted", "rejected"):
        if kind == "head_unbacked" and outcome == "promoted":
            continue
        c, obs = _continued(expectations, damages, kind, outcome)
        assert check_damage(expectations, obs) == []
        whole = complete(expectations)
        for name in ("damages", "damage_reads", "continuations"):
            setattr(whole, name, getattr(obs, name))
        whole.promoted += [p for p in obs.promoted if p.response_id == c.response_id]
        whole.rejected += [r for r in obs.rejected if r.response_id == c.response_id]
        assert check(expectations, whole) == []  # not an unexpected_outcome either


def test_a_continuation_on_a_head_no_checkpoint_backs_promoted_is_reported(expectations,
                                                                           damages):
    c, obs = _continued(expectations, damages, "items_garbage", "promoted")
    head = next(x for x, _ in damage.continuations(expectations, damages)
                if x.kind == "head_unbacked")
    obs.continuations = [dataclasses.replace(c, allowed=head.allowed)]
    assert _kinds(check_damage(expectations, obs)) == {"damage_continuation_wrong"}


def test_a_continuation_served_from_storage_is_reported(expectations, damages):
    c, obs = _continued(expectations, damages, "item_dropped", "promoted")
    served = full(c.promo, None if c.promo.conversation_id is None else c.promo.seq)
    obs = _replace(obs, lambda r: (r.ident, r.what, r.cached) == (c.response_id, "history",
                                                                  False), served)
    assert _kinds(check_damage(expectations, obs)) == {"damage_undetected"}
    c, obs = _continued(expectations, damages, "items_garbage", "rejected")
    obs = _replace(obs, lambda r: (r.ident, r.what) == (c.response_id, "status"),
                   ("unknown", None, None))
    assert _kinds(check_damage(expectations, obs)) == {"damage_status_mismatch"}


class _Recording:
    """A stand-in cluster and session: the level of every statement ``apply`` sends; a
    read answers one turn row (an empty items cell is damaged like any other)."""

    def __init__(self) -> None:
        self.levels: list[tuple[str, int]] = []

    def connect(self):
        return self

    def shutdown(self) -> None:
        pass

    def execute(self, statement, params=None, **kwargs):
        self.levels.append((statement.query_string.split()[0], statement.consistency_level))
        row = type("Row", (), {"items": encode_turn_items([])})()
        return type("Result", (), {"one": lambda self: row})()


@pytest.mark.parametrize(("datacenters", "level"), [("one", "LOCAL_QUORUM"),
                                                    ("several", "QUORUM")])
def test_the_damage_reads_and_writes_at_the_store_s_levels(monkeypatch, datacenters, level):
    """Under ``RATCHET_DATACENTERS=several`` the store commits at QUORUM: a LOCAL_QUORUM
    read of the turn to damage need not see it (the run fails, "no turn row"), and a
    LOCAL_QUORUM damage need not reach the API's QUORUM read (the damage phase reports a
    leak that is not one). rrevt's outside review of m-rmdc2 (session 51)."""
    from cassandra import ConsistencyLevel

    import services.cassandra_cluster
    from ratchet.settings import Settings

    recording = _Recording()
    monkeypatch.setattr(services.cassandra_cluster, "open_cluster", lambda settings: recording)
    damages = [Damage("s1", "tenant", "conv", True, kind, "resp", frozenset({"resp"}))
               for kind in ("head_unbacked", "turn_deleted", "content_altered")]
    monkeypatch.setattr(damage, "damaged_cell", lambda kind, records, rng: b"damaged")
    damage.apply(Settings(datacenters=datacenters), damages, 7, say=lambda line: None)
    assert [verb for verb, _ in recording.levels] == ["UPDATE", "DELETE", "SELECT", "UPDATE"]
    assert {ConsistencyLevel.value_to_name[cl] for _, cl in recording.levels} == {level}
