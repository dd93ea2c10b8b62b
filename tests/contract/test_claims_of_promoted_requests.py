"""No tool runs for a request that already stands promoted (both backends).

A claim that would let its holder run the tool (``CLAIMED``, ``IN_PROGRESS``,
``LEASE_EXPIRED``) of a request already promoted is answered ``PROMOTED`` with the
response it stands promoted as: no turn of the request can be promoted any more, so
nothing would use the run, and a holder that vanished left it published nowhere
(docs/decisions.md, "Claims of a promoted request"). The claim's conditional mark and
the promotion batch are ordered by one Paxos round, so whichever lands first, the run
is either refused or seen by the promotion."""

from __future__ import annotations

import hashlib
import uuid

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.domain.claims import effect_id_for_claim
from ratchet.samples import NOW_MS, TENANT, make_turn, new_id
from schemas.models import CheckpointPromoted, EffectOrphaned, OrphanReason
from services.api.claims import claims_router
from tests.contract.test_processor_handover import ENTRIES, PausedBatch, data  # noqa: F401


class Claims:
    """The claims API over one backend's store and ledger, on a clock tests move."""

    def __init__(self, data) -> None:  # noqa: F811
        self.now_ms = NOW_MS
        app = FastAPI()
        app.include_router(claims_router(data.ledger(), data.store(), lambda: self.now_ms))
        self.http = TestClient(app)

    def claim(self, key: str, partition: str, *, attempt: int, token: str | None = None,
              policy: str = "at_most_once", response_id: str | None = None) -> dict:
        body = {
            "tenant_id": TENANT, "idempotency_key": key, "partition_key": partition,
            "attempt": attempt, "subturn_index": 0, "tool_name": "send_email",
            "occurrence": 0, "arguments_digest": hashlib.sha256(b"{}").hexdigest(),
            "call_id": f"call_{attempt}", "token": token or uuid.uuid4().hex,
            "lease_ms": 30_000, "policy": policy}
        if response_id is not None:
            body["response_id"] = response_id
        answer = self.http.post("/v1/effects/claims", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()


def _promoted(worker, t) -> None:
    assert isinstance(worker.outcome(t), CheckpointPromoted)


@ENTRIES
def test_a_claim_after_the_promotion_is_answered_promoted(data, entry):  # noqa: F811
    claims, worker = Claims(data), data.worker(entry)
    conv = new_id("conv")
    t = make_turn(conversation_id=conv)
    _promoted(worker, t)
    token = uuid.uuid4().hex
    answer = claims.claim(t.idempotency_key, conv, attempt=2, token=token)
    assert (answer["state"], answer["existing_response_id"]) == ("PROMOTED", t.response_id)
    assert answer["effect_id"] == effect_id_for_claim(t.idempotency_key, 0, "send_email", 0)
    # the same call re-sent, another attempt while its lease runs, and one after it ran
    # out under either policy: none may run the tool
    assert claims.claim(t.idempotency_key, conv, attempt=2, token=token)["state"] == "PROMOTED"
    assert claims.claim(t.idempotency_key, conv, attempt=3)["state"] == "PROMOTED"
    claims.now_ms += 60_000
    for policy in ("at_most_once", "at_least_once"):
        later = claims.claim(t.idempotency_key, conv, attempt=4, policy=policy)
        assert (later["state"], later["existing_response_id"]) == ("PROMOTED", t.response_id)
    # another request of the Conversation is not promoted: its claim runs
    assert claims.claim(new_id("idem"), conv, attempt=1)["state"] == "CLAIMED"


@ENTRIES
def test_a_completed_claim_is_still_reused_after_the_promotion(data, entry):  # noqa: F811
    """Reusing a recorded outcome never runs the tool: ``COMPLETED`` stays."""
    claims, worker = Claims(data), data.worker(entry)
    conv, key, token = new_id("conv"), new_id("idem"), uuid.uuid4().hex
    first = claims.claim(key, conv, attempt=1, token=token)
    assert first["state"] == "CLAIMED"
    content = b'{"call_id":"call_1","id":"fco_1","output":"sent","type":"function_call_output"}'
    done = claims.http.post(f"/v1/effects/claims/{first['effect_id']}/complete", json={
        "tenant_id": TENANT, "idempotency_key": key, "partition_key": conv,
        "token": token, "status": "succeeded",
        "output": {"item_id": "fco_1", "type": "function_call_output", "role": None,
                   "call_id": "call_1", "content": content.decode(),
                   "content_digest": hashlib.sha256(content).hexdigest()}})
    assert done.json()["state"] == "COMPLETED"
    _promoted(worker, make_turn(conversation_id=conv, idempotency_key=key, attempt=2))
    again = claims.claim(key, conv, attempt=3)
    assert (again["state"], again["output"]["content"]) == ("COMPLETED", content.decode())


def test_a_promotion_landing_before_the_claims_mark_refuses_the_claim(data):  # noqa: F811
    """The batch was decided without any fact and lands just before the claim's mark:
    the claim is written, then answered ``PROMOTED`` (its holder never runs it). The
    thread path's ``promote`` is where a test can hold a batch (``PausedBatch``)."""
    claims = Claims(data)
    store = PausedBatch(data.store())
    worker = data.worker("handle", store=store)
    conv = new_id("conv")
    t = make_turn(conversation_id=conv)
    answers = []

    def a_claim_meanwhile(land):
        land()
        answers.append(claims.claim(t.idempotency_key, conv, attempt=2))
    store.before_promote = a_claim_meanwhile
    assert isinstance(worker.handle(t).outbound[0].model, CheckpointPromoted)
    assert [(a["state"], a["existing_response_id"]) for a in answers] == [
        ("PROMOTED", t.response_id)]


def test_a_claim_landing_before_the_batch_is_seen_by_the_promotion(data):  # noqa: F811
    """The other order: the claim is written and marked while the batch, decided
    without it, waits. The batch is refused (the mark moved), the turn decided again
    with the claim, which it does not use: published for compensation."""
    claims = Claims(data)
    store = PausedBatch(data.store())
    worker = data.worker("handle", store=store)
    conv = new_id("conv")
    t = make_turn(conversation_id=conv)
    answers = []
    store.before_promote = lambda land: answers.append(
        claims.claim(t.idempotency_key, conv, attempt=2))
    handled = worker.handle(t)
    assert [a["state"] for a in answers] == ["CLAIMED"]
    assert isinstance(handled.outbound[0].model, CheckpointPromoted)
    orphans = [(o.model.effect_id, o.model.reason, o.model.effect_completed)
               for o in handled.outbound if isinstance(o.model, EffectOrphaned)]
    assert orphans == [(answers[0]["effect_id"], OrphanReason.ATTEMPT_SUPERSEDED, False)]


@ENTRIES
def test_a_chains_first_request_retried_under_another_response_id(data, entry):  # noqa: F811
    """A chain's first response is its own partition; a retry under another response id
    claims with its own id as partition key, and still learns the promotion."""
    claims, worker = Claims(data), data.worker(entry)
    root = new_id("resp")
    first = make_turn(response_id=root, conversation_id=None, chain_root_id=root,
                      expected_head_seq=None)
    _promoted(worker, first)
    retry_id = new_id("resp")
    answer = claims.claim(first.idempotency_key, retry_id, attempt=2, response_id=retry_id)
    assert (answer["state"], answer["existing_response_id"]) == ("PROMOTED", root)
    # Without its response id the API cannot tell a chain's first response from a
    # later turn of another chain (partition_key = its root), which is another request
    # under the same key: only that partition is looked at (attempt 2's claim is live).
    assert claims.claim(first.idempotency_key, retry_id, attempt=3)["state"] == "IN_PROGRESS"


def test_the_same_key_in_another_chain_or_a_conversation_is_another_request(
        data, entry="handle"):  # noqa: F811
    """An idempotency key's scope is its partition: a chain's first request promoted
    under a key says nothing of a request of another chain or a Conversation that uses
    the same key. Their claims run (claims themselves are per tenant and key: the
    docs say so)."""
    claims, worker = Claims(data), data.worker(entry)
    root = new_id("resp")
    first = make_turn(response_id=root, conversation_id=None, chain_root_id=root,
                      expected_head_seq=None)
    _promoted(worker, first)
    other_root, conv = new_id("resp"), new_id("conv")
    # a later turn of another chain (partition: its root), and a Conversation's turn
    later = claims.claim(first.idempotency_key, other_root, attempt=1,
                         response_id=new_id("resp"))
    assert later["state"] == "CLAIMED", later
    in_conversation = claims.claim(first.idempotency_key, conv, attempt=1,
                                   response_id=new_id("resp"))
    assert in_conversation["state"] == "IN_PROGRESS", in_conversation  # the same claim


def test_a_retrys_claim_before_a_chains_first_promotion_is_published_by_it(data):  # noqa: F811
    """A chain's first response: a retry under another response id claims (its own
    partition) before the first attempt holds the request, so the claim's marks miss
    the first attempt's partition, and its batch, asserting no mark, lands. The first
    attempt reads the request's facts again after its batch: the claim is published
    for compensation (it may have run), never left unnamed."""
    claims = Claims(data)
    store = PausedBatch(data.store())
    worker = data.worker("handle", store=store)
    root = new_id("resp")
    first = make_turn(response_id=root, conversation_id=None, chain_root_id=root,
                      expected_head_seq=None)
    answers = []
    store.before_promote = lambda land: answers.append(
        claims.claim(first.idempotency_key, new_id("resp"), attempt=2))
    handled = worker.handle(first)
    assert [a["state"] for a in answers] == ["CLAIMED"]
    assert isinstance(handled.outbound[0].model, CheckpointPromoted)
    orphans = [(o.model.effect_id, o.model.reason, o.model.effect_completed)
               for o in handled.outbound if isinstance(o.model, EffectOrphaned)]
    assert orphans == [(answers[0]["effect_id"], OrphanReason.ATTEMPT_SUPERSEDED, False)]
