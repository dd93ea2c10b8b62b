"""Per-partition lanes: order within a partition, progress across partitions.

These are the properties the Faust agent relies on (see streams/lanes.py): a slow or
retrying partition must not stall the others, and acks must come out in offset
order per partition, never past an unfinished event.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from schemas.errors import RegistryUnavailable
from services.ledger.base import LedgerUnavailable
from services.store.base import StoreUnavailable
from streams.health import Health
from streams.lanes import PartitionLanes
from streams.retry import Backoff, LaneStopped, PublishUnavailable, retry_until_done


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_one_blocked_partition_does_not_stall_the_others():
    async def scenario():
        gate = asyncio.Event()
        handled: list[tuple[str, int]] = []
        acked: list[tuple[str, int]] = []

        async def handle(payload, lane):
            key, n = payload
            if key == "slow":
                await gate.wait()
            handled.append(payload)

        lanes = PartitionLanes(handle)
        await lanes.submit("slow", ("slow", 0), lambda: acked.append(("slow", 0)))
        for n in range(50):
            for key in ("a", "b"):
                await lanes.submit(key, (key, n), lambda p=(key, n): acked.append(p))
        while len(acked) < 100:
            await asyncio.sleep(0.01)
        assert ("slow", 0) not in acked  # still waiting, never acked early
        assert [n for k, n in acked if k == "a"] == list(range(50))
        gate.set()
        await lanes.wait_idle()
        assert ("slow", 0) in acked
        await lanes.stop()

    run(scenario())


def test_events_of_one_partition_are_handled_one_at_a_time_in_order():
    async def scenario():
        active = 0
        seen = []

        async def handle(payload, lane):
            nonlocal active
            active += 1
            assert active == 1
            await asyncio.sleep(0.001)
            seen.append(payload)
            active -= 1

        lanes = PartitionLanes(handle)
        for n in range(30):
            await lanes.submit("p", n, lambda: None)
        await lanes.wait_idle()
        assert seen == list(range(30))
        await lanes.stop()

    run(scenario())


def test_submit_waits_for_room_when_the_lanes_are_full():
    async def scenario():
        gate = asyncio.Event()

        async def handle(payload, lane):
            await gate.wait()

        lanes = PartitionLanes(handle, max_queued=3)
        for n in range(4):  # the 4th waits until the lane takes the 1st
            await lanes.submit("p", n, lambda: None)
        assert lanes.queued() == 3
        blocked = asyncio.create_task(lanes.submit("q", 99, lambda: None))
        await asyncio.sleep(0.05)
        assert not blocked.done()  # lane "p" is stuck in handle(0), 3 queued
        gate.set()
        await asyncio.wait_for(blocked, 2)
        await lanes.wait_idle()
        await lanes.stop()

    run(scenario())


def test_stopping_a_lane_finishes_the_event_in_flight_and_drops_the_queue_unacked():
    async def scenario():
        started = asyncio.Event()
        release = asyncio.Event()
        acked = []

        async def handle(payload, lane):
            started.set()
            await release.wait()

        lanes = PartitionLanes(handle)
        for n in range(5):
            await lanes.submit("p", n, lambda n=n: acked.append(n))
        await started.wait()
        stopping = asyncio.create_task(lanes.stop(grace_s=5))
        await asyncio.sleep(0.05)
        release.set()
        await stopping
        assert acked == [0]  # in flight finished and acked; 1..4 left for redelivery

    run(scenario())


def test_retry_reports_degraded_until_persistence_is_back():
    async def scenario():
        health = Health()
        attempts = 0
        states = []

        async def flaky():
            nonlocal attempts
            attempts += 1
            states.append(health.status)
            if attempts < 4:
                raise StoreUnavailable("cassandra down", retryable=True)
            return "done"

        result = await retry_until_done(flaky, lane="p0", health=health,
                                        backoff=Backoff(base_s=0.001, cap_s=0.01),
                                        stopping=lambda: False)
        assert result == "done" and attempts == 4
        assert states == ["ok", "degraded", "degraded", "degraded"]
        assert health.status == "ok"

    run(scenario())


def test_retry_gives_up_only_when_the_lane_stops():
    async def scenario():
        async def down():
            raise PublishUnavailable("down")

        stop = False

        async def flip():
            nonlocal stop
            await asyncio.sleep(0.1)
            stop = True

        flipper = asyncio.create_task(flip())
        with pytest.raises(LaneStopped):
            await retry_until_done(down, lane="p0", health=Health(),
                                   backoff=Backoff(base_s=0.01, cap_s=0.02),
                                   stopping=lambda: stop)
        await flipper

    run(scenario())


def test_backoff_is_capped_exponential():
    b = Backoff(base_s=0.1, factor=2, cap_s=1.0, jitter=0)
    assert [b.delay(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


# --- a window of events in flight per partition (RATCHET_LANE_WINDOW) ----------------------


def test_window_runs_other_keys_beside_a_slow_one_and_acks_in_offset_order():
    async def scenario():
        gate = asyncio.Event()
        acked: list[int] = []
        active = peak = 0

        async def handle(payload, lane):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            if payload == 0:
                await gate.wait()
            await asyncio.sleep(0.001)
            active -= 1

        lanes = PartitionLanes(handle, window=4)
        for n in range(12):  # offset n, key n % 6: offsets 0 and 6 share the slow key
            await lanes.submit("p", n, lambda n=n: acked.append(n), order_key=n % 6)
        await asyncio.sleep(0.2)
        # offset 0 blocks: nothing is acked past it although later offsets finished
        assert acked == []
        assert peak == 4  # never more than the window in flight
        gate.set()
        await lanes.wait_idle()
        assert acked == list(range(12))
        await lanes.stop()

    run(scenario())


def test_owed_counts_the_events_in_flight_and_queued_until_acked():
    """The consumer-lag gauge counts ``owed``: a partition whose one event retried a
    storage outage read 0 when only the queue was counted (an operator's review)."""
    async def scenario():
        gate = asyncio.Event()

        async def handle(payload, lane):
            await gate.wait()

        lanes = PartitionLanes(handle)
        await lanes.submit("p", 0, lambda: None)
        await asyncio.sleep(0.01)
        assert (lanes.depth("p"), lanes.owed("p")) == (0, 1)  # in flight
        await lanes.submit("p", 1, lambda: None)
        assert (lanes.depth("p"), lanes.owed("p")) == (1, 2)
        gate.set()
        await lanes.wait_idle()
        assert lanes.owed("p") == 0 and lanes.owed("never") == 0
        await lanes.stop()

    run(scenario())


def test_window_handles_one_key_one_event_at_a_time_in_order():
    async def scenario():
        seen: list[tuple[str, int]] = []
        busy: set[str] = set()

        async def handle(payload, lane):
            key, n = payload
            assert key not in busy  # never two events of one key at once
            busy.add(key)
            await asyncio.sleep(0.002 * (3 - n % 3))  # later events are faster
            busy.discard(key)
            seen.append(payload)

        lanes = PartitionLanes(handle, window=8)
        for n in range(30):
            key = "abc"[n % 3]
            await lanes.submit("p", (key, n), lambda: None, order_key=key)
        await lanes.wait_idle()
        for key in "abc":
            assert [n for k, n in seen if k == key] == [n for n in range(30) if "abc"[n % 3] == key]
        await lanes.stop()

    run(scenario())


def test_window_stop_never_acks_past_an_unfinished_event():
    async def scenario():
        release = asyncio.Event()
        acked: list[int] = []

        async def handle(payload, lane):
            if payload == 0:
                await release.wait()  # never released: the lane stops with it in flight
                raise LaneStopped()

        lanes = PartitionLanes(handle, window=4)
        for n in range(4):
            await lanes.submit("p", n, lambda n=n: acked.append(n), order_key=n)
        await asyncio.sleep(0.05)
        stopping = asyncio.create_task(lanes.stop(grace_s=0.2))
        await asyncio.sleep(0.05)
        release.set()
        await stopping
        assert acked == []  # 1-3 finished, but 0 did not: none of them is acked

    run(scenario())


@pytest.mark.parametrize("error,named", [
    (RegistryUnavailable("registry answered 503"), "the schema registry"),
    (StoreUnavailable("no replica", retryable=True), "the checkpoint store (Cassandra)"),
    (LedgerUnavailable("timeout"), "the effect ledger (Cassandra)"),
    (PublishUnavailable("broker down"), "Kafka or the schema registry (publishing outcomes)"),
])
def test_the_retry_log_names_what_is_unavailable(caplog, error, named):
    """A registry answering 503 or 403 was logged as "persistence unavailable" (a
    review, session 33): the operator looked at Cassandra."""
    async def scenario():
        attempts = 0

        async def flaky():
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                raise error
            return "done"

        with caplog.at_level(logging.INFO, logger="streams.retry"):
            await retry_until_done(flaky, lane="p0", health=Health(),
                                   backoff=Backoff(base_s=0.001, cap_s=0.001),
                                   stopping=lambda: False)

    run(scenario())
    assert f"p0: {named} unavailable, retrying: {error}" in caplog.text
    assert f"p0: {named} back after 1 retries" in caplog.text
