"""The chaos workload's coverage turns (ratchet/chaos/coverage.py) are
produced for a typical seed, and the oracle expects the documented outcome of each:
catalogue item types with their pairing rules, NO_ARTIFACT, truncated turns, router
receipts, subturns, a large turn, and expiries that pass during the run
(ratchet/chaos/timed.py). No servers: the oracle alone, and the stamping and judging
of timed reads on made-up observations."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from ratchet.chaos import timed
from ratchet.chaos.coverage import LARGE_BYTES, UNPAIRED_CATALOGUE, _unpaired_catalogue
from ratchet.chaos.observations import History, Observations, Promoted, Wait
from ratchet.chaos.oracle import KNOWN_TYPES, _unpaired, expect
from ratchet.chaos.story import Story, StoryGateway, workload_fp_hash
from ratchet.chaos.workload import generate
from schemas.models import TurnCompleted

# Every item type of the catalogue (contracts.md section 7).
CATALOGUE = {
    "message", "reasoning", "compaction", "web_search_call", "file_search_call",
    "code_interpreter_call", "image_generation_call", "mcp_list_tools", "mcp_call",
    "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
    "computer_call", "computer_call_output", "local_shell_call", "local_shell_call_output",
    "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
    "mcp_approval_request", "mcp_approval_response",
}


@pytest.fixture(scope="module")
def work():
    w = generate(9, 2000, "cov")
    return w, [expect(s) for s in w.stories]


def _turns(work, label_prefix: str):
    """(story, expectation, event index, turn) of every turn sent under a label."""
    w, exps = work
    for story, exp in zip(w.stories, exps, strict=True):
        for step, label in zip(story.steps, story.labels, strict=True):
            if label.startswith(label_prefix):
                for i in (*step.sends, *step.race):
                    if isinstance(story.events[i], TurnCompleted):
                        yield story, exp, i, story.events[i]


def _outcomes(exp, index):
    return set().union(*(w.decided[index] for w in exp.worlds if index in w.decided))


def _promo(exp, ev):
    promos = {w.promoted.get(ev.response_id) for w in exp.worlds}
    promos.discard(None)
    return promos


def test_the_workload_sends_every_catalogue_type(work):
    w, _ = work
    sent = Counter(i.type for s in w.stories for e in s.events if isinstance(e, TurnCompleted)
                   for i in (*e.input_items, *e.output_items))
    assert set(sent) >= CATALOGUE, CATALOGUE - set(sent)
    assert KNOWN_TYPES == CATALOGUE


def test_catalogue_turns_promote(work):
    turns = list(_turns(work, "catalogue"))
    assert len(turns) > 20
    for story, exp, i, ev in turns:
        if ev.tenant_id == story.tenant and any(
                ev.response_id in w.promoted and w.promoted[ev.response_id].key
                == ev.idempotency_key for w in exp.worlds):
            continue
        # Only what the story's head allows refuses them (a race lost), never the items.
        assert all(sig[0] == "R" and sig[1] in ("CONFLICT", "OUT_OF_ORDER", "DUPLICATE")
                   for sig in _outcomes(exp, i)), (story.sid, _outcomes(exp, i))


def test_catalogue_pairing_breaches_are_sent_and_unpaired(work):
    turns = list(_turns(work, "unpaired_"))
    hows = {story.labels[[j for j, st in enumerate(story.steps) if i in st.sends][0]]
            for story, _, i, _ in turns}
    assert len(hows & {f"unpaired_{h}" for h in UNPAIRED_CATALOGUE}) >= 3, hows
    for _, exp, i, _ in turns:
        assert ("R", "UNPAIRED_TOOL_CALL", None) in _outcomes(exp, i)


@pytest.mark.parametrize("how", UNPAIRED_CATALOGUE)
def test_each_catalogue_pairing_breach_is_unpaired(how):
    story = Story(0, "cov-pin", "conversation", "ten-pin", "conv-cov-pin", "gateway")
    gw = StoryGateway(story, random.Random(1))
    first = story.add("normal", gw.turn(gw.identity(gw.rid(), 0), gw.key(), "hello"))[0]
    rid = gw.rid()
    bad = gw.turn(gw.identity(rid, 1), gw.key(), "again",
                  extra_output=tuple(_unpaired_catalogue(rid, how, gw.rng)))
    second = story.add(how, bad)[0]
    (world,) = expect(story).worlds
    assert world.decided[first] == {world.promoted[story.events[first].response_id].sig}
    assert world.decided[second] == {("R", "UNPAIRED_TOOL_CALL", None)}


def test_pairing_rules_per_call_type():
    assert not _unpaired((("shell_call", "c1"), ("shell_call_output", "c1"), ("message", None)))
    assert _unpaired((("shell_call", "c1"), ("local_shell_call_output", "c1")))
    assert not _unpaired((("mcp_approval_request", "a1"), ("function_call", "c1"),
                          ("function_call_output", "c1"), ("mcp_approval_response", "a1"),
                          ("message", None)))
    assert _unpaired((("mcp_approval_request", "a1"), ("message", None)))
    assert not _unpaired((("message", None), ("computer_call", "c9")))  # open at the end
    assert _unpaired((("custom_tool_call", "c1"), ("custom_tool_call_output", "c1"),
                      ("apply_patch_call", "c1"), ("apply_patch_call_output", "c1")))


def test_no_artifact_truncated_and_receipts(work):
    fp = workload_fp_hash()
    seen = Counter()
    for label, want in (("no_artifact", ("fallback", "NO_ARTIFACT")),
                        ("truncated", ("fallback", "NOT_CERTIFIED")),
                        ("receipt", ("certified", None))):
        for _, exp, _, ev in _turns(work, label):
            if label == "no_artifact":
                assert ev.status == "completed" and ev.token_artifact is None
            if label == "truncated":
                assert ev.effective_config.truncation == "auto" and ev.effective_config.truncated
            if label == "receipt":
                assert ev.router_receipt is not None
            for promo in _promo(exp, ev):
                assert promo.read(fp) == want, (label, ev.response_id)
                cert = "logical_only" if label == "truncated" else "certified"
                assert promo.certification == cert
                seen[label] += 1
    assert all(seen[label] > 5 for label in ("no_artifact", "truncated", "receipt")), seen


def test_subturns_list_their_effects(work):
    turns = list(_turns(work, "subturns"))
    assert turns
    for _, exp, _, ev in turns:
        assert ev.subturns and not ev.tool_effect_ids
        assert all(s.ephemeral_artifact_ref for s in ev.subturns)
        listed = {e for s in ev.subturns for e in s.effect_ids}
        for promo in _promo(exp, ev):
            assert promo.effect_ids == listed  # used: never orphaned
        for w in exp.worlds:
            if ev.response_id in w.promoted:
                assert listed <= w.used and not listed & w.orphans


def test_a_large_turn_is_sent_raw_and_promotes(work):
    turns = list(_turns(work, "large"))
    assert 1 <= len(turns) <= len(work[0].stories) // 30
    for story, exp, i, ev in turns:
        assert story.path == "raw"
        assert sum(len(x.content) for x in ev.output_items) >= LARGE_BYTES
        assert any(s[0] == "P" for s in _outcomes(exp, i))


def test_timed_turns_expect_the_expiry(work):
    fp = workload_fp_hash()
    wants = {"receipt": ("fallback", "ARTIFACT_EXPIRED"),
             "artifact": ("fallback", "ARTIFACT_EXPIRED"), "logical": ("failure", "EXPIRED")}
    seen = Counter()
    for story, exp, i, ev in _turns(work, "expiring"):
        what, _ = story.timed[i]
        for promo in _promo(exp, ev):
            assert promo.expiring == what
            assert promo.read(fp) == wants[what]
            assert promo.read_at(fp, past_expiry=False) == ("certified", None)
            seen[what] += 1
    assert all(seen[k] for k in wants), seen


def test_stamping_sets_the_expiry_at_the_send(work):
    story, _, i, ev = next(_turns(work, "expiring_artifact"))
    stamped = timed.stamp(story, i, ev, 1_000_000)
    assert stamped.token_artifact.expires_at == 1_000_000 + story.timed[i][1]
    assert stamped.boundary_proof.expires_at == ev.boundary_proof.expires_at
    stamper = timed.Stamper()
    assert stamper(story, i, ev) is stamper(story, i, ev)  # the same bytes when sent again


def _timed_case(work, what: str):
    w, exps = work
    for story, exp in zip(w.stories, exps, strict=True):
        for i, (kind, _) in story.timed.items():
            ev = story.events[i]
            if kind == what and len(exp.worlds) == 1 and ev.response_id in exp.worlds[0].promoted:
                return story, exp, ev
    raise AssertionError(what)


@pytest.mark.parametrize("what", ["receipt", "artifact", "logical"])
def test_timed_reads_are_judged_by_when_they_were_asked(work, what):
    story, exp, ev = _timed_case(work, what)
    key = (story.tenant, ev.response_id)
    st = timed.Stamp(story.tenant, ev.response_id, what, 100_000, 97_000)
    stamps = {key: st}
    promo = exp.worlds[0].promoted[ev.response_id]
    items = promo.items
    certified = History("certified", None, items, ev.response_id, promo.seq)
    expired = (History("failure", "EXPIRED", ()) if what == "logical" else
               History("fallback", "ARTIFACT_EXPIRED", items, ev.response_id, promo.seq))

    def judged(history, asked, answered):
        return timed.judge([exp], stamps, [timed.TimedRead(*key, history, asked, answered)])

    assert judged(certified, 97_100, 97_200) == ([], {"before": 1, "after": 0, "unjudged": 0,
                                                      "missing_stamp": 0})
    assert judged(expired, 102_000, 102_050)[0] == []
    # B3: an expired receipt or artifact offered for reuse after its expiry.
    bad, _ = judged(certified, 102_000, 102_050)
    assert [v.kind for v in bad] == ["expiry_mismatch"]
    # Expired too early.
    assert [v.kind for v in judged(expired, 97_100, 97_200)[0]] == ["expiry_mismatch"]
    # Too close to the expiry, or answered too late to tell: not judged.
    assert judged(certified, 100_500, 100_600)[1]["unjudged"] == 1
    assert judged(expired, 97_100, None)[1]["unjudged"] == 1


def test_a_slow_worker_may_have_dropped_a_timed_artifact(work):
    story, exp, ev = _timed_case(work, "artifact")
    key = (story.tenant, ev.response_id)
    stamps = {key: timed.Stamp(story.tenant, ev.response_id, "artifact", 100_000, 97_000)}
    promo = exp.worlds[0].promoted[ev.response_id]
    obs = Observations()
    obs.promoted.append(Promoted(story.tenant, ev.response_id, None, None, promo.seq,
                                 "certified", promo.key, promo.digest, len(promo.items), 99_500))
    obs.histories[key] = History("fallback", "NO_ARTIFACT", promo.items, ev.response_id,
                                 promo.seq)
    timed.settle([exp], stamps, obs)
    assert exp.worlds[0].promoted[ev.response_id].read(workload_fp_hash()) == (
        "fallback", "NO_ARTIFACT")
    # Published well before its expiry: the artifact was kept, NO_ARTIFACT is wrong.
    exp2 = expect(story)
    obs.promoted[0] = Promoted(story.tenant, ev.response_id, None, None, promo.seq,
                               "certified", promo.key, promo.digest, len(promo.items), 97_500)
    timed.settle([exp2], stamps, obs)
    assert exp2.worlds[0].promoted[ev.response_id].read(workload_fp_hash()) == (
        "fallback", "ARTIFACT_EXPIRED")


def test_wait_answers_of_timed_turns_are_judged_apart():
    obs = Observations()
    h = History("certified", None, ())
    obs.waits += [Wait("t", "r1", h, 5), Wait("t", "r2", h, 6)]
    stamps = {("t", "r1"): timed.Stamp("t", "r1", "receipt", 10, 1)}
    taken = timed.take_waits(obs, stamps)
    assert [r.response_id for r in taken] == ["r1"] and taken[0].answered_ms is None
    assert [x.response_id for x in obs.waits] == ["r2"]


def test_recipe_violations_on_a_typical_seed_are_none(work):
    assert timed.recipe_violations(work[0]) == []


def test_story_timed_defaults_empty():
    assert Story(0, "s", "chain", "t", "k", "gateway").timed == {}
