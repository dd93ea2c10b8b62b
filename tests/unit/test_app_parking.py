"""A partition whose lane is full is parked, not waited for (``streams/parking.py``).

streams/app.py's own dispatcher with the real PromotionProcessor on the in-memory
backends (``tests/unit/stream_world.py``). The worker's bound here: 8 queued events in
all, so a lane's share is 2. Partition 0's first event hangs (a write that keeps
failing). Before parking, its lane filled the whole bound and the dispatcher waited for
room: partition 1 waited with it. Now partition 0 is paused at the first record its lane
could not take, partition 1 goes on, and once partition 0's lane has room it is resumed
at that record: every one of its records promoted once, in Kafka order.
"""
from __future__ import annotations

import asyncio

from faust.types import TP

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted
from tests.unit.stream_world import TOPIC, build, dispatch_task
from tests.unit.test_processor_rules import conv_id


def fetch_after_seeks(w, log: dict) -> None:
    """As Kafka and Faust after a seek: once the partition is in the fetch set again,
    its records of ``log`` from the seek's offset, after one record taken from Faust
    before the pause that was still on its way to the dispatcher (stale)."""
    seek, resume = w.consumer.seek_wait, w.consumer.resume_partitions
    sought: dict = {}

    async def seek_wait(partitions):
        await seek(partitions)
        sought.update(partitions)

    def resume_partitions(tps):
        resume(tps)
        for tp in tps:
            if tp in sought:
                records = log[tp.partition]
                w.stream.queue.put_nowait(records[-1])  # stale: the last offset
                for event in records[sought.pop(tp):]:
                    w.stream.queue.put_nowait(event)

    w.consumer.seek_wait, w.consumer.resume_partitions = seek_wait, resume_partitions


def test_a_full_lane_parks_its_partition_and_the_others_go_on(tmp_path, monkeypatch):
    hang = asyncio.Event()

    def gate(record):
        return hang.wait() if (record.partition, record.offset) == (0, 0) else None

    slow = conv_id()  # partition 0: one Conversation, 10 turns (any skip or reorder shows)
    slow_turns = [make_turn(conversation_id=slow, expected_head_seq=h) for h in range(10)]
    other_turns = [make_turn(conversation_id=conv_id()) for _ in range(4)]  # partition 1

    async def scenario():
        w = build(tmp_path, monkeypatch, max_queued=8, gate=gate)
        log = {0: [w.event(t, n) for n, t in enumerate(slow_turns)],
               1: [w.event(t, n, partition=1) for n, t in enumerate(other_turns)]}
        fetch_after_seeks(w, log)
        task = dispatch_task(w)
        for event in log[0] + log[1]:
            await w.stream.queue.put(event)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len([h for h in w.handled if h[0] == 1]) == 4 and w.app.parking.paused():
                break
        # partition 1 was handled while partition 0's first event hangs (partition 1
        # may have been parked too, for a moment: its records came in one burst)
        assert [h for h in w.handled if h[0] == 1] == [(1, n) for n in range(4)]
        assert [h for h in w.handled if h[0] == 0] == [(0, 0)]
        # partition 0: paused with its lane at its share, the rest of it not taken (it
        # may have been resumed once: its lane had 0 and 1 queued when it was parked
        # first, and was at half its share once 0 was taken)
        assert w.app.parking.paused() == {TP(TOPIC, 0)}
        assert w.app.lanes.depth(TP(TOPIC, 0)) == 2
        calls = list(w.consumer.calls)
        assert ("pause", 0, None) in calls
        await asyncio.sleep(0.2)
        assert w.consumer.calls == calls  # parked for good while it hangs: no flapping
        hang.set()  # the write succeeds at last
        for _ in range(300):
            await asyncio.sleep(0.01)
            if len([h for h in w.handled if h[0] == 0]) >= 10 and not w.app.parking.paused():
                break
        await w.app.lanes.wait_idle()
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 30))
    # resumed after the hang: back in the fetch, its position moved back to a record
    # its lane had not taken (the one it was parked at; offset 0 was taken)
    mine = [c for c in w.consumer.calls if c[1] == 0]
    assert mine[0] == ("pause", 0, None) and mine[-2][0] == "seek" and mine[-1][0] == "resume"
    assert [c for c in mine if c[0] == "seek"][0][2] in (1, 2, 3)
    assert [h for h in w.handled if h[0] == 0] == [(0, n) for n in range(10)]
    assert [a for a in w.acks if a[0] == 0] == [(0, n) for n in range(10)]
    for head, turn in enumerate(slow_turns):
        outcomes = w.outcomes(turn.response_id)
        assert len(outcomes) == 1 and isinstance(outcomes[0], CheckpointPromoted), outcomes
        assert outcomes[0].seq == head + 1
    assert all(isinstance(w.outcomes(t.response_id)[0], CheckpointPromoted)
               for t in other_turns)


def test_a_revoked_parked_partition_is_not_resumed(tmp_path, monkeypatch):
    """Revoked while parked: no resumption (its new owner starts from the committed
    offset), and once assigned again its records are taken from wherever Faust starts."""
    hang = asyncio.Event()

    def gate(record):
        return hang.wait() if (record.partition, record.offset) == (0, 0) else None

    turns = [make_turn(conversation_id=conv_id()) for _ in range(6)]

    async def scenario():
        w = build(tmp_path, monkeypatch, max_queued=8, gate=gate, grace_s=0.2)
        log = {0: [w.event(t, n) for n, t in enumerate(turns)]}
        fetch_after_seeks(w, log)
        task = dispatch_task(w)
        for event in log[0]:
            await w.stream.queue.put(event)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if w.app.parking.paused():
                break
        assert w.app.parking.paused() == {TP(TOPIC, 0)}
        before = list(w.consumer.calls)
        await w.revoke(0)
        assert w.app.parking.paused() == set()
        hang.set()
        for _ in range(30):
            await asyncio.sleep(0.01)
        calls = w.consumer.calls[len(before):]
        # assigned again: Faust starts from the committed offset (0 here)
        await w.app.on_partitions_assigned.send({TP(TOPIC, 0)})
        for event in log[0]:
            await w.stream.queue.put(event)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(w.acks) == 6:
                break
        task.cancel()
        await w.app.lanes.stop()
        return w, calls

    w, calls = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert calls == []  # not resumed nor seeked by the old parking after the revocation
    # after the reassignment every record is handled again, in order (the first
    # assignment's offset 0 was cut short by the revocation: never acked)
    assert sorted(set(w.acks)) == [(0, n) for n in range(6)]
