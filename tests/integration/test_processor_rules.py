"""The promotion processor against real Kafka + Cassandra + registry.

One ``ratchet worker`` subprocess serves the whole module (a worker takes ~10 s to
join its group); every test uses its own conversation ids, and the module its own
topic prefix and consumer group, so runs never see each other's events.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from ratchet.samples import (
    TENANT,
    make_tool_effect,
    make_tool_loop_turn,
    make_turn,
    make_turn_cancelled,
    new_id,
    tampered,
)
from schemas.items import make_item, message
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
from services.ledger.cassandra import CassandraLedger
from services.store.base import StoreOptions
from services.store.cassandra import CassandraCheckpointStore
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration
R = RejectionReason


@pytest.fixture(scope="module")
def rig(settings, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("processor")
    rig = Rig(isolated_settings(settings, "rules", home=tmp / "home"))
    worker = rig.worker(tmp)
    rig.worker_process = worker
    yield rig
    code = worker.terminate()
    rig.close()
    assert code == 0, f"worker exit code {code}:\n{worker.log_tail()}"


@pytest.fixture(scope="module")
def cassandra(settings, cassandra_cluster):
    session = cassandra_cluster.connect(settings.keyspace)
    return CassandraCheckpointStore(session, StoreOptions()), CassandraLedger(session)


def now_ms() -> int:
    return int(time.time() * 1000)


def conv() -> str:
    return f"conv_{uuid.uuid4().hex[:10]}"


def uid(prefix: str) -> str:
    """Globally unique id: ``new_id`` counts per process, and the keyspace is shared."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def unique_ids(kw: dict) -> dict:
    kw.setdefault("response_id", uid("resp"))
    kw.setdefault("idempotency_key", uid("idem"))
    return kw


def turn(conversation: str, head: int, **kw):
    return make_turn(conversation_id=conversation, expected_head_seq=head, now_ms=now_ms(),
                     **unique_ids(kw))


def chain(root: str | None, previous: str | None, **kw):
    kw = unique_ids(kw)
    return make_turn(conversation_id=None, chain_root_id=root or kw["response_id"],
                     expected_head_seq=None, previous_response_id=previous, now_ms=now_ms(),
                     **kw)


def outcome(rig, event, timeout_s: float = 90):
    return rig.collector.outcome(event.response_id, timeout_s)


def test_five_turn_conversation(rig, cassandra):
    c = conv()
    turns = [turn(c, head) for head in range(5)]
    rig.send(*turns)
    assert [outcome(rig, t).seq for t in turns] == [1, 2, 3, 4, 5]
    store, ledger = cassandra
    assert store.head(TENANT, c).seq == 5
    assert store.get_checkpoint(TENANT, turns[-1].response_id).seq == 5  # what status says
    assert ledger.conversation_owner(c) == TENANT
    # A Conversation's responses are never a chain's parent: no owner rows for them.
    assert ledger.response_owner(turns[-1].response_id) is None


def test_chain_with_a_fork(rig):
    root = chain(None, None)
    rig.send(root)
    assert outcome(rig, root).seq == 1
    left, right = chain(root.response_id, root.response_id), chain(root.response_id,
                                                                   root.response_id)
    rig.send(left, right)
    grandchild = chain(root.response_id, left.response_id)
    rig.send(grandchild)
    assert (outcome(rig, left).seq, outcome(rig, right).seq) == (2, 2)
    assert outcome(rig, grandchild).seq == 3
    orphan_parent = chain(root.response_id, "resp_never_promoted")
    rig.send(orphan_parent)
    assert outcome(rig, orphan_parent).reason is R.PARENT_NOT_PROMOTED


def test_three_round_tool_loop_with_retried_first_attempt(rig):
    c = conv()
    final, effects = make_tool_loop_turn(rounds=3, conversation_id=c, attempt=2,
                                         now_ms=now_ms(), **unique_ids({}))
    # same partition key as the turn, so the effects are ordered before it
    effects = [e.model_copy(update={"conversation_id": c}) for e in effects]
    # Attempt 1 ran rounds 0 and 1 (reused by attempt 2) and then a different tool in
    # round 2 before the gateway died; attempt 2 redid round 2 and completed.
    stray = make_tool_effect("call_stray", '{"sent": true}', idempotency_key=final.idempotency_key,
                             subturn_index=2, tool_name="send_email", conversation_id=c)
    rig.send(effects[0], effects[1], stray, effects[0], effects[2], final)
    promoted = outcome(rig, final)
    assert isinstance(promoted, CheckpointPromoted) and promoted.seq == 1
    rig.collector.wait(lambda: rig.collector.orphans(final.response_id), 30, "orphans")
    orphans = rig.collector.orphans(final.response_id)
    assert [(o.effect_id, o.reason) for o in orphans] == [
        (stray.effect_id, OrphanReason.ATTEMPT_SUPERSEDED)]


def test_duplicate_redelivery_publishes_the_same_outcome_and_promotes_once(rig, cassandra):
    c = conv()
    t = turn(c, 0)
    rig.send(t, t)
    rig.collector.wait(lambda: len(rig.collector.outcomes(t.response_id)) == 2, 60, "two")
    first, second = rig.collector.outcomes(t.response_id)
    assert first == second and first.seq == 1
    assert cassandra[0].head(TENANT, c).seq == 1


def test_retried_attempt_after_promotion_is_duplicate(rig):
    c = conv()
    original = turn(c, 0)
    retry = turn(c, 0, idempotency_key=original.idempotency_key, attempt=2)
    rig.send(original, retry)
    assert outcome(rig, original).seq == 1
    dup = outcome(rig, retry)
    assert dup.reason is R.DUPLICATE and dup.existing_response_id == original.response_id


def test_retry_by_another_attempt_keeps_the_promoted_attempt_and_its_effects(rig, cassandra):
    # Attempt 1 made two tool calls and was promoted; its gateway lost the answer, and
    # attempt 2 (same response id, key and digest) repeated only the first call.
    c = conv()
    same = {"conversation_id": c, "response_id": uid("resp"), "idempotency_key": uid("idem"),
            "request_digest": "e" * 64, "now_ms": now_ms()}
    first, first_effects = make_tool_loop_turn(rounds=2, **same)
    retry, retry_effects = make_tool_loop_turn(rounds=1, attempt=2, **same)
    # Then a cancelled request of the same Conversation, whose orphan comes after any
    # orphan of the retry on the same partition: once it is seen, all of them were.
    marker, marker_effects = make_tool_loop_turn(rounds=1, conversation_id=c,
                                                 now_ms=now_ms(), **unique_ids({}))
    rig.send(*first_effects, first, *retry_effects, retry, *marker_effects,
             make_turn_cancelled(marker), marker)
    rig.collector.wait(lambda: rig.collector.orphans(marker.response_id), 60, "the marker")
    assert len(rig.collector.outcomes(first.response_id)) == 2
    promoted, answer = rig.collector.outcomes(first.response_id)
    assert (promoted.seq, promoted.attempt) == (1, 1)
    assert (answer.seq, answer.attempt, answer.promoted_at) == (1, 1, promoted.promoted_at)
    stored = cassandra[0].get_checkpoint(TENANT, first.response_id)
    assert stored.accepted_attempt == 1
    assert stored.accepted_effect_ids == tuple(e.effect_id for e in first_effects)
    # Both effects of attempt 1 are promoted, never orphaned. Attempt 2 ran the first
    # call again (a new ToolEffect, another output item under the same effect id): that
    # second execution is in no history, published EFFECT_CONFLICT with its own digest.
    orphans = rig.collector.orphans(first.response_id)
    assert [(o.effect_id, o.reason, o.output_digest) for o in orphans] == [
        (retry_effects[0].effect_id, OrphanReason.EFFECT_CONFLICT,
         retry_effects[0].output.content_digest)]
    assert retry_effects[0].effect_id == first_effects[0].effect_id


def test_a_chains_first_request_retried_under_another_response_id(rig, cassandra):
    # Each attempt is its own partition (and Kafka key): only the request's claim
    # (migration 013) connects them.
    first = chain(None, None)
    retry = first.model_copy(update={"event_id": str(uuid.uuid4()), "attempt": 2,
                                     "response_id": uid("resp"), "chain_root_id": None})
    rig.send(first)
    assert outcome(rig, first).seq == 1
    rig.send(retry)
    rejected = outcome(rig, retry)
    assert (rejected.reason, rejected.existing_response_id) == (R.DUPLICATE,
                                                                 first.response_id)
    assert cassandra[0].get_checkpoint(TENANT, retry.response_id) is None


def test_idempotency_key_reuse(rig):
    c = conv()
    original = turn(c, 0)
    reuse = turn(c, 1, idempotency_key=original.idempotency_key, request_digest="e" * 64)
    rig.send(original, reuse)
    assert outcome(rig, reuse).reason is R.IDEMPOTENCY_KEY_REUSED


def test_two_concurrent_turns_on_one_head(rig, cassandra):
    c = conv()
    a, b = turn(c, 0), turn(c, 0)
    rig.send(a, b)
    results = {type(outcome(rig, a)), type(outcome(rig, b))}
    assert results == {CheckpointPromoted, PromotionRejected}
    loser = next(o for o in (outcome(rig, a), outcome(rig, b)) if o.__class__ is PromotionRejected)
    assert loser.reason is R.CONFLICT and loser.head_seq == 1
    assert cassandra[0].head(TENANT, c).seq == 1


def test_cancel_before_completion(rig, cassandra):
    c = conv()
    t = turn(c, 0)
    rig.send(make_turn_cancelled(t), t)
    assert outcome(rig, t).reason is R.CANCELLED
    status = cassandra[1].status(TENANT, t.response_id)
    assert status.status is ResponseState.REJECTED and status.reason == "CANCELLED"
    assert cassandra[0].head(TENANT, c) is None


@pytest.mark.parametrize("status", [TurnStatus.FAILED, TurnStatus.IN_PROGRESS])
def test_failed_and_in_progress_are_not_promoted(rig, cassandra, status):
    t = turn(conv(), 0, status=status, certified=False)
    rig.send(t)
    assert outcome(rig, t).reason is R.NOT_PROMOTABLE_STATUS
    assert cassandra[1].status(TENANT, t.response_id).status is ResponseState.REJECTED


def test_corrupt_item(rig):
    bad = tampered(message("hi", role="assistant", item_id=new_id("msg")))
    t = turn(conv(), 0, items=[bad])
    rig.send(t)
    assert outcome(rig, t).reason is R.CORRUPT


def test_unknown_item_type(rig):
    t = turn(conv(), 0, items=[make_item("hologram", {"x": 1}, item_id=new_id("it"))])
    rig.send(t)
    assert outcome(rig, t).reason is R.UNKNOWN_ITEM_TYPE


def test_out_of_order(rig):
    t = turn(conv(), 3)
    rig.send(t)
    out = outcome(rig, t)
    assert out.reason is R.OUT_OF_ORDER and out.head_seq == 0


def test_undecodable_records_go_to_dead_letters_and_processing_continues(rig):
    c = conv()
    key = c.encode()
    before = len(rig.collector.dead_letters)
    # valid Avro of a record type that does not belong on the gateway topic
    wrong_type = rig.serde.encode(DeadLetter(error="x", reason=DeadLetterReason.UNKNOWN,
                                             source_topic="t", source_partition=0,
                                             source_offset=0, dead_lettered_at=now_ms()),
                                  rig.topics.gateway_events)
    garbage = {
        DeadLetterReason.BAD_MAGIC_BYTE: b"\x07not avro at all",
        DeadLetterReason.TRUNCATED: b"\x00\x00",
        DeadLetterReason.UNKNOWN_SCHEMA_ID: b"\x00\x7f\xff\xff\xf0" + b"\x02",
        DeadLetterReason.NULL_VALUE: None,
    }
    for value in garbage.values():
        rig.producer.send_raw(key, value)
    rig.producer.send_raw(key, wrong_type)
    after = turn(c, 0)
    rig.send(after)
    assert outcome(rig, after).seq == 1  # the partition kept going
    rig.collector.wait(lambda: len(rig.collector.dead_letters) >= before + 5, 30, "dead letters")
    letters = [s.model for s in rig.collector.dead_letters[before:]
               if s.model.key == key]
    reasons = {letter.reason for letter in letters}
    assert set(garbage) <= reasons
    assert DeadLetterReason.UNEXPECTED_RECORD_TYPE in reasons
    bad_magic = next(x for x in letters if x.reason is DeadLetterReason.BAD_MAGIC_BYTE)
    assert bad_magic.value == garbage[DeadLetterReason.BAD_MAGIC_BYTE]
    assert bad_magic.source_topic == rig.topics.gateway_events and bad_magic.error
    assert rig.worker_process.alive()


def test_health_file_reports_ok(rig):
    from streams.health import read_health

    rig.collector.wait(lambda: read_health(rig.settings.home)["status"] != "down", 30, "health")
    assert read_health(rig.settings.home)["status"] == "ok"


def test_every_outcome_event_is_keyed_like_its_conversation(rig):
    c = conv()
    t = turn(c, 0)
    rig.send(t)
    outcome(rig, t)
    seen = rig.collector.by_response[t.response_id][0]
    gateway_partition = seen.partition
    assert 0 <= gateway_partition < rig.settings.partitions
    assert Path(rig.worker_process.log_path).exists()


def _metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_worker_metrics_count_what_it_published(rig):
    """The worker's /metrics: promotions, rejections by reason, dead letters, LWT and
    validation latency, consumer lag. Counted after a fresh promoted turn, a fresh
    rejected one and a fresh dead letter, as deltas (other tests share this worker)."""
    worker = rig.worker_process

    def serving() -> bool:
        try:
            worker.metrics()
        except OSError:  # the worker is still starting
            return False
        return True

    rig.collector.wait(serving, 60, "the worker's metrics endpoint")
    before = worker.metrics()
    c = conv()
    good, next_turn, ahead = turn(c, 0), turn(c, 1), turn(c, 7)
    rig.send(good)
    assert outcome(rig, good).seq == 1
    rig.send(next_turn)  # the schema and the lineage are known now: the loop's fast path
    assert outcome(rig, next_turn).seq == 2
    rig.send(ahead)
    assert outcome(rig, ahead).reason is R.OUT_OF_ORDER
    rig.producer.send_raw(c.encode(), b"\x07not avro")
    rig.producer.flush()
    rig.collector.wait(
        lambda: _metric(worker.metrics(), "ratchet_worker_dead_letters_total")
        > _metric(before, "ratchet_worker_dead_letters_total"), 30, "dead-letter metric")
    after = worker.metrics()

    def delta(name: str, **labels: str) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    assert delta("ratchet_worker_promotions_total", certification="certified") >= 1
    assert delta("ratchet_worker_rejections_total", reason="OUT_OF_ORDER") >= 1
    assert delta("ratchet_worker_dead_letters_total", reason="BAD_MAGIC_BYTE") >= 1
    # The two promotions; the turn ahead of the head is judged by a SERIAL read, not
    # sent to a conditional write (docs/decisions.md, "Off the head").
    assert delta("ratchet_worker_lwt_seconds_count") >= 2
    assert delta("ratchet_worker_events_total", path="loop") >= 1
    assert delta("ratchet_worker_events_total", path="thread") >= 2  # rejection, dead letter
    assert delta("ratchet_worker_validation_seconds_count") >= 2
    rig.collector.wait(lambda: "ratchet_worker_consumer_lag_records{" in worker.metrics(),
                       10, "consumer lag gauge")
