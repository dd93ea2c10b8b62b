"""Retries answered as the store would, and one outcome per event, where session 21's
outside review found the processor wrong: a retry answered with another attempt's
promotion while another worker rejected the same event; a retry under another response
id of a turn that answered a call (pairing checked against the head it is now); a key
reused under the same response id on a history that cannot be read. In-memory
backends, both entry points; each test failed before its fix."""

from __future__ import annotations

import uuid

import pytest

from ratchet.samples import TENANT, canonical_digest, make_tool_loop_turn, make_turn, new_id
from schemas.items import function_call, function_call_output, message
from schemas.limits import MAX_EVENT_BYTES
from schemas.models import CheckpointPromoted, PromotionRejected
from schemas.models import RejectionReason as R
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.test_processor_races import Worker, uid
from tests.unit.test_processor_identity import _damage_first_item

ENTRIES = pytest.mark.parametrize("entry", ["handle", "handle_async"])


# CONTRACT 4 / gateway-protocol 7: "Every outcome is published only after it is durable";
# an outcome never flips (docs/decisions.md session 20: "only a promotion of this attempt
# (accepted_attempt) settles a rejection as promoted ... another attempt's promotion does
# not count: this rejection was decided first"). One event, one outcome, on any worker.
#
# ``EarlyRejections.reject_before_the_store`` (too large / malformed digest / unkeyed)
# reads the event's decision, then, if there is none, answers with
# ``VerdictRecorder.already_promoted`` -- a promotion of ANY attempt -- without
# recording anything or checking that no rejection of this very event was recorded
# meanwhile. Two workers on one partition (a rebalance): the old
# owner reads E_big's facts (attempt 2, above the size limit: no decision yet) and
# pauses; the new owner rejects E_big UNSUPPORTED_FORMAT (recorded, published), then
# promotes the next record, attempt 1 of the same request under the same response id
# (attempt 1 finished later: Kafka order E_big, E1). The old owner resumes, finds the
# attempt-1 promotion and publishes E_big as CheckpointPromoted. E_big is published
# rejected by one worker and promoted by the other; the settle step the session-20 fix
# added (record the decision first, count only this attempt) is bypassed on this path.

class AfterFacts:
    """A ledger that runs ``after`` once, right after its next ``turn_facts`` answer."""

    def __init__(self, ledger) -> None:
        self._ledger, self.after = ledger, None

    def __getattr__(self, name):
        return getattr(self._ledger, name)

    def turn_facts(self, **kw):
        facts = self._ledger.turn_facts(**kw)
        if self.after is not None:
            act, self.after = self.after, None
            act()
        return facts


@ENTRIES
def test_a_too_large_retry_is_never_published_both_rejected_and_promoted(entry):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    old_ledger = AfterFacts(ledger)
    old = Worker(store, old_ledger, entry)
    new = Worker(store, ledger)  # thread path: it runs inside the old owner's call
    conv, resp, key = uid("conv"), uid("resp"), uid("idem")
    e1 = make_turn(conversation_id=conv, expected_head_seq=0, response_id=resp,
                   idempotency_key=key)
    big = message("x" * (MAX_EVENT_BYTES + 10), role="assistant", item_id=new_id("msg"))
    e_big = make_turn((big,), conversation_id=conv, expected_head_seq=0, response_id=resp,
                      idempotency_key=key, attempt=2)
    assert e_big.request_digest == e1.request_digest
    published = {}

    def the_new_owner_runs():
        published["new"] = new.outcome(e_big)
        assert isinstance(new.outcome(e1), CheckpointPromoted)
    old_ledger.after = the_new_owner_runs
    published["old"] = old.outcome(e_big)
    assert isinstance(published["new"], PromotionRejected)
    assert published["new"].reason is R.UNSUPPORTED_FORMAT
    assert type(published["old"]) is type(published["new"]), (
        f"E_big published {type(published['new']).__name__} by the new owner and "
        f"{type(published['old']).__name__} by the old one")


# CONTRACT 4: "Same idempotency_key + same request_digest already promoted -> ...
# another response_id: DUPLICATE, naming the original response. Same key, different
# digest -> IDEMPOTENCY_KEY_REUSED." CONTRACT 5 / gateway-protocol 8: the status of a
# DUPLICATE names the original "so a retried request can answer with the original
# response".
#
# A Conversation turn that answers a client function call of the previous head (its
# input is the ``function_call_output``) is promoted. The gateway lost the answer and
# retries the SAME request (same key, same digest, same expected_head_seq) under a new
# response id. Without a tool call, the retry is DUPLICATE naming the original. With the
# call answered, the processor validates the retry's pairing against the CURRENT head
# (the original turn itself, where the call is already answered): UNPAIRED_TOOL_CALL,
# which ``StoreAnswers.out_of_lineage`` turns into ordering: CONFLICT "expected head 1, head is 2",
# no existing_response_id. The session-20 fix put DUPLICATE/KEY_REUSED before ordering
# only on the unreadable-lineage path (``StoreAnswers.on_unreadable_lineage``), not here.
# Same for a key reused with another digest (CONFLICT instead of IDEMPOTENCY_KEY_REUSED).

def _promoted_answer(worker):
    conv = uid("conv")
    asks = make_turn([function_call("call_c1", "lookup", {"q": 1}, item_id=new_id("fc"))],
                     conversation_id=conv, expected_head_seq=0)
    assert isinstance(worker.outcome(asks), CheckpointPromoted)
    answer = make_turn([message("done", role="assistant", item_id=new_id("msg"))],
                       input_items=[function_call_output("call_c1", "42", item_id=new_id("fco"))],
                       conversation_id=conv, expected_head_seq=1)
    assert isinstance(worker.outcome(answer), CheckpointPromoted)
    return answer


@ENTRIES
def test_a_retry_under_another_id_of_a_turn_answering_a_call_is_duplicate(entry):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    original = _promoted_answer(worker)
    retry = original.model_copy(update={"event_id": str(uuid.uuid4()),
                                        "response_id": uid("resp"), "attempt": 2})
    out = Worker(store, ledger, entry).outcome(retry)
    assert isinstance(out, PromotionRejected)
    assert (out.reason, out.existing_response_id) == (R.DUPLICATE, original.response_id), (
        out.reason, out.detail)


@ENTRIES
def test_a_key_reused_by_a_turn_answering_a_call_is_idempotency_key_reused(entry):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    original = _promoted_answer(worker)
    reused = original.model_copy(update={
        "event_id": str(uuid.uuid4()), "response_id": uid("resp"),
        "request_digest": canonical_digest(["another request", uid("x")])})
    out = Worker(store, ledger, entry).outcome(reused)
    assert isinstance(out, PromotionRejected)
    assert out.reason is R.IDEMPOTENCY_KEY_REUSED, (out.reason, out.detail)


# CONTRACT 4: "Same key, different digest -> IDEMPOTENCY_KEY_REUSED".
# ``StoreAnswers.on_unreadable_lineage`` (streams/store_answers.py; session 20 fix): "As
# the store would answer, a retry of a request promoted ... (DUPLICATE /
# IDEMPOTENCY_KEY_REUSED) first ... Under the same id, 'already promoted' follows";
# gateway-protocol 7: IDEMPOTENCY_KEY_REUSED decides before CONFLICT "for the same key
# with another digest once that key is promoted".
#
# A request promoted under response R; then a turn with the same key and the same
# response id R but ANOTHER request digest. On a readable lineage the processor answers
# IDEMPOTENCY_KEY_REUSED (checked below). Once the lineage it extends cannot be read,
# the "another response id" test in ``StoreAnswers.on_unreadable_lineage`` skips it (same
# id), and "already promoted" does not follow either (``VerdictRecorder.already_promoted``
# needs the same digest): chain mode answers CORRUPT, Conversation mode CONFLICT. The
# answer to a key reuse depends on whether unrelated rows are damaged.

@ENTRIES
@pytest.mark.parametrize("mode", ["conversation", "chain"])
@pytest.mark.parametrize("damaged", [False, True], ids=["readable", "unreadable"])
def test_a_reused_key_under_the_same_response_id_is_key_reused(entry, mode, damaged):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    if mode == "conversation":
        conv = uid("conv")
        first = make_turn(conversation_id=conv, expected_head_seq=0)
        assert isinstance(worker.outcome(first), CheckpointPromoted)
        original = make_turn(conversation_id=conv, expected_head_seq=1)
        key, damage = conv, first.response_id
    else:
        root = make_turn(conversation_id=None, expected_head_seq=None)
        assert isinstance(worker.outcome(root), CheckpointPromoted)
        original = make_turn(conversation_id=None, expected_head_seq=None,
                             chain_root_id=root.response_id,
                             previous_response_id=root.response_id)
        key, damage = root.response_id, root.response_id
    assert isinstance(worker.outcome(original), CheckpointPromoted)
    if damaged:
        _damage_first_item(store, TENANT, key, damage)
    reused = original.model_copy(update={
        "event_id": str(uuid.uuid4()), "attempt": 2,
        "request_digest": canonical_digest(["another request", uid("x")])})
    out = Worker(store, ledger, entry).outcome(reused)  # nothing cached
    assert isinstance(out, PromotionRejected)
    assert out.reason is R.IDEMPOTENCY_KEY_REUSED, (out.reason, out.detail)


# An outside review, session 36: a retry of a promoted request under the SAME response
# id with ANOTHER digest (a key reuse), sent on the history that holds the original
# (its expected head is the original's seq, or its chain parent is a later turn): the
# calls the original made are "not unique" there, so pairing failed and
# UNPAIRED_TOOL_CALL stood, where a message-only turn, or the same retry under another
# response id, is IDEMPOTENCY_KEY_REUSED (CONTRACT 4: "Same key, different digest").
# ``StoreAnswers.retry_unpaired_by_its_original`` skipped every retry under the original's own id;
# only one with the original's digest is not a key reuse (it is replayed).

@ENTRIES
@pytest.mark.parametrize("mode", ["conversation", "chain"])
def test_a_reused_key_under_its_own_id_on_the_original_history_is_key_reused(entry, mode):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    worker = Worker(store, ledger, entry)
    where = (dict(conversation_id=uid("conv"), expected_head_seq=0) if mode == "conversation"
             else dict(conversation_id=None, expected_head_seq=None))
    original, effects = make_tool_loop_turn(rounds=2, **where)
    worker.feed(*effects)
    assert isinstance(worker.outcome(original), CheckpointPromoted)
    retry = {"event_id": str(uuid.uuid4()), "attempt": 2,
             "request_digest": canonical_digest(["another request", uid("x")])}
    if mode == "conversation":
        retry["expected_head_seq"] = 1  # the head: the original itself
    else:  # a child of the original, then the retry continuing it
        child = make_turn(conversation_id=None, expected_head_seq=None,
                          chain_root_id=original.response_id,
                          previous_response_id=original.response_id)
        assert isinstance(worker.outcome(child), CheckpointPromoted)
        retry.update(chain_root_id=original.response_id, previous_response_id=child.response_id)
    for reader in (worker, Worker(store, ledger, entry)):  # the tail cached, and not
        out = reader.outcome(original.model_copy(update=retry))
        assert isinstance(out, PromotionRejected)
        assert (out.reason, out.existing_response_id) == (
            R.IDEMPOTENCY_KEY_REUSED, original.response_id), (out.reason, out.detail)


# A retry of a promoted request whose OWN items break the pairing rules (a
# ``function_call_output`` answering no call: nothing to do with a moved head) is
# answered DUPLICATE (``StoreAnswers.out_of_lineage`` ->
# ``StoreAnswers._retry_of_promoted_request``) instead of UNPAIRED_TOOL_CALL.
#
# docs/gateway-protocol.md section 7: "a TurnCompleted is checked (first failure wins):
# ... then the event itself: NOT_PROMOTABLE_STATUS, ..., CORRUPT, INCOMPLETE_FINGERPRINT,
# UNPAIRED_TOOL_CALL (continuing the stored history), INVALID_BOUNDARY_PROOF; then tool
# effects ...; then the conditional write (CONFLICT, ..., DUPLICATE,
# IDEMPOTENCY_KEY_REUSED)". CONTRACT 4 ("Pairing ... each function_call_output follows
# its function_call"). The new shortcut is meant for "a retry that never reaches the store
# (pairing against a moved head)"; a chain turn's lineage (its parent, or none for a
# chain's first response) never moves, so its pairing failure is the event's own, and the
# same broken retry with a CORRUPT item instead gets CORRUPT (the event's own reason):
# the reason depends on which intrinsic rule the retry breaks. A DUPLICATE also tells the
# gateway to answer with the original response, and orphans differently
# (ATTEMPT_SUPERSEDED for all vs TURN_REJECTED for the attempt's).

def _broken_items():
    return (message("here", role="assistant", item_id=new_id("msg")),
            function_call_output("call_nowhere", "42", item_id=new_id("fco")))


@pytest.mark.parametrize("entry", ["handle", "handle_async"])
@pytest.mark.parametrize("mode", ["first_of_chain", "continued_chain"])
def test_an_intrinsically_unpaired_retry_is_unpaired_tool_call(entry, mode):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    w = Worker(store, ledger, entry)
    where = dict(conversation_id=None, expected_head_seq=None)
    if mode == "continued_chain":
        root = make_turn(chain_root_id=None, **where)
        assert isinstance(w.outcome(root), CheckpointPromoted)
        where.update(chain_root_id=root.response_id, previous_response_id=root.response_id)
    original = make_turn(idempotency_key=uid("idem"), **where)
    assert isinstance(w.outcome(original), CheckpointPromoted)
    # Sanity: a request never promoted, with the same broken items, is UNPAIRED_TOOL_CALL.
    fresh = make_turn(_broken_items(), idempotency_key=uid("idem"), **where)
    assert w.outcome(fresh).reason is R.UNPAIRED_TOOL_CALL
    retry = make_turn(_broken_items(), idempotency_key=original.idempotency_key,
                      request_digest=original.request_digest, attempt=2,
                      response_id=uid("resp"), **where)
    out = Worker(store, ledger, entry).outcome(retry)
    assert isinstance(out, PromotionRejected)
    assert out.reason is R.UNPAIRED_TOOL_CALL, (out.reason, out.detail)
