"""No tool runs for a request that already stands promoted (both backends).

A claim of a request already promoted is answered ``PROMOTED`` with the response it
stands promoted as and that request's digest, and nothing is written: no turn of the
request can be promoted any more, so nothing would use a run, and a holder that
vanished left it published nowhere (docs/decisions.md, "Claims of a promoted
request"). The claim's conditional marks, before and after its write, and the promotion
batch are ordered by one Paxos round, so whichever lands first, the run is either
refused or seen by the promotion. Found by review (session 39): a claim refused after
its write was published for compensation, and a refused takeover locked a live holder
out of recording its run."""

from __future__ import annotations

import hashlib
import uuid

from fastapi import FastAPI
from fastapi.testclient import TestClient

from ratchet.domain.claims import effect_id_for_claim
from ratchet.samples import NOW_MS, TENANT, make_turn, new_id
from schemas.models import CheckpointPromoted, EffectOrphaned, OrphanReason
from services.api.claims import claims_router
from tests.contract.test_processor_handover import ENTRIES, PausedBatch


class Claims:
    """The claims API over one backend's store and ledger, on a clock tests move."""

    def __init__(self, data, ledger=None) -> None:
        self.now_ms = NOW_MS
        app = FastAPI()
        app.include_router(claims_router(ledger or data.ledger(), data.store(),
                                         lambda: self.now_ms))
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

    def complete(self, key: str, partition: str, effect_id: str, token: str):
        """The holder ``token`` records a succeeded run of ``effect_id``."""
        content = (b'{"call_id":"call_1","id":"fco_1","output":"sent",'
                   b'"type":"function_call_output"}')
        return self.http.post(f"/v1/effects/claims/{effect_id}/complete", json={
            "tenant_id": TENANT, "idempotency_key": key, "partition_key": partition,
            "token": token, "status": "succeeded",
            "output": {"item_id": "fco_1", "type": "function_call_output", "role": None,
                       "call_id": "call_1", "content": content.decode(),
                       "content_digest": hashlib.sha256(content).hexdigest()}})


class AfterClaim:
    """A ledger that runs ``after`` once a claim is written, before its answer."""

    def __init__(self, ledger, after) -> None:
        self._ledger, self.after = ledger, after

    def claim_effect(self, request, now_ms):
        answer = self._ledger.claim_effect(request, now_ms)
        if self.after is not None:
            act, self.after = self.after, None
            act()
        return answer

    def __getattr__(self, name):
        return getattr(self._ledger, name)

def _chain_first(root: str):
    """A chain's first response ``root`` (its own partition)."""
    return make_turn(response_id=root, conversation_id=None, chain_root_id=root,
                     expected_head_seq=None)


def _promoted(worker, t) -> None:
    assert isinstance(worker.outcome(t), CheckpointPromoted)


@ENTRIES
def test_a_claim_after_the_promotion_is_answered_promoted(data, entry):
    claims, worker = Claims(data), data.worker(entry)
    conv = new_id("conv")
    t = make_turn(conversation_id=conv)
    _promoted(worker, t)
    token = uuid.uuid4().hex
    answer = claims.claim(t.idempotency_key, conv, attempt=2, token=token)
    assert (answer["state"], answer["existing_response_id"],
            answer["existing_request_digest"]) == ("PROMOTED", t.response_id,
                                                   t.request_digest)
    assert answer["effect_id"] == effect_id_for_claim(t.idempotency_key, 0, "send_email", 0)
    assert (answer["attempt"], answer["lease_until"]) == (None, None)  # nobody holds it
    # nothing was written: no claim to publish for compensation, now or on redelivery
    assert data.ledger().claim(TENANT, t.idempotency_key, answer["effect_id"]) is None
    assert _orphans(worker.handle(t)) == []
    # the same call re-sent, another attempt, and one after a lease would have run out
    # under either policy: none may run the tool
    assert claims.claim(t.idempotency_key, conv, attempt=2, token=token)["state"] == "PROMOTED"
    assert claims.claim(t.idempotency_key, conv, attempt=3)["state"] == "PROMOTED"
    claims.now_ms += 60_000
    for policy in ("at_most_once", "at_least_once"):
        later = claims.claim(t.idempotency_key, conv, attempt=4, policy=policy)
        assert (later["state"], later["existing_response_id"]) == ("PROMOTED", t.response_id)
    # another request of the Conversation is not promoted: its claim runs
    assert claims.claim(new_id("idem"), conv, attempt=1)["state"] == "CLAIMED"


def _orphans(handled) -> list:
    return [(o.model.effect_id, o.model.reason, o.model.effect_completed)
            for o in handled.outbound if isinstance(o.model, EffectOrphaned)]


def _claimed_while_the_batch_waits(data, turn, partition: str) -> None:
    """A claim of ``turn``'s request (attempt 2, in ``partition``) written and marked
    while the turn's batch, decided without it, waits (``PausedBatch``, the thread
    path): the claim is ``CLAIMED``, the turn promoted all the same, and the claim,
    which it does not use, published for compensation."""
    claims = Claims(data)
    store = PausedBatch(data.store())
    worker = data.worker("handle", store=store)
    answers = []
    store.before_promote = lambda land: answers.append(
        claims.claim(turn.idempotency_key, partition, attempt=2))
    handled = worker.handle(turn)
    assert [a["state"] for a in answers] == ["CLAIMED"]
    assert isinstance(handled.outbound[0].model, CheckpointPromoted)
    assert _orphans(handled) == [
        (answers[0]["effect_id"], OrphanReason.ATTEMPT_SUPERSEDED, False)]


@ENTRIES
def test_a_completed_claim_is_not_reused_after_the_promotion(data, entry):
    """A retry of a promoted request is told so even where a recorded output could be
    reused: it stops at its first claim instead of building a turn that is a
    ``DUPLICATE``."""
    claims, worker = Claims(data), data.worker(entry)
    conv, key, token = new_id("conv"), new_id("idem"), uuid.uuid4().hex
    first = claims.claim(key, conv, attempt=1, token=token)
    assert first["state"] == "CLAIMED"
    done = claims.complete(key, conv, first["effect_id"], token)
    assert done.json()["state"] == "COMPLETED"
    promoted = make_turn(conversation_id=conv, idempotency_key=key, attempt=2)
    _promoted(worker, promoted)
    again = claims.claim(key, conv, attempt=3)
    assert (again["state"], again["existing_response_id"]) == ("PROMOTED",
                                                               promoted.response_id)


@ENTRIES
def test_a_refused_takeover_leaves_the_running_holder_its_completion(data, entry):
    """Attempt 1 holds the claim (``at_least_once``) and its tool runs past its lease;
    attempt 2's turn is promoted meanwhile. Attempt 3 would take the expired lease
    over: it is answered ``PROMOTED`` without writing, so attempt 1 still records what
    its run did (a first draft wrote the takeover, then refused it: attempt 1's
    completion was ``NOT_HOLDER`` and the run's outcome was never recorded)."""
    claims, worker = Claims(data), data.worker(entry)
    conv, key, token = new_id("conv"), new_id("idem"), uuid.uuid4().hex
    assert claims.claim(key, conv, attempt=1, token=token,
                        policy="at_least_once")["state"] == "CLAIMED"
    effect_id = effect_id_for_claim(key, 0, "send_email", 0)
    promoted = make_turn(conversation_id=conv, idempotency_key=key, attempt=2)
    worker.handle(promoted)
    claims.now_ms += 60_000
    taker = claims.claim(key, conv, attempt=3, policy="at_least_once")
    assert taker["state"] == "PROMOTED", taker
    done = claims.complete(key, conv, effect_id, token)
    assert (done.status_code, done.json()["state"]) == (200, "COMPLETED"), done.text


def test_a_promotion_landing_before_the_claims_mark_refuses_the_claim(data):
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


def test_a_claim_landing_before_the_batch_is_seen_by_the_promotion(data):
    """The other order: the claim is written and marked while the batch, decided
    without it, waits. The batch is refused (the mark moved), the turn decided again
    with the claim, which it does not use: published for compensation."""
    conv = new_id("conv")
    _claimed_while_the_batch_waits(data, make_turn(conversation_id=conv), conv)


@ENTRIES
def test_a_chains_first_request_retried_under_another_response_id(data, entry):
    """A chain's first response is its own partition; a retry under another response id
    claims with its own id as partition key, and still learns the promotion."""
    claims, worker = Claims(data), data.worker(entry)
    root = new_id("resp")
    first = _chain_first(root)
    _promoted(worker, first)
    retry_id = new_id("resp")
    answer = claims.claim(first.idempotency_key, retry_id, attempt=2, response_id=retry_id)
    assert (answer["state"], answer["existing_response_id"]) == ("PROMOTED", root)
    # Without its response id the API cannot tell a chain's first response from a
    # later turn of another chain (partition_key = its root), which is another request
    # under the same key: only that partition is looked at (attempt 2 wrote no claim).
    assert claims.claim(first.idempotency_key, retry_id, attempt=3)["state"] == "CLAIMED"


def test_the_same_key_in_another_chain_or_a_conversation_is_another_request(
        data, entry="handle"):
    """An idempotency key's scope is its partition: a chain's first request promoted
    under a key says nothing of a request of another chain or a Conversation that uses
    the same key. Their claims run (claims themselves are per tenant and key: the
    docs say so)."""
    claims, worker = Claims(data), data.worker(entry)
    root = new_id("resp")
    first = _chain_first(root)
    _promoted(worker, first)
    other_root, conv = new_id("resp"), new_id("conv")
    # a later turn of another chain (partition: its root), and a Conversation's turn
    later = claims.claim(first.idempotency_key, other_root, attempt=1,
                         response_id=new_id("resp"))
    assert later["state"] == "CLAIMED", later
    in_conversation = claims.claim(first.idempotency_key, conv, attempt=1,
                                   response_id=new_id("resp"))
    assert in_conversation["state"] == "IN_PROGRESS", in_conversation  # the same claim


def test_a_retrys_claim_before_a_chains_first_promotion_is_published_by_it(data):
    """A chain's first response: a retry under another response id claims (its own
    partition) before the first attempt holds the request, so the claim's marks miss
    the first attempt's partition, and its batch, asserting no mark, lands. The first
    attempt reads the request's facts again after its batch: the claim is published
    for compensation (it may have run), never left unnamed."""
    _claimed_while_the_batch_waits(data, _chain_first(new_id("resp")), new_id("resp"))


@ENTRIES
def test_a_promotion_landing_between_the_claim_and_its_second_mark(data, entry):
    """The first mark found nothing promoted; the batch lands right after the claim's
    write: the second mark learns it. The claim stays written (the promotion may have
    read it): it is answered ``PROMOTED`` all the same, and never run."""
    worker = data.worker(entry)
    conv = new_id("conv")
    t = make_turn(conversation_id=conv)
    claims = Claims(data, AfterClaim(data.ledger(), lambda: _promoted(worker, t)))
    answer = claims.claim(t.idempotency_key, conv, attempt=2)
    assert (answer["state"], answer["existing_response_id"]) == ("PROMOTED", t.response_id)
