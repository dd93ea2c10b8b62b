"""With RATCHET_LANE_WINDOW > 1 two events of one partition can wait on persistence at
once: the worker is ``degraded`` until the last of them succeeds (docs/processor.md:
"the worker is `degraded` until the first success", per event). Health kept one entry
per partition, so the first event to recover cleared it and the worker said "ok" while
the other still waited. (Found by an outside review of the worker's stream layer,
2026-12-04.)
"""
from __future__ import annotations

import asyncio

from services.store.base import StoreUnavailable
from streams.health import Health
from streams.lanes import PartitionLanes
from streams.retry import Backoff, retry_until_done


def test_health_stays_degraded_while_any_event_of_the_partition_retries():
    health = Health()
    backoff = Backoff(base_s=0.5, factor=1.0, cap_s=0.5, jitter=0.0)
    b_down = True
    a_fails = 2
    samples = []

    async def scenario():
        nonlocal a_fails

        async def handle(payload, lane):
            async def call():
                nonlocal a_fails
                if payload == "a" and a_fails:
                    a_fails -= 1
                    raise StoreUnavailable("a: timeout", retryable=True, operation="promote")
                if payload == "b" and b_down:
                    raise StoreUnavailable("b: timeout", retryable=True, operation="promote")
            await retry_until_done(call, lane="gw[0]", health=health, backoff=backoff,
                                   stopping=lambda: lane.stopping)

        lanes = PartitionLanes(handle, window=2)
        acked = []
        await lanes.submit("gw[0]", "b", lambda: acked.append("b"), order_key=b"kb")
        await lanes.submit("gw[0]", "a", lambda: acked.append("a"), order_key=b"ka")
        for _ in range(150):  # 1.5 s: a recovers after ~1 s, b keeps waiting
            samples.append(health.status)
            await asyncio.sleep(0.01)
        assert acked == []  # b (offset first) still unfinished: nothing acked
        await lanes.stop(grace_s=0.1)

    asyncio.run(asyncio.wait_for(scenario(), 10))
    first_degraded = samples.index("degraded")
    assert "ok" not in samples[first_degraded:], (
        "health said 'ok' while event b of the partition was still retrying persistence: "
        + "".join("D" if s == "degraded" else "o" for s in samples))
