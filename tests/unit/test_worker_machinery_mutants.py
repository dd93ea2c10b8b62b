"""The worker's machinery around the decisions (``streams/lanes.py``, ``retry.py``,
``health.py``, ``parking.py``, ``fetchwatch.py``, ``app.py``, ``consumer_loop.py``):
promises of docs/processor.md that a mutation review (session 43) found no test
holding. Each test names the promise it holds."""

from __future__ import annotations

import asyncio

from streams.lanes import PartitionLanes


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
