"""Contract violations the chaos checker used to pass (found by an outside review of the
chaos harness, 2026-12-04): each test doctors a faithful observation into one that
breaks CONTRACT.md the way a broken processor or API could, and asserts the checker
reports it with the right class. The checker is what guards every rework in the chaos
run, so what it cannot see, no chaos run can find.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import httpx
import pytest

from ratchet.chaos import observe
from ratchet.chaos.checker import check
from ratchet.chaos.observations import History, Wait
from ratchet.chaos.observe import FOREIGN_TENANT, history_of
from ratchet.chaos.oracle import expect
from ratchet.chaos.workload import generate
from schemas.models import TurnCancelled, TurnCompleted
from services.gateway.client import RehydrationClient
from services.gateway.errors import RehydrationUnavailable
from tests.unit.test_chaos_checker import answer, faithful, kinds


@pytest.fixture(scope="module")
def expectations():
    return [expect(s) for s in generate(seed=7, turns=800, tag="unit").stories]


def labelled(expectations, label):
    return [e for e in expectations if label in e.story.labels]


def test_a_retry_answered_by_nobody_is_reported(expectations):
    """CONTRACT 4: a retry of a promoted request gets the original outcome re-emitted;
    never skip silently. Records were merged per response id, so the original's record
    answered for the retry too."""
    e, rid = next((e, e.story.events[step.sends[0]].response_id)
                  for e in labelled(expectations, "gateway_retry")
                  for step, label in zip(e.story.steps, e.story.labels, strict=True)
                  if label == "gateway_retry"
                  and _sends(e)[(e.story.tenant, e.story.events[step.sends[0]].response_id)] == 2
                  and e.story.events[step.sends[0]].response_id in e.worlds[0].promoted)
    obs = faithful([e])
    second = [p for p in obs.promoted if p.response_id == rid][1]
    obs.promoted.remove(second)
    assert kinds([e], obs) == {"outcome_missing"}


def _sends(e):
    from ratchet.chaos.checker import sends_per_response
    return sends_per_response(e)


def test_an_effect_the_promoted_turn_used_published_orphaned_to_compensate_is_reported(
        expectations):
    """docs/gateway-protocol.md, "When to compensate": ATTEMPT_SUPERSEDED, TURN_CANCELLED
    and EFFECT_CONFLICT tell the gateway to undo the tool call; one the promoted history
    used must never get them. Only missing orphans were checked, never extra ones."""
    e, turn = next((e, ev) for e in labelled(expectations, "tool_loop")
                   for ev in e.story.events if isinstance(ev, TurnCompleted)
                   and ev.tool_effect_ids and ev.response_id in e.worlds[0].promoted)
    obs = faithful([e])
    obs.orphaned.add((e.story.tenant, turn.tool_effect_ids[0]))
    assert check([e], obs) == []  # TURN_REJECTED first, then used by a retry: allowed
    obs.final_orphans.add((e.story.tenant, turn.tool_effect_ids[0]))
    assert kinds([e], obs) == {"orphan_of_used_effect"}


def test_a_history_served_for_the_race_loser_is_reported(expectations):
    """CONTRACT 5: 409 NOT_PROMOTED for a response that was not promoted. Only the
    chosen world's promotions were compared, and rejected responses never asked."""
    # a race with a loser (a response id raced on two Conversations promotes in both)
    raced = next(e for e in expectations if len(e.worlds) == 2
                 and e.story.kind == "conversation"
                 and set(e.worlds[1].promoted) - set(e.worlds[0].promoted))
    obs = faithful([raced])
    loser = next(rid for rid in raced.worlds[1].promoted if rid not in raced.worlds[0].promoted)
    assert obs.histories[(raced.story.tenant, loser)].outcome == "failure"
    obs.histories[(raced.story.tenant, loser)] = answer(raced.worlds[1].promoted[loser])
    assert kinds([raced], obs) == {"history_mismatch"}


@pytest.mark.parametrize("reason", ["CORRUPT", "CANCELLED", "CONFLICT"])
def test_a_wait_answer_serving_a_rejected_response_is_reported(expectations, reason):
    obs = faithful(expectations)
    r = next(r for r in obs.rejected if r.reason == reason
             and not any(p.response_id == r.response_id for p in obs.promoted))
    obs.waits.append(Wait(r.tenant, r.response_id,
                          History("certified", None, (("i", "message", "d"),), r.response_id, 1),
                          asked_ms=0))
    assert kinds(expectations, obs) == {"history_mismatch"}


@pytest.mark.parametrize("wrong", ["FINGERPRINT_MISMATCH", "ARTIFACT_EXPIRED", "NO_ARTIFACT"])
def test_a_logical_only_history_with_another_fallback_reason_is_reported(expectations, wrong):
    """CONTRACT 5: a logical_only turn falls back NOT_CERTIFIED (the reason was never
    compared)."""
    obs = faithful(expectations)
    e, rid = next((e, rid) for e in expectations for rid, p in e.worlds[0].promoted.items()
                  if p.certification == "logical_only")
    h = obs.histories[(e.story.tenant, rid)]
    assert (h.outcome, h.reason) == ("fallback", "NOT_CERTIFIED")
    obs.histories[(e.story.tenant, rid)] = dataclasses.replace(h, reason=wrong)
    assert kinds(expectations, obs) == {"history_mismatch"}


@pytest.mark.parametrize("certification,served", [
    ("certified", ("fallback", "FINGERPRINT_MISMATCH")),  # asked with the right fingerprint
    ("logical_only", ("certified", None)),
])
def test_the_conversation_endpoint_outcome_is_checked(expectations, certification, served):
    """A certified head served as a fingerprint mismatch, a logical_only head served
    certified: the Conversation endpoint's outcome was never compared."""
    e = next(e for e in expectations if e.story.kind == "conversation" and e.worlds[0].head
             and any(p.seq == e.worlds[0].head and p.certification == certification
                     for p in e.worlds[0].promoted.values()))
    obs = faithful([e])
    key = (e.story.tenant, e.story.key)
    outcome, reason = served
    obs.conversations[key] = dataclasses.replace(obs.conversations[key], outcome=outcome,
                                                 reason=reason)
    assert kinds([e], obs) == {"history_mismatch"}


def test_a_wait_answer_with_the_wrong_outcome_is_reported(expectations):
    obs = faithful(expectations)
    e, rid, p = next((e, rid, p) for e in expectations
                     for rid, p in e.worlds[0].promoted.items() if p.read_as[0] == "certified")
    obs.waits.append(Wait(e.story.tenant, rid, dataclasses.replace(
        answer(p), outcome="fallback", reason="NOT_CERTIFIED"), asked_ms=0))
    assert kinds(expectations, obs) == {"history_mismatch"}


def test_a_wait_answered_not_promoted_after_the_promotion_was_published_is_reported(
        expectations):
    """CONTRACT 5: wait_ms is read-your-writes. Failed answers were not kept at all."""
    obs = faithful(expectations)
    p = obs.promoted[0]
    obs.promoted[0] = dataclasses.replace(p, at_ms=1_000)
    not_yet = History("failure", "NOT_PROMOTED", ())
    obs.waits.append(Wait(p.tenant, p.response_id, not_yet, asked_ms=900))  # before: fine
    assert check(expectations, obs) == []
    obs.waits.append(Wait(p.tenant, p.response_id, not_yet, asked_ms=1_200))
    assert kinds(expectations, obs) == {"stale_wait"}


@pytest.mark.parametrize("field,value", [("head_seq", 99), ("response_id", "resp-other"),
                                         ("faults", ("item 0 content_digest is wrong",))])
def test_a_history_naming_another_response_or_seq_or_contradicting_itself_is_reported(
        expectations, field, value):
    obs = faithful(expectations)
    key, h = next((k, h) for k, h in obs.histories.items() if h.outcome != "failure")
    obs.histories[key] = dataclasses.replace(h, **{field: value})
    assert kinds(expectations, obs) == {"history_mismatch"}


def test_a_history_with_another_item_type_or_id_is_reported(expectations):
    obs = faithful(expectations)
    key, h = next((k, h) for k, h in obs.histories.items() if len(h.items) > 1)
    item_id, _type, digest = h.items[-1]
    for changed in ((item_id, "x_unknown", digest), ("another-id", _type, digest)):
        obs.histories[key] = dataclasses.replace(h, items=(*h.items[:-1], changed))
        assert kinds(expectations, obs) == {"history_mismatch"}


def test_a_decodable_event_dead_lettered_is_reported(expectations):
    """CONTRACT 4: only undecodable records are dead-lettered (docs/chaos.md defect 4
    was a valid TurnCancelled dead-lettered during a Cassandra restart). Extra dead
    letters were never checked."""
    e = labelled(expectations, "cancel_after")[0]
    cancel = next(ev for ev in e.story.events if isinstance(ev, TurnCancelled))
    obs = faithful([e])
    obs.dead_letters.add((e.story.key.encode(), cancel.model_dump_json().encode()))
    assert kinds([e], obs) == {"unexpected_dead_letter"}


def test_a_promotion_naming_the_wrong_lineage_is_reported(expectations):
    """A chain child published with its fork sibling as parent keeps parent.seq + 1;
    a Conversation's promotion without its conversation_id looks like a chain root."""
    e = next(e for e in expectations if e.story.kind == "chain" and any(
        p.previous_response_id for p in e.worlds[0].promoted.values()))
    obs = faithful([e])
    p = next(p for p in obs.promoted if p.previous_response_id)
    obs.promoted[obs.promoted.index(p)] = dataclasses.replace(p, previous_response_id="resp-x")
    assert "promotion_mismatch" in kinds([e], obs)
    e = next(e for e in expectations if e.story.kind == "conversation"
             and len(e.worlds) == 1 and e.worlds[0].head >= 1)
    obs = faithful([e])
    p = next(p for p in obs.promoted if p.seq == 1 and p.conversation_id == e.story.key)
    obs.promoted[obs.promoted.index(p)] = dataclasses.replace(p, conversation_id=None)
    assert "promotion_mismatch" in kinds([e], obs)


def test_an_outcome_for_a_response_nobody_sent_or_under_another_tenant_is_reported(
        expectations):
    """CONTRACT 4: promoted at most once per tenant. A phantom promotion at head + 1
    makes no gap and no repeat."""
    e = next(e for e in expectations if e.story.kind == "conversation"
             and len(e.worlds) == 1 and e.worlds[0].head >= 1)
    obs = faithful([e])
    last = max((p for p in obs.promoted if p.conversation_id == e.story.key), key=lambda p: p.seq)
    obs.promoted.append(dataclasses.replace(last, response_id="resp-phantom", seq=last.seq + 1,
                                            key="idem-phantom"))
    assert "unexpected_outcome" in kinds([e], obs)
    obs = faithful([e])
    obs.promoted.append(dataclasses.replace(obs.promoted[0], tenant="another-tenant"))
    assert "unexpected_outcome" in kinds([e], obs)


def test_a_history_served_to_another_tenant_is_reported(expectations):
    """CONTRACT 5: NOT_FOUND also for another tenant's id (no leak)."""
    obs = faithful(expectations)
    e, rid, p = next((e, rid, p) for e in expectations for rid, p in e.worlds[0].promoted.items())
    obs.foreign[(FOREIGN_TENANT, rid)] = History("failure", "NOT_FOUND", ())
    assert check(expectations, obs) == []
    obs.foreign[(FOREIGN_TENANT, rid)] = answer(p)
    assert kinds(expectations, obs) == {"tenant_leak"}


# --- what the observer keeps of an HTTP answer ----------------------------------------

FP = "f" * 64


def _item(n: int, **over) -> dict:
    content = json.dumps({"type": "message", "role": "user", "content": f"m{n}"},
                         sort_keys=True, separators=(",", ":"))
    item = {"item_id": f"it-{n}", "type": "message", "role": "user", "call_id": None,
            "content": content, "content_digest": hashlib.sha256(content.encode()).hexdigest(),
            "format_version": 1}
    item.update(over)
    return item


def _body(**over) -> dict:
    body = {"outcome": "certified", "reason": None, "head_seq": 2, "response_id": "resp-a",
            "items": [_item(0), _item(1)],
            "checkpoint": {"seq": 2, "fingerprint_hash": FP, "expires_at": None,
                           "token_artifact": {"artifact_id": "art-1", "fingerprint_hash": FP},
                           "router_receipt": None, "boundary_proof": {"fingerprint_hash": FP}}}
    body.update(over)
    return body


def _observed(body: dict, status: int = 200) -> History:
    transport = httpx.MockTransport(lambda req: httpx.Response(status, json=body))
    with RehydrationClient("http://mock", transport=transport) as client:
        return history_of(client.response_history("ten", "resp-a", FP), FP)


GOOD = _body()


@pytest.mark.parametrize("label,body", [
    ("head_seq wrong", _body(head_seq=7)),
    ("head_seq missing", _body(head_seq=None)),
    ("response_id of another response", _body(response_id="resp-other")),
    ("content_digest field wrong", _body(items=[_item(0), _item(1, content_digest="0" * 64)])),
    ("item type wrong", _body(items=[_item(0), _item(1, type="x_unknown")])),
    ("item_id wrong", _body(items=[_item(0), _item(1, item_id="it-0")])),
    ("checkpoint of another fingerprint",
     _body(checkpoint={**GOOD["checkpoint"], "fingerprint_hash": "e" * 64})),
    ("checkpoint of another seq", _body(checkpoint={**GOOD["checkpoint"], "seq": 1})),
    ("certified without an artifact", _body(checkpoint={**GOOD["checkpoint"],
                                                        "token_artifact": None})),
])
def test_the_observer_keeps_what_a_wrong_answer_gets_wrong(label, body):
    good = _observed(GOOD)
    assert good.faults == () and good.head_seq == 2 and good.response_id == "resp-a"
    assert _observed(body) != good, f"{label}: erased before the checker looks"


@pytest.mark.parametrize("status", [409, 500])
def test_a_history_body_with_an_error_status_is_not_trusted(status):
    """CONTRACT 5: 200 certified/fallback. The gateway library took the body's word."""
    with pytest.raises(RehydrationUnavailable):
        _observed(GOOD, status)
    with pytest.raises(RehydrationUnavailable):
        _observed({"outcome": "failure", "reason": "NOT_FOUND"}, 200)


def test_the_waiters_keep_failed_answers_with_when_they_were_asked(monkeypatch):
    class NotYet:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            pass

        def response_history(self, tenant, rid, fp, wait_ms=0):
            from services.gateway.client import Failure
            return Failure("NOT_PROMOTED", 409, rid)

    from ratchet.chaos.observations import Observations
    monkeypatch.setattr(observe, "RehydrationClient", NotYet)
    obs = Observations()
    waiters = observe.Waiters("http://mock", FP, lambda rng: ("ten", "resp-a"), obs, threads=1)
    waiters.start()
    import time
    time.sleep(0.1)
    waiters.close()
    assert obs.waits and all(w.history.reason == "NOT_PROMOTED" and w.asked_ms > 0
                             for w in obs.waits)


@pytest.mark.parametrize("reason", ["CORRUPT_HISTORY", "MISSING_HISTORY", "EXPIRED"])
def test_a_wait_answering_a_failure_other_than_not_yet_for_a_promoted_response_is_reported(
        expectations, reason):
    """Only "not promoted yet" is a right failure for a response that is promoted (and
    only before its promotion was published); an integrity failure or EXPIRED never is.
    (Found by an outside review of the stricter checker, 2026-12-04.)"""
    obs = faithful(expectations)
    p = obs.promoted[0]
    obs.waits.append(Wait(p.tenant, p.response_id, History("failure", reason, ()),
                          asked_ms=-1))  # even asked long before the promotion
    assert kinds(expectations, obs) == {"history_mismatch"}


@pytest.mark.parametrize("asked_other", [True, False])
def test_a_fingerprint_change_served_as_reusable_is_reported(expectations, asked_other):
    """CONTRACT 5: a fingerprint change invalidates reuse, never the history. A certified
    history asked with a fingerprint nobody deployed, or a redeployed model's turn asked
    with the workload's fingerprint, must fall back FINGERPRINT_MISMATCH with every item
    (found while adding the rules the chaos workload never sent, session 25)."""
    from ratchet.chaos.observations import OTHER_FINGERPRINT
    if asked_other:
        e, rid, p = next((e, rid, p) for e in expectations if len(e.worlds) == 1
                         for rid, p in e.worlds[0].promoted.items() if p.read_as[0] == "certified")
        obs = faithful([e])
        right = History(*p.read(OTHER_FINGERPRINT), p.items, rid, p.seq)
        assert right.reason == "FINGERPRINT_MISMATCH"
        obs.other_fingerprint[(e.story.tenant, rid)] = right
        assert check([e], obs) == []
        obs.other_fingerprint[(e.story.tenant, rid)] = dataclasses.replace(
            right, outcome="certified", reason=None)
    else:
        e = next(e for e in labelled(expectations, "redeployed") if len(e.worlds) == 1)
        step = e.story.labels.index("redeployed")
        rid = e.story.events[e.story.steps[step].sends[0]].response_id
        obs = faithful([e])
        assert obs.histories[(e.story.tenant, rid)].reason == "FINGERPRINT_MISMATCH"
        obs.histories[(e.story.tenant, rid)] = dataclasses.replace(
            obs.histories[(e.story.tenant, rid)], outcome="certified", reason=None)
    assert kinds([e], obs) == {"history_mismatch"}


def test_a_claim_without_an_outcome_published_as_completed_is_reported(expectations):
    """gateway-protocol.md section 8, rule 7: under ``at_most_once`` a vanished holder's
    claim is LEASE_EXPIRED for the next attempt, which must not run the tool; nobody
    records an outcome, so its orphan says ``effect_completed`` false ("may or may not
    have run"). A true one means an attempt ran the tool again or an outcome was made
    up: the at-most-once promise was broken where no turn outcome shows it."""
    e = labelled(expectations, "claim_expired")[0]
    (eid,) = e.worlds[0].no_outcome
    assert eid in e.worlds[0].orphans  # the promotion without the tool orphans it
    obs = faithful([e])
    assert check([e], obs) == []
    obs.completed_orphans.add((e.story.tenant, eid))
    assert kinds([e], obs) == {"orphan_said_completed"}


def test_a_claim_answered_against_the_rules_is_reported(expectations):
    """A takeover refused, a LEASE_EXPIRED answered CLAIMED, a late holder's completion
    accepted: the producer sees these in the claims API's answers (no output topic
    carries them) and logs them; the checker turns each into a violation."""
    e = labelled(expectations, "claim_takeover")[0]
    obs = faithful([e])
    assert check([e], obs) == []
    obs.claim_answers_wrong.append((e.story.tenant, "eff_" + "0" * 32, "got IN_PROGRESS"))
    assert kinds([e], obs) == {"claim_answer_wrong"}


def test_the_producers_claim_log_reaches_the_checker(tmp_path):
    """A wrong claim answer reaches the checker only through the producers' sent logs,
    which also carry the first send of every turn (the latency plot's start)."""
    from ratchet.chaos.runner import _claims_wrong, _sent_times

    (tmp_path / "sent-0.jsonl").write_text(
        json.dumps({"t": 1.0, "tenant": "ten-a", "rid": "resp-1"}) + "\n"
        + json.dumps({"t": 2.0, "tenant": "ten-a", "effect_id": "eff_1",
                      "claim_wrong": "got IN_PROGRESS"}) + "\n")
    (tmp_path / "sent-1.jsonl").write_text(
        json.dumps({"t": 3.0, "tenant": "ten-b", "rid": "resp-2"}) + "\n")
    assert _sent_times(tmp_path) == {("ten-a", "resp-1"): 1.0, ("ten-b", "resp-2"): 3.0}
    assert _claims_wrong(tmp_path) == [("ten-a", "eff_1", "got IN_PROGRESS")]
