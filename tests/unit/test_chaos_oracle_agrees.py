"""The chaos oracle and the processor agree on every event of a generated workload.

The oracle (``ratchet/chaos/oracle.py``) re-derives each outcome from CONTRACT 4
without the domain code; the chaos run compares it with what real servers publish,
under faults. Here the same workload runs through the processor core on the in-memory
backends, story after story, each race in the order that sends it first (the oracle's
first world) or, in a second run, each the other way round (its last world): every
decision must be one the oracle accepts, every effect the oracle
says is orphaned must be published orphaned, and no effect a promoted turn used may
carry a reason to compensate. A rule the workload sends that the oracle models wrongly
(or the processor breaks) fails here in seconds, before a chaos run.

The workload covers the rules added to the chaos run in session 25: fingerprints that
are not identities, unknown formats, boundary proofs that prove nothing, pairing
breaches and a client tool answered by the next turn, a redeployed model, a conflicted
effect, a response id raced on two Conversations of one tenant, one used by another
tenant too, and another tenant's turn on a Conversation (``TENANT_MISMATCH``); since
session 26 also another tenant's child of a chain's response (``foreign_parent``); since
session 46 Conversations whose id is a chain's first response id (one partition, two
histories: the chain's story before or after the Conversation's, as the stories are
processed in order here).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from datetime import UTC, datetime

import httpx
import pytest
from fastapi.testclient import TestClient

from ratchet.chaos.answers import answer_problem, final_heads, head_range, status_problem
from ratchet.chaos.claims import ClaimedRun, ClaimProbe, ClaimRunner
from ratchet.chaos.observations import FINAL_ORPHAN_REASONS, OTHER_FINGERPRINT
from ratchet.chaos.observe import history_of
from ratchet.chaos.oracle import expect
from ratchet.chaos.story import Story, StoryGateway, workload_fp_hash
from ratchet.chaos.timed import stamp
from ratchet.chaos.workload import generate
from schemas.models import CheckpointPromoted, EffectOrphaned, PromotionRejected, TurnCompleted
from services.api.app import create_app
from services.api.claims import claims_router
from services.api.fastpath import HistoryFastPath
from services.api.service import RehydrationService
from services.api.waiters import PromotionWaiters
from services.gateway.client import parse_outcome
from services.gateway.events import TurnIdentity
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.processor import PromotionProcessor
from tests.unit.test_processor_rules import TOPICS, PickleCodec, raw_record

NEW_LABELS = ("bad_fingerprint", "unsupported_format", "bad_proof", "unpaired", "redeployed",
              "client_tool", "client_tool_answer", "foreign_rid", "effect_conflict",
              "rid_elsewhere", "foreign_tenant", "foreign_parent", "late_effect", "expired",
              "claimed", "claim_abandoned", "claim_takeover", "claim_expired",
              "claim_contended", "claim_conflict", "claim_conflict_live", "claim_promoted",
              "claim_cancelled")


def _sig(model) -> tuple:
    if isinstance(model, CheckpointPromoted):
        return ("P", model.seq, str(model.certification), model.idempotency_key,
                model.request_digest, model.item_count)
    reason = str(model.reason)
    return ("R", reason, model.existing_response_id if reason == "DUPLICATE" else None)


class _Clock:
    """Wall-clock milliseconds that a lease wait moves forward instead of sleeping."""

    def __init__(self) -> None:
        self.skipped_ms = 0

    def now_ms(self) -> int:
        return int(time.time() * 1000) + self.skipped_ms

    def sleep(self, seconds: float) -> None:
        self.skipped_ms += int(seconds * 1000)


def _processor(clock_ms=lambda: int(time.time() * 1000)):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    processor = PromotionProcessor(store, ledger, PickleCodec(), TOPICS, clock_ms=clock_ms)
    return processor, store, ledger


def _through(api: TestClient):
    """An httpx transport handler that answers with ``api`` (the in-process app)."""
    def handle(request: httpx.Request) -> httpx.Response:
        got = api.request(request.method, request.url.raw_path.decode(), content=request.content,
                          headers={"content-type": "application/json"})
        return httpx.Response(got.status_code, content=got.content,
                              headers={"content-type": got.headers.get("content-type", "")})
    return handle


def _run(seed: int, turns: int, raced: bool):
    """Every story of the workload through one processor (stories share its store, as
    they share the servers in a chaos run). Returns (expectations, decisions, orphans,
    api): decisions[(story index, event index)] lists the outcome of each send; api is
    the rehydration API over the processor's store."""
    clock = _Clock()
    processor, store, ledger = _processor(clock.now_ms)
    # The API reads a minute ahead of the processor: past every expiry a timed turn was
    # stamped with at its send (ratchet/chaos/timed.py), as the checker's reads are.
    service = RehydrationService(store, ledger, PromotionWaiters(), clock=lambda: (
        datetime.fromtimestamp((clock.now_ms() + 60_000) / 1000, UTC)))
    routers = [claims_router(ledger, store, clock.now_ms)]
    api = TestClient(HistoryFastPath(create_app(service, lambda: True, routers=routers),
                                     service), raise_server_exceptions=False)
    # Claims go through the API over the same store and ledger, as in a chaos run; a
    # lease is waited out by moving the clock.
    claims = ClaimRunner("http://api", transport=httpx.MockTransport(_through(api)),
                         sleep=clock.sleep)
    expectations = [expect(s) for s in generate(seed, turns, f"agree{seed}").stories]
    decisions: dict[tuple[int, int], list[tuple]] = {}
    orphans: dict[int, dict[str, str]] = {}
    completed: set[tuple[int, str]] = set()  # (story, effect) orphaned effect_completed
    records: dict[tuple[str, str], list[tuple]] = {}  # (tenant, effect) -> each record
    offset = 0
    for e in expectations:
        if e.story.kind == "garbage":
            continue
        for step in e.story.steps:
            order = (*step.sends, *step.race)
            if raced and step.race:  # the oracle's last world: the race won by the other
                order = (*step.sends[:-1], *reversed((step.sends[-1], *step.race)))
            for index in order:
                if isinstance(e.story.events[index], (ClaimedRun, ClaimProbe)):
                    claims.run(e.story.events[index])
                    continue
                offset += 1
                ev = e.story.events[index]
                if index in e.story.timed:
                    ev = stamp(e.story, index, ev, clock.now_ms())
                handled = processor.handle(raw_record(ev, offset))
                for out in handled.outbound:
                    if isinstance(out.model, (CheckpointPromoted, PromotionRejected)):
                        decisions.setdefault((e.story.index, index), []).append(_sig(out.model))
                    elif isinstance(out.model, EffectOrphaned):
                        orphans.setdefault(e.story.index, {})[out.model.effect_id] = str(
                            out.model.reason)
                        if out.model.effect_completed:
                            completed.add((e.story.index, out.model.effect_id))
                        records.setdefault((out.model.tenant_id, out.model.effect_id),
                                           []).append((str(out.model.reason),
                                                       out.model.effect_completed,
                                                       out.model.output_digest))
    assert claims.ran > 0  # the workload claimed tools
    assert claims.findings == []  # every check made was right
    # Every check made, but where the race run the other way round legitimately rejects
    # a probe's turn (a Conversation's head left behind by the race: OUT_OF_ORDER after
    # it), which the probe then leaves unchecked.
    assert claims.unchecked == [] if not raced else all(
        "is rejected, not promoted" in line for line in claims.unchecked), claims.unchecked
    assert all(n <= 2 for n in claims.runs.values())
    assert {"promoted", "cancelled", "conflict"} <= {check for check, _ in claims.checked}
    _run.records = records  # every orphan record: test_every_orphan_record_is_as_the_rules_say
    return expectations, decisions, orphans, completed, api


@pytest.fixture(scope="module", params=[(3, False), (11, False), (5, True)],
                ids=["seed3", "seed11", "seed5-raced"])
def run(request):
    seed, raced = request.param
    expectations, decisions, orphans, completed, api = _run(seed, 1500, raced)
    world = -1 if raced else 0
    run_records[request.param] = _run.records
    return [(e, e.worlds[world]) for e in expectations], decisions, orphans, completed, api


run_records: dict[tuple, dict] = {}  # per run: every orphan record (tenant, effect) -> [...]


def test_every_decision_is_one_the_oracle_accepts(run):
    expectations, decisions, orphans, completed, _ = run
    wrong, sent_labels = [], Counter()
    for e, w in expectations:
        if e.story.kind == "garbage":
            continue
        for step, label in zip(e.story.steps, e.story.labels, strict=True):
            for index in (*step.sends, *step.race):
                ev = e.story.events[index]
                if not isinstance(ev, TurnCompleted):
                    continue
                sent_labels[label.split("_")[0] if label.startswith("unpaired") else label] += 1
                got = decisions.get((e.story.index, index), [])
                if not got or any(sig not in w.decided[index] for sig in got):
                    wrong.append(f"{e.story.sid} {label} {ev.response_id}: processor {got}, "
                                 f"oracle {sorted(map(str, w.decided[index]))}")
        published = orphans.get(e.story.index, {})
        missing = w.orphans - set(published)
        if missing:
            wrong.append(f"{e.story.sid}: effects never published orphaned: {sorted(missing)}")
        # A claim no attempt recorded an outcome for (attempt 2 refused LEASE_EXPIRED):
        # "may or may not have run", never "completed".
        said_done = {eid for eid in w.orphans & w.no_outcome
                     if (e.story.index, eid) in completed}
        if said_done:
            wrong.append(f"{e.story.sid}: claims without an outcome published "
                         f"effect_completed: {sorted(said_done)}")
        undone = {eid for eid in w.used if published.get(eid) in FINAL_ORPHAN_REASONS}
        if undone:
            wrong.append(f"{e.story.sid}: used effects orphaned to compensate: {sorted(undone)}")
    assert wrong == []
    # The workload sent every new rule (else this test proves nothing about them).
    assert all(sent_labels[label] > 0 for label in NEW_LABELS), sent_labels
    # And shared keys, the chain's story first and the Conversation's first.
    stories = [e.story for e, _ in expectations]
    pairs = [(c.index, ch.index) for c in stories for ch in stories
             if (c.kind, ch.kind) == ("conversation", "chain")
             and (c.tenant, c.key) == (ch.tenant, ch.key)]
    assert {c < ch for c, ch in pairs} == {True, False}, pairs


def test_every_orphan_record_is_as_the_rules_say(run, request):
    """Each EffectOrphaned the processor publishes, judged as the chaos checker judges
    it (``_records_of_world``): a final ATTEMPT_SUPERSEDED for an effect its promoted
    request did not use, no final reason while the request is unsettled,
    ``effect_completed`` true with the recorded output's digest for an outcome that was
    recorded, no digest for a claim without one."""
    from ratchet.chaos.checker import _records_of_world
    from ratchet.chaos.observations import Observations

    expectations = run[0]
    records = run_records[request.node.callspec.params["run"]]
    obs = Observations(orphan_records=records)
    wrong = [v for e, w in expectations if e.story.kind != "garbage"
             for v in _records_of_world(e, w, obs)]
    assert wrong == []
    reasons = Counter(r[0] for rs in records.values() for r in rs)
    assert reasons["ATTEMPT_SUPERSEDED"] > 10, reasons  # the rule was exercised


def test_every_history_is_the_one_the_oracle_promoted(run):
    """The rehydration API over the processor's store answers every response sent and
    every Conversation as the oracle says (``answer_problem``, the chaos checker's own
    judgement): the outcome and fallback reason for the workload's fingerprint and for
    another one (a redeployed model's turns fall back, and every certified history
    asked with a fingerprint nobody deployed), the complete history in order, a failure
    for a response never promoted."""
    expectations, _, _, _, api = run
    wrong, checked = [], Counter()

    def ask(path: str, tenant: str, fp: str):
        resp = api.get(path, params={"tenant_id": tenant, "fingerprint_hash": fp})
        return history_of(parse_outcome(resp.json(), resp.status_code), fp, resp.json())

    for e, w in expectations:
        if e.story.kind == "garbage":
            continue
        tenant = e.story.tenant
        # Asked by the tenant that sent it (a turn of another tenant on the story's
        # Conversation is that tenant's: rejected, NOT_PROMOTED; not the story's).
        rids = {(e.story.events[i].tenant_id, e.story.events[i].response_id)
                for i in w.decided}
        for n, (sender, rid) in enumerate(sorted(rids)):
            promo = w.promoted.get(rid) if sender == tenant else None
            heads = head_range(promo, final_heads(e.story, w))
            for fp in (workload_fp_hash(), *((OTHER_FINGERPRINT,) if n % 3 == 0 else ())):
                got = ask(f"/v1/responses/{rid}/history", sender, fp)
                problem = answer_problem(promo, rid, got, fp, heads=heads)
                checked[got.reason or got.outcome] += 1
                if problem:
                    wrong.append(f"{e.story.sid} {rid} asked with {fp[:8]}: {problem}")
        if e.story.kind == "conversation" and w.head:
            head = next(p for p in w.promoted.values()
                        if p.conversation_id == e.story.key and p.seq == w.head)
            got = ask(f"/v1/conversations/{e.story.key}/history", tenant, workload_fp_hash())
            problem = answer_problem(head, head.response_id, got, heads=(w.head, w.head))
            if problem:
                wrong.append(f"{e.story.sid} conversation {e.story.key}: {problem}")
    assert wrong == []
    assert {"certified", "FINGERPRINT_MISMATCH", "NOT_CERTIFIED", "NOT_PROMOTED",
            "EXPIRED"} <= set(checked)


def _story_of(*turns, kind: str = "conversation") -> tuple[Story, list[tuple]]:
    """A one-world story of ``turns`` (functions of the story's gateway helper, sent in
    order); the processor's outcome of each, and the oracle's acceptable ones."""
    key = "conv-agree-pinned" if kind == "conversation" else "resp-agree-pinned-0"
    story = Story(0, "agree-pinned", kind, "ten-pinned", key, "gateway")
    gw = StoryGateway(story, random.Random(0))
    for make in turns:
        story.add("pinned", make(gw, story))
    (world,) = expect(story).worlds
    processor, _, _ = _processor()
    got = []
    for offset, index in enumerate(range(len(story.events)), start=1):
        for out in processor.handle(raw_record(story.events[index], offset)).outbound:
            if isinstance(out.model, (CheckpointPromoted, PromotionRejected)):
                got.append((_sig(out.model), world.decided[index]))
    return story, got


def _turn(conversation: str, rid: str, head: int, key: str):
    def make(gw, story):
        ident = TurnIdentity.conversation(story.tenant, conversation, rid, head)
        return gw.turn(ident, key, f"ask {rid} {key}")
    return make


def test_a_turn_ahead_of_the_head_whose_id_is_bound_elsewhere_is_out_of_order():
    """Found by a chaos run (seed 26, story 104): a response id raced on two
    Conversations and bound by the other one; a later turn of this Conversation, sent
    ahead of its head under that id, was ``OUT_OF_ORDER`` where the oracle said
    ``CONFLICT``. The processor is right and was documented wrong: an id bound in
    another partition is found by the claim a turn takes just before its write, which
    matters only to a turn that would be written (gateway-protocol.md section 7)."""
    c, other = "conv-agree-pinned", "conv-agree-pinned-x"
    _, got = _story_of(_turn(c, "r0", 0, "k0"), _turn(other, "rX", 0, "k1"),
                       _turn(c, "rX", 1, "k2"), _turn(c, "rX", 5, "k3"))
    assert [g[0][:2] for g in got] == [("P", 1), ("P", 1), ("R", "CONFLICT"),
                                      ("R", "OUT_OF_ORDER")]
    assert all(sig in accepted for sig, accepted in got), got


def test_a_response_id_bound_by_a_rejected_turn_stays_bound():
    """Found by a chaos run (seed 26, story 61): a response id raced on two
    Conversations, the turn sent on this one processed first and rejected
    ``OUT_OF_ORDER``; the other, which would have been promoted, was ``CONFLICT``. The
    processor is right (gateway-protocol.md: the binding is taken before any check and
    never released, so a rejected turn still binds its response id); the oracle had
    bound response ids only by promotion."""
    c, other = "conv-agree-pinned", "conv-agree-pinned-y"
    _, got = _story_of(_turn(c, "r0", 0, "k0"), _turn(c, "rY", 5, "k1"),
                       _turn(other, "rY", 0, "k2"))
    assert [g[0][:2] for g in got] == [("P", 1), ("R", "OUT_OF_ORDER"), ("R", "CONFLICT")]
    assert all(sig in accepted for sig, accepted in got), got


def test_another_tenants_turn_on_a_conversation_is_tenant_mismatch():
    """The workload's ``foreign_tenant`` scenario, pinned: the Conversation is its first
    promoted turn's tenant's; another tenant's turn at its head is refused first."""
    def foreign(gw, story):
        ident = TurnIdentity.conversation("ten-intruder", story.key, "r9", 1)
        return gw.turn(ident, "k9", "let me in")
    _, got = _story_of(_turn("conv-agree-pinned", "r0", 0, "k0"), foreign,
                       _turn("conv-agree-pinned", "r1", 1, "k1"))
    assert [g[0][:2] for g in got] == [("P", 1), ("R", "TENANT_MISMATCH"), ("P", 2)]
    assert all(sig in accepted for sig, accepted in got), got


def test_another_tenants_child_of_a_chain_response_is_tenant_mismatch():
    """The workload's ``foreign_parent`` scenario, pinned: a chain response is its
    promoting tenant's; another tenant's child of it is ``TENANT_MISMATCH``, and its
    child of a response never promoted is ``PARENT_NOT_PROMOTED``; the chain's own
    tenant goes on."""
    def chain(rid, parent, key, tenant=None):
        def make(gw, story):
            ident = TurnIdentity.chain(tenant or story.tenant, rid, previous_response_id=parent,
                                       chain_root_id=None if parent is None else story.key)
            return gw.turn(ident, key, f"ask {rid}")
        return make
    root = "resp-agree-pinned-0"
    _, got = _story_of(chain(root, None, "k0"),
                       chain("r1", root, "k1", tenant="ten-intruder"),
                       chain("r2", "never-promoted", "k2", tenant="ten-intruder"),
                       chain("r3", root, "k3"), kind="chain")
    assert [g[0][:2] for g in got] == [("P", 1), ("R", "TENANT_MISMATCH"),
                                      ("R", "PARENT_NOT_PROMOTED"), ("P", 2)]
    assert all(sig in accepted for sig, accepted in got), got


def test_every_status_is_the_one_the_oracle_says(run):
    """``/status`` of every response sent, asked by its sender, as the chaos checker
    judges it (``status_problem``): promoted at the oracle's seq, else rejected with a
    reason the oracle allows (or unknown where it allows CORRUPT)."""
    expectations, _, _, _, api = run
    wrong, states = [], Counter()
    for e, w in expectations:
        if e.story.kind == "garbage":
            continue
        per_rid: dict[tuple[str, str], set] = {}
        for i, acceptable in w.decided.items():
            ev = e.story.events[i]
            per_rid.setdefault((ev.tenant_id, ev.response_id), set()).update(acceptable)
        for (sender, rid), wanted in sorted(per_rid.items()):
            body = api.get(f"/v1/responses/{rid}/status", params={"tenant_id": sender}).json()
            got = (body["state"], body.get("reason"), body.get("seq"))
            states[got[0]] += 1
            promo = w.promoted.get(rid) if sender == e.story.tenant else None
            problem = status_problem(promo, wanted, got)
            if problem:
                wrong.append(f"{e.story.sid} {rid}: {problem}")
    assert wrong == []
    assert states["promoted"] > 100 and states["rejected"] > 20, states


def test_a_status_against_the_oracle_is_judged():
    from ratchet.chaos.oracle import Promo

    promo = Promo("resp_1", "key_1", "d" * 64, 3, (), "certified")
    assert status_problem(promo, set(), ("promoted", None, promo.seq)) is None
    assert "promoted at seq" in status_problem(promo, set(), ("promoted", None, promo.seq + 1))
    assert "promoted at seq" in status_problem(promo, set(), ("unknown", None, None))
    rejected = {("R", "CONFLICT", None)}
    assert status_problem(None, rejected, ("rejected", "CONFLICT", None)) is None
    assert "expected one of" in status_problem(None, rejected, ("rejected", "OUT_OF_ORDER", 3))
    assert "never promoted" in status_problem(None, rejected, ("promoted", None, 2))
    assert "a rejection was recorded" in status_problem(None, rejected, ("unknown", None, None))
    assert status_problem(None, {("R", "CORRUPT", None)}, ("unknown", None, None)) is None
