"""Checks the chaos checker could not fail (an outside review of the chaos harness,
2026-12-06: bugs injected in a clone, chaos runs still PASSED): answers that never came,
orphan records' fields, what a certified answer's checkpoint carries, the items' role
and call_id, ``conversation_head_seq``, an artifact expiry that made runs longer than an
hour fail on correct behaviour, and a run that could hang. Each test doctors a faithful
observation the way the injected bug did and asserts the checker reports it, and that
the faithful one passes. No servers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from ratchet.chaos import observe
from ratchet.chaos.answers import final_heads
from ratchet.chaos.checker import check
from ratchet.chaos.observations import OTHER_FINGERPRINT, UNSEEN, History, Lost, Observations, Wait
from ratchet.chaos.oracle import expect
from ratchet.chaos.story import REUSE_TTL_MS, workload_fp_hash
from ratchet.chaos.workload import generate
from tests.unit.test_chaos_checker import faithful, kinds


@pytest.fixture(scope="module")
def expectations():
    return [expect(s) for s in generate(seed=7, turns=800, tag="unit").stories]


def full(promo, head: int | None, fp: str | None = None) -> History:
    """The answer a correct API gives for ``promo`` with every field the observer
    records: ``conversation_head_seq`` ``head`` and, certified, the checkpoint's
    artifact, proof and receipt (the promoted turn's)."""
    outcome, reason = promo.read_as if fp is None else promo.read(fp)
    return History(outcome, reason, promo.items, promo.response_id, promo.seq, (), head,
                   promo.certificate if outcome == "certified" else UNSEEN)


def complete(expectations) -> Observations:
    """``faithful`` with every field recorded (test_chaos_checker's leaves them unseen)."""
    obs = faithful(expectations)
    for e in expectations:
        w, heads = e.worlds[0], final_heads(e.story, e.worlds[0])
        for (tenant, rid), h in list(obs.histories.items()):
            promo = w.promoted.get(rid) if tenant == e.story.tenant else None
            if promo is not None and h.outcome != "failure":
                obs.histories[(tenant, rid)] = full(promo, heads.get(promo.conversation_id))
        # (A chain story's partition key may be a Conversation's id too: the workload's
        # shared keys. Its Conversation is the Conversation story's.)
        if e.story.kind == "conversation" and (e.story.tenant, e.story.key) in obs.conversations:
            head = next(p for p in w.promoted.values()
                        if p.conversation_id == e.story.key and p.seq == w.head)
            obs.conversations[(e.story.tenant, e.story.key)] = full(head, w.head)
    return obs


def test_the_complete_faithful_observation_passes(expectations):
    assert check(expectations, complete(expectations)) == []


# --- 1. answers that never came ---------------------------------------------------


def _certified(expectations):
    return next((e, rid, p) for e in expectations if len(e.worlds) == 1
                for rid, p in e.worlds[0].promoted.items() if p.read_as[0] == "certified")


def test_a_request_with_another_fingerprint_that_got_no_answer_is_reported(expectations):
    """Other-fingerprint, foreign-tenant and Conversation reads that failed were dropped:
    the check passed on an empty input. Now each is a ``Lost``, excused only inside a
    fault window (and shortly after it)."""
    e, rid, p = _certified(expectations)
    obs = complete([e])
    obs.asked["other_fingerprint"] = {(e.story.tenant, rid)}
    obs.other_fingerprint[(e.story.tenant, rid)] = full(p, final_heads(e.story, e.worlds[0])
                                                        .get(p.conversation_id),
                                                        OTHER_FINGERPRINT)
    assert check([e], obs) == []
    del obs.other_fingerprint[(e.story.tenant, rid)]
    assert kinds([e], obs) == {"answer_missing"}  # neither answered nor lost
    obs.lost.append(Lost("other_fingerprint", e.story.tenant, rid, 10_000, 25_000,
                         "RehydrationUnavailable: HTTP 503"))
    assert kinds([e], obs) == {"answer_missing"}
    obs.fault_windows = [(1_000, 9_000)]  # asked within FAULT_GRACE_MS of a fault's end
    assert check([e], obs) == []
    obs.fault_windows = [(100_000, 200_000)]  # a fault long after: explains nothing
    assert kinds([e], obs) == {"answer_missing"}


def test_a_history_that_got_no_answer_is_reported_even_inside_a_fault(expectations):
    e, rid, _ = _certified(expectations)
    obs = complete([e])
    del obs.histories[(e.story.tenant, rid)]
    obs.lost.append(Lost("history", e.story.tenant, rid, 0, 1, "ConnectError"))
    obs.fault_windows = [(0, 10)]
    assert kinds([e], obs) == {"history_mismatch"}  # "no answer": read after the faults


def test_wait_ms_answered_by_nobody_fails_the_run(expectations):
    """Injected F2 (every wait_ms request answered 503): ``waits {"asked": 57,
    "answered": 0, "unavailable": 57}`` and PASS."""
    e, rid, p = _certified(expectations)
    obs = complete(expectations)
    lost = [Lost("wait", e.story.tenant, rid, 1_000 * n, 1_000 * n + 5, "HTTP 503")
            for n in range(57)]
    obs.lost += lost
    got = kinds(expectations, obs)
    assert got == {"answer_missing", "waits_unanswered"}
    obs.fault_windows = [(0, 60_000)]  # an API restart explains every one of them
    assert check(expectations, obs) == []
    # Answered, the same number: fine.
    obs = complete(expectations)
    head = final_heads(e.story, e.worlds[0]).get(p.conversation_id)
    obs.waits += [Wait(e.story.tenant, rid, full(p, head), 1_000 * n) for n in range(57)]
    assert check(expectations, obs) == []
    # Each answered "not promoted yet" (asked before the promotion was published): each
    # is a right answer, but read-your-writes never worked.
    obs = complete(expectations)
    obs.waits += [Wait(e.story.tenant, rid, History("failure", "NOT_PROMOTED", ()), -1)
                  for _ in range(57)]
    assert kinds(expectations, obs) == {"waits_unanswered"}


def test_a_rejected_response_answered_not_found_is_reported(expectations):
    """gateway-protocol.md section 8: NOT_FOUND is an id this tenant never sent;
    a rejected one is NOT_PROMOTED (409). NOT_FOUND was accepted for both."""
    obs = complete(expectations)
    key = next(k for k, h in obs.histories.items() if h.reason == "NOT_PROMOTED")
    assert check(expectations, obs) == []
    obs.histories[key] = History("failure", "NOT_FOUND", ())
    assert kinds(expectations, obs) == {"history_mismatch"}


def test_the_waiters_keep_every_request_that_got_no_answer(monkeypatch):
    from services.gateway.errors import RehydrationUnavailable

    class Down:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            pass

        def response_history(self, tenant, rid, fp, wait_ms=0):
            raise RehydrationUnavailable("HTTP 503: UNAVAILABLE")

    monkeypatch.setattr(observe, "RehydrationClient", Down)
    monkeypatch.setattr(observe.time, "sleep", lambda s: None)
    obs = Observations()
    waiters = observe.Waiters("http://mock", "f" * 64, lambda rng: ("ten", "resp-a"), obs,
                              threads=1)
    waiters.start()
    # Until the waiter asked once. The patched ``time.sleep`` is the module's own, so
    # the fixed 0.05 s here slept nothing: the close could come before the thread's
    # first ask, nothing kept (a loaded full run of session 49).
    deadline = time.monotonic() + 30
    while waiters.counts["unavailable"] == 0 and time.monotonic() < deadline:
        waiters.stop.wait(0.01)
    waiters.close()
    assert obs.lost and all(x.what == "wait" and x.ident == "resp-a" and "503" in x.error
                            and x.ended_ms >= x.asked_ms > 0 for x in obs.lost)
    assert waiters.counts["unavailable"] == len(obs.lost)


def test_fetch_histories_keeps_what_was_asked_and_what_got_no_answer(monkeypatch):
    """Every request after the run is in ``obs.asked``; one whose five tries all fail
    is a ``Lost`` (with a fingerprint nobody deployed, here: answered 503)."""
    good = json.loads(json.dumps(_body()))

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/status"):
            rid = request.url.path.split("/")[-2]
            return httpx.Response(200, json={"response_id": rid, "state": "promoted",
                                             "reason": None, "seq": 2})
        if request.url.params["fingerprint_hash"] == OTHER_FINGERPRINT:
            return httpx.Response(503, json={"error": "UNAVAILABLE", "retryable": True})
        return httpx.Response(200, json=good)

    real = observe.RehydrationClient
    monkeypatch.setattr(observe, "RehydrationClient",
                        lambda url, timeout_s: real(url, timeout_s,
                                                    transport=httpx.MockTransport(handle)))
    monkeypatch.setattr(observe.time, "sleep", lambda s: None)
    obs = Observations()
    observe.fetch_histories("http://mock", FP, [("ten", "resp-a"), ("ten", "resp-b")], [],
                            obs, other_fp_every=1)
    assert obs.asked["history"] == {("ten", "resp-a"), ("ten", "resp-b")}
    assert obs.asked["other_fingerprint"] == {("ten", "resp-b")}
    assert obs.asked["foreign"] == {(observe.FOREIGN_TENANT, "resp-a")}
    assert [(x.what, x.ident) for x in obs.lost] == [("other_fingerprint", "resp-b")], obs.lost
    assert "503" in obs.lost[0].error
    assert obs.histories[("ten", "resp-a")].conversation_head_seq == 2  # the body's
    # every response's /status too
    assert obs.asked["status"] == {("ten", "resp-a"), ("ten", "resp-b")}
    assert obs.statuses[("ten", "resp-b")] == ("promoted", None, 2)


# --- 2. orphan records ------------------------------------------------------------


def right_records(e, w) -> dict:
    """The records a correct processor publishes for the orphans of world ``w``."""
    out = {}
    for eid in w.orphans - w.conflicted:
        key, _, output = w.effects.get(eid, (None, None, None))
        reason = "ATTEMPT_SUPERSEDED" if key in w.keys else (
            "TURN_CANCELLED" if key in w.cancelled else "TURN_REJECTED")
        done = eid not in w.no_outcome
        out[(e.story.tenant, eid)] = [(reason, done, output if done else None)]
    return out


def test_an_orphan_record_with_a_provisional_reason_or_no_outcome_is_reported(expectations):
    """Injected C4: ATTEMPT_SUPERSEDED published as TURN_REJECTED, effect_completed false,
    no output_digest. Only an orphan's existence was checked."""
    e = next(e for e in expectations if len(e.worlds) == 1 and "orphan_retry" in e.story.labels)
    w = e.worlds[0]
    obs = complete([e])
    obs.orphan_records = right_records(e, w)
    assert check([e], obs) == []
    key, records = next((k, r) for k, r in obs.orphan_records.items()
                        if r[0][0] == "ATTEMPT_SUPERSEDED")
    c4 = dict(obs.orphan_records)
    c4[key] = [("TURN_REJECTED", False, None)]
    obs.orphan_records = c4
    found = check([e], obs)
    assert {v.kind for v in found} == {"orphan_record_wrong"}
    assert len(found) == 2  # the reason, and the outcome that was recorded
    # a provisional record first, the final one later: fine
    obs.orphan_records = {**c4, key: [("TURN_REJECTED", True, records[0][2]), *records]}
    assert check([e], obs) == []
    # completed, but with another output's digest
    obs.orphan_records = {**c4, key: [(records[0][0], True, "0" * 64)]}
    assert kinds([e], obs) == {"orphan_record_wrong"}


def test_an_unsettled_requests_effect_published_final_is_reported(expectations):
    """A request neither promoted nor cancelled may still be promoted with the effect:
    a final reason would have its gateway undo a tool call a history may use."""
    # (in a race's world: the attempt that lost is rejected, its request unsettled)
    e, w, eid = next((dataclasses.replace(e, worlds=[w]), w, eid)
                     for e in map(expect, generate(seed=1, turns=800, tag="unit").stories)
                     for w in e.worlds for eid in sorted(w.orphans - w.conflicted)
                     if w.effects[eid][0] not in w.keys and w.effects[eid][0] not in w.cancelled)
    obs = complete([e])
    obs.orphan_records = right_records(e, w)
    assert check([e], obs) == []
    (reason, done, digest), = obs.orphan_records[(e.story.tenant, eid)]
    obs.orphan_records[(e.story.tenant, eid)] = [("ATTEMPT_SUPERSEDED", done, digest)]
    assert kinds([e], obs) == {"orphan_record_wrong"}


def test_a_claim_without_an_outcome_published_with_a_digest_is_reported(expectations):
    e = next(e for e in expectations if "claim_expired" in e.story.labels and len(e.worlds) == 1)
    w = e.worlds[0]
    obs = complete([e])
    obs.orphan_records = right_records(e, w)
    assert check([e], obs) == []
    (eid,) = w.no_outcome
    obs.orphan_records[(e.story.tenant, eid)] = [("ATTEMPT_SUPERSEDED", False, "a" * 64)]
    assert kinds([e], obs) == {"orphan_record_wrong"}


# --- 3. what a history answer carries --------------------------------------------


def test_a_certified_checkpoint_with_another_artifact_or_no_proof_is_reported(expectations):
    """Injected B4: the served artifact another one (id, token_count 1, a zero hash) and
    no boundary proof; only the seq, the fingerprint and an artifact's presence were
    checked."""
    obs = complete(expectations)
    key, h = next((k, h) for k, h in obs.histories.items() if h.outcome == "certified")
    artifact, proof, receipt = h.certificate
    b4 = ("art-of-someone-else", "0" * 64, 1, *artifact[3:])
    for wrong in ((b4, proof, receipt), (artifact, None, receipt), (artifact, proof, True)):
        obs.histories[key] = dataclasses.replace(h, certificate=wrong)
        assert kinds(expectations, obs) == {"history_mismatch"}, wrong
    obs.histories[key] = h
    assert check(expectations, obs) == []


@pytest.mark.parametrize("chain", [False, True])
def test_a_wrong_conversation_head_seq_is_reported(expectations, chain):
    """Injected E5: ``conversation_head_seq`` null on a Conversation's answers (the docs:
    the Conversation's current head; null in chain mode)."""
    obs = complete(expectations)
    key, h = next((k, h) for k, h in obs.histories.items() if h.outcome != "failure"
                  and (h.conversation_head_seq is None) == chain)
    obs.histories[key] = dataclasses.replace(h, conversation_head_seq=None if not chain else 1)
    assert kinds(expectations, obs) == {"history_mismatch"}
    if not chain:  # an older head (the one the response made, not the current one)
        e = next(e for e in expectations if (e.story.tenant, e.story.key) in obs.conversations
                 and e.worlds[0].head > 1)
        ckey = (e.story.tenant, e.story.key)
        good = obs.conversations[ckey]
        obs = complete(expectations)
        obs.conversations[ckey] = dataclasses.replace(good, conversation_head_seq=good.seq
                                                      if hasattr(good, "seq") else 1)
        assert kinds(expectations, obs) == {"history_mismatch"}


def test_a_wait_answer_may_report_any_head_since_its_response(expectations):
    e, rid, p = next((e, rid, p) for e in expectations if len(e.worlds) == 1
                     and e.story.kind == "conversation" and e.worlds[0].head > 2
                     for rid, p in e.worlds[0].promoted.items()
                     if p.seq == 1 and p.read_as[0] != "failure")
    final = e.worlds[0].head
    for head, right in ((1, True), (final, True), (final + 1, False), (None, False)):
        o = complete(expectations)
        o.waits.append(Wait(e.story.tenant, rid, full(p, head), 0))
        assert (check(expectations, o) == []) == right, head


FP = "e" * 64  # not OTHER_FINGERPRINT


def _item(n: int, **over) -> dict:
    content = json.dumps({"type": "message", "role": "user", "content": f"m{n}"},
                         sort_keys=True, separators=(",", ":"))
    item = {"item_id": f"it-{n}", "type": "message", "role": "user", "call_id": None,
            "content": content, "content_digest": hashlib.sha256(content.encode()).hexdigest(),
            "format_version": 1}
    item.update(over)
    return item


def _body(**over) -> dict:
    artifact = {"artifact_id": "art-1", "token_hash": "a" * 64, "token_count": 200,
                "safe_append_boundary": 200, "fingerprint_hash": FP,
                "expires_at": "2030-01-01T00:00:00+00:00"}
    body = {"outcome": "certified", "reason": None, "head_seq": 2, "conversation_head_seq": 2,
            "response_id": "resp-a", "items": [_item(0), _item(1)],
            "checkpoint": {"seq": 2, "fingerprint_hash": FP, "expires_at": None,
                           "token_artifact": artifact, "router_receipt": None,
                           "boundary_proof": {"fingerprint_hash": FP}}}
    body.update(over)
    return body


def _observed(body: dict) -> History:
    transport = httpx.MockTransport(lambda req: httpx.Response(200, json=body))
    with observe.RehydrationClient("http://mock", transport=transport) as client:
        outcome = client.response_history("ten", "resp-a", FP)
        return observe.history_of(outcome, FP, client.last_body)


def test_the_observer_records_the_fields_beside_the_items():
    h = _observed(_body())
    assert h.faults == () and h.conversation_head_seq == 2
    artifact, proof, receipt = h.certificate
    assert artifact[:3] == ("art-1", "a" * 64, 200) and proof is not None and not receipt
    assert _observed(_body(conversation_head_seq=None)).conversation_head_seq is None
    assert _observed(_body(checkpoint={**_body()["checkpoint"], "boundary_proof": None})) \
        .certificate[1] is None


@pytest.mark.parametrize("over", [{"role": None}, {"role": "assistant"}, {"call_id": "c-1"}])
def test_an_item_whose_role_or_call_id_is_not_its_contents_is_reported(over):
    """Injected E3: role and call_id served null (gateway-protocol.md section 5: the
    item's ``role`` / ``call_id`` if a string, else null)."""
    h = _observed(_body(items=[_item(0), _item(1, **over)]))
    assert any("item 1" in f for f in h.faults), h.faults


# --- 4. artifacts that expired while a long run read them --------------------------


def test_a_run_longer_than_an_hour_reads_what_the_oracle_expects():
    """The workload's artifacts expired an hour after it was built: a run longer than
    that read correct ARTIFACT_EXPIRED fallbacks as ``history_mismatch``
    (/tmp/revtests/long_run_false_alarm.py). They now outlive any run; the API read here
    with its clock 61 minutes ahead answers what the oracle expects."""
    from fastapi.testclient import TestClient

    from ratchet.chaos.answers import answer_problem, head_range
    from ratchet.chaos.claims import ClaimedRun, ClaimProbe
    from services.api.app import create_app
    from services.api.service import RehydrationService
    from services.api.waiters import PromotionWaiters
    from services.gateway.client import parse_outcome
    from tests.unit.test_chaos_oracle_agrees import _processor
    from tests.unit.test_processor_rules import raw_record

    processor, store, ledger = _processor()
    # Stories with claims (they need the claims API) or timed turns (stamped at their
    # send, ratchet/chaos/timed.py: their expiry is meant to pass) are left out.
    exps = [expect(s) for s in generate(4, 120, "longrun").stories
            if s.kind != "garbage" and not s.timed
            and not any(isinstance(ev, (ClaimedRun, ClaimProbe)) for ev in s.events)]
    offset = 0
    for e in exps:
        for step in e.story.steps:
            for i in (*step.sends, *step.race):
                offset += 1
                processor.handle(raw_record(e.story.events[i], offset))

    def later():
        return datetime.now(UTC) + timedelta(minutes=61)

    api = TestClient(create_app(RehydrationService(store, ledger, PromotionWaiters(), later),
                                lambda: True), raise_server_exceptions=False)
    fp, problems, certified = workload_fp_hash(), [], 0
    for e in exps:
        w = e.worlds[0]
        for rid, promo in w.promoted.items():
            r = api.get(f"/v1/responses/{rid}/history",
                        params={"tenant_id": e.story.tenant, "fingerprint_hash": fp})
            got = observe.history_of(parse_outcome(r.json(), r.status_code), fp, r.json())
            certified += got.outcome == "certified"
            problem = answer_problem(promo, rid, got,
                                      heads=head_range(promo, final_heads(e.story, w)))
            if problem:
                problems.append(f"{rid}: {problem}")
    assert problems == [] and certified > 20
    turn = next(ev for e in exps for ev in e.story.events
                if getattr(ev, "token_artifact", None) is not None)
    assert turn.token_artifact.expires_at >= turn.produced_at + REUSE_TTL_MS - 60_000
    assert turn.boundary_proof.expires_at == turn.token_artifact.expires_at


# --- 5. a run that cannot end -------------------------------------------------------


def _stuck(stop) -> None:
    """A producer resending a failing round forever (it never looks at ``stop``)."""
    while True:
        time.sleep(0.05)


def _polite(stop) -> None:
    while not stop.value:
        time.sleep(0.05)


def test_producers_past_the_deadline_are_stopped_even_when_stuck():
    from ratchet.chaos.runner import stop_producers

    ctx = multiprocessing.get_context("fork")  # the runner spawns; the same to stop
    stop = ctx.Value("b", 0)
    procs = [ctx.Process(target=_polite, args=(stop,), daemon=True),
             ctx.Process(target=_stuck, args=(stop,), daemon=True)]
    for p in procs:
        p.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    done = stop_producers(procs, stop, grace_s=3)
    assert not any(p.is_alive() for p in procs) and time.monotonic() - t0 < 15
    assert "stopped" in done[0] and "terminated" in done[1]


def test_the_send_deadline_follows_turns_rate_and_the_fault_plan():
    from ratchet.chaos.runner import ChaosConfig, send_budget_s

    small = send_budget_s(ChaosConfig(turns=400, rate=40, faults="none"), 0)
    assert 100 < small < 300  # 10 s of paced sending: minutes, not forever
    ci = send_budget_s(ChaosConfig(turns=2000, rate=10), 9)
    assert ci > 3 * 200 + 9 * 90  # the CI run (221 s) with every fault far inside it
    assert send_budget_s(ChaosConfig(send_deadline_s=5), 9) == 5
    assert ci + 300 < REUSE_TTL_MS / 1000 / 2


def test_the_summary_puts_the_run_deadline_first():
    from ratchet.chaos.observations import Violation
    from ratchet.chaos.report import group, summary

    v = [Violation("never_decided", "s", "resp-1: expected ..."),
         Violation("run_deadline", "-", "past the send deadline")]
    report = {"seed": 1, "tag": "t", "duration_s": 1, "workers": 1, "producers": 1,
              "events": {"sent_turns": 1, "responses": 1, "stories": 1,
                         "dead_letter_records": 0},
              "observed": {"promoted": 0, "rejected": 0, "orphaned": 0, "dead_letters": 0},
              "expected_outcomes": {}, "waits": {}, "faults": [], "unexpected_exits": [],
              "violations": group(v), "passed": False, "report_path": "x"}
    text = summary(report)
    assert text.index("run_deadline") < text.index("never_decided")
    assert "verdict: FAIL" in text


def test_fault_windows_are_those_of_faults_that_may_cost_an_answer():
    """An answer lost while the API, Kafka, Cassandra or the registry was restarted or
    paused is excused (``answer_missing`` is not for those); a worker killed or frozen
    leaves the API alone and excuses nothing."""
    from ratchet.chaos.faults import FaultRecord
    from ratchet.chaos.runner import fault_windows

    class Done:
        records = [FaultRecord("worker_kill", 10.0, 11.0, True),
                   FaultRecord("api_restart", 20.0, 24.5, True),
                   FaultRecord("zombie", 30.0, 55.0, True),
                   FaultRecord("cassandra_pause", 60.0, 75.0, True)]

        def is_alive(self):
            return False

    assert fault_windows(Done(), 1000.0, 80.0) == [(1_020_000, 1_024_500),
                                                    (1_060_000, 1_075_000)]

    class Busy(Done):
        def is_alive(self):
            return True

    assert fault_windows(Busy(), 1000.0, 80.0)[-1] == (1_075_000, 1_080_000)


def test_a_wait_answered_not_found_is_reported(expectations):
    """"With wait_ms > 0 there is no 404" (gateway-protocol.md section 8): not decided
    in time is 409 NOT_PROMOTED. NOT_FOUND was taken for "not yet"."""
    e, rid, p = _certified(expectations)
    obs = complete(expectations)
    obs.waits.append(Wait(e.story.tenant, rid, History("failure", "NOT_PROMOTED", ()), -1))
    assert check(expectations, obs) == []
    obs.waits[-1] = Wait(e.story.tenant, rid, History("failure", "NOT_FOUND", ()), -1)
    assert kinds(expectations, obs) == {"history_mismatch"}


def test_reads_beside_the_histories_that_were_never_asked_are_reported(expectations):
    """The observer asks every tenth response with another fingerprint and every
    twentieth as another tenant: none asked at all is a check that never ran."""
    obs = complete(expectations)
    obs.asked["history"] = set(obs.histories)
    assert kinds(expectations, obs) == {"answer_missing"}
    e, rid, p = _certified(expectations)
    head = final_heads(e.story, e.worlds[0]).get(p.conversation_id)
    obs.asked["other_fingerprint"] = {(e.story.tenant, rid)}
    obs.other_fingerprint[(e.story.tenant, rid)] = full(p, head, OTHER_FINGERPRINT)
    obs.asked["foreign"] = {(observe.FOREIGN_TENANT, rid)}
    obs.foreign[(observe.FOREIGN_TENANT, rid)] = History("failure", "NOT_FOUND", ())
    assert check(expectations, obs) == []
