"""The chaos run's claim checks fire on wrong answers and stay quiet on right ones.

The review of 2026-12-05 found that the chaos run's promise "never duplicate a tool side
effect" was barely exercised: no attempt claimed while another held a live lease, none
after its request was promoted or cancelled, none with other arguments, a ``COMPLETED``
answer's output was never compared, and the tool's run count was never checked.
``ratchet/chaos/claims.py`` now has roles for each (``contended``, ``conflicted``, the
``promoted`` and ``cancelled`` probes) and three checks: ``claim_answer_wrong``,
``effect_executed_twice``, ``claim_output_mismatch``.

Here each role runs against the claims API and the processor on the in-memory backends
(no servers): faithful, no finding; through a transport that doctors the answers the
way the review's injected bugs do (a live lease let in, ``PROMOTED`` never answered, the
``CONFLICT`` rule gone, a ``COMPLETED`` answer replaying another output), the finding
of the right class. Then the findings' way to the verdict: the producer's log, the
runner's reading of it, the checker's classes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random

import httpx
import pytest
from fastapi.testclient import TestClient

from ratchet.chaos.checker import check, claim_violation
from ratchet.chaos.claims import (
    ClaimAnswerWrong,
    ClaimedRun,
    ClaimProbe,
    ClaimRunner,
    Finding,
)
from ratchet.chaos.observations import Observations
from ratchet.chaos.story import Story, StoryGateway
from ratchet.chaos.workload import _claim_role, _root_probe, _tool_turn
from services.api.app import create_app
from services.api.claims import claims_router
from services.api.fastpath import HistoryFastPath
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.gateway.events import TurnIdentity
from tests.unit.test_chaos_oracle_agrees import _Clock, _processor, _through
from tests.unit.test_processor_rules import raw_record


class _World:
    """The processor and the claims API over one in-memory store and ledger; claims go
    through ``doctor`` (a function of the request and the API's response)."""

    def __init__(self, doctor=None) -> None:
        self.clock = _Clock()
        self.processor, store, ledger = _processor(self.clock.now_ms)
        service = RehydrationService(store, ledger, PromotionWaiters())
        app = create_app(service, lambda: True,
                         routers=[claims_router(ledger, store, self.clock.now_ms)])
        api = TestClient(HistoryFastPath(app, service), raise_server_exceptions=False)
        handle = _through(api)

        def doctored(request: httpx.Request) -> httpx.Response:
            got = handle(request)
            return doctor(request, got) if doctor else got

        self.claims = ClaimRunner("http://api", transport=httpx.MockTransport(doctored),
                                  sleep=self.clock.sleep)
        self.offset = 0

    def play(self, story: Story) -> list[Finding]:
        """Every event of ``story`` in order: claims through the API, the rest through
        the processor. Returns the claim runner's findings."""
        for step in story.steps:
            for index in (*step.sends, *step.race):
                ev = story.events[index]
                if isinstance(ev, (ClaimedRun, ClaimProbe)):
                    try:
                        self.claims.run(ev)
                    except ClaimAnswerWrong as exc:
                        assert exc.findings  # raised after the step, with its findings
                    continue
                self.offset += 1
                self.processor.handle(raw_record(ev, self.offset))
        return self.claims.findings


def _story(role: str, kind: str = "conversation", seed: int = 0) -> Story:
    """A first plain turn, then ``role`` (``claim_*`` of the workload, or
    ``claim_promoted_root``: a chain's first response claimed by a retry)."""
    key = "conv-claims-pinned" if kind == "conversation" else "resp-claims-pinned-0"
    story = Story(0, "claims-pinned", kind, "ten-claims", key, "gateway")
    rng = random.Random(seed)
    gw = StoryGateway(story, rng)
    rid = gw.rid()
    first_ident = (TurnIdentity.conversation(story.tenant, key, rid, 0) if kind == "conversation"
                   else TurnIdentity.chain(story.tenant, rid))
    first = gw.turn(first_ident, gw.key(), "hello")
    story.add("normal", first)
    if role == "claim_promoted_root":
        _root_probe(story, gw, rng, first)
        return story
    ident = (gw.identity(gw.rid(), 1) if kind == "conversation"
             else gw.identity(gw.rid(), parent=rid))
    _claim_role(story, gw, rng, role, ident)
    return story


def _kinds(findings: list[Finding]) -> set[str]:
    return {f.kind for f in findings}


def _rewrite(response: httpx.Response, **fields) -> httpx.Response:
    body = {**response.json(), **fields}
    return httpx.Response(200, content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"})


def _is_claim(request: httpx.Request) -> bool:
    return request.url.path == "/v1/effects/claims"


ROLES = [("claim_contended", "conversation"), ("claim_conflict", "conversation"),
         ("claim_promoted", "conversation"), ("claim_cancelled", "conversation"),
         ("claim_contended", "chain"), ("claim_conflict", "chain"),
         ("claim_promoted", "chain"), ("claim_promoted_root", "chain")]


@pytest.mark.parametrize(("role", "kind"), ROLES, ids=[f"{r}-{k}" for r, k in ROLES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_faithful_api_passes_every_claim_check(role, kind, seed):
    """Every role's answers are the rules' (gateway-protocol.md section 8): no finding,
    nothing left unchecked, the tool run once where it runs at all."""
    world = _World()
    story = _story(role, kind, seed)
    assert world.play(story) == []
    assert world.claims.unchecked == []
    assert all(n == 1 for n in world.claims.runs.values())
    if role in ("claim_promoted", "claim_promoted_root", "claim_cancelled"):
        assert {check for check, _ in world.claims.checked} == {role.split("_")[1]}


def _story_of(label: str, seed: int) -> tuple[str, str, int]:
    """(role, kind, seed) whose story has ``label`` (a variant drawn from the seed)."""
    return next((role, kind, s) for s in range(seed, seed + 50) for role, kind in ROLES
                if label in _story(role, kind, s).labels)


def test_a_live_lease_let_in_is_reported_and_the_second_run_too():
    """Bug A3 of the review: a claim while another attempt holds a live lease was taken
    over (``CLAIMED``), so two attempts ran the tool. The contenders (one
    ``at_most_once``, one ``at_least_once``) must get ``IN_PROGRESS``; let in, each runs
    the tool as a gateway would: the answers are wrong and the effect ran again."""
    def let_in(request, response):
        if _is_claim(request) and response.json().get("state") == "IN_PROGRESS":
            return _rewrite(response, state="CLAIMED", previous_attempt=1, wait_ms=None)
        return response
    world = _World(let_in)
    found = world.play(_story("claim_contended"))
    assert {"claim_answer_wrong", "effect_executed_twice"} <= _kinds(found), found
    assert max(world.claims.runs.values()) == 3


def test_a_promoted_request_answered_claimed_is_reported():
    """Bug A4: ``PROMOTED`` never answered; a finished request's claim got ``CLAIMED``.
    For a Conversation's turn, a chain's child and a chain's first response claimed by
    a retry under another response id."""
    def never_promoted(request, response):
        if _is_claim(request) and response.json().get("state") == "PROMOTED":
            return _rewrite(response, state="CLAIMED", attempt=2, existing_response_id=None,
                            existing_request_digest=None)
        return response
    for role, kind in (("claim_promoted", "conversation"), ("claim_promoted", "chain"),
                       ("claim_promoted_root", "chain")):
        found = _World(never_promoted).play(_story(role, kind))
        assert _kinds(found) == {"claim_answer_wrong"}, (role, kind, found)


def test_promoted_naming_another_response_is_reported():
    """``PROMOTED`` must name the promoted response and its request digest."""
    def elsewhere(request, response):
        if _is_claim(request) and response.json().get("state") == "PROMOTED":
            return _rewrite(response, existing_response_id="resp-somebody-else")
        return response
    found = _World(elsewhere).play(_story("claim_promoted_root", "chain"))
    assert _kinds(found) == {"claim_answer_wrong"}, found


def test_other_arguments_not_answered_conflict_are_reported():
    """Bug A5: the ``CONFLICT`` rule for other arguments removed: the claim of the same
    place with other arguments got ``COMPLETED`` (after the holder's completion) or
    ``IN_PROGRESS`` (while it runs). Both variants."""
    def no_conflict(request, response):
        body = response.json()
        if _is_claim(request) and body.get("state") == "CONFLICT":
            return _rewrite(response, state="COMPLETED" if body.get("output") else "IN_PROGRESS",
                            wait_ms=None if body.get("output") else 1000)
        return response
    for label in ("claim_conflict", "claim_conflict_live"):
        role, kind, seed = _story_of(label, 0)
        found = _World(no_conflict).play(_story(role, kind, seed))
        assert _kinds(found) == {"claim_answer_wrong"}, (label, found)


def test_a_cancelled_request_answered_claimed_is_reported():
    """After the request's ``TurnCancelled``: a new claim is ``CANCELLED`` (rule 1)."""
    def not_cancelled(request, response):
        if _is_claim(request) and response.json().get("state") == "CANCELLED":
            return _rewrite(response, state="CLAIMED", attempt=2)
        return response
    found = _World(not_cancelled).play(_story("claim_cancelled"))
    assert _kinds(found) == {"claim_answer_wrong"}, found


def _stale(response: httpx.Response) -> httpx.Response:
    """Bug E1: the output of a ``COMPLETED`` answer replaced by another result."""
    body = response.json()
    output = dict(body["output"])
    content = json.loads(output["content"])
    content["output"] = "stale result of another call"
    text = json.dumps(content, sort_keys=True, separators=(",", ":"))
    output.update(content=text, content_digest=hashlib.sha256(text.encode()).hexdigest())
    return _rewrite(response, output=output)


@pytest.mark.parametrize("role", ["claim_contended", "claim_cancelled"])
def test_a_completed_answer_replaying_another_output_is_reported(role):
    """Bug E1: a ``COMPLETED`` answer replays another output than the recorded one (the
    contender's reuse; attempt 2's claim after the cancellation)."""
    def replay_stale(request, response):
        if _is_claim(request) and response.json().get("state") == "COMPLETED":
            return _stale(response)
        return response
    found = _World(replay_stale).play(_story(role))
    assert "claim_output_mismatch" in _kinds(found), found


def test_the_takeover_roles_compare_a_replayed_output_too():
    """The overtaken holder claiming again gets the taker's output (``COMPLETED``):
    compared with the completion the taker recorded."""
    story = Story(0, "claims-pinned", "conversation", "ten-claims", "conv-claims-pinned",
                  "gateway")
    gw = StoryGateway(story, random.Random(0))
    ident = gw.identity(gw.rid(), 0)
    _tool_turn(story, gw, "claim_takeover", ident, gw.key(), "hi", random.Random(0))
    assert _World().play(story) == []

    def replay_stale(request, response):
        if _is_claim(request) and response.json().get("state") == "COMPLETED":
            return _stale(response)
        return response
    found = _World(replay_stale).play(story)
    assert _kinds(found) == {"claim_output_mismatch"}, found


def test_an_assertion_of_the_harness_is_a_finding_not_a_refusal():
    """produce.py took every ``AssertionError`` but ``ClaimAnswerWrong`` for a refusal;
    the runner now makes each a ``claim_answer_wrong`` finding: here a claimed run
    whose recorded output is not the one its turn carries."""
    story = _story("claim_contended")
    index = next(i for i, ev in enumerate(story.events) if isinstance(ev, ClaimedRun))
    story.events[index] = dataclasses.replace(story.events[index], output_digest="0" * 64)
    found = _World().play(story)
    assert _kinds(found) == {"claim_answer_wrong"}
    assert "AssertionError" in found[0].detail


def test_the_producer_logs_every_finding_and_swallows_no_assertion(tmp_path):
    """The producer's ``_claim`` keeps every finding of the runner for the log (its
    class tagged), whatever the step raised; the runner reads the log back and the
    checker reports each finding by its class."""
    from ratchet.chaos.produce import _Sender
    from ratchet.chaos.runner import _claims_wrong

    class _Runner:
        def __init__(self):
            self.findings, self.unchecked = [], []

        def run(self, step):
            self.findings.append(Finding("effect_executed_twice", "ten-a", "eff_1", "ran 2"))
            raise ClaimAnswerWrong("ran 2", tuple(self.findings))

    sender = object.__new__(_Sender)
    sender.claims, sender.claims_wrong = _Runner(), []
    sender._claim(_story("claim_contended").events[1])
    assert sender.claims_wrong == [("ten-a", "eff_1", "[effect_executed_twice] ran 2")]
    (tmp_path / "sent-0.jsonl").write_text("".join(
        json.dumps({"t": 1.0, "tenant": t, "effect_id": e, "claim_wrong": d}) + "\n"
        for t, e, d in [*sender.claims_wrong, ("ten-a", "eff_2", "[claim_output_mismatch] x"),
                        ("ten-a", "eff_3", "got IN_PROGRESS")]))
    obs = Observations()
    obs.claim_answers_wrong.extend(_claims_wrong(tmp_path))
    assert sorted(v.kind for v in check([], obs)) == [
        "claim_answer_wrong", "claim_output_mismatch", "effect_executed_twice"]


def test_claim_violation_reads_the_class_tag():
    assert claim_violation("t", "eff_1", "[effect_executed_twice] ran 2").kind \
        == "effect_executed_twice"
    assert claim_violation("t", "eff_1", "[claim_output_mismatch] x").detail == "eff_1: x"
    assert claim_violation("t", "eff_1", "[not_a_class] x").kind == "claim_answer_wrong"
    assert claim_violation("t", "eff_1", "got IN_PROGRESS").kind == "claim_answer_wrong"
    assert check([], Observations()) == []


def test_a_rejected_contended_turn_is_orphaned_with_its_holders_output():
    """A contended claim's outcome is the holder's (attempt 1's item, id
    ``<effect id>:1``); attempt 2's turn carries it re-keyed. When that turn is rejected,
    its orphan record names the recorded output, and the oracle must expect that one:
    both CI chaos runs of session 40 reported ``orphan_record_wrong`` for a contended
    turn a race had rejected, on right behaviour."""
    import copy

    from ratchet.chaos.checker import _records_of_world
    from ratchet.chaos.oracle import expect
    from schemas.models import EffectOrphaned

    story = _story("claim_contended")
    # The first plain turn never sent: the contended turn, expecting head 1, is
    # OUT_OF_ORDER, and the claimed effect is orphaned TURN_REJECTED.
    trimmed = copy.copy(story)
    trimmed.steps = story.steps[1:]
    world, records = _World(), {}
    for step in trimmed.steps:
        for index in (*step.sends, *step.race):
            ev = story.events[index]
            if isinstance(ev, (ClaimedRun, ClaimProbe)):
                world.claims.run(ev)
                continue
            world.offset += 1
            for out in world.processor.handle(raw_record(ev, world.offset)).outbound:
                if isinstance(out.model, EffectOrphaned):
                    records.setdefault((out.model.tenant_id, out.model.effect_id), []).append(
                        (out.model.reason.value, out.model.effect_completed,
                         out.model.output_digest))
    run = next(ev for ev in story.events if isinstance(ev, ClaimedRun))
    assert run.role == "contended" and run.recorded_digest != run.output_digest
    assert records[(run.tenant_id, run.effect_id)] == [
        ("TURN_REJECTED", True, run.recorded_digest)]
    exp = expect(trimmed)
    assert _records_of_world(exp, exp.worlds[0], Observations(orphan_records=records)) == []


def test_a_damaged_claims_500_is_a_finding_not_an_outage():
    """A claim answered 500 ``CORRUPT_HISTORY`` (not retryable: a damaged claim row,
    session 53) is a finding of the step. The runner's raw posts took every 5xx for an
    outage (``RehydrationUnavailable``: "send the round again"), so a damaged row was
    retried as long as the run lasted and never reported; the gateway library types it
    (``server_error``, session 40), and so do they now."""
    def damaged(request, response):
        if _is_claim(request) and response.json().get("state") == "PROMOTED":
            return httpx.Response(500, json={
                "error": "CORRUPT_HISTORY", "retryable": False,
                "detail": "the claim of request k of tenant t names no partition"})
        return response
    found = _World(damaged).play(_story("claim_promoted_root", "chain"))
    assert _kinds(found) == {"claim_answer_wrong"}, found
    assert "CORRUPT_HISTORY" in repr(found), found
