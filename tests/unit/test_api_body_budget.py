"""The API reads a bounded number of large bodies at once (``BodyBudget``,
``RATCHET_API_BODY_BUDGET_BYTES``). Eight 33 MB completion bodies at once took the API
past its pod's 384 MiB memory limit (found by an outside review of the deployment,
session 25): a body above 1 MiB now waits, unread, for its share of the budget, and
holds it until its answer is sent; small bodies never wait; one larger than the whole
budget runs alone; a chunked body counts as the largest allowed."""

from __future__ import annotations

import asyncio

import pytest

from services.api.body_limit import LARGE_BODY_BYTES, BodyBudget, BodyLimit

MIB = 1024 * 1024


def _run(budget: int, requests: list[dict[bytes, bytes]], max_bytes: int = 32 * MIB) -> int:
    """Serve ``requests`` (their headers) at once; the most handled at one time."""
    inside, most = 0, 0

    async def app(scope, receive, send):
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        await receive()
        await asyncio.sleep(0.01)  # the handler holds the parsed body meanwhile
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
