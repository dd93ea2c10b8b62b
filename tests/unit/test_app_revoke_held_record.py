"""A record the dispatcher holds while the lanes are full (2000 queued events; 1 here)
is not handled once its partition was revoked (or the worker is stopping): its queued
predecessors were dropped unacked for the new owner, so handling it would decide it out
of Kafka order (CONTRACT 4: "per partition key, in Kafka order") and its ack would let
Faust commit past the dropped ones, which nobody would then process ("its offset is not
committed; the partition waits"). ``PartitionLanes`` closes a revoked partition's key
until it is assigned again and refuses work taken before a stop of its key.

(Found by an outside review of the worker's stream layer, 2026-12-04.)
"""
from __future__ import annotations

import asyncio

import pytest
from faust.types import TP
from faust.types.tuples import Message

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions, StoreUnavailable
from services.store.memory import MemoryCheckpointStore
from tests.unit.stream_world import TOPIC, build, dispatch_task
from tests.unit.test_processor_rules import conv_id


@pytest.mark.parametrize("how", ["revoke", "shutdown"])
def test_a_record_held_while_its_partition_is_revoked_is_not_handled(tmp_path, monkeypatch,
                                                                   how):
    store, ledger = MemoryCheckpointStore(StoreOptions()), MemoryLedger()
    release_first = asyncio.Event()

    def gate(record):
        return release_first.wait() if record.offset == 0 else None

    conv = conv_id()
    turns = [make_turn(conversation_id=conv, expected_head_seq=h) for h in range(3)]

    async def scenario():
        w = build(tmp_path, monkeypatch, max_queued=1, store=store, ledger=ledger, gate=gate,
                  lane_share=None)
        task = dispatch_task(w)
        for offset, t in enumerate(turns):
            await w.stream.queue.put(w.event(t, offset))
        for _ in range(50):
            await asyncio.sleep(0.01)
        # offset 0 in flight, offset 1 queued, the agent holds offset 2 (waiting for room)
        assert w.handled == [(0, 0)] and w.app.lanes.depth(w.app.lanes.keys[0]) == 1
        revoking = asyncio.ensure_future(
            w.revoke(0) if how == "revoke" else w.app.on_before_shutdown.send())
        await asyncio.sleep(0.05)
        release_first.set()  # the event in flight finishes within the grace
        await revoking
        for _ in range(50):
            await asyncio.sleep(0.01)
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 20))
    # The new owner re-reads from offset 1 (the committed one): turns 1 and 2, in order.
    from tests.unit.test_processor_rules import Harness
    h = Harness()
    h.store, h.ledger = store, ledger
    h.rewire()
    h.processor.handle(h.record(turns[1]))
    final = h.outcome(turns[2])
    assert (0, 2) not in w.handled, (
        f"offset 2 was handled by the old owner after the revocation, before offset 1 "
        f"(handled {w.handled}, acked {w.acks}); its outcome there: "
        f"{[type(m).__name__ + ':' + str(getattr(m, 'reason', '')) for m in w.outcomes(turns[2].response_id)]}; "
        f"after the new owner's redelivery in Kafka order: {type(final).__name__} "
        f"{getattr(final, 'reason', '')} (in order it is promoted at seq 3)")
    assert isinstance(final, CheckpointPromoted) and final.seq == 3


def test_no_commit_passes_the_records_a_revoked_lane_dropped(tmp_path, monkeypatch):
    store_down = {"p0": True}
    other_gate = asyncio.Event()

    def gate(record):
        if record.partition == 0 and record.offset == 0 and store_down["p0"]:
            async def down():
                raise StoreUnavailable("timeout", retryable=True, operation="promote")
            return down()
        if record.partition == 1:
            return other_gate.wait()  # another partition's event, slow but finishing
        return None

    conv = conv_id()
    turns = [make_turn(conversation_id=conv, expected_head_seq=h) for h in range(3)]
    other = make_turn(conversation_id=conv_id(), expected_head_seq=0)

    async def scenario():
        w = build(tmp_path, monkeypatch, max_queued=1, gate=gate, grace_s=5.0,
                  lane_share=None)
        # Faust's real ack/commit bookkeeping, with the acks our lanes give it.
        faust = w.app._new_consumer()
        monkeypatch.setattr(w.app.topics, "acks_enabled_for", lambda topic: True)
        committed = {}

        class Ev:
            def __init__(self, event):
                self.message = event.message
                self._m = Message(TOPIC, event.message.partition, event.message.offset,
                                  0.0, 0, None, event.message.key, event.message.value,
                                  None)

            def ack(self):
                faust.ack(self._m)

        class Commits:
            async def commit(self, *a, **k):
                tps = [tp for tp in list(faust._acked)]
                committed.update(faust._filter_committable_offsets(tps))

            def assignment(self):
                return set()

        w.app.consumer = Commits()
        tp0, tp1 = TP(TOPIC, 0), TP(TOPIC, 1)
        task = dispatch_task(w)
        await w.stream.queue.put(Ev(w.event(other, 0, partition=1)))
        for offset, t in enumerate(turns):
            await w.stream.queue.put(Ev(w.event(t, offset)))
        for _ in range(50):
            await asyncio.sleep(0.01)
        # p0: offset 0 retrying on the store, offset 1 queued; the agent holds offset 2
        assert w.handled[:2] == [(1, 0), (0, 0)]
        # What Consumer.on_partitions_revoked does first (faust/transport/consumer.py)
        for tp in (tp0, tp1):
            faust._acked.pop(tp, None)
            faust._acked_index.pop(tp, None)
            faust._committed_offset.pop(tp, None)
        revoking = asyncio.ensure_future(w.revoke(0, 1))
        # The store answers again once the revocation has begun (the lane is stopping):
        # offset 0's retry, waiting on persistence, has given up by then. Flipped any
        # earlier, a retry could succeed before the revocation began (CI, 2026-12-04):
        # offset 0 handled to the end, a commit at 1 rightly, and this test not about it.
        while tp0 in w.app.lanes.keys:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)  # the lane's stop has run its first step: stopping
        store_down["p0"] = False
        for _ in range(50):
            await asyncio.sleep(0.01)
        other_gate.set()
        await revoking
        task.cancel()
        await w.app.lanes.stop()
        return w, committed

    w, committed = asyncio.run(asyncio.wait_for(scenario(), 30))
    p0 = [o for p, o in w.handled if p == 0]
    assert committed.get(TP(TOPIC, 0), 0) <= 0, (
        f"partition 0 committed at {committed.get(TP(TOPIC, 0))} on revocation although "
        f"offsets 0 and 1 were never handled to the end (handled on p0: {p0}, acked "
        f"{w.acks or 'see Faust'}): the new owner starts after them")
