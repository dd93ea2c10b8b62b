"""A dead letter whose publication fails: the record's offset is not acked (so never
committed) until its dead letter is on the broker, the partition waits meanwhile (the
next record is not handled before it: Kafka order), and a revocation during the
retries leaves it unacked for the next owner (CONTRACT 4: "undecodable -> dead
letters; never skip silently"). (An outside review of the worker across rebalances,
session 42: held.)"""
from __future__ import annotations

import asyncio

import pytest

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted, DeadLetter
from tests.unit.stream_world import TOPIC, Ev, Msg, build, dispatch_task
from tests.unit.test_processor_rules import conv_id


@pytest.mark.parametrize("revoked", [False, True])
def test_a_dead_letter_not_published_is_never_acked_and_holds_its_partition(
        tmp_path, monkeypatch, revoked):
    conv = conv_id()
    turn = make_turn(conversation_id=conv, expected_head_seq=0)
    broker_down = {"dead-letters": True}

    async def scenario():
        w = build(tmp_path, monkeypatch, grace_s=1.0)
        send = w.producer.send

        async def failing_send(topic, key, value, *rest):
            if topic.endswith("dead-letters") and broker_down["dead-letters"]:
                raise ConnectionError("broker away")
            return await send(topic, key, value, *rest)

        w.producer.send = failing_send
        task = dispatch_task(w)
        garbage = Msg(TOPIC, 0, 0, turn.conversation_id.encode(), b"\x00not avro")
        await w.stream.queue.put(Ev(garbage, w.acks))
        await w.stream.queue.put(w.event(turn, 1))
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert w.acks == [] and (0, 1) not in w.handled  # waits, in order
        assert w.runtime.health.status == "degraded"
        if revoked:
            await w.revoke(0)
        else:
            broker_down["dead-letters"] = False
            await w.until_acked(2, polls=300)
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 30))
    letters = [m for _t, _k, m in w.producer.sent if isinstance(m, DeadLetter)]
    if revoked:
        assert w.acks == [] and letters == [] and w.outcomes(turn.response_id) == []
    else:
        assert w.acks == [(0, 0), (0, 1)]
        assert [(d.source_partition, d.source_offset) for d in letters] == [(0, 0)]
        assert [type(o) for o in w.outcomes(turn.response_id)] == [CheckpointPromoted]
