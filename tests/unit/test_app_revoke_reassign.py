"""A partition revoked while its event is in a pool thread past the grace, then assigned
back to the same worker: the old generation's event is abandoned (its thread runs on,
nothing can stop it), the new generation handles the partition again from the committed
offset. Nothing of the old generation may be published or acked after the revocation,
the new lane must not inherit any of the old one's state, and each event's outcome is
published once, by the new generation, in Kafka order (CONTRACT 4). (An outside review
of the worker across rebalances, session 42.)"""
from __future__ import annotations

import asyncio
import threading

from faust.types import TP

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted
from tests.unit.stream_world import TOPIC, Ev, build, dispatch_task
from tests.unit.test_processor_rules import conv_id


def test_an_event_abandoned_in_its_thread_is_neither_published_nor_acked_after_a_reassign(
        tmp_path, monkeypatch):
    conv = conv_id()
    turns = [make_turn(conversation_id=conv, expected_head_seq=h) for h in range(2)]
    entered, release = threading.Event(), threading.Event()
    calls = {"n": 0}

    async def scenario():
        w = build(tmp_path, monkeypatch, grace_s=0.2)
        processor = w.runtime.processor
        handle = processor.handle

        def hung_once(record):
            calls["n"] += 1
            if calls["n"] == 1:  # the old generation's offset 0: a driver call that hangs
                entered.set()
                release.wait(10)
            return handle(record)

        async def never_on_the_loop(record):
            return None

        processor.handle = hung_once
        processor._loop.promote = never_on_the_loop
        task = dispatch_task(w)
        old_acks: list = []
        for offset, t in enumerate(turns):
            event = w.event(t, offset)
            await w.stream.queue.put(Ev(event.message, old_acks))
        while not entered.is_set():
            await asyncio.sleep(0.01)
        await w.revoke(0)  # the grace ends with offset 0 still in its thread
        published_at_revoke = len(w.producer.sent)
        await w.app.on_partitions_assigned.send({TP(TOPIC, 0)})
        new_acks: list = []
        for offset, t in enumerate(turns):  # from the committed offset (none: 0)
            event = w.event(t, offset)
            await w.stream.queue.put(Ev(event.message, new_acks))
        for _ in range(300):
            if len(new_acks) == 2:
                break
            await asyncio.sleep(0.01)
        release.set()  # the abandoned thread finishes its (idempotent) writes now
        for _ in range(50):
            await asyncio.sleep(0.01)
        task.cancel()
        await w.app.lanes.stop()
        return w, old_acks, new_acks, published_at_revoke

    w, old_acks, new_acks, published_at_revoke = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert published_at_revoke == 0
    assert old_acks == [], f"the old generation acked {old_acks} after its revocation"
    assert new_acks == [(0, 0), (0, 1)]
    for seq, t in enumerate(turns, start=1):
        outcomes = w.outcomes(t.response_id)
        assert [type(o) for o in outcomes] == [CheckpointPromoted], outcomes
        assert outcomes[0].seq == seq
    assert calls["n"] == 3  # offset 0 twice (old, new), offset 1 once (new)
