"""The worker's machinery around the decisions (``streams/lanes.py``, ``retry.py``,
``health.py``, ``parking.py``, ``fetchwatch.py``, ``app.py``, ``consumer_loop.py``):
promises of docs/processor.md that a mutation review (session 43) found no test
holding. Each test names the promise it holds."""

from __future__ import annotations

import asyncio

from streams.lanes import PartitionLanes


def _acks_at_each_commit(w) -> list[list]:
    """The acks the lanes had made at each commit the worker's consumer was asked for
    (filled as the commits come)."""
    noted: list[list] = []
    commit = w.consumer.commit

    async def noting(*a, **k):
        noted.append(list(w.acks))
        return await commit(*a, **k)

    w.consumer.commit = noting
    return noted


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_bug_in_the_handler_is_retried_never_acked_past():
    """An exception other than the retried outages is a bug met by one event: it is
    logged and the same event handled again; it is never acked (nor the events after
    it) before a handling of it returned."""
    async def scenario():
        log: list[tuple[str, int]] = []
        failed = False

        async def handle(payload, lane):
            nonlocal failed
            log.append(("try", payload))
            if payload == 0 and not failed:
                failed = True
                raise RuntimeError("a bug")
            log.append(("done", payload))

        lanes = PartitionLanes(handle)
        for n in range(2):
            await lanes.submit("p", n, lambda n=n: log.append(("ack", n)))
        await lanes.wait_idle()
        await lanes.stop()
        assert log == [("try", 0), ("try", 0), ("done", 0), ("ack", 0),
                       ("try", 1), ("done", 1), ("ack", 1)]

    run(scenario())


def test_a_lanes_share_of_events_is_full_at_exactly_its_share():
    """One lane may hold a quarter of the events bound: a record that finds its lane at
    that share (not past it) is not queued, its partition is parked."""
    async def scenario():
        gate = asyncio.Event()

        async def handle(payload, lane):
            await gate.wait()

        lanes = PartitionLanes(handle, max_queued=8, lane_share=4)  # a share of 2
        await lanes.submit("p", 0, lambda: None)
        while lanes.depth("p"):
            await asyncio.sleep(0)  # 0 in flight
        await lanes.submit("p", 1, lambda: None)
        assert not lanes.lane_full("p")
        await lanes.submit("p", 2, lambda: None)
        assert lanes.depth("p") == 2 and lanes.lane_full("p")
        gate.set()
        await lanes.wait_idle()
        await lanes.stop()

    run(scenario())


def test_the_queued_events_a_stopping_lane_drops_give_their_bytes_back_at_once():
    """A revoked lane drops its queued events unacked at once; only its event in
    flight holds bytes during the grace, so other partitions are not held back by
    records nobody will handle."""
    async def scenario():
        gate = asyncio.Event()
        started = asyncio.Event()

        async def handle(payload, lane):
            started.set()
            await gate.wait()

        lanes = PartitionLanes(handle, max_bytes=1000, lane_share=None)
        await lanes.submit("p", 0, lambda: None, size=100)
        await started.wait()
        for n in range(1, 4):
            await lanes.submit("p", n, lambda: None, size=200)
        assert lanes.held_bytes() == 700
        [lane] = [lane for lane in lanes._lanes.values()]
        stopping = asyncio.create_task(lanes.stop(["p"], grace_s=5))
        while not lane.stopping:  # the stop has begun (dropping the queue is its first step)
            await asyncio.sleep(0)
        assert lanes.held_bytes() == 100  # the one in flight, until it finishes
        assert lanes.has_room(800)
        gate.set()
        await stopping
        assert lanes.held_bytes() == 0

    run(scenario())


def test_a_lanes_share_of_bytes_counts_the_record_and_an_empty_lane_takes_any_one():
    """A lane is full when the record would take its bytes past its share (a quarter
    of ``max_bytes``); a lane holding nothing takes any one record, however large (a
    valid turn is never refused for its size: parking it would park it for ever)."""
    async def scenario():
        gate = asyncio.Event()

        async def handle(payload, lane):
            if payload == "slow":
                await gate.wait()

        lanes = PartitionLanes(handle, max_bytes=1000, lane_share=4)  # a share of 250
        await lanes.submit("p", "quick", lambda: None, size=10)
        await lanes.wait_idle()
        assert not lanes.lane_full("p", 5000)  # the lane exists and holds nothing
        await lanes.submit("p", "slow", lambda: None, size=200)
        assert not lanes.lane_full("p", 50)
        assert lanes.lane_full("p", 51)
        gate.set()
        await lanes.wait_idle()
        await lanes.stop()

    run(scenario())


def test_a_parked_partition_waits_until_its_lane_could_take_its_record_at_half_share():
    """A parked partition resumes once its lane is down to half its share counting the
    record it was parked at (``lane_room(key, size)``), not half without it."""
    async def scenario():
        gate = asyncio.Event()

        async def handle(payload, lane):
            await gate.wait()

        lanes = PartitionLanes(handle, max_bytes=1000, lane_share=4)  # half a share: 125
        await lanes.submit("p", 0, lambda: None, size=100)
        room = asyncio.create_task(lanes.lane_room("p", 50))
        await asyncio.sleep(0.05)
        assert not room.done()  # 100 + 50 > 125: not yet
        gate.set()
        await asyncio.wait_for(room, 5)
        await lanes.wait_idle()
        await lanes.stop()

    run(scenario())


def test_a_revoked_partition_is_closed_until_assigned_again():
    """A record of a revoked partition that the stream still delivers (its generation
    taken after the revocation) is refused, never queued nor acked, until the
    partition is assigned again."""
    async def scenario():
        handled, acked = [], []

        async def handle(payload, lane):
            handled.append(payload)

        lanes = PartitionLanes(handle)
        assert await lanes.submit("p", 0, lambda: acked.append(0), generation=lanes.generation("p"))
        await lanes.wait_idle()
        await lanes.stop(["p"])
        assert not await lanes.submit("p", 1, lambda: acked.append(1),
                                      generation=lanes.generation("p"))
        lanes.reopen(["p"])
        assert await lanes.submit("p", 2, lambda: acked.append(2),
                                  generation=lanes.generation("p"))
        await lanes.wait_idle()
        await lanes.stop()
        assert handled == acked == [0, 2]

    run(scenario())


def test_a_record_held_for_room_across_a_revoke_and_reassign_is_refused():
    """A record the dispatcher took before its partition was revoked, and still held
    while the lanes were full, is refused even once the partition is assigned again:
    its queued predecessors were dropped, it would be decided out of order."""
    async def scenario():
        gate = asyncio.Event()
        handled = []

        async def handle(payload, lane):
            handled.append(payload)
            await gate.wait()

        lanes = PartitionLanes(handle, max_queued=1, lane_share=None)
        await lanes.submit("q", "q0", lambda: None)  # in flight, blocked
        await lanes.submit("q", "q1", lambda: None)  # queued: the lanes are full
        held = asyncio.create_task(lanes.submit("p", "p5", lambda: None,
                                                generation=lanes.generation("p")))
        await asyncio.sleep(0.05)
        assert not held.done()
        await lanes.stop(["p"])
        lanes.reopen(["p"])
        gate.set()
        assert await asyncio.wait_for(held, 5) is False
        await lanes.wait_idle()
        await lanes.stop()
        assert "p5" not in handled

    run(scenario())


def test_a_closed_key_never_waits_for_room():
    """A record held for room whose partition is revoked is refused as soon as the
    revocation begins, not once the lanes have room again: the dispatcher is not held
    up by a record that is no longer its to queue."""
    async def scenario():
        gate = asyncio.Event()

        async def handle(payload, lane):
            await gate.wait()

        lanes = PartitionLanes(handle, max_queued=1, lane_share=None)
        await lanes.submit("p", 0, lambda: None)  # in flight, blocked
        await lanes.submit("p", 1, lambda: None)  # queued: the lanes are full
        held = asyncio.create_task(lanes.submit("p", 2, lambda: None,
                                                generation=lanes.generation("p")))
        await asyncio.sleep(0.05)
        assert not held.done()
        stopping = asyncio.create_task(lanes.stop(["p"], grace_s=5))
        # Refused while the event in flight still runs (the gate is still shut).
        assert await asyncio.wait_for(held, 5) is False
        gate.set()
        await stopping

    run(scenario())


def test_a_bug_is_not_retried_as_an_outage():
    """Only ``Unavailable`` (store, ledger, registry, broker) is retried with backoff
    and reported ``degraded``; any other exception leaves ``retry_until_done`` at once
    (the lane logs it as a bug), the worker's health untouched."""
    from streams.health import Health
    from streams.retry import Backoff, retry_until_done

    async def scenario():
        health = Health()
        calls = []

        async def call():
            calls.append(1)
            raise ValueError("a bug")

        try:
            await retry_until_done(call, lane="p0", health=health,
                                   backoff=Backoff(base_s=0.001, jitter=0), stopping=lambda: False)
        except ValueError:
            pass
        else:
            raise AssertionError("the bug was swallowed")
        assert calls == [1] and health.status == "ok"

    run(scenario())


def test_a_stop_during_a_backoff_step_gives_up_before_another_attempt():
    """A lane stopped while its event waits out a backoff step gives up at that step
    (``LaneStopped``: the event stays unacked), with no further attempt."""
    from services.store.base import StoreUnavailable
    from streams.health import Health
    from streams.retry import Backoff, LaneStopped, retry_until_done

    async def scenario():
        calls = []
        asked = []

        async def call():
            calls.append(1)
            if len(calls) == 1:
                raise StoreUnavailable("down", retryable=True, operation="promote")
            return "done"

        def stopping() -> bool:  # the stop comes during the first backoff step
            asked.append(1)
            return len(asked) > 1

        try:
            await retry_until_done(call, lane="p0", health=Health(),
                                   backoff=Backoff(base_s=0.05, jitter=0), stopping=stopping)
        except LaneStopped:
            pass
        else:
            raise AssertionError("a stopped lane made another attempt")
        assert calls == [1]

    run(scenario())


# --- the dispatcher and the revoke handler (``streams/app.py``, with tests/unit/stream_world.py)


def test_a_record_refused_after_a_revocation_does_not_hide_the_redelivery(tmp_path, monkeypatch):
    """A record of a revoked partition that the stream still delivers is refused; once
    the partition is assigned again its records come again from the committed offset,
    and every one of them is handled (the refused one was never dispatched: it must not
    count as "already in its lane")."""
    from faust.types import TP

    from ratchet.samples import make_turn
    from tests.unit.stream_world import TOPIC, build, dispatch_task
    from tests.unit.test_processor_rules import conv_id

    conv = conv_id()
    turns = [make_turn(conversation_id=conv, expected_head_seq=h) for h in range(3)]

    async def scenario():
        w = build(tmp_path, monkeypatch)
        task = dispatch_task(w)
        await w.revoke(0)
        await w.stream.queue.put(w.event(turns[2], 2))  # fetched before the revocation
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert w.handled == []
        await w.app.on_partitions_assigned.send({TP(TOPIC, 0)})
        for offset, t in enumerate(turns):  # from the committed offset, 0
            await w.stream.queue.put(w.event(t, offset))
        await w.until_acked(3, polls=100)
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert w.handled == [(0, 0), (0, 1), (0, 2)] and w.acks == [(0, 0), (0, 1), (0, 2)]


def test_what_a_revoked_lane_acks_during_its_grace_is_committed(tmp_path, monkeypatch):
    """A revocation lets the event in flight finish (the grace) and then commits what
    the lanes acked, that event included: its next owner does not handle it again."""
    from ratchet.samples import make_turn
    from tests.unit.stream_world import build, dispatch_task
    from tests.unit.test_processor_rules import conv_id

    release = asyncio.Event()
    turn = make_turn(conversation_id=conv_id(), expected_head_seq=0)

    async def scenario():
        w = build(tmp_path, monkeypatch, gate=lambda record: release.wait(), grace_s=5.0)
        acked_at_commit = _acks_at_each_commit(w)
        task = dispatch_task(w)
        await w.stream.queue.put(w.event(turn, 0))
        while not w.handled:
            await asyncio.sleep(0.01)
        revoking = asyncio.ensure_future(w.revoke(0))
        await asyncio.sleep(0.05)
        release.set()  # finishes within the grace
        await revoking
        task.cancel()
        await w.app.lanes.stop()
        return w, acked_at_commit

    w, acked_at_commit = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert w.acks == [(0, 0)]
    assert any((0, 0) in acked for acked in acked_at_commit), acked_at_commit


def test_an_event_is_acked_only_once_the_broker_acknowledged_its_outcomes(tmp_path, monkeypatch):
    """Step 2 of the commit order waits for the broker's acknowledgement of every
    outcome, not only for the send: a delivery that fails is retried like an outage
    (``PublishUnavailable``), and the event is acked once, after a delivery that
    succeeded."""
    from ratchet.samples import make_turn
    from tests.unit.stream_world import build, dispatch_task
    from tests.unit.test_processor_rules import conv_id

    turn = make_turn(conversation_id=conv_id(), expected_head_seq=0)

    async def scenario():
        w = build(tmp_path, monkeypatch)
        deliveries: list[str] = []

        async def send(topic, key, value, partition, timestamp, headers):
            fut = asyncio.get_running_loop().create_future()
            if not deliveries:
                deliveries.append("failed")
                fut.set_exception(RuntimeError("not enough in-sync replicas"))
            else:
                deliveries.append("delivered")
                fut.set_result(None)
            return fut

        w.producer.send = send
        task = dispatch_task(w)
        await w.stream.queue.put(w.event(turn, 0))
        await w.until_acked(1, polls=200)
        task.cancel()
        await w.app.lanes.stop()
        return w, deliveries

    w, deliveries = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert deliveries[0] == "failed" and "delivered" in deliveries
    assert w.acks == [(0, 0)] and w.handled == [(0, 0), (0, 0)]


def test_an_outcome_that_cannot_be_encoded_is_an_outage_not_a_bug(tmp_path, monkeypatch):
    """Encoding an outcome asks the registry; any failure of it is ``PublishUnavailable``:
    retried with backoff and reported ``degraded`` while it lasts, then acked."""
    from ratchet.samples import make_turn
    from tests.unit.stream_world import build, dispatch_task
    from tests.unit.test_processor_rules import conv_id

    turn = make_turn(conversation_id=conv_id(), expected_head_seq=0)

    async def scenario():
        w = build(tmp_path, monkeypatch)
        encode = w.runtime.codec.encode
        failures = []
        retried = []

        def flaky(topic, model):
            if not failures:
                failures.append(1)
                raise ConnectionError("registry unreachable")
            return encode(topic, model)

        w.runtime.codec.encode = flaky
        retrying = w.runtime.health.retrying
        w.runtime.health.retrying = lambda lane, error, **kw: (retried.append(error),
                                                             retrying(lane, error, **kw))
        task = dispatch_task(w)
        await w.stream.queue.put(w.event(turn, 0))
        await w.until_acked(1, polls=300)
        task.cancel()
        await w.app.lanes.stop()
        return w, retried

    w, retried = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert w.acks == [(0, 0)]
    assert retried and "registry unreachable" in retried[0]
    assert w.runtime.health.status == "ok"


def test_the_health_file_counts_the_outcomes(tmp_path, monkeypatch):
    """The worker's health file counts what it promoted, rejected and dead-lettered."""
    from ratchet.samples import make_turn
    from tests.unit.stream_world import build, dispatch_task
    from tests.unit.test_processor_rules import conv_id

    conv = conv_id()
    promoted = make_turn(conversation_id=conv, expected_head_seq=0)
    rejected = make_turn(conversation_id=conv, expected_head_seq=5)  # OUT_OF_ORDER

    async def scenario():
        w = build(tmp_path, monkeypatch)
        task = dispatch_task(w)
        await w.stream.queue.put(w.event(promoted, 0))
        await w.stream.queue.put(w.event(rejected, 1))
        await w.until_acked(2, polls=200)
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 20))
    snapshot = w.runtime.health.snapshot()
    assert (snapshot["promoted"], snapshot["rejected"], snapshot["dead_lettered"]) == (1, 1, 0)


# --- health (``streams/health.py``) -----------------------------------------------------


def test_the_worker_is_degraded_while_any_lane_retries_and_since_the_first():
    """``degraded`` from the first lane that retries until the last one recovered;
    ``degraded_since`` is when it became degraded, not the latest retry."""
    from streams.health import Health

    health = Health()
    health.retrying("events[0]", "store: timeout")
    since = health.snapshot()["degraded_since"]
    health.retrying("events[1]", "store: timeout")
    assert health.snapshot()["degraded_since"] == since
    health.recovered("events[0]")
    assert health.status == "degraded" and health.is_retrying("events[1]")
    health.recovered("events[1]")
    assert health.status == "ok" and health.snapshot()["degraded_since"] is None
    # What it says of an error is bounded (the file is rewritten every 2 s).
    health.retrying("events[2]", "x" * 100_000)
    assert len(health.snapshot()["retrying"]["events[2]"]) == 500


def test_read_health_folds_the_live_workers_files(tmp_path):
    """``read_health``: ``degraded`` if any live worker retries, ``ok`` if one reports
    ok, ``down`` without a live one; a file whose heartbeat is stale (a hung worker) or
    whose process is gone does not count."""
    import json
    import os
    import subprocess
    import sys
    import time

    from streams.health import STALE_AFTER_S, Health, health_path, read_health

    assert read_health(tmp_path)["status"] == "down"
    ok = Health(health_path(tmp_path))
    ok.write()
    assert read_health(tmp_path)["status"] == "ok"
    # A second live worker (the test's parent process stands in for it), degraded.
    other = Health(health_path(tmp_path, os.getppid()))
    other._state.pid = os.getppid()
    other.retrying("events[3]", "store: timeout")
    assert read_health(tmp_path)["status"] == "degraded"
    assert len(read_health(tmp_path)["workers"]) == 2
    # Stale: as if both stopped writing long ago.
    later = time.time() + STALE_AFTER_S + 1
    assert read_health(tmp_path, now=later)["status"] == "down"
    # A worker whose process is gone: its file does not count.
    other.remove()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    state = {**ok.snapshot(), "pid": dead, "status": "degraded"}
    health_path(tmp_path, dead).write_text(json.dumps(state))
    assert read_health(tmp_path)["status"] == "ok"
    assert [w["pid"] for w in read_health(tmp_path)["workers"]] == [os.getpid()]


def test_a_partition_in_fausts_flow_control_may_still_be_handed_over():
    """``may_hand_over``: Faust hands over records of a partition in its fetch set, and
    also of one in its flow control's set (``_buffered_partitions``) even when paused:
    a resumption must hold such a partition through another batch."""
    from faust.types import TP

    from streams.consumer_loop import _ParkingSupport

    tp = TP("t", 0)

    class Consumer(_ParkingSupport):
        def __init__(self):
            self._buffered_partitions = set()
            self.active = set()

        def _get_active_partitions(self):
            return self.active

        def pause_partitions(self, tps):
            self.active.difference_update(tps)

    consumer = Consumer()
    assert not consumer.may_hand_over(tp)
    consumer._buffered_partitions.add(tp)
    assert consumer.may_hand_over(tp)
    consumer.hold_partitions([tp])
    assert not consumer.may_hand_over(tp)


def test_a_shutdown_commits_what_the_lanes_acked_and_removes_the_health_file(
        tmp_path, monkeypatch):
    """SIGTERM: the lanes finish the event in flight, what they acked is committed (that
    event included: the partition's next owner does not handle it again), and the
    health file is removed (a stopped worker is not a live one)."""
    from ratchet.samples import make_turn
    from streams.health import Health, health_path
    from tests.unit.stream_world import build, dispatch_task
    from tests.unit.test_processor_rules import conv_id

    release = asyncio.Event()
    turn = make_turn(conversation_id=conv_id(), expected_head_seq=0)

    async def scenario():
        w = build(tmp_path, monkeypatch, gate=lambda record: release.wait(), grace_s=5.0)
        w.runtime.health = Health(health_path(tmp_path))
        w.runtime.health.write()
        acked_at_commit = _acks_at_each_commit(w)
        task = dispatch_task(w)
        await w.stream.queue.put(w.event(turn, 0))
        while not w.handled:
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(w.app.on_before_shutdown.send())
        await asyncio.sleep(0.05)
        release.set()  # finishes within the grace
        await stopping
        task.cancel()
        return w, acked_at_commit

    w, acked_at_commit = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert w.acks == [(0, 0)]
    assert any((0, 0) in acked for acked in acked_at_commit), acked_at_commit
    assert not health_path(tmp_path).exists()
