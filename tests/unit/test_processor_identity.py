"""What the processor decides from an event's identity and order alone, before or
instead of pairing: ids and keys that no row could hold or no reader could find, the
ordering of a turn that does not extend the head it was validated against, and a
retry of a promoted request whatever its size. Found by an outside review (session
19); each test failed before its fix."""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import replace

import fastavro
import pytest

from ratchet.samples import (
    TENANT,
    make_tool_effect,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
    new_id,
)
from schemas import avsc
from schemas.items import function_call, function_call_output, message
from schemas.limits import MAX_EVENT_BYTES, MIB, TOPIC_MAX_MESSAGE_BYTES
from schemas.models import (
    CheckpointPromoted,
    DeadLetter,
    DeadLetterReason,
    OrphanReason,
    PromotionRejected,
    RejectionReason,
    TurnStatus,
)
from services.ledger.base import ResponseState
from streams.records import RawRecord
from streams.tail_cache import TailCache
from tests.unit.test_processor_rules import TOPICS, Harness, raw_record

R = RejectionReason


@pytest.fixture
def h() -> Harness:
    return Harness()


class Untouchable:
    """A store or ledger that fails the test on any use."""

    def __getattr__(self, name):
        raise AssertionError(f"{name} used for an event rejected on its identity")


def test_a_turn_with_an_id_no_row_can_hold_is_corrupt_with_nothing_written(h):
    h.rewire(store=Untouchable(), ledger=Untouchable())
    for turn in (make_turn(conversation_id=new_id("conv"), idempotency_key="k" * 70_000),
                 make_turn(conversation_id=new_id("conv"), event_id="e" * 201),
                 make_turn(conversation_id=new_id("conv"), tenant_id="")):
        rejected = h.outcome(turn)
        assert rejected.reason is R.CORRUPT, rejected.detail
        assert "does not match the API's id pattern" in rejected.detail


@pytest.mark.parametrize(("field", "kinds"), [
    ("idempotency_key", 2), ("event_id", 2), ("effect_id", 1), ("tenant_id", 2)])
def test_an_effect_or_cancel_with_an_id_no_row_can_hold_is_dead_lettered(h, field, kinds):
    turn = make_turn(conversation_id=new_id("conv"))
    effect = make_tool_effect("call_1", idempotency_key=turn.idempotency_key,
                              conversation_id=turn.conversation_id)
    cancel = make_turn_cancelled(turn)
    h.rewire(store=Untouchable(), ledger=Untouchable())
    events = [e for e in (effect, cancel) if field in type(e).model_fields]
    assert len(events) == kinds
    for event in events:
        bad = event.model_copy(update={field: "x" * 70_000})
        record = RawRecord(TOPICS.gateway_events, 0, 1, event.partition_key.encode(),
                           h.record(bad).value)
        [letter] = h.processor.handle(record).outbound
        assert isinstance(letter.model, DeadLetter)
        assert letter.model.reason is DeadLetterReason.INVALID_EVENT
        assert field in letter.model.error


def test_a_record_keyed_apart_from_its_partition_key_is_refused(h):
    turn = make_turn(conversation_id=new_id("conv"))
    for key in (b"someone-else", None):
        handled = h.processor.handle(RawRecord(TOPICS.gateway_events, 0, 1, key,
                                               h.record(turn).value))
        [rejected] = handled.outbound
        assert isinstance(rejected.model, PromotionRejected)
        assert rejected.model.reason is R.CORRUPT and "Kafka key" in rejected.model.detail
        assert rejected.key == turn.conversation_id.encode()
    cancel = make_turn_cancelled(turn)
    handled = h.processor.handle(RawRecord(TOPICS.gateway_events, 0, 2, b"someone-else",
                                           h.record(cancel).value))
    assert [o.model.reason for o in handled.outbound] == [DeadLetterReason.INVALID_EVENT]
    # nothing was recorded: the turn, keyed right, promotes
    assert isinstance(h.outcome(turn), CheckpointPromoted)


def test_a_first_response_naming_another_chain_root_is_corrupt(h):
    root = make_turn(conversation_id=None, expected_head_seq=None, response_id=new_id("resp"),
                     chain_root_id="resp_elsewhere")
    rejected = h.outcome(root)
    assert rejected.reason is R.CORRUPT and "chain_root_id" in rejected.detail
    # its own id as root is the same partition as none at all
    same = root.model_copy(update={"chain_root_id": root.response_id, "event_id": new_id("e")})
    assert isinstance(h.outcome(same), CheckpointPromoted)


@pytest.mark.parametrize("attempt", [0, -7])
def test_an_attempt_below_1_is_corrupt(h, attempt):
    rejected = h.outcome(make_turn(conversation_id=new_id("conv"), attempt=attempt))
    assert rejected.reason is R.CORRUPT and "attempt" in rejected.detail


def _open_call(conv: str):
    return make_turn(conversation_id=conv, certified=False,
                     items=[function_call("c1", "get_weather", {"city": "Paris"},
                                          item_id=new_id("fc"))])


def _answer(conv: str, head: int):
    """Answers call c1, which turn 1 left open: valid on top of head 1 only."""
    return make_turn(conversation_id=conv, expected_head_seq=head, certified=False,
                     input_items=[function_call_output("c1", "sunny", item_id=new_id("fco"))],
                     items=[message("ok", role="assistant", item_id=new_id("m"))])


def test_a_turn_that_lost_the_race_is_conflict_not_a_pairing_failure(h):
    conv = new_id("conv")
    assert h.outcome(_open_call(conv)).seq == 1
    winner, loser = _answer(conv, 1), _answer(conv, 1)  # both from head 1
    assert h.outcome(winner).seq == 2
    h.rewire(tails=TailCache(capacity=0))  # decided from a read of the head
    rejected = h.outcome(loser)
    assert (rejected.reason, rejected.head_seq) == (R.CONFLICT, 2), rejected.detail


def test_a_turn_ahead_of_the_head_is_out_of_order_not_a_pairing_failure(h):
    conv = new_id("conv")
    assert h.outcome(make_turn(conversation_id=conv)).seq == 1
    rejected = h.outcome(_answer(conv, 2))  # turn 2, which opened c1, never came
    assert (rejected.reason, rejected.head_seq) == (R.OUT_OF_ORDER, 1), rejected.detail
    ahead_of_nothing = h.outcome(_answer(new_id("conv"), 3))
    assert (ahead_of_nothing.reason, ahead_of_nothing.head_seq) == (R.OUT_OF_ORDER, 0)


def test_a_chain_turn_whose_parent_is_missing_is_parent_not_promoted(h):
    root = new_id("resp")
    turn = make_turn(conversation_id=None, expected_head_seq=None, chain_root_id=root,
                     previous_response_id=root, certified=False,
                     input_items=[function_call_output("c1", "sunny", item_id=new_id("fco"))],
                     items=[message("ok", role="assistant", item_id=new_id("m"))])
    assert h.outcome(turn).reason is R.PARENT_NOT_PROMOTED


def test_an_oversized_retry_of_a_promoted_request_gets_the_promotion(h):
    first = make_turn(conversation_id=new_id("conv"))
    assert h.outcome(first).seq == 1
    big = (message("x" * (MAX_EVENT_BYTES + 10), role="assistant", item_id=new_id("m")),)
    retry = first.model_copy(update={"attempt": 2, "event_id": new_id("e"),
                                     "output_items": big})
    answered = h.outcome(retry)
    assert isinstance(answered, CheckpointPromoted)
    assert (answered.seq, answered.attempt) == (1, 1)
    # no rejection recorded for it (the store's checkpoint is a promotion's status)
    assert h.ledger.status(TENANT, first.response_id).status is ResponseState.UNKNOWN


def test_a_chain_turn_naming_a_head_is_corrupt(h):
    rejected = h.outcome(make_turn(conversation_id=None, expected_head_seq=3))
    assert rejected.reason is R.CORRUPT and "expected_head_seq" in rejected.detail


@pytest.mark.parametrize("digest", ["", "F" * 64, "e" * 63, "not-a-digest"])
def test_a_request_digest_that_is_not_a_sha256_is_corrupt(h, digest):
    rejected = h.outcome(make_turn(conversation_id=new_id("conv"), request_digest=digest))
    assert rejected.reason is R.CORRUPT and "request_digest" in rejected.detail


def test_an_item_without_an_id_is_corrupt(h):
    rejected = h.outcome(make_turn(
        conversation_id=new_id("conv"), items=[message("hi", role="assistant", item_id="")]))
    assert rejected.reason is R.CORRUPT and "item_id" in rejected.detail


def test_an_effect_above_the_size_limit_is_dead_lettered(h):
    turn = make_turn(conversation_id=new_id("conv"))
    effect = make_tool_effect("call_1", '{"text": "%s"}' % ("x" * MAX_EVENT_BYTES),
                              idempotency_key=turn.idempotency_key,
                              conversation_id=turn.conversation_id)
    h.rewire(store=Untouchable(), ledger=Untouchable())
    [letter] = h.processor.handle(h.record(effect)).outbound
    assert letter.model.reason is DeadLetterReason.INVALID_EVENT
    assert "protocol maximum" in letter.model.error


class HeaderedPickleCodec:
    """Records as a gateway writes them: the Confluent header (magic byte 0, a 4-byte
    schema id), then the event (pickled here)."""

    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def decode(self, record):
        return pickle.loads(record.value[5:])


class Broken:
    def __getattr__(self, name):
        raise RuntimeError("a bug met by this record")


@pytest.mark.parametrize("why", ["invalid event", "processing failed"])
def test_a_dead_letter_raised_after_decoding_names_the_writer_schema(h, why):
    """A record dead-lettered after it decoded (INVALID_EVENT, or UNKNOWN for a bug)
    names its header's schema id, like one that failed to decode."""
    cancel = make_turn_cancelled(make_turn(conversation_id=new_id("conv")))
    key = b"someone-else" if why == "invalid event" else cancel.partition_key.encode()
    h.rewire(codec=HeaderedPickleCodec(h.processor.codec),
             ledger=Broken() if why == "processing failed" else None)
    value = b"\x00" + (4242).to_bytes(4, "big") + pickle.dumps(cancel)
    [letter] = h.processor.handle(RawRecord(TOPICS.gateway_events, 0, 1, key, value)).outbound
    assert isinstance(letter.model, DeadLetter)
    assert letter.model.reason is (DeadLetterReason.INVALID_EVENT if why == "invalid event"
                                   else DeadLetterReason.UNKNOWN)
    assert letter.model.schema_id == 4242


@pytest.mark.parametrize("digest", ["", "A" * 64, "0" * 63])
@pytest.mark.parametrize("status", [TurnStatus.COMPLETED, TurnStatus.FAILED])
def test_a_turn_whose_request_digest_is_not_a_digest_binds_nothing(h, digest, status):
    """Rejected CORRUPT before the response id is claimed (the claim binds the id to
    the digest), recorded, with the attempt's effects orphaned: the gateway's
    corrected retry under the same response id promotes. A turn that could never
    promote anyway is NOT_PROMOTABLE_STATUS first (gateway-protocol section 7)."""
    good, effects = make_tool_loop_turn(rounds=1, conversation_id=new_id("conv"))
    h.feed(*effects)
    bad = good.model_copy(update={"request_digest": digest, "event_id": new_id("e"),
                                  "status": status})
    handled = h.processor.handle(raw_record(bad))
    rejected = handled.outbound[0].model
    orphans = [(o.model.effect_id, o.model.reason) for o in handled.outbound[1:]]
    if status is TurnStatus.COMPLETED:
        assert rejected.reason is R.CORRUPT and "request_digest" in rejected.detail
        assert orphans == [(e.effect_id, OrphanReason.TURN_REJECTED) for e in effects]
        assert h.ledger.status(TENANT, bad.response_id).status is ResponseState.REJECTED
    else:
        assert rejected.reason is R.NOT_PROMOTABLE_STATUS
        assert orphans == [(e.effect_id, OrphanReason.TURN_NOT_PROMOTABLE) for e in effects]
    assert isinstance(h.outcome(good), CheckpointPromoted)


def test_the_partition_key_rule_is_applied_as_written_never_corrected(h):
    """gateway-protocol section 1: a continued chain turn naming another chain root is
    looked for in that root's partition (PARENT_NOT_PROMOTED); a Conversation turn
    with a stray chain_root_id is keyed by its conversation_id alone."""
    root = make_turn(conversation_id=None, expected_head_seq=None, response_id=new_id("resp"))
    assert isinstance(h.outcome(root), CheckpointPromoted)
    child = make_turn(conversation_id=None, expected_head_seq=None,
                      previous_response_id=root.response_id, chain_root_id="resp_elsewhere")
    rejected = h.outcome(child)
    assert rejected.reason is R.PARENT_NOT_PROMOTED, rejected
    stray = make_turn(conversation_id=new_id("conv"), chain_root_id=root.response_id)
    promoted = h.outcome(stray)
    assert isinstance(promoted, CheckpointPromoted)
    assert promoted.partition_key == stray.conversation_id


def _damage_first_item(store, tenant: str, key: str, response_id: str) -> None:
    """The first stored item of ``response_id`` no longer matches its digest (as a
    direct write to the store would leave it)."""
    partition = store._partitions[(tenant, key)]
    stored = partition.items[response_id]
    partition.items[response_id] = replace(stored, contents=(b'{"x":1}', *stored.contents[1:]))


def test_a_turn_is_never_promoted_on_top_of_a_history_that_cannot_be_read(h):
    """Pairing could not be checked and the history could never be served: the turn
    is rejected CORRUPT (ordering first: a stale head is still CONFLICT), and nothing
    is written on top of the damage."""
    conv = new_id("conv")
    first = make_turn(conversation_id=conv)
    assert isinstance(h.outcome(first), CheckpointPromoted)
    _damage_first_item(h.store, TENANT, conv, first.response_id)
    h.rewire(tails=TailCache(capacity=0))  # a worker that must read the lineage
    stale = make_turn(conversation_id=conv, expected_head_seq=0)
    assert h.outcome(stale).reason is R.CONFLICT
    nxt = make_turn(conversation_id=conv, expected_head_seq=1)
    rejected = h.outcome(nxt)
    assert rejected.reason is R.CORRUPT and "CORRUPT_HISTORY" in rejected.detail, rejected
    assert h.store.head(TENANT, conv).seq == 1
    # a chain whose parent's history is damaged: the same
    root = make_turn(conversation_id=None, expected_head_seq=None, response_id=new_id("resp"))
    assert isinstance(h.outcome(root), CheckpointPromoted)
    _damage_first_item(h.store, TENANT, root.response_id, root.response_id)
    child = make_turn(conversation_id=None, expected_head_seq=None,
                      previous_response_id=root.response_id, chain_root_id=root.response_id)
    assert h.outcome(child).reason is R.CORRUPT


# A chain's first response whose ``response_id`` is ~4.8 MiB of id characters (an
# outside red team of session 26's own fixes; failed before its fix) is a legal-size
# event, rejected ``CORRUPT`` (the id is outside the API's pattern); its rejection
# repeated the id up to four times (three fields and the record's key): a 20 MB
# record for a 16 MiB topic, refused by the broker, retried for ever, the partition
# stopped. A turn whose ids and request digest hold more than ``MAX_QUOTED_CHARS``
# (1 MiB) together is now dead-lettered ``INVALID_EVENT`` (the record is kept).
def _avro_size(model, record: str) -> int:
    schema = fastavro.parse_schema(json.loads(avsc.schema_text(record)))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, model.to_avro())
    return 5 + len(buf.getvalue())


def test_an_event_whose_ids_no_record_could_carry_is_parked_not_rejected():
    rid = "resp_" + "a" * int(4.8 * MIB)
    t = make_turn(conversation_id=None, chain_root_id=rid, response_id=rid,
                  previous_response_id=None, expected_head_seq=None)
    assert _avro_size(t, "TurnCompleted") <= MAX_EVENT_BYTES  # a legal-size event
    (out,) = Harness().processor.handle(raw_record(t)).outbound
    assert out.topic == TOPICS.dead_letters
    assert out.model.reason is DeadLetterReason.INVALID_EVENT
    assert "response_id of" in out.model.error
    assert len(out.key or b"") + _avro_size(out.model, "DeadLetter") <= 2 * TOPIC_MAX_MESSAGE_BYTES


def test_an_id_just_outside_the_pattern_is_still_rejected_corrupt():
    rid = "resp_" + "a" * 300  # beyond the 200 of the pattern, quotable
    t = make_turn(conversation_id=None, chain_root_id=rid, response_id=rid,
                  previous_response_id=None, expected_head_seq=None)
    rejected = Harness().outcome(t)
    assert isinstance(rejected, PromotionRejected)
    assert rejected.reason is RejectionReason.CORRUPT
