"""The pre-warmer and the notifier's hand-off to it (services/api/prewarm.py, notifier.py).

Pinned: a promotion record is warmed on the serving event loop (scheduled from the
notifier's thread, never blocking it), at most ``capacity`` at once; a promotion that
woke a waiting request is not warmed (that request reads the row itself), one that woke
nobody is; rejections and undecodable records are never warmed."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from services.api.notifier import DecisionNotifier
from services.api.prewarm import Prewarmer
from services.api.waiters import PromotionWaiters

TOPICS = {"ck": "promoted", "rj": "rejected"}


def _record(response_id: str) -> SimpleNamespace:
    return SimpleNamespace(tenant_id="t", partition_key="conv", response_id=response_id)


def _notifier(waiters: PromotionWaiters, handed: list) -> DecisionNotifier:
    def decode(topic: str, value: bytes):
        if value == b"bad":
            raise ValueError("undecodable")
        return _record(value.decode())

    return DecisionNotifier("unused:9092", TOPICS, waiters, decode, on_promoted=handed.append)


def test_a_promotion_nobody_waits_for_is_handed_to_the_prewarmer():
    handed: list = []
    _notifier(PromotionWaiters(), handed)._handle("ck", b"resp_1")
    assert [r.response_id for r in handed] == ["resp_1"]


def test_a_promotion_that_woke_a_waiting_request_is_not_warmed_beside_it():
    async def scenario() -> tuple[list, str | None]:
        waiters, handed = PromotionWaiters(), []
        ticket = waiters.register("resp_1")
        _notifier(waiters, handed)._handle("ck", b"resp_1")
        await asyncio.wait_for(ticket.event.wait(), 1)
        return handed, ticket.decision

    handed, decision = asyncio.run(scenario())
    assert handed == [] and decision == "promoted"


def test_a_woken_request_learns_where_the_record_says_its_response_lives():
    async def scenario() -> list[tuple[str, str] | None]:
        waiters = PromotionWaiters()
        promoted, rejected = waiters.register("resp_1"), waiters.register("resp_2")
        notifier = _notifier(waiters, [])
        notifier._handle("ck", b"resp_1")
        notifier._handle("rj", b"resp_2")
        for ticket in (promoted, rejected):
            await asyncio.wait_for(ticket.event.wait(), 1)
        return [promoted.found_in, rejected.found_in]

    assert asyncio.run(scenario()) == [("t", "conv"), ("t", "conv")]


def test_rejections_and_undecodable_records_are_never_warmed():
    handed: list = []
    notifier = _notifier(PromotionWaiters(), handed)
    notifier._handle("rj", b"resp_1")
    notifier._handle("ck", b"bad")
    assert handed == []


def test_warm_ups_run_on_the_attached_loop_scheduled_from_another_thread():
    async def scenario() -> tuple[list, set]:
        loops, seen = set(), []

        async def warm(tenant_id: str, partition_key: str, response_id: str) -> bool:
            loops.add(asyncio.get_running_loop())
            seen.append((tenant_id, partition_key, response_id))
            return True

        prewarmer = Prewarmer(warm)
        prewarmer.attach(asyncio.get_running_loop())
        sender = threading.Thread(target=lambda: [prewarmer.promoted(_record(f"r{i}")) for i in range(3)])
        sender.start()
        sender.join()
        for _ in range(50):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        return seen, loops

    seen, loops = asyncio.run(scenario())
    assert seen == [("t", "conv", "r0"), ("t", "conv", "r1"), ("t", "conv", "r2")]
    assert len(loops) == 1


def test_at_most_capacity_warm_ups_run_at_once_and_a_failure_does_not_stop_warming():
    async def scenario() -> tuple[list, list]:
        release = asyncio.Event()
        started: list[str] = []

        async def warm(tenant_id: str, partition_key: str, response_id: str) -> bool:
            started.append(response_id)
            if response_id == "boom":
                raise RuntimeError("store hiccup")
            await release.wait()
            return True

        prewarmer = Prewarmer(warm, capacity=2)
        prewarmer.attach(asyncio.get_running_loop())
        for rid in ("a", "b", "c"):  # c finds two running: dropped
            prewarmer.promoted(_record(rid))
        await asyncio.sleep(0.05)
        first = list(started)
        release.set()
        await asyncio.sleep(0.05)
        for rid in ("boom", "d"):
            prewarmer.promoted(_record(rid))
        await asyncio.sleep(0.05)
        return first, started

    first, started = asyncio.run(scenario())
    assert first == ["a", "b"]
    assert started == ["a", "b", "boom", "d"]


def test_before_start_up_nothing_is_warmed():
    calls: list = []

    async def warm(*job: str) -> bool:
        calls.append(job)
        return True

    Prewarmer(warm).promoted(_record("r"))
    assert calls == []
