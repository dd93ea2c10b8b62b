"""Fault injection against the real servers: a killed worker, a stopped Cassandra.

What must hold (checked independently of the worker, by reading Cassandra and the
checkpoints topic):

* no lost promotion: every valid turn ends promoted, each conversation's head is its
  last turn;
* no duplicate promotion: each response id is promoted at exactly one seq (an outcome
  may be re-published after a redelivery, always identical), seqs gap-free, in order;
* nothing is published as promoted while Cassandra is down.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from ratchet.samples import TENANT, make_turn
from schemas.models import CheckpointPromoted
from services.store.base import StoreOptions, StoreUnavailable
from services.store.cassandra import CassandraCheckpointStore
from streams.health import read_health
from streams.testing import Rig, isolated_settings

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def conversation_turns(conversations: int, turns: int):
    now = int(time.time() * 1000)
    plan = []
    for _ in range(conversations):
        conv = f"conv_{uuid.uuid4().hex[:12]}"
        plan.append([make_turn(conversation_id=conv, expected_head_seq=head, now_ms=now,
                               response_id=f"resp_{uuid.uuid4().hex[:12]}",
                               idempotency_key=f"idem_{uuid.uuid4().hex[:12]}")
                     for head in range(turns)])
    return plan


def promoted_seqs(rig: Rig) -> dict[str, set[int]]:
    """response_id -> every seq it was published as promoted with (must be one)."""
    found: dict[str, set[int]] = {}
    with rig.collector._lock:
        seen = list(rig.collector.all)
    for s in seen:
        if isinstance(s.model, CheckpointPromoted):
            found.setdefault(s.model.response_id, set()).add(s.model.seq)
    return found


def assert_promoted_exactly_once_in_order(rig: Rig, plan, store) -> None:
    seqs = promoted_seqs(rig)
    for turns in plan:
        for expected_seq, t in enumerate(turns, start=1):
            assert seqs.get(t.response_id) == {expected_seq}, (t.response_id, seqs.get(
                t.response_id), rig.collector.outcomes(t.response_id))
        head = store.head(TENANT, turns[0].conversation_id)
        assert head is not None and head.seq == len(turns)
        assert head.response_id == turns[-1].response_id


def store_answers(store) -> bool:
    try:
        store.head(TENANT, "conv_probe")
    except StoreUnavailable:
        return False
    return True


@pytest.fixture
def rig(settings, tmp_path):
    rig = Rig(isolated_settings(settings, "faults", home=tmp_path / "home"))
    yield rig
    rig.close()


@pytest.fixture
def store(settings, cassandra_cluster):
    return CassandraCheckpointStore(cassandra_cluster.connect(settings.keyspace), StoreOptions())


def progress_report(rig: Rig, plan) -> str:
    """Which turns have no promotion yet, where their events sit, what became of them."""
    seqs = promoted_seqs(rig)
    missing = [t for turns in plan for t in turns if t.response_id not in seqs]
    by_partition: dict[int | None, list[str]] = {}
    for t in missing:
        partition, offset = rig.producer.placed.get(t.response_id, (None, None))
        outcomes = [type(o).__name__ + (f"({o.reason})" if hasattr(o, "reason") else "")
                    for o in rig.collector.outcomes(t.response_id)]
        by_partition.setdefault(partition, []).append(
            f"offset {offset} {t.response_id}: {outcomes or 'no outcome'}")
    lines = [f"{len(seqs)} of {sum(map(len, plan))} turns promoted (events sent twice by the"
             f" test producer: {rig.producer.resent}; reported delivered without an offset:"
             f" {rig.producer.unconfirmed}); missing by partition:"]
    for partition in sorted(by_partition, key=lambda p: -1 if p is None else p):
        lines.append(f"  partition {partition}: {len(by_partition[partition])} missing, "
                     f"first {by_partition[partition][:3]}")
    return "\n".join(lines)


def wait_or_explain(rig: Rig, plan, workers, condition, timeout_s: float, why: str) -> None:
    """``rig.collector.wait``, failing with the missing turns and the workers' logs."""
    try:
        rig.collector.wait(condition, timeout_s, why)
    except TimeoutError as exc:
        tails = "\n".join(w.log_tail(6000) + w.stacks() for w in workers)
        pytest.fail(f"{exc}\n{progress_report(rig, plan)}\n{tails}", pytrace=False)


def test_worker_killed_mid_stream_and_restarted_loses_and_duplicates_nothing(rig, store,
                                                                              tmp_path):
    plan = conversation_turns(conversations=40, turns=5)
    first = rig.worker(tmp_path, "first")
    workers = [first]
    try:
        for round_ in range(5):  # turn k of every conversation, then turn k+1 ...
            rig.producer.deliver(*[turns[round_] for turns in plan])
        wait_or_explain(rig, plan, workers, lambda: len(promoted_seqs(rig)) >= 60, 120,
                        "first promotions")
        first.kill()  # SIGKILL: no commit, no cleanup, mid-stream
        killed_at = len(promoted_seqs(rig))
        assert killed_at < 200, "the worker finished before it could be killed; use more turns"
        second = rig.worker(tmp_path, "second")
        workers.append(second)
        wait_or_explain(rig, plan, workers, lambda: len(promoted_seqs(rig)) == 200, 180,
                        "all promotions")
        assert_promoted_exactly_once_in_order(rig, plan, store)
        assert not any(rig.collector.outcomes(t.response_id)[-1].__class__ is not
                       CheckpointPromoted for turns in plan for t in turns)
    finally:
        # Whatever failed above, no worker outlives the test (a leaked worker would
        # keep consuming this run's topics next to the following tests).
        first.kill()
        codes = [w.terminate() for w in workers[1:]]
    assert codes == [0], "\n".join(w.log_tail() for w in workers[1:])


def test_a_partition_starved_after_assignment_is_recovered_by_the_fetch_watchdog(
        rig, store, tmp_path):
    """The symptom of the upstream stall (an assigned partition Faust no longer fetches),
    injected on purpose: the watchdog must notice it, name it, and recover it in-process
    (nothing lost, nothing promoted twice, the worker not restarted).

    Without the watchdog (RATCHET_FETCH_STALL_S=0) this test times out: the starved
    partition's turns after the first are never promoted."""
    plan = conversation_turns(conversations=12, turns=3)
    for round_ in range(3):
        rig.producer.deliver(*[turns[round_] for turns in plan])
    starved = rig.producer.placed[plan[0][0].response_id][0]
    worker = rig.worker(tmp_path, "worker", env={"RATCHET_TEST_STARVE_PARTITION": str(starved),
                                                 "RATCHET_FETCH_STALL_S": "5"})
    try:
        wait_or_explain(rig, plan, [worker], lambda: len(promoted_seqs(rig)) == 36, 180,
                        "all promotions")
        assert_promoted_exactly_once_in_order(rig, plan, store)
        log = worker.log_tail(200_000)
        assert f"test hook: partition {starved} taken out of the fetch set" in log
        assert f"fetch watchdog: partition {starved} owes records" in log, log
        assert f"fetch watchdog: partition {starved} resumed and seeked" in log, log
        assert worker.alive()
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_tail()


def test_cassandra_down_20s_nothing_promoted_then_everything_once_in_order(
        rig, store, settings, tmp_path):
    from infra import launcher

    plan = conversation_turns(conversations=12, turns=6)
    worker = rig.worker(tmp_path, "worker")
    stop_feeding = threading.Event()

    def feed() -> None:  # a steady stream: one turn of every conversation per round
        for round_ in range(6):
            rig.producer.deliver(*[turns[round_] for turns in plan])
            if stop_feeding.wait(3.0):
                return

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        rig.collector.wait(lambda: read_health(rig.settings.home)["status"] != "down", 60,
                           "worker health file")
        feeder.start()
        rig.collector.wait(lambda: len(promoted_seqs(rig)) >= 12, 120, "first promotions")
        launcher.stop_server(settings, "cassandra", out=lambda _msg: None)
        down_since = time.monotonic()
        time.sleep(3)  # events already durable before the stop may still be published
        promoted_while_down = len(promoted_seqs(rig))
        rig.collector.wait(lambda: read_health(rig.settings.home)["status"] == "degraded", 30,
                           "degraded health")
        time.sleep(max(0.0, 20 - (time.monotonic() - down_since)))
        assert len(promoted_seqs(rig)) == promoted_while_down, "promoted while Cassandra down"
        assert worker.alive()
    finally:
        launcher.start_server(settings, "cassandra", out=lambda _msg: None)
    feeder.join(timeout=60)
    try:
        rig.collector.wait(lambda: len(promoted_seqs(rig)) == 72, 240, "all promotions")
        # The worker can finish before this test's own driver session has reconnected
        # (it retries every few seconds): wait for the verifier, not for the worker.
        rig.collector.wait(lambda: store_answers(store), 60, "the verifier's session")
        assert_promoted_exactly_once_in_order(rig, plan, store)
        rig.collector.wait(lambda: read_health(rig.settings.home)["status"] == "ok", 30,
                           "health back to ok")
    finally:
        stop_feeding.set()
        assert worker.terminate() == 0, worker.log_tail()
