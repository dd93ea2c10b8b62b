"""The chaos checker can fail: doctored observations are reported, a faithful one is not.

The faithful observation is built from the oracle's expectations (what a correct
ratchet publishes); each test doctors one thing a broken ratchet could do.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from ratchet.chaos.checker import check
from ratchet.chaos.observations import History, Observations, Promoted, Rejected
from ratchet.chaos.oracle import expect
from ratchet.chaos.workload import generate
from schemas.models import TurnCompleted


@pytest.fixture(scope="module")
def expectations():
    return [expect(s) for s in generate(seed=7, turns=400, tag="unit").stories]


def faithful(expectations) -> Observations:
    obs = Observations()
    for e in expectations:
        w, story = e.worlds[0], e.story
        for r in e.dead_letters:
            obs.dead_letters.add((r.key, r.value))
        # One outcome record per event sent: a redelivery or a retry gets its own.
        for step in story.steps:
            for index in (*step.sends, *step.race):
                if index not in w.decided:
                    continue
                ev: TurnCompleted = story.events[index]
                sig = min(w.decided[index], key=str)
                if sig[0] == "P":
                    obs.promoted.append(Promoted(ev.tenant_id, ev.response_id,
                                                 ev.conversation_id, ev.previous_response_id,
                                                 *sig[1:], at_ms=0))
                else:
                    obs.rejected.append(Rejected(ev.tenant_id, ev.response_id, sig[1],
                                                 sig[2], 0))
        for index in w.decided:
            ev = story.events[index]
            promo = w.promoted.get(ev.response_id) if ev.tenant_id == story.tenant else None
            obs.histories[(ev.tenant_id, ev.response_id)] = answer(promo) if promo else History(
                "failure", "NOT_PROMOTED", ())
        if story.kind == "conversation" and w.head:
            head = next(p for p in w.promoted.values() if p.conversation_id == story.key
                        and p.seq == w.head)
            obs.conversations[(story.tenant, story.key)] = answer(head)
        obs.orphaned |= {(story.tenant, eid) for eid in w.orphans}
    return obs


def answer(promo) -> History:
    """The history answer a correct API gives for ``promo`` (an oracle promotion)."""
    return History(*promo.read_as, promo.items, promo.response_id, promo.seq)


def kinds(expectations, obs) -> set[str]:
    return {v.kind for v in check(expectations, obs)}


def test_a_faithful_observation_has_no_violation(expectations):
    assert check(expectations, faithful(expectations)) == []


def test_duplicate_promotion_of_one_idempotency_key_is_reported(expectations):
    obs = faithful(expectations)
    dup = next(r for r in obs.rejected if r.reason == "DUPLICATE")
    original = next(p for p in obs.promoted if p.response_id == dup.existing_response_id)
    obs.rejected.remove(dup)
    obs.promoted.append(dataclasses.replace(original, response_id=dup.response_id))
    assert {"duplicate_promotion", "promotion_should_not_exist"} <= kinds(expectations, obs)


def test_seq_gap_is_reported(expectations):
    obs = faithful(expectations)
    # the only record of its response id (one of several missing is ``outcome_missing``)
    records = Counter((r.tenant, r.response_id) for r in (*obs.promoted, *obs.rejected))
    second = next(p for p in obs.promoted if p.conversation_id and p.seq == 2
                  and records[(p.tenant, p.response_id)] == 1
                  and any(q.conversation_id == p.conversation_id and q.seq == 3
                          for q in obs.promoted))
    obs.promoted = [p for p in obs.promoted if p is not second]
    assert {"seq_gap", "never_decided"} <= kinds(expectations, obs)


def test_seq_repeat_and_conflicting_records_are_reported(expectations):
    obs = faithful(expectations)
    p = next(p for p in obs.promoted if p.conversation_id and p.seq == 2)
    obs.promoted.append(dataclasses.replace(p, seq=3))  # the same response again, elsewhere
    assert "conflicting_outcome_records" in kinds(expectations, obs)
    obs = faithful(expectations)
    other = next(q for q in obs.promoted if q.conversation_id == p.conversation_id and q.seq == 1)
    obs.promoted.append(dataclasses.replace(other, seq=2))
    assert "seq_repeat" in kinds(expectations, obs)


def test_shortened_history_is_reported(expectations):
    obs = faithful(expectations)
    key, h = next((k, h) for k, h in obs.histories.items() if len(h.items) > 2)
    obs.histories[key] = dataclasses.replace(h, items=h.items[:-1])
    assert kinds(expectations, obs) == {"history_mismatch"}


def test_reordered_history_is_reported(expectations):
    obs = faithful(expectations)
    key, h = next((k, h) for k, h in obs.histories.items() if len(set(h.items)) > 2)
    obs.histories[key] = dataclasses.replace(h, items=h.items[::-1])
    assert kinds(expectations, obs) == {"history_mismatch"}


def test_wrong_reason_is_reported(expectations):
    obs = faithful(expectations)
    r = next(r for r in obs.rejected if r.reason == "OUT_OF_ORDER")
    obs.rejected[obs.rejected.index(r)] = dataclasses.replace(r, reason="CONFLICT")
    assert kinds(expectations, obs) == {"wrong_reason"}


def test_rejection_without_reason_is_reported(expectations):
    obs = faithful(expectations)
    obs.rejected[0] = dataclasses.replace(obs.rejected[0], reason=None)
    assert "rejection_without_reason" in kinds(expectations, obs)


def test_promotion_of_an_invalid_turn_is_reported(expectations):
    obs = faithful(expectations)
    r = next(r for r in obs.rejected if r.reason == "CORRUPT")
    obs.rejected.remove(r)
    obs.promoted.append(Promoted(r.tenant, r.response_id, None, None, 1, "certified", "k", "d",
                                 1, 0))
    assert "promotion_should_not_exist" in kinds(expectations, obs)


def test_lost_turn_orphan_and_dead_letter_are_reported(expectations):
    obs = faithful(expectations)
    # the only record of its response id (one of several missing is ``outcome_missing``)
    records = Counter((r.tenant, r.response_id) for r in (*obs.promoted, *obs.rejected))
    obs.promoted.remove(next(p for p in reversed(obs.promoted)
                             if records[(p.tenant, p.response_id)] == 1))
    obs.orphaned.pop()
    obs.dead_letters.pop()
    assert {"never_decided", "orphan_missing", "dead_letter_missing"} <= kinds(expectations, obs)


def test_either_order_of_a_race_is_accepted_but_not_both_winners(expectations):
    # a race with a loser (a response id raced on two Conversations promotes in both)
    # (each world promotes a response the other does not: two different winners)
    raced = next(e for e in expectations if len(e.worlds) == 2
                 and set(e.worlds[0].promoted) - set(e.worlds[1].promoted)
                 and set(e.worlds[1].promoted) - set(e.worlds[0].promoted))
    obs = faithful([raced])
    winner = {p.response_id for p in obs.promoted}
    # The other world: the other racer won. Rebuild the observation from world 1.
    swapped = dataclasses.replace(raced, worlds=[raced.worlds[1]])
    obs1 = faithful([swapped])
    assert {p.response_id for p in obs1.promoted} != winner
    assert check([raced], obs1) == []
    both = faithful([raced])
    both.promoted += [p for p in obs1.promoted if p.response_id not in winner]
    assert kinds([raced], both) & {"seq_repeat", "promotion_should_not_exist"}


def test_a_retried_chain_root_may_lose_to_its_retry(expectations):
    """A chain's first response and its retry under another response id are two
    partitions: either may claim the request. In the world where the retry wins, the
    first response is DUPLICATE naming it and the root's children have no parent."""
    raced = next(e for e in expectations
                 if e.story.kind == "chain" and e.story.labels[0] == "root_retry")
    assert len(raced.worlds) == 2
    root, retry = (raced.story.events[i] for i in (*raced.story.steps[0].sends,
                                                   *raced.story.steps[0].race))
    outcomes = []
    for world in raced.worlds:
        obs = faithful([dataclasses.replace(raced, worlds=[world])])
        assert check([raced], obs) == []
        outcomes.append({r.response_id: r.reason for r in obs.rejected})
    assert {o.get(root.response_id) for o in outcomes} == {None, "DUPLICATE"}
    assert {o.get(retry.response_id) for o in outcomes} == {None, "DUPLICATE"}


def test_the_drain_counts_a_response_decided_when_every_send_has_an_acceptable_record():
    """The runner waits (up to its drain deadline) until every response is decided. It
    counted distinct outcomes, so a response whose two sends may be answered alike
    (a retry and its original, each accepting the same rejection) waited out the whole
    deadline in a chaos run (seed 30, session 26): 300 s for nothing."""
    from ratchet.chaos.runner import _is_decided

    conflict = ("R", "CONFLICT", None)
    either = frozenset({conflict, ("R", "OUT_OF_ORDER", None)})
    need = ([[frozenset({conflict}), either]], 2)  # one world, two sends
    assert _is_decided(need, {conflict}, records=2)
    assert not _is_decided(need, {conflict}, records=1)  # a send without its record
    assert not _is_decided(need, {("R", "OUT_OF_ORDER", None)}, records=2)
    raced = ([[frozenset({("P", 1)})], [frozenset({conflict})]], 1)  # either world
    assert _is_decided(raced, {conflict}, records=1)
    assert not _is_decided(raced, set(), records=1)
