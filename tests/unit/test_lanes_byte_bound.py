"""The lanes' memory bound in bytes (streams/lanes.py, RATCHET_LANE_MAX_BYTES): the
events the lanes hold, waiting or in flight, never carry more record bytes than the
bound, so a burst of large turns (up to 10 MiB each, CONTRACT section 4) cannot grow a
worker's memory with its backlog; the count bound (2 000 events) alone let 2 000 such
turns, 20 GiB, wait in one worker. One event larger than the bound still runs, alone:
a valid turn is never refused or stalled for its size.
"""

from __future__ import annotations

import asyncio

from streams.lanes import PartitionLanes

MIB = 1024 * 1024


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


class Gated:
    """A handler whose events finish only when the test releases them; it records the
    lanes' bytes each time an event starts."""

    def __init__(self) -> None:
        self.release: dict[object, asyncio.Event] = {}
        self.started: list[object] = []
        self.lanes: PartitionLanes | None = None
        self.peak = 0

    def gate(self, payload) -> asyncio.Event:
        return self.release.setdefault(payload, asyncio.Event())

    async def handle(self, payload, lane) -> None:
        self.started.append(payload)
        self.peak = max(self.peak, self.lanes.held_bytes())
        await self.gate(payload).wait()


def test_submit_waits_while_the_bytes_held_would_pass_the_bound():
    async def scenario():
        h = Gated()
        lanes = h.lanes = PartitionLanes(h.handle, max_bytes=10 * MIB)
        acked = []
        for n, key in enumerate(["p", "q", "r"]):  # 3 x 3 MiB: 9 MiB held
            assert await lanes.submit(key, n, lambda n=n: acked.append(n), size=3 * MIB)
        assert lanes.held_bytes() == 9 * MIB
        fourth = asyncio.create_task(lanes.submit("s", 3, lambda: acked.append(3),
                                                  size=3 * MIB))
        await asyncio.sleep(0.05)
        assert not fourth.done()  # 12 MiB would pass the bound
        assert not lanes.has_room()  # the fetch watchdog must not count this as a stall
        h.gate(0).set()  # one finishes: 6 MiB held, room for 3 more
        assert await asyncio.wait_for(fourth, 2)
        await asyncio.sleep(0.01)
        assert 3 in h.started
        for n in range(4):
            h.gate(n).set()
        await lanes.wait_idle()
        assert sorted(acked) == [0, 1, 2, 3]
        assert lanes.held_bytes() == 0
        assert h.peak <= 10 * MIB
        await lanes.stop()

    run(scenario())


def test_queued_events_count_as_well_as_the_ones_in_flight():
    """A lane handles one event at a time: the events behind it still hold memory."""
    async def scenario():
        h = Gated()
        lanes = h.lanes = PartitionLanes(h.handle, max_bytes=4 * MIB)
        for n in range(4):  # one partition, 4 x 1 MiB: one in flight, three queued
            assert await lanes.submit("p", n, lambda: None, size=MIB)
        blocked = asyncio.create_task(lanes.submit("p", 4, lambda: None, size=MIB))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        assert lanes.queued() == 3 and lanes.held_bytes() == 4 * MIB
        h.gate(0).set()
        assert await asyncio.wait_for(blocked, 2)
        for n in range(5):
            h.gate(n).set()
        await lanes.wait_idle()
        await lanes.stop()

    run(scenario())


def test_an_event_larger_than_the_bound_runs_alone_and_is_not_refused():
    async def scenario():
        h = Gated()
        lanes = h.lanes = PartitionLanes(h.handle, max_bytes=2 * MIB)
        acked = []
        assert await lanes.submit("p", "small", lambda: acked.append("small"), size=MIB)
        big = asyncio.create_task(lanes.submit("q", "big", lambda: acked.append("big"),
                                               size=8 * MIB))
        await asyncio.sleep(0.05)
        assert not big.done()  # waits for the lanes to be empty ...
        h.gate("small").set()
        assert await asyncio.wait_for(big, 2)  # ... then runs on its own
        after = asyncio.create_task(lanes.submit("r", "after", lambda: acked.append("after"),
                                                 size=1))
        await asyncio.sleep(0.05)
        assert not after.done()  # nothing joins it while it holds more than the bound
        h.gate("big").set()
        assert await asyncio.wait_for(after, 2)
        h.gate("after").set()
        await lanes.wait_idle()
        assert acked == ["small", "big", "after"]
        await lanes.stop()

    run(scenario())


def test_stopping_lanes_gives_their_bytes_back_and_wakes_a_waiting_submit():
    """A revoked partition's queued events are dropped unacked: their bytes must not
    keep the other partitions' records waiting for ever."""
    async def scenario():
        h = Gated()
        lanes = h.lanes = PartitionLanes(h.handle, max_bytes=4 * MIB)
        for n in range(4):
            assert await lanes.submit("revoked", n, lambda: None, size=MIB)
        waiting = asyncio.create_task(lanes.submit("kept", "x", lambda: None, size=MIB))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        stopping = asyncio.create_task(lanes.stop(["revoked"], grace_s=0.1))
        assert await asyncio.wait_for(waiting, 2)  # queued under "kept"
        await stopping
        assert lanes.held_bytes() == MIB
        h.gate("x").set()
        await lanes.wait_idle()
        assert lanes.held_bytes() == 0
        await lanes.stop()

    run(scenario())


def test_a_failed_event_keeps_its_bytes_until_the_lane_stops():
    """An event that is never handled stays unacked (and held): the bound must count it
    until its lane is stopped, not forget it."""
    async def scenario():
        async def handle(payload, lane):
            await asyncio.Event().wait()  # never finishes

        lanes = PartitionLanes(handle, max_bytes=4 * MIB)
        assert await lanes.submit("p", 0, lambda: None, size=3 * MIB)
        await asyncio.sleep(0.01)
        assert lanes.held_bytes() == 3 * MIB
        await lanes.stop(["p"], grace_s=0.05)
        assert lanes.held_bytes() == 0

    run(scenario())


def test_the_worker_dispatcher_holds_back_records_past_the_byte_bound(tmp_path, monkeypatch):
    """streams/app.py's own agent sizes each record (key + value) and waits for room:
    with a bound of two records' bytes, a third record of another partition is not
    handled while the first two are in flight, and is once one finishes (while the other
    is still in flight)."""
    from ratchet.samples import make_turn
    from tests.unit.stream_world import build, dispatch_task

    release = {offset: asyncio.Event() for offset in (0, 1, 2)}
    partition_of = {0: 0, 1: 1, 2: 1}
    turns = [make_turn(conversation_id=f"conv_bytes{p}") for p in (0, 1, 2)]

    def gate(record):
        return release[record.offset].wait()

    async def scenario():
        probe = build(tmp_path, monkeypatch, gate=gate)
        sizes = [len(e.message.key) + len(e.message.value)
                 for e in (probe.event(t, n, partition=partition_of[n])
                           for n, t in enumerate(turns))]
        w = build(tmp_path, monkeypatch, gate=gate, lane_max_bytes=sizes[0] + sizes[1],
                  lane_share=None)
        task = dispatch_task(w)
        for n, t in enumerate(turns):  # offsets 0, 1, 2 on partitions 0, 1, 1
            await w.stream.queue.put(w.event(t, n, partition=partition_of[n]))
        for _ in range(30):
            await asyncio.sleep(0.01)
        assert sorted(w.handled) == [(0, 0), (1, 1)]
        assert w.app.lanes.held_bytes() == sizes[0] + sizes[1]
        release[1].set()  # partition 1's record finishes: room for the third
        for _ in range(50):
            await asyncio.sleep(0.01)
            if (1, 2) in w.handled:
                break
        assert (1, 2) in w.handled  # while offset 0 is still in flight
        release[0].set()
        release[2].set()
        await w.app.lanes.wait_idle()
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert sorted(w.handled) == [(0, 0), (1, 1), (1, 2)]
    assert sorted(w.acks) == [(0, 0), (1, 1), (1, 2)]


# Found by an outside review of the byte bound (2026-12-04): a lane being stopped (a
# revoked partition, up to its grace) still holds its event in flight, and a record
# of a revoked partition must not wait for room it will never use.

def test_the_event_in_flight_of_a_stopping_lane_still_counts():
    async def scenario():
        h = Gated()
        lanes = h.lanes = PartitionLanes(h.handle, max_bytes=10 * MIB)
        assert await lanes.submit("revoked", "big", lambda: None, size=10 * MIB)
        await asyncio.sleep(0.01)
        assert h.started == ["big"]
        stopping = asyncio.create_task(lanes.stop(["revoked"], grace_s=5))
        await asyncio.sleep(0.01)
        assert not stopping.done()  # finishing its event in flight
        assert lanes.held_bytes() == 10 * MIB and not lanes.has_room(1)
        other = asyncio.create_task(lanes.submit("kept", "next", lambda: None,
                                                 size=10 * MIB))
        await asyncio.sleep(0.05)
        assert not other.done()  # 20 MiB would be held
        h.gate("big").set()
        await stopping
        assert await asyncio.wait_for(other, 2)  # the stopped lane's bytes given back
        h.gate("next").set()
        await lanes.wait_idle()
        await lanes.stop()

    run(scenario())


def test_a_waiting_submit_of_a_revoked_key_returns_at_once():
    async def scenario():
        h = Gated()
        lanes = h.lanes = PartitionLanes(h.handle, max_bytes=10 * MIB)
        assert await lanes.submit("busy", "slow", lambda: None, size=8 * MIB)
        waiting = asyncio.create_task(lanes.submit(
            "revoked", "r", lambda: None, generation=lanes.generation("revoked"),
            size=4 * MIB))
        await asyncio.sleep(0.02)
        assert not waiting.done()
        await lanes.stop(["revoked"], grace_s=1)
        assert await asyncio.wait_for(waiting, 1) is False  # while "busy" still holds 8
        assert "r" not in h.started
        h.gate("slow").set()
        await lanes.stop()

    run(scenario())
