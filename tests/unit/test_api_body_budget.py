"""The API reads a bounded number of large bodies at once (``BodyBudget``,
``RATCHET_API_BODY_BUDGET_BYTES``). Eight 33 MB completion bodies at once took the API
past its pod's 384 MiB memory limit (found by an outside review of the deployment,
session 25): a body above 256 KiB now waits, unread, for its share of the budget, and
holds it until its answer is sent; small bodies never wait; one larger than the whole
budget runs alone; a chunked body counts as the largest allowed."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.api.body_limit import LARGE_BODY_BYTES, BodyBudget, BodyLimit

MIB = 1024 * 1024


def _run(budget: int, requests: list[dict[bytes, bytes]], max_bytes: int = 32 * MIB) -> int:
    """Serve ``requests`` (their headers) at once; the most handled at one time."""
    inside, most = 0, 0

    async def app(scope, receive, send):
        nonlocal inside, most
        await receive()  # the body is read: from here on the handler holds it
        inside += 1
        most = max(most, inside)
        await asyncio.sleep(0.01)
        inside -= 1

    limited = BodyLimit(app, max_bytes=max_bytes, budget=BodyBudget(budget))

    async def one(headers):
        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}
        scope = {"type": "http", "headers": list(headers.items())}
        await limited(scope, receive, lambda message: asyncio.sleep(0))

    async def main():
        await asyncio.gather(*(one(h) for h in requests))

    asyncio.run(main())
    return most


def length(n: int) -> dict[bytes, bytes]:
    return {b"content-length": str(n).encode()}


def test_large_bodies_share_the_budget():
    assert _run(10 * MIB, [length(6 * MIB)] * 4) == 1
    assert _run(10 * MIB, [length(3 * MIB)] * 4) == 3


def test_small_bodies_and_reads_never_wait():
    assert _run(2 * MIB, [length(LARGE_BODY_BYTES)] * 6 + [{}] * 4) == 10


def test_a_body_larger_than_the_budget_runs_alone():
    assert _run(4 * MIB, [length(20 * MIB)] * 3 + [length(2 * MIB)]) == 1


def test_a_chunked_body_counts_as_the_largest_allowed():
    chunked = {b"transfer-encoding": b"chunked"}
    assert _run(40 * MIB, [chunked] * 2, max_bytes=32 * MIB) == 1


def test_a_budget_must_be_positive():
    with pytest.raises(ValueError):
        BodyBudget(0)


# A second review (session 25) found the first version's budget unfair and easy to hold.


def test_a_large_body_is_not_starved_by_a_stream_of_smaller_large_bodies():
    """Every release woke every waiter and whichever fitted went first: 40 clients
    looping on 2 MiB bodies kept a 32 MiB body waiting for as long as they ran."""
    async def app(scope, receive, send):
        await receive()
        await asyncio.sleep(0.02)

    limited = BodyLimit(app, max_bytes=32 * MIB, budget=BodyBudget(64 * MIB))

    async def request(n: int) -> None:
        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}
        await limited({"type": "http", "headers": list(length(n).items())}, receive,
                      lambda message: asyncio.sleep(0))

    async def main() -> float:
        stop = time.monotonic() + 2.0

        async def client():
            while time.monotonic() < stop:
                await request(2 * MIB)

        clients = [asyncio.ensure_future(client()) for _ in range(40)]
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        await asyncio.wait_for(request(32 * MIB), timeout=5)
        waited = time.monotonic() - t0
        await asyncio.gather(*clients)
        return waited

    assert asyncio.run(main()) < 1.0  # served in its turn, not after the load


def test_a_body_that_never_arrives_holds_no_share_and_one_that_stops_gets_a_408(
        monkeypatch):
    """A client that declared 32 MiB and sent nothing held its share for as long as it
    kept the connection open. The share is now taken at the body's first bytes, and a
    body that stops arriving for BODY_READ_TIMEOUT_S is refused, its share returned."""
    import services.api.body_limit as body_limit

    monkeypatch.setattr(body_limit, "BODY_READ_TIMEOUT_S", 0.2)
    budget = BodyBudget(32 * MIB)
    answered = []

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        answered.append(scope["name"])

    limited = BodyLimit(app, max_bytes=32 * MIB, budget=budget)
    never = asyncio.Event()

    async def silent():  # declares 32 MiB, sends nothing
        await never.wait()

    async def stops():  # sends a first chunk, then nothing
        if not stops.sent:
            stops.sent = True
            return {"type": "http.request", "body": b"x", "more_body": True}
        await never.wait()
    stops.sent = False

    async def honest():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def call(name, receive, n=32 * MIB):
        scope = {"type": "http", "name": name, "headers": list(length(n).items())}
        await limited(scope, receive, lambda message: asyncio.sleep(0))

    async def main():
        idle = [asyncio.ensure_future(call(f"idle{i}", silent)) for i in range(2)]
        await asyncio.sleep(0.05)
        await asyncio.wait_for(call("honest", honest), timeout=1)  # not behind the idle
        with pytest.raises(body_limit.BodyStalled):
            await call("stops", stops)
        assert budget.held == 0  # the stalled body's share came back
        for task in idle:
            task.cancel()

    asyncio.run(main())
    assert answered == ["honest"]
