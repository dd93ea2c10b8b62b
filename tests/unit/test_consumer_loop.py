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

from streams.consumer_loop import LoopConsumerApp


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
