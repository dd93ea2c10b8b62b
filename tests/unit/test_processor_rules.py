"""The promotion rules (CONTRACT section 4), driven through the processor core with the
in-memory store and ledger: no Kafka, no Cassandra, no registry.

Records are pickled models (a stand-in codec); the real Avro codec is exercised by the
integration tests.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import uuid
from datetime import UTC, datetime, timedelta

import fastavro
import pytest

from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.domain.plan import ResponseClaim
from ratchet.domain.promotion import (
    Accepted,
    Facts,
    Reject,
    ValidationVerdict,
    decide_turn,
    orphaned_effects,
    promotion_request,
)
from ratchet.samples import (
    HOUR_MS,
    NOW_MS,
    TENANT,
    make_tool_effect,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
    new_id,
    tampered,
)
from schemas import avsc
from schemas.canonical import sha256_hex
from schemas.errors import Unavailable
from schemas.items import (
    arguments_digest,
    function_call,
    function_call_output,
    make_item,
    message,
)
from schemas.keys import MissingChainRoot, partition_key
from schemas.limits import MAX_EVENT_BYTES
from schemas.models import (
    Certification,
    CheckpointPromoted,
    DeadLetterReason,
    EffectiveConfig,
    Item,
    OrphanReason,
    RejectionReason,
    TurnStatus,
)
from services.ledger.base import LedgerUnavailable, ResponseState
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions, turn_size
from services.store.memory import MemoryCheckpointStore
from streams.outcomes import recorded_effect
from streams.processor import PromotionProcessor
from streams.records import DecodeFailed, RawRecord
from streams.topics import Topics

R = RejectionReason
TOPICS = Topics.with_prefix("t.")


class PickleCodec:
    """Stand-in codec: records carry pickled models; anything else is undecodable."""

    def decode(self, record: RawRecord):
        try:
            return pickle.loads(record.value)
        except Exception as exc:
            raise DecodeFailed(DeadLetterReason.BAD_MAGIC_BYTE, f"not a pickle: {exc}") from exc

    def encode(self, topic, model):
        return pickle.dumps(model)

    def decodes_offline(self, record):
        return True

    def encodes_offline(self, model):
        return True


def kafka_key(event) -> bytes:
    """The Kafka key a gateway gives ``event``: its partition key (CONTRACT 2; the
    processor refuses another). A continued chain without its root has none: any."""
    try:
        key = getattr(event, "partition_key", None)
        return (key if isinstance(key, str) else partition_key(event)).encode()
    except (MissingChainRoot, AttributeError):
        return b"unkeyed"


def raw_record(event, offset: int = 1, partition: int = 0) -> RawRecord:
    """``event`` pickled as the gateway-events record the processor consumes."""
    return RawRecord(TOPICS.gateway_events, partition, offset, kafka_key(event),
                     pickle.dumps(event))


class Harness:
    def __init__(self) -> None:
        self.store = MemoryCheckpointStore(StoreOptions())
        self.ledger = MemoryLedger()
        self.processor = PromotionProcessor(self.store, self.ledger, PickleCodec(), TOPICS,
                                            clock_ms=lambda: NOW_MS)
        self.offset = 0

    def rewire(self, *, store=None, ledger=None, tails=None, codec=None) -> None:
        """A new processor (the same codec and clock unless given) on other
        collaborators: a store or ledger that fails on use, a cold tail cache."""
        old = self.processor
        self.processor = PromotionProcessor(
            self.store if store is None else store, self.ledger if ledger is None else ledger,
            old.codec if codec is None else codec, TOPICS,
            clock_ms=old.clock_ms, tails=tails)

    def record(self, event) -> RawRecord:
        self.offset += 1
        return raw_record(event, self.offset)

    def feed(self, *events):
        return [self.processor.handle(self.record(e)) for e in events]

    def outcome(self, event):
        """Feed one event; return its single outcome model (promoted or rejected)."""
        handled = self.processor.handle(self.record(event))
        return handled.outbound[0].model

    def orphans(self, event):
        handled = self.processor.handle(self.record(event))
        return [o.model for o in handled.outbound if o.topic == TOPICS.orphaned_effects]


def conv_id() -> str:
    return f"conv_{uuid.uuid4().hex[:8]}"


def turn(conversation: str, head: int, **kw):
    return make_turn(conversation_id=conversation, expected_head_seq=head, **kw)


def chain_turn(root: str | None, previous: str | None, **kw):
    """A chain-mode turn; ``root=None`` starts a chain (its own id is the chain root)."""
    response_id = kw.pop("response_id", None) or new_id("resp")
    return make_turn(conversation_id=None, chain_root_id=root or response_id,
                     expected_head_seq=None, previous_response_id=previous,
                     response_id=response_id, **kw)


@pytest.fixture
def h() -> Harness:
    return Harness()


# --- ordering ---------------------------------------------------------------------------


def test_five_turn_conversation_promotes_seq_1_to_5(h):
    conv = conv_id()
    seqs = [h.outcome(turn(conv, head)).seq for head in range(5)]
    assert seqs == [1, 2, 3, 4, 5]
    assert h.store.head(TENANT, conv).seq == 5


def test_two_turns_on_one_head_exactly_one_promoted_other_conflict(h):
    conv = conv_id()
    first, second = h.outcome(turn(conv, 0)), h.outcome(turn(conv, 0))
    assert first.seq == 1
    assert second.reason is R.CONFLICT and second.head_seq == 1


def test_expected_head_beyond_head_is_out_of_order(h):
    conv = conv_id()
    out = h.outcome(turn(conv, 2))
    assert out.reason is R.OUT_OF_ORDER and out.head_seq == 0


def test_redelivered_rejection_never_flips_even_after_the_gap_is_filled(h):
    conv = conv_id()
    late = turn(conv, 1)
    assert h.outcome(late).reason is R.OUT_OF_ORDER
    assert h.outcome(turn(conv, 0)).seq == 1
    assert h.outcome(late).reason is R.OUT_OF_ORDER  # replayed from the decision record


# --- idempotency -------------------------------------------------------------------------


def test_redelivery_republishes_the_identical_outcome_and_promotes_once(h):
    conv = conv_id()
    t = turn(conv, 0)
    first, again = h.outcome(t), h.outcome(t)
    assert first == again  # same event id, same seq, same promoted_at
    assert h.store.head(TENANT, conv).seq == 1


def test_retry_with_same_key_and_digest_is_duplicate_pointing_at_original(h):
    conv = conv_id()
    original = turn(conv, 0)
    retry = turn(conv, 0, idempotency_key=original.idempotency_key, attempt=2)
    assert h.outcome(original).seq == 1
    dup = h.outcome(retry)
    assert dup.reason is R.DUPLICATE
    assert dup.existing_response_id == original.response_id and dup.head_seq == 1
    # the status endpoint answers promoted from the store, the retry's from the ledger
    assert h.store.get_checkpoint(TENANT, original.response_id).seq == 1
    retried = h.ledger.status(TENANT, retry.response_id)
    assert (retried.status, retried.reason) == (ResponseState.REJECTED, "DUPLICATE")


def test_same_key_different_digest_is_key_reused(h):
    conv = conv_id()
    original = turn(conv, 0)
    other = turn(conv, 1, idempotency_key=original.idempotency_key, request_digest="f" * 64)
    h.outcome(original)
    out = h.outcome(other)
    assert out.reason is R.IDEMPOTENCY_KEY_REUSED
    assert out.existing_response_id == original.response_id


# --- cancellation and status --------------------------------------------------------------


def test_cancel_before_completion_is_never_promoted(h):
    conv = conv_id()
    t = turn(conv, 0)
    h.feed(make_turn_cancelled(t))
    assert h.outcome(t).reason is R.CANCELLED
    assert h.store.head(TENANT, conv) is None
    status = h.ledger.status(TENANT, t.response_id)
    assert status.status is ResponseState.REJECTED and status.reason == "CANCELLED"


def test_cancel_after_promotion_does_not_unpromote_a_redelivery(h):
    conv = conv_id()
    t = turn(conv, 0)
    assert h.outcome(t).seq == 1
    h.feed(make_turn_cancelled(t))
    assert h.outcome(t).seq == 1


@pytest.mark.parametrize("status", [TurnStatus.FAILED, TurnStatus.IN_PROGRESS,
                                    TurnStatus.QUEUED, TurnStatus.CANCELLED])
def test_non_promotable_status_is_rejected(h, status):
    out = h.outcome(turn(conv_id(), 0, status=status, certified=False))
    assert out.reason is R.NOT_PROMOTABLE_STATUS


def test_in_progress_then_completed_for_the_same_response_promotes(h):
    conv = conv_id()
    done = turn(conv, 0)
    pending = done.model_copy(update={"event_id": str(uuid.uuid4()),
                                      "status": TurnStatus.IN_PROGRESS})
    assert h.outcome(pending).reason is R.NOT_PROMOTABLE_STATUS
    assert h.outcome(done).seq == 1
    # the status endpoint answers from the store first: promoted wins
    assert h.store.get_checkpoint(TENANT, done.response_id).seq == 1


def test_incomplete_promotes_logical_only_without_artifact(h):
    out = h.outcome(turn(conv_id(), 0, status=TurnStatus.INCOMPLETE))
    assert out.certification is Certification.LOGICAL_ONLY and out.artifact_id is None


def test_auto_truncation_promotes_logical_only(h):
    t = turn(conv_id(), 0)
    truncated = t.model_copy(update={"effective_config": EffectiveConfig(
        **{**t.effective_config.model_dump(), "truncation": "auto", "truncated": True})})
    assert h.outcome(truncated).certification is Certification.LOGICAL_ONLY


# --- item problems ------------------------------------------------------------------------


def test_corrupt_item_is_rejected(h):
    bad = tampered(message("hi", role="assistant", item_id=new_id("msg")))
    assert h.outcome(turn(conv_id(), 0, items=[bad])).reason is R.CORRUPT


def test_unknown_item_type_is_rejected(h):
    odd = make_item("hologram", {"x": 1}, item_id=new_id("it"))
    assert h.outcome(turn(conv_id(), 0, items=[odd])).reason is R.UNKNOWN_ITEM_TYPE


def test_an_event_within_the_size_limit_is_promoted_whatever_its_item_count(h):
    # CONTRACT 4: the documented maximum travels end to end; many small items cost the
    # store's count more per byte of event than a few large ones (docs/store.md).
    items = [message("x", role="assistant", item_id=f"m{i:06d}") for i in range(45_000)]
    big = turn(conv_id(), 0, items=items)
    avro = io.BytesIO()
    fastavro.schemaless_writer(avro, avsc.parsed("TurnCompleted"), big.to_avro())
    event_bytes = 5 + len(avro.getvalue())  # the Confluent header + the Avro body
    stored = turn_size(promotion_request(big, Certification.CERTIFIED))
    assert event_bytes <= MAX_EVENT_BYTES < stored
    # the pickled stand-in record is larger than the Avro one: decided as its Avro is
    assert h.processor._turns.handle(big).outbound[0].model.seq == 1


def test_undecodable_record_becomes_a_dead_letter(h):
    record = RawRecord(TOPICS.gateway_events, 3, 42, b"key", b"\x00garbage")
    handled = h.processor.handle(record)
    (out,) = handled.outbound
    assert out.topic == TOPICS.dead_letters and out.key == b"key"
    assert out.model.value == b"\x00garbage" and out.model.source_offset == 42
    assert out.model.source_partition == 3 and out.model.error


# --- pairing across the history ------------------------------------------------------------


def test_client_tool_call_answered_in_the_next_turn(h):
    conv = conv_id()
    call = function_call("c_client", "lookup", {"q": 1}, item_id=new_id("fc"))
    assert h.outcome(turn(conv, 0, items=[call])).seq == 1
    answer = function_call_output("c_client", '{"ok": true}', item_id=new_id("fco"))
    reply = message("done", role="assistant", item_id=new_id("msg"))
    assert h.outcome(turn(conv, 1, input_items=[answer], items=[reply])).seq == 2


def test_call_id_reused_across_turns_is_unpaired(h):
    conv = conv_id()
    call = function_call("c_dup", "lookup", {}, item_id=new_id("fc"))
    out_item = function_call_output("c_dup", "{}", item_id=new_id("fco"))
    done = message("ok", role="assistant", item_id=new_id("msg"))
    assert h.outcome(turn(conv, 0, items=[call, out_item, done])).seq == 1
    again = function_call("c_dup", "lookup", {}, item_id=new_id("fc"))
    out = h.outcome(turn(conv, 1, items=[again]))
    assert out.reason is R.UNPAIRED_TOOL_CALL


# --- tool effects ----------------------------------------------------------------------------


def test_tool_loop_with_recorded_effects_promotes_certified(h):
    t, effects = make_tool_loop_turn(rounds=3, conversation_id=conv_id())
    h.feed(*effects)
    out = h.outcome(t)
    assert out.seq == 1 and out.certification is Certification.CERTIFIED
    # only the outer artifact is promoted, never a subturn's ephemeral one
    assert out.artifact_id == t.token_artifact.artifact_id
    assert out.artifact_id not in {s.ephemeral_artifact_ref for s in t.subturns}


def test_a_certified_turn_whose_artifact_expired_is_promoted_without_it(h):
    """A completed turn whose token artifact expired (its proof still valid) is certified
    with no reusable artifact: the checkpoint keeps no artifact, proof or receipt, and a
    read falls back ``NO_ARTIFACT`` (CONTRACT 5), not ``ARTIFACT_EXPIRED``. Found by a
    mutation review: the store request could carry the artifact with every test passing."""
    from ratchet.domain.rehydration import Fallback, FallbackReason, rehydrate
    from ratchet.samples import make_artifact_and_proof

    fresh = make_turn()
    artifact, proof = make_artifact_and_proof(fresh.fingerprint_hash)
    artifact = artifact.model_copy(update={"expires_at": NOW_MS - 1})
    proof = proof.model_copy(update={"expires_at": NOW_MS + HOUR_MS})
    conv = conv_id()
    t = turn(conv, 0, token_artifact=artifact, boundary_proof=proof)
    out = h.outcome(t)
    assert out.seq == 1 and out.certification is Certification.CERTIFIED
    stored = h.store.get_checkpoint(TENANT, t.response_id)
    assert (stored.token_artifact, stored.boundary_proof, stored.router_receipt) == (
        None, None, None)
    now = datetime.fromtimestamp(NOW_MS / 1000, UTC)
    read = rehydrate(h.store.read_history(TENANT, conversation_id=conv, now=now),
                     t.fingerprint_hash, now)
    assert isinstance(read, Fallback) and read.reason is FallbackReason.NO_ARTIFACT


def test_a_backlog_older_than_its_proofs_is_promoted_in_full(h):
    """A worker down for longer than the boundary proofs' lifetime (here: turns sent
    two hours ago, proofs and artifacts valid for one) comes back to a backlog. Every
    turn is promoted in order, certified without a reusable artifact (reads fall back
    ``NO_ARTIFACT``), and the Conversation and the chain go on; the first fresh turn is
    reusable again. Before session 43 each was ``INVALID_BOUNDARY_PROOF``, and every
    later turn of its Conversation ``OUT_OF_ORDER`` (of its chain
    ``PARENT_NOT_PROMOTED``): an outage rejected every Conversation in flight."""
    from ratchet.domain.rehydration import Fallback, FallbackReason, rehydrate

    sent = NOW_MS - 2 * HOUR_MS
    conv = conv_id()
    backlog = [turn(conv, head, now_ms=sent) for head in range(3)]
    root = chain_turn(None, None, now_ms=sent)
    child = chain_turn(root.response_id, root.response_id, now_ms=sent)
    for t in [*backlog, root, child]:
        out = h.outcome(t)
        assert isinstance(out, CheckpointPromoted), out
        assert out.certification is Certification.CERTIFIED and out.artifact_id is None, out
    assert [h.store.get_checkpoint(TENANT, t.response_id).seq for t in backlog] == [1, 2, 3]
    now = datetime.fromtimestamp(NOW_MS / 1000, UTC)
    read = rehydrate(h.store.read_history(TENANT, conversation_id=conv, now=now),
                     backlog[0].fingerprint_hash, now)
    assert isinstance(read, Fallback) and read.reason is FallbackReason.NO_ARTIFACT
    assert len(read.items) == sum(len(t.items) for t in backlog)
    fresh = h.outcome(turn(conv, 3))
    assert fresh.seq == 4 and fresh.artifact_id is not None, fresh


def test_missing_tool_effect_is_rejected(h):
    t, effects = make_tool_loop_turn(rounds=3, conversation_id=conv_id())
    h.feed(*effects[:2])
    assert h.outcome(t).reason is R.MISSING_TOOL_EFFECT


def test_effect_recorded_twice_with_different_outputs_is_duplicate_tool_effect(h):
    t, effects = make_tool_loop_turn(rounds=2, conversation_id=conv_id())
    h.feed(*effects)
    clash = make_tool_effect(effects[0].call_id, '{"temperature_c": -40}',
                             idempotency_key=t.idempotency_key, subturn_index=0,
                             conversation_id=t.conversation_id)
    assert clash.effect_id == effects[0].effect_id
    h.feed(clash)
    (recorded,) = [e for e in h.ledger.effects_for(TENANT, t.idempotency_key)
                   if e.effect_id == clash.effect_id]
    assert recorded.conflicted
    out = h.outcome(t)
    assert out.reason is R.DUPLICATE_TOOL_EFFECT


def test_redelivered_effect_is_deduplicated(h):
    t, effects = make_tool_loop_turn(rounds=1, conversation_id=conv_id())
    h.feed(effects[0], effects[0])
    assert len(h.ledger.effects_for(TENANT, t.idempotency_key)) == 1
    assert not h.ledger.effects_for(TENANT, t.idempotency_key)[0].conflicted


def test_function_call_output_differing_from_recorded_effect_is_rejected(h):
    t, effects = make_tool_loop_turn(rounds=1, conversation_id=conv_id())
    lying = make_tool_effect(effects[0].call_id, '{"temperature_c": 99}',
                             idempotency_key=t.idempotency_key, subturn_index=0,
                             conversation_id=t.conversation_id)
    h.feed(lying)
    assert h.outcome(t).reason is R.DUPLICATE_TOOL_EFFECT


def test_retried_tool_loop_reuses_effects_and_orphans_the_unused_ones(h):
    conv = conv_id()
    final, effects = make_tool_loop_turn(rounds=3, conversation_id=conv, attempt=2)
    # attempt 1 ran rounds 0 and 1 like attempt 2, but its round 2 called another tool
    stray = make_tool_effect("call_stray", '{"x": 1}', idempotency_key=final.idempotency_key,
                             subturn_index=2, tool_name="send_email", conversation_id=conv)
    h.feed(effects[0], effects[1], stray)
    h.feed(effects[2])  # attempt 2's own round 2
    handled = h.processor.handle(h.record(final))
    promoted = handled.outbound[0].model
    orphans = [o.model for o in handled.outbound[1:]]
    assert promoted.seq == 1
    assert [(o.effect_id, o.reason) for o in orphans] == [
        (stray.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


def _attempts(h, first_rounds: int, retry_rounds: int):
    """A tool turn promoted as attempt 1, then the same request (response id, key and
    digest) completed again by attempt 2 with ``retry_rounds`` rounds: what attempt 2
    is answered with, and each attempt's effects."""
    same = {"conversation_id": conv_id(), "response_id": f"resp_{uuid.uuid4().hex[:8]}",
            "idempotency_key": f"idem_{uuid.uuid4().hex[:8]}", "request_digest": "d" * 64}
    first, first_effects = make_tool_loop_turn(rounds=first_rounds, **same)
    h.feed(*first_effects)
    assert h.outcome(first).seq == 1
    retry, retry_effects = make_tool_loop_turn(rounds=retry_rounds, attempt=2, **same)
    h.feed(*retry_effects)
    handled = h.processor.handle(h.record(retry))
    promoted, orphans = handled.outbound[0].model, [o.model for o in handled.outbound[1:]]
    return promoted, orphans, first_effects, retry_effects


def test_a_retry_by_another_attempt_orphans_nothing_the_promoted_turn_used(h):
    # Attempt 1 used two effects; attempt 2 repeated the first call only. The history
    # holds attempt 1's turn: neither of its effects may be compensated.
    promoted, orphans, first_effects, _ = _attempts(h, first_rounds=2, retry_rounds=1)
    assert (promoted.seq, promoted.attempt) == (1, 1)  # the promotion that stands
    assert orphans == []
    assert h.ledger.effects_for(TENANT, first_effects[0].idempotency_key)


def test_a_retry_by_another_attempt_orphans_the_effects_only_it_used(h):
    # Attempt 2 ran one more call than the promoted attempt 1: that effect is in no
    # promoted history, so it is orphaned for compensation.
    promoted, orphans, first_effects, retry_effects = _attempts(h, first_rounds=1,
                                                                retry_rounds=2)
    assert (promoted.seq, promoted.attempt) == (1, 1)
    extra = {e.effect_id for e in retry_effects} - {e.effect_id for e in first_effects}
    assert len(extra) == 1
    assert [(o.effect_id, o.reason) for o in orphans] == [
        (extra.pop(), OrphanReason.ATTEMPT_SUPERSEDED)]


def test_a_replay_of_a_checkpoint_without_its_effects_orphans_nothing():
    # A row promoted before migration 012 does not say which effects its turn used:
    # nothing can be shown unused, so nothing is compensated.
    t, effects = make_tool_loop_turn(rounds=2, conversation_id=conv_id())
    other_attempt, _ = make_tool_loop_turn(rounds=1, response_id=t.response_id,
                                           idempotency_key=t.idempotency_key)
    store = MemoryCheckpointStore(StoreOptions())
    promoted = store.promote(promotion_request(t, Certification.CERTIFIED)).checkpoint
    old_row = dataclasses.replace(promoted, accepted_attempt=None, accepted_effect_ids=None)
    recorded = [recorded_effect(e) for e in effects]
    assert orphaned_effects(other_attempt, Accepted(old_row, replayed=True), recorded) == []
    fresh = orphaned_effects(other_attempt, Accepted(promoted, replayed=True), recorded)
    assert fresh == []  # both effects are the promoted turn's
    # Promoted afresh, the other attempt's own checkpoint (a fresh verdict's checkpoint
    # is always its turn's) uses only its one round's effect.
    own = MemoryCheckpointStore(StoreOptions()).promote(
        promotion_request(other_attempt, Certification.CERTIFIED)).checkpoint
    assert [o.effect.effect_id for o in orphaned_effects(
        other_attempt, Accepted(own), recorded)] == [effects[1].effect_id]


def test_a_duplicate_whose_original_cannot_be_read_orphans_nothing():
    """A ``DUPLICATE`` retry orphans the request's effects its original did not use;
    when the original's promotion cannot be read, any effect may be one it used: none is
    orphaned (never compensate an execution the promoted history holds). Found by a
    mutation review: dropping the unreadable-original guard passed every test."""
    t, effects = make_tool_loop_turn(rounds=2, conversation_id=conv_id())
    retry, _ = make_tool_loop_turn(rounds=1, idempotency_key=t.idempotency_key,
                                   conversation_id=t.conversation_id)
    store = MemoryCheckpointStore(StoreOptions())
    used_one = t.model_copy(update={"tool_effect_ids": t.tool_effect_ids[:1],
                                    "subturns": t.subturns[:1]})
    promoted = store.promote(promotion_request(used_one, Certification.CERTIFIED)).checkpoint
    recorded = [recorded_effect(e) for e in effects]
    duplicate = Reject(R.DUPLICATE, "already promoted", existing_response_id=t.response_id)
    assert orphaned_effects(retry, duplicate, recorded, promoted=None) == []
    assert [(o.effect.effect_id, o.reason) for o in orphaned_effects(
        retry, duplicate, recorded, promoted=promoted)] == [
        (effects[1].effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


def _another_attempt(first, **changes):
    """``first``'s request (same key and digest) completed again by attempt 2 under
    another response id."""
    return first.model_copy(update={"event_id": str(uuid.uuid4()),
                                    "response_id": new_id("resp"), "attempt": 2, **changes})


def test_a_duplicate_orphans_the_effects_only_its_attempt_ran(h):
    # Attempt 2 under another response id ran its calls after attempt 1 was promoted:
    # DUPLICATE, and its effects are in no promoted history.
    conv = conv_id()
    first, first_effects = make_tool_loop_turn(rounds=1, conversation_id=conv)
    h.feed(*first_effects)
    assert h.outcome(first).seq == 1
    retry, retry_effects = make_tool_loop_turn(
        rounds=2, conversation_id=conv, idempotency_key=first.idempotency_key,
        request_digest=first.request_digest, attempt=2)
    h.feed(*retry_effects)
    handled = h.processor.handle(h.record(retry))
    rejected = handled.outbound[0].model
    assert (rejected.reason, rejected.existing_response_id) == (R.DUPLICATE,
                                                                 first.response_id)
    extra = {e.effect_id for e in retry_effects} - {e.effect_id for e in first_effects}
    assert extra
    assert [(o.model.effect_id, o.model.reason) for o in handled.outbound[1:]] == [
        (effect_id, OrphanReason.ATTEMPT_SUPERSEDED) for effect_id in sorted(extra)]


def _retry_cancelled_after_the_promotion(h, first, effects, **changes):
    """``first`` promoted with its ``effects``; then a cancellation naming attempt 2's
    response id, then attempt 2: DUPLICATE naming ``first``, nothing orphaned."""
    h.feed(*effects)
    assert h.outcome(first).seq == 1
    retry = _another_attempt(first, **changes)
    h.feed(make_turn_cancelled(retry))
    handled = h.processor.handle(h.record(retry))
    rejected = handled.outbound[0].model
    assert (rejected.reason, rejected.existing_response_id) == (R.DUPLICATE,
                                                                 first.response_id)
    assert handled.outbound[1:] == ()
    return retry


def test_a_cancel_naming_a_retry_after_the_promotion_changes_nothing(h):
    # The request was promoted by attempt 1; a cancellation naming attempt 2's response
    # id came after it: attempt 2 is DUPLICATE (its status names the original) and the
    # promoted turn's effects are not compensated.
    first, effects = make_tool_loop_turn(rounds=1, conversation_id=conv_id())
    retry = _retry_cancelled_after_the_promotion(h, first, effects)
    status = h.ledger.status(TENANT, retry.response_id)
    assert (status.reason, status.existing_response_id) == ("DUPLICATE", first.response_id)


def test_a_reused_key_never_orphans_the_promoted_requests_effects(h):
    conv = conv_id()
    first, effects = make_tool_loop_turn(rounds=2, conversation_id=conv)
    h.feed(*effects)
    assert h.outcome(first).seq == 1
    other = turn(conv, 1, idempotency_key=first.idempotency_key, request_digest="f" * 64)
    handled = h.processor.handle(h.record(other))
    assert handled.outbound[0].model.reason is R.IDEMPOTENCY_KEY_REUSED
    assert handled.outbound[1:] == ()


def test_a_failed_retry_never_orphans_what_the_promoted_attempt_used(h):
    # Effect ids are stable across retries: attempt 2 ran the same call, then failed.
    first, effects = make_tool_loop_turn(rounds=1, conversation_id=conv_id())
    h.feed(*effects)
    assert h.outcome(first).seq == 1
    failed = _another_attempt(first, status=TurnStatus.FAILED, token_artifact=None,
                              boundary_proof=None)
    handled = h.processor.handle(h.record(failed))
    assert handled.outbound[0].model.reason is R.NOT_PROMOTABLE_STATUS
    assert handled.outbound[1:] == ()


def _completed_claim(h, key: str, conversation: str, call_id: str, output, occurrence: int):
    """A claim of this request's call ``call_id``, completed with ``output``."""
    effect_id = effect_id_for_claim(key, 0, "send_email", occurrence)
    request = ClaimRequest(TENANT, key, effect_id, 1, 0, call_id, "send_email",
                           arguments_digest({"to": call_id}), uuid.uuid4().hex, 30_000,
                           EffectPolicy.AT_MOST_ONCE)
    h.ledger.claim_effect(request, NOW_MS)
    h.ledger.complete_claim(TENANT, key, effect_id, request.token, "succeeded", output, NOW_MS)
    h.store.mark_request_facts(TENANT, conversation, key)
    return effect_id


def test_claimed_results_swapped_between_their_calls_are_refused(h):
    conv, key = conv_id(), new_id("idem")
    sent_a = function_call_output("ca", '{"sent": "A"}', item_id="fco_a")
    sent_b = function_call_output("cb", '{"sent": "B"}', item_id="fco_b")
    effect_a = _completed_claim(h, key, conv, "ca", sent_a, occurrence=0)
    effect_b = _completed_claim(h, key, conv, "cb", sent_b, occurrence=1)
    items = [function_call("ca", "send_email", {"to": "ca"}, item_id="fc_a"),
             function_call("cb", "send_email", {"to": "cb"}, item_id="fc_b"),
             function_call_output("ca", '{"sent": "B"}', item_id="fco_a"),  # B's result
             function_call_output("cb", '{"sent": "A"}', item_id="fco_b"),  # A's result
             message("done", role="assistant", item_id=new_id("msg"))]
    swapped = turn(conv, 0, items=items, idempotency_key=key,
                   tool_effect_ids=(effect_a, effect_b))
    rejected = h.outcome(swapped)
    assert rejected.reason is R.DUPLICATE_TOOL_EFFECT
    assert "for call ca differs" in rejected.detail
    # the same outputs, each answering its own call, promote
    right = turn(conv, 0, items=[*items[:2], sent_a, sent_b, items[4]],
                 idempotency_key=new_id("idem"), tool_effect_ids=())
    assert h.outcome(right).seq == 1


def test_a_tool_effect_disagreeing_with_its_claims_completion_is_an_effect_conflict(h):
    conv, key = conv_id(), new_id("idem")
    recorded = function_call_output("c1", '{"sent": 1}', item_id="fco_1")
    effect_id = _completed_claim(h, key, conv, "c1", recorded, occurrence=0)
    other = function_call_output("c1", '{"sent": 2}', item_id="fco_1")
    h.feed(make_tool_effect("c1", other, idempotency_key=key, conversation_id=conv,
                            effect_id=effect_id, tool_name="send_email"))
    items = [function_call("c1", "send_email", {"to": "c1"}, item_id="fc_1"), recorded,
             message("done", role="assistant", item_id=new_id("msg"))]
    rejected = h.outcome(turn(conv, 0, items=items, idempotency_key=key,
                              tool_effect_ids=(effect_id,)))
    assert rejected.reason is R.DUPLICATE_TOOL_EFFECT
    assert "another output than its claim" in rejected.detail


def test_a_claimed_output_with_no_canonical_form_is_a_rejection_not_a_dead_letter(h):
    # Recorded before the claims API refused such outputs: 1e400 is read as infinity,
    # which has no canonical JSON, so its result digest cannot be computed. The turn is
    # decodable and valid: it gets a decision (no output can equal that record).
    conv, key = conv_id(), new_id("idem")
    content = (b'{"call_id":"c1","id":"fco_1","output":"sent","score":1e400,'
               b'"type":"function_call_output"}')
    unusable = Item(item_id="fco_1", type="function_call_output", call_id="c1",
                    content=content, content_digest=sha256_hex(content))
    effect_id = _completed_claim(h, key, conv, "c1", unusable, occurrence=0)
    items = [function_call("c1", "send_email", {"to": "c1"}, item_id="fc_1"),
             function_call_output("c1", "sent", item_id="fco_1"),
             message("done", role="assistant", item_id=new_id("msg"))]
    t = turn(conv, 0, items=items, idempotency_key=key, tool_effect_ids=(effect_id,))
    handled = h.processor.handle(h.record(t))
    topics = [o.topic for o in handled.outbound]
    assert TOPICS.dead_letters not in topics and topics[0] == TOPICS.rejections, topics
    rejected = handled.outbound[0].model
    assert rejected.reason is R.DUPLICATE_TOOL_EFFECT
    assert "no canonical form" in rejected.detail and "range of a double" in rejected.detail


# 10_000_834_592_310 ms (year 2286): a float division lost its millisecond on the way in
# (promotion._utc_ms); 69_097_842_566_678: a float product lost it on the way out (the
# published record, streams/outcomes.py); the last one is the last readable millisecond.
@pytest.mark.parametrize("epoch_ms", [10_000_834_592_310, 69_097_842_566_678,
                                      253_402_300_799_999])
def test_far_future_expiries_are_kept_to_the_millisecond(h, epoch_ms):
    t = turn(conv_id(), 0, expires_at=epoch_ms)
    t = t.model_copy(update={"token_artifact": t.token_artifact.model_copy(
        update={"expires_at": epoch_ms})})
    exact = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=epoch_ms)
    request = promotion_request(t, Certification.CERTIFIED)
    assert request.expires_at == request.token_artifact.expires_at == exact
    promoted = h.outcome(t)
    assert (promoted.seq, promoted.expires_at, promoted.artifact_expires_at) == (
        1, epoch_ms, epoch_ms)


def test_an_expiry_outside_the_readable_range_is_named_as_such():
    for epoch_ms in (253_402_300_800_000, -62_135_596_800_001, 2**63 - 1):
        with pytest.raises(ValueError, match="outside the readable range"):
            promotion_request(make_turn(expires_at=epoch_ms), Certification.CERTIFIED)


def test_cancelled_request_orphans_all_its_effects(h):
    t, effects = make_tool_loop_turn(rounds=2, conversation_id=conv_id())
    h.feed(*effects, make_turn_cancelled(t))
    orphans = h.orphans(t)
    assert {o.effect_id for o in orphans} == {e.effect_id for e in effects}
    assert {o.reason for o in orphans} == {OrphanReason.TURN_CANCELLED}


def _tool_round(call_id: str) -> list:
    return [function_call(call_id, "get_weather", {"city": "Paris"}, item_id=new_id("fc")),
            function_call_output(call_id, '{"t": 1}', item_id=new_id("fco")),
            message("ok", role="assistant", item_id=new_id("msg"))]


@pytest.mark.parametrize("mode", ["chain", "conversation"])
def test_a_turn_on_an_expired_lineage_is_paired_against_all_of_it(mode):
    # The parent's history is past its expiry when the child comes: the child may still
    # extend it (and renew it), but not repeat one of its call ids.
    clock = {"now": NOW_MS}
    h = Harness()
    h.store = MemoryCheckpointStore(StoreOptions(
        clock=lambda: datetime.fromtimestamp(clock["now"] / 1000, UTC)))
    h.processor = PromotionProcessor(h.store, h.ledger, PickleCodec(), TOPICS,
                                     clock_ms=lambda: clock["now"])
    if mode == "chain":
        parent = chain_turn(None, None, items=_tool_round("c1"), certified=False,
                            expires_at=NOW_MS + 1000)
    else:
        conv = conv_id()
        parent = turn(conv, 0, items=_tool_round("c1"), certified=False,
                      expires_at=NOW_MS + 1000)
    assert h.outcome(parent).seq == 1
    clock["now"] = NOW_MS + 5000

    def child(call_id: str):
        if mode == "chain":
            return chain_turn(parent.response_id, parent.response_id,
                              items=_tool_round(call_id), certified=False, now_ms=clock["now"])
        return turn(conv, 1, items=_tool_round(call_id), certified=False, now_ms=clock["now"])

    rejected = h.outcome(child("c1"))
    assert rejected.reason is R.UNPAIRED_TOOL_CALL
    assert h.outcome(child("c2")).seq == 2


# Epoch 0, the millisecond before it, and the first readable one (year 1): expiries a
# gateway may send (a 0 meaning "none", a clock off by decades), all already past.
@pytest.mark.parametrize("expires_at", [0, -1, -62_135_596_800_000])
@pytest.mark.parametrize("mode", ["chain", "conversation"])
def test_a_turn_continuing_one_that_expired_before_1970_is_promoted(mode, expires_at):
    """Promotion ignores expiry (docs/gateway-protocol.md, "Logical expiry"): a turn whose
    parent expired at or before epoch 0 extends it like any expired parent. An outside
    review, session 42: the lineage was read again "as of" epoch 0 to ignore expiry, which
    such a parent is past too, so its child was rejected ``CORRUPT`` ("the history this
    turn extends cannot be read (EXPIRED)"), on every backend. Its pairing is still checked
    against the expired parent's items."""
    h = Harness()
    if mode == "chain":
        parent = chain_turn(None, None, items=_tool_round("c1"), expires_at=expires_at)
    else:
        conv = conv_id()
        parent = turn(conv, 0, items=_tool_round("c1"), expires_at=expires_at)
    assert h.outcome(parent).seq == 1

    def child(call_id: str):
        if mode == "chain":
            return chain_turn(parent.response_id, parent.response_id, items=_tool_round(call_id))
        return turn(conv, 1, items=_tool_round(call_id))

    assert h.outcome(child("c1")).reason is R.UNPAIRED_TOOL_CALL
    promoted = h.outcome(child("c2"))
    assert (promoted.seq, promoted.expires_at) == (2, None)
    history = h.store.read_history(TENANT, response_id=promoted.response_id,
                                   partition_key=promoted.partition_key)
    first = [i.item_id for i in parent.items]
    assert [i.item_id for i in history.items[:len(first)]] == first
    assert len(history.items) == 2 * len(first)


# --- chains, forks, tenants ---------------------------------------------------------------------


def test_chain_with_a_fork(h):
    root = chain_turn(None, None)
    root_id = root.response_id
    assert h.outcome(root).seq == 1
    left = chain_turn(root_id, root_id)
    right = chain_turn(root_id, root_id)
    assert h.outcome(left).seq == 2 and h.outcome(right).seq == 2  # forks are legal
    assert h.outcome(chain_turn(root_id, left.response_id)).seq == 3


def test_a_chains_first_request_retried_under_another_response_id(h):
    # Each first response of a chain is its own partition (and Kafka key): the retry
    # lands in another partition than the promoted attempt, and is still DUPLICATE.
    first = chain_turn(None, None)
    assert h.outcome(first).seq == 1
    retry = _another_attempt(first, chain_root_id=None)
    rejected = h.outcome(retry)
    assert (rejected.reason, rejected.existing_response_id) == (R.DUPLICATE,
                                                                 first.response_id)
    reused = _another_attempt(first, chain_root_id=None, request_digest="e" * 64)
    assert h.outcome(reused).reason is R.IDEMPOTENCY_KEY_REUSED
    assert h.store.get_checkpoint(TENANT, retry.response_id) is None


def test_a_chains_first_request_promoted_elsewhere_keeps_its_effects(h):
    # The retries of a chain's first request are other partitions than the promoted
    # attempt: a cancellation naming a retry after the promotion, and a reuse of the key,
    # still never orphan what the promoted turn used.
    first, effects = make_tool_loop_turn(rounds=1, conversation_id=None,
                                         expected_head_seq=None, chain_root_id=None)
    _retry_cancelled_after_the_promotion(h, first, effects, chain_root_id=None)
    reused = _another_attempt(first, chain_root_id=None, request_digest="e" * 64)
    handled = h.processor.handle(h.record(reused))
    assert handled.outbound[0].model.reason is R.IDEMPOTENCY_KEY_REUSED
    assert handled.outbound[1:] == ()


def test_a_chains_first_request_once_cancelled_never_promotes_under_another_id(h):
    # The cancellation is keyed to one attempt's partition (or to an id never produced);
    # the request it cancels is every attempt, whatever partition each is.
    first = chain_turn(None, None)
    h.feed(make_turn_cancelled(first))
    assert h.outcome(first).reason is R.CANCELLED
    retry = _another_attempt(first, chain_root_id=None)
    assert h.outcome(retry).reason is R.CANCELLED
    other = chain_turn(None, None)
    h.feed(make_turn_cancelled(_another_attempt(other, chain_root_id=None)))  # never produced
    assert h.outcome(other).reason is R.CANCELLED


def test_a_chains_first_request_held_by_an_undecided_response_waits_for_it(h):
    first = chain_turn(None, None)
    request = promotion_request(first, Certification.CERTIFIED)
    h.store._claim_request(ResponseClaim.of(request))  # its batch not written yet
    retry = _another_attempt(first, chain_root_id=None)
    with pytest.raises(Unavailable, match="not decided yet"):
        h.processor.handle(h.record(retry))
    # the holder rejected (its request is bound to it): the retry is CONFLICT
    h.ledger.mark_rejected(TENANT, first.response_id, "CANCELLED", "cancelled", None)
    rejected = h.outcome(retry)
    assert rejected.reason is R.CONFLICT
    assert f"bound to response {first.response_id}" in rejected.detail


def test_chain_parent_not_promoted(h):
    out = h.outcome(chain_turn("resp_never_promoted", "resp_never_promoted"))
    assert out.reason is R.PARENT_NOT_PROMOTED


def test_chain_parent_of_another_tenant_is_tenant_mismatch(h):
    root = chain_turn(None, None)
    h.outcome(root)
    intruder = chain_turn(root.response_id, root.response_id, tenant_id="tenant-2")
    assert h.outcome(intruder).reason is R.TENANT_MISMATCH


def test_conversation_of_another_tenant_is_tenant_mismatch(h):
    conv = conv_id()
    h.outcome(turn(conv, 0))
    assert h.outcome(turn(conv, 1, tenant_id="tenant-2")).reason is R.TENANT_MISMATCH


def test_owners_are_written_only_where_a_later_decision_reads_them(h):
    """A chain's response ids (a chain turn's missing parent is looked up there) and a
    Conversation's owner (once); a Conversation's responses are never a chain's parent."""
    conv = conv_id()
    first, second = turn(conv, 0), turn(conv, 1)
    assert h.outcome(first).seq == 1 and h.outcome(second).seq == 2
    assert h.ledger.conversation_owner(conv) == TENANT
    assert h.ledger.response_owner(first.response_id) is None
    assert h.ledger.response_owner(second.response_id) is None
    root = chain_turn(None, None)
    child = chain_turn(root.response_id, root.response_id)
    assert h.outcome(root).seq == 1 and h.outcome(child).seq == 2
    assert h.ledger.response_owner(root.response_id) == TENANT
    assert h.ledger.response_owner(child.response_id) == TENANT


def test_a_chain_naming_another_tenants_conversation_response_is_not_promoted(h):
    """Not recorded as owned (above), it is simply not promoted in the chain's tenant:
    PARENT_NOT_PROMOTED, which says even less about the other tenant."""
    conv = conv_id()
    promoted = turn(conv, 0)
    h.outcome(promoted)
    intruder = chain_turn(promoted.response_id, promoted.response_id, tenant_id="tenant-2")
    assert h.outcome(intruder).reason is R.PARENT_NOT_PROMOTED


# --- the pure decision directly -------------------------------------------------------------------


def test_decide_checks_cancellation_before_validation():
    t = turn(conv_id(), 0, status=TurnStatus.FAILED, certified=False)
    verdict = decide_turn(t, ValidationVerdict(None, R.NOT_PROMOTABLE_STATUS), Facts(cancelled=True))
    assert isinstance(verdict, Reject) and verdict.reason is R.CANCELLED


def test_accepted_is_a_verdict_type():
    assert Accepted.__name__ == "Accepted"


# --- persistence failures ----------------------------------------------------------------------------


class FlakyLedger(MemoryLedger):
    """Fails the first ``failures`` calls of ``method``."""

    def __init__(self, failures: int, method: str) -> None:
        super().__init__()
        self.failures = failures
        real = getattr(self, method)

        def flaky(*args, **kwargs):
            if self.failures:
                self.failures -= 1
                raise LedgerUnavailable("cassandra down")
            return real(*args, **kwargs)

        setattr(self, method, flaky)


# before the decision (the owner read of a first turn), beside the promotion batch
@pytest.mark.parametrize("method", ["conversation_owner", "record_conversation_owner"])
def test_persistence_failure_raises_retryable_and_a_retry_promotes_once(method):
    h = Harness()
    h.ledger = FlakyLedger(failures=1, method=method)
    h.processor = PromotionProcessor(h.store, h.ledger, PickleCodec(), TOPICS,
                                     clock_ms=lambda: NOW_MS)
    t = turn(conv_id(), 0)
    record = h.record(t)
    with pytest.raises(LedgerUnavailable) as raised:  # the Unavailable the lane retries
        h.processor.handle(record)
    assert isinstance(raised.value, Unavailable) and raised.value.retryable
    assert h.processor.handle(record).outbound[0].model.seq == 1


def test_an_expiry_beyond_year_9999_is_corrupt_not_a_dead_letter(h):
    """Avro cannot carry it (dead-lettered at decode); a turn that reaches the rules
    as a model anyway gets a decision, never an exception."""
    handled = h.processor.handle(h.record(turn(conv_id(), 0, expires_at=2**63 - 1)))
    assert [o.topic for o in handled.outbound] == [TOPICS.rejections]
    assert handled.outbound[0].model.reason is R.CORRUPT


def test_an_effect_a_fresh_promotion_carries_is_not_orphaned_when_it_conflicts_after():
    """A product defect found by a mutation review (fixed). A chain's first response carries
    the output of an effect E it does not list (carried: its checkpoint's
    ``accepted_effect_ids`` names E). Its facts are read again after its batch
    (``TurnPromotion.handle``: a chain's first response); if a second record of E with another
    output (another attempt re-ran the tool) lands in between, E is conflicted and
    ``orphaned_effects`` (fresh ``Accepted``: ``carried_effect_ids``, which counts no
    conflicted effect) publishes E ``ATTEMPT_SUPERSEDED``: a compensator undoes the run
    whose output the promoted history holds. The same facts on a redelivery (replayed:
    the checkpoint's effects) orphan nothing; the re-run itself is published
    ``EFFECT_CONFLICT`` by its own record."""
    h = Harness()
    rid = new_id("resp")
    t, effects = make_tool_loop_turn(rounds=1, conversation_id=None, chain_root_id=rid,
                                     response_id=rid, expected_head_seq=None)
    unlisted = t.model_copy(update={
        "tool_effect_ids": (),
        "subturns": tuple(s.model_copy(update={"effect_ids": ()}) for s in t.subturns)})
    h.feed(*effects)
    (effect,) = effects
    rerun = effect.model_copy(update={
        "event_id": str(uuid.uuid4()), "attempt": 2,
        "output": function_call_output(effect.call_id, '{"temperature_c": -40}',
                                       item_id=new_id("fco"))})
    ledger, real_turn_facts = h.ledger, h.ledger.turn_facts

    def turn_facts(**kw):
        if h.store.get_checkpoint(TENANT, rid) is not None and not getattr(
                turn_facts, "done", False):
            turn_facts.done = True  # the re-run lands between the batch and this read
            ledger.record_effect(recorded_effect(rerun))
        return real_turn_facts(**kw)

    ledger.turn_facts = turn_facts
    handled = h.processor.handle(h.record(unlisted))
    promoted = handled.outbound[0].model
    assert getattr(promoted, 'seq', None) == 1, promoted
    checkpoint = h.store.get_checkpoint(TENANT, rid)
    assert effect.effect_id in checkpoint.accepted_effect_ids  # carried, so used
    orphans = [(o.model.effect_id, o.model.reason) for o in handled.outbound
               if o.topic == TOPICS.orphaned_effects]
    assert (effect.effect_id, OrphanReason.ATTEMPT_SUPERSEDED) not in orphans, orphans


def test_a_continued_chain_requests_cancellation_orphans_its_effects(h):
    """A cancellation of a continued chain turn's request that stands promoted nowhere
    publishes the request's effects ``TURN_CANCELLED`` itself (``record_cancel``), as a
    Conversation's does; only a chain's FIRST response publishes nothing there (its
    other attempts are other partitions). Found by a mutation review: counting every
    effect and cancellation as a chain's first response passed every test (the first
    check sees only a Conversation or a ``previous_response_id``; a ``ToolEffect`` or
    ``TurnCancelled`` of a continued chain has neither)."""
    root = chain_turn(None, None)
    assert h.outcome(root).seq == 1
    t, effects = make_tool_loop_turn(rounds=2, conversation_id=None,
                                     chain_root_id=root.response_id,
                                     previous_response_id=root.response_id,
                                     expected_head_seq=None)
    h.feed(*effects)
    handled = h.processor.handle(h.record(make_turn_cancelled(t)))
    orphans = {(o.model.effect_id, o.model.reason) for o in handled.outbound
               if o.topic == TOPICS.orphaned_effects}
    assert orphans == {(e.effect_id, OrphanReason.TURN_CANCELLED) for e in effects}
