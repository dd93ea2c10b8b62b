"""Faust's consumer served on the worker's own loop (``streams/consumer_loop.py``).

Built, not started: no broker is contacted. That the consumer fetches, commits,
rebalances and stops on the loop is what every worker of the integration, e2e and fault
suites does (it is the default); ``tests/integration/test_worker_consumer_thread.py``
keeps Faust's threaded consumer (``RATCHET_WORKER_CONSUMER=thread``) working."""

from __future__ import annotations

import asyncio
import threading

import faust
import pytest

from streams.consumer_loop import FETCH_MIN_BYTES, LoopConsumerApp, WorkerApp
from tests.unit.stream_world import build


def _app(cls: type[faust.App], tmp_path) -> faust.App:
    return cls("unit-consumer-loop", broker="kafka://127.0.0.1:1", web_enabled=False,
               store="memory://", datadir=str(tmp_path / "faust"))


def test_the_consumer_is_served_on_the_apps_loop(tmp_path):
    async def check() -> None:
        consumer = _app(LoopConsumerApp, tmp_path).consumer
        loop = asyncio.get_running_loop()
        assert consumer._thread.thread_loop is loop
        assert consumer._thread.parent_loop is loop

    asyncio.run(check())


def test_a_call_into_the_consumer_runs_in_the_calling_thread(tmp_path):
    """What mode's method queue would run in the consumer's thread runs here, coroutine
    or plain function alike, with its result or its exception."""
    async def check() -> None:
        inner = _app(LoopConsumerApp, tmp_path).consumer._thread
        caller = threading.get_ident()

        async def coroutine(x: int) -> tuple[int, int]:
            return x + 1, threading.get_ident()

        def plain(x: int) -> tuple[int, int]:
            return x * 2, threading.get_ident()

        def fails() -> None:
            raise KeyError("boom")

        assert await inner.call_thread(coroutine, 1) == (2, caller)
        assert await inner.call_thread(plain, x=4) == (8, caller)
        with pytest.raises(KeyError, match="boom"):
            await inner.call_thread(fails)

    asyncio.run(check())


def test_fausts_own_app_keeps_its_consumer_thread(tmp_path):
    async def check() -> None:
        consumer = _app(faust.App, tmp_path).consumer
        assert consumer._thread.thread_loop is not asyncio.get_running_loop()

    asyncio.run(check())


def _worker_consumer(cls: type[faust.App], tmp_path, fetch_wait_ms: int):
    """The aiokafka consumer the worker's app builds when it starts (not started)."""
    app = _app(cls, tmp_path)
    app.fetch_wait_ms = fetch_wait_ms
    inner = app.consumer._thread
    return inner._create_worker_consumer(app.transport)


@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_a_fetch_is_held_for_the_apps_wait(tmp_path, cls):
    """RATCHET_FETCH_WAIT_MS: the broker may hold the worker's fetch until
    FETCH_MIN_BYTES are there or the wait has passed, on either consumer."""
    async def check() -> None:
        consumer = _worker_consumer(cls, tmp_path, 7)
        assert consumer._fetch_max_wait_ms == 7
        assert consumer._fetch_min_bytes == FETCH_MIN_BYTES

    asyncio.run(check())


@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_no_wait_keeps_fausts_fetches(tmp_path, cls):
    """0: a fetch is answered at its first record, as Faust builds it (1 byte, and
    Faust's own 1 500 ms as the longest an empty fetch is held)."""
    async def check() -> None:
        consumer = _worker_consumer(cls, tmp_path, 0)
        assert consumer._fetch_min_bytes == 1
        assert consumer._fetch_max_wait_ms == 1500

    asyncio.run(check())


def test_the_thread_consumer_app_keeps_its_consumer_thread(tmp_path):
    async def check() -> None:
        consumer = _app(WorkerApp, tmp_path).consumer
        assert consumer._thread.thread_loop is not asyncio.get_running_loop()

    asyncio.run(check())


@pytest.mark.parametrize("wait_ms", [0, 9])
def test_the_worker_app_carries_the_fetch_wait_setting(tmp_path, monkeypatch, wait_ms):
    """``create_app`` hands RATCHET_FETCH_WAIT_MS to the app whose consumer reads it."""
    world = build(tmp_path, monkeypatch, fetch_wait_ms=wait_ms)
    assert isinstance(world.app, LoopConsumerApp)
    assert world.app.fetch_wait_ms == wait_ms
