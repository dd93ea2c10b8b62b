"""A chain's first response filed under another partition key than its own response id,
end to end through the processor (an outside review of session 49's store rule, rrevj).

Session 49 made the store refuse to write such a root (``validate_request``) and read
one, as a chain turn's parent, as a Conversation's first turn whose ``mode`` cell was
damaged (``_may_be_a_chain_row``: ``CorruptPartition``). Checked here:

- a gateway cannot make one: the processor rejects a first response naming another
  ``chain_root_id`` ``CORRUPT`` before the store (``schemas/keys.py`` ``root_problem``),
  nothing written, the same answer again on a redelivery;
- a chain whose root was filed so before the processor refused it (2026-12-03: its
  gateway sent the chain's partition as ``chain_root_id`` on the first response, and
  kept sending it on the children) stays what the reads say it is, a verified chain,
  and takes a new turn on its root as on any other turn. Session 49 answered the fork on
  the root ``CORRUPT`` ("is a Conversation's") while the reads served the root and a
  turn on the root's child was promoted. A root off its key is now read as damage only
  where the view shows a Conversation in the partition (a head or its marker).

Both backends (Cassandra: a keyspace of its own), both entries, warm and cold workers.
"""

from __future__ import annotations

import pytest

from ratchet.domain.history import HistoryFailure, HistoryFailureReason, VerifiedHistory
from ratchet.samples import make_turn, new_id
from schemas.models import CheckpointPromoted, PromotionRejected
from schemas.models import RejectionReason as R
from tests.contract.test_processor_handover import ENTRIES
from tests.unit.test_processor_rules import TENANT

COLD = pytest.mark.parametrize("cold", [False, True], ids=["warm", "cold"])


def _chain(response_id: str, root: str, previous: str | None = None):
    return make_turn(conversation_id=None, expected_head_seq=None, response_id=response_id,
                     chain_root_id=root, previous_response_id=previous)


@ENTRIES
@COLD
def test_a_gateways_first_response_under_another_root_is_corrupt_and_unwritten(
        data, entry, cold):
    """CONTRACT section 2: a chain's first response is its own partition key. A gateway
    naming another root gets a typed ``CORRUPT`` (not a dead letter), before any write:
    no checkpoint under either key, no history, and a redelivery answers alike."""
    worker = data.worker(entry)
    other = new_id("resp")
    assert isinstance(worker.outcome(_chain(other, other)), CheckpointPromoted)  # a real root
    misfiled = _chain(new_id("resp"), other)
    for attempt in range(2):  # the event, then its redelivery
        answering = data.worker(entry) if cold and attempt else worker
        out = answering.outcome(misfiled)
        assert isinstance(out, PromotionRejected), out
        assert out.reason is R.CORRUPT and "chain_root_id" in out.detail, out
    store = data.store()
    assert store.get_checkpoint(TENANT, misfiled.response_id) is None
    failure = store.read_history(TENANT, response_id=misfiled.response_id)
    assert isinstance(failure, HistoryFailure), failure
    assert failure.reason is HistoryFailureReason.NOT_FOUND, failure


@pytest.fixture
def before_the_root_rule(monkeypatch):
    """The processor and store as they were before 2026-12-03: no ``root_problem`` check,
    and no refusal of a root under another key in the write (session 49)."""
    import ratchet.domain.validation as validation
    import services.store.promotion as promotion
    import streams.identity_checks as identity_checks
    from services.store.request_checks import validate_request

    def undo() -> None:
        monkeypatch.undo()

    monkeypatch.setattr(identity_checks, "root_problem", lambda event: None)
    monkeypatch.setattr(validation, "root_problem", lambda event: None)
    monkeypatch.setattr(promotion, "validate_request",
                        lambda request: validate_request(request, written=False))
    return undo


@ENTRIES
@COLD
def test_a_chain_rooted_off_its_key_before_the_rule_is_served_and_continued(
        data, entry, cold, before_the_root_rule):
    """Old data: a root filed under its gateway's ``chain_root_id``. The reads verify it
    (one chain, links and lineage digests agreeing); a new turn on it, by the worker that
    promoted it or a cold one, is promoted at seq 2 and the lineage read back verified,
    as before session 49 (then ``CORRUPT``: the root taken for a damaged Conversation
    row, though no Conversation is in the partition)."""
    partition, root = new_id("resp"), new_id("resp")
    old = data.worker(entry)
    assert old.outcome(_chain(root, partition)).seq == 1
    before_the_root_rule()  # the upgrade: today's processor and store from here on
    store = data.store()
    served = store.read_history(TENANT, response_id=root)
    assert isinstance(served, VerifiedHistory) and served.checkpoint.seq == 1, served
    worker = data.worker(entry) if cold else old
    fork = _chain(new_id("resp"), partition, root)
    out = worker.outcome(fork)
    assert isinstance(out, CheckpointPromoted) and out.seq == 2, out
    on_fork = _chain(new_id("resp"), partition, fork.response_id)
    assert worker.outcome(on_fork).seq == 3
    history = data.store().read_history(TENANT, response_id=on_fork.response_id)
    assert isinstance(history, VerifiedHistory) and history.checkpoint.seq == 3, history


def test_the_api_serves_a_chain_rooted_off_its_key_as_one_at_its_key(before_the_root_rule):
    """The rehydration API over such old data (memory store): the root, and a turn
    written on it after the upgrade, answer as the same chain written at its own key
    does (200, the same fallback, the complete history); ``/status`` says promoted."""
    from tests.contract.store_support import chain_turn
    from tests.unit.test_api_http import Stack

    stack = Stack()
    answers = {}
    for name, partition in (("off", new_id("resp")), ("at", None)):
        root = new_id("resp")
        first = chain_turn(TENANT, partition or root, root, None)
        assert type(stack.store.promote(first)).__name__ == "Promoted"
        if name == "off":
            before_the_root_rule()  # the upgrade
        child = chain_turn(TENANT, partition or root, new_id("resp"), root)
        assert type(stack.store.promote(child)).__name__ == "Promoted", name
        got = []
        for request in (first, child):
            response = stack.history(TENANT, request.response_id, fp="0" * 64)
            body = response.json()
            status = stack.client.get(f"/v1/responses/{request.response_id}/status",
                                      params={"tenant_id": TENANT}).json()
            got.append((response.status_code, body["outcome"], body.get("reason"),
                        body["head_seq"], len(body["items"]), status["state"]))
        answers[name] = got
    assert answers["off"] == answers["at"], answers
    # The turns carry no boundary proof: a NO_ARTIFACT fallback, the complete history.
    assert answers["at"] == [(200, "fallback", "NO_ARTIFACT", 1, 2, "promoted"),
                             (200, "fallback", "NO_ARTIFACT", 2, 4, "promoted")]
