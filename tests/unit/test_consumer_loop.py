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

from streams.consumer_loop import FETCH_MIN_BYTES, LoopConsumerApp, WorkerApp, pace_fetches
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


class _Request:
    """A fetch request as aiokafka builds it: the two values it is sent with."""

    def __init__(self, fetcher: _Fetcher) -> None:
        self._min_bytes, self._max_wait_ms = fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms


class _Fetcher:
    """An aiokafka ``Fetcher`` as ``pace_fetches`` sees it: the two values each fetch
    request is built from, and the call that sends each request and handles its answer
    (True: records)."""

    def __init__(self, answers: list[bool], took_ms: list[float] | None = None) -> None:
        self._fetch_min_bytes, self._fetch_max_wait_ms = 1, 1500  # as Faust builds it
        self.answers = answers
        self.took_ms = took_ms or [0.0] * len(answers)  # how long each answer takes
        # (broker, (min bytes, max wait)) of each request as it was sent
        self.sent: list[tuple[int, tuple[int, int]]] = []
        self.now = 0.0

    @property
    def requests(self) -> list[tuple[int, int]]:
        return [values for _node, values in self.sent]

    def clock(self) -> float:
        return self.now

    async def _proc_fetch_request(self, assignment, node_id, request) -> bool:
        self.sent.append((node_id, (request._min_bytes, request._max_wait_ms)))
        self.now += self.took_ms.pop(0) / 1000
        return self.answers.pop(0)

    async def fetch(self, node_id: int = 0) -> bool:
        """One fetch from broker ``node_id``, its request built as aiokafka does."""
        return await self._proc_fetch_request("assignment", node_id, _Request(self))


FLOWING_7, QUIET = (FETCH_MIN_BYTES, 7), (1, 1500)


def test_fetches_wait_while_records_flow_and_not_once_they_stop():
    """RATCHET_FETCH_WAIT_MS: a fetch after one that brought records is held for
    FETCH_MIN_BYTES or the wait; one after an empty answer is Faust's again (answered at
    its first record, so an idle worker does not poll every few ms and the first turn
    after a quiet spell is not held). The fetcher's own values are never changed."""
    async def check() -> None:
        fetcher = _Fetcher([True, True, False, True, False])
        assert pace_fetches(fetcher, 7, clock=fetcher.clock)
        for _ in range(5):
            await fetcher.fetch()
        assert fetcher.requests == [QUIET, FLOWING_7, FLOWING_7, QUIET, FLOWING_7]
        assert (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == QUIET

    asyncio.run(check())


def test_each_broker_holds_its_fetches_by_its_own_records():
    """Found by an outside review (session 28), fixed in session 29: with one state for
    all brokers, a quiet broker's empty answer ended a busy one's holding, so a cluster
    lost the sharing whenever one of its brokers led no busy partition. Broker 1's
    records flow; broker 2's fetches come back empty in between."""
    async def check() -> None:
        fetcher = _Fetcher([True, False, True, False, True, False])
        assert pace_fetches(fetcher, 7, clock=fetcher.clock)
        for node in (1, 2, 1, 2, 1, 2):
            await fetcher.fetch(node)
        assert fetcher.sent == [(1, QUIET), (2, QUIET), (1, FLOWING_7), (2, QUIET),
                                (1, FLOWING_7), (2, QUIET)]

    asyncio.run(check())


def test_a_trickle_sparser_than_the_wait_costs_one_fetch_per_record():
    """Found by an outside review (session 28): records 25 ms apart with a 5 ms wait each
    cost an answered fetch and then a held one that came back empty, two fetches per
    record. One of Faust's fetches that brought its record only after the wait says
    records are sparser than it: the next is Faust's too. One that brought records
    within the wait (records denser than it) starts holding, as before."""
    async def check() -> None:
        flowing = (FETCH_MIN_BYTES, 5)
        trickle = _Fetcher([True] * 4, took_ms=[25.0] * 4)
        assert pace_fetches(trickle, 5, clock=trickle.clock)
        for _ in range(4):
            await trickle.fetch()
        assert trickle.requests == [QUIET] * 4

        # denser than the wait: held from the second fetch; a held one that brings
        # records after its whole wait still holds (it was asked to wait)
        dense = _Fetcher([True, True, True, False, True],
                         took_ms=[1.0, 5.0, 5.0, 5.0, 30.0])
        assert pace_fetches(dense, 5, clock=dense.clock)
        for _ in range(5):
            await dense.fetch()
        assert dense.requests == [QUIET, flowing, flowing, flowing, QUIET]
        assert (dense._fetch_min_bytes, dense._fetch_max_wait_ms) == QUIET

    asyncio.run(check())


def test_a_fetcher_without_those_members_is_left_as_it_is():
    """Another aiokafka whose fetcher lacks them: False (the worker logs that fetches are
    answered at their first record), nothing patched."""
    class Other:
        _fetch_min_bytes = 1

    other = Other()
    assert not pace_fetches(other, 5)
    assert vars(other) == {}


def test_a_fetcher_whose_requests_do_not_keep_the_values_is_left_as_it_is(monkeypatch):
    """An aiokafka whose fetch request no longer keeps them as members: False too."""
    from streams import consumer_loop

    monkeypatch.setattr(consumer_loop, "_requests_carry_fetch_values", lambda: False)
    fetcher = _Fetcher([True])
    own = fetcher._proc_fetch_request
    assert not pace_fetches(fetcher, 5)
    assert fetcher._proc_fetch_request == own


def test_the_installed_aiokafka_has_what_pace_fetches_uses():
    """Guards an upgrade: the fetcher builds each request from the two values and hands
    each answer to ``_proc_fetch_request``, which says whether records came."""
    import inspect

    from aiokafka.consumer.fetcher import Fetcher

    build = inspect.getsource(Fetcher._get_actions_per_node)
    assert "self._fetch_max_wait_ms" in build and "self._fetch_min_bytes" in build
    routine = inspect.getsource(Fetcher._fetch_requests_routine)
    assert "self._proc_fetch_request(" in routine
    assert list(inspect.signature(Fetcher._proc_fetch_request).parameters) == [
        "self", "assignment", "node_id", "request"]
    answer = inspect.getsource(Fetcher._proc_fetch_request)
    assert "needs_wakeup = True" in answer and "return needs_wakeup" in answer
    # it sends the request and awaits the broker's answer: its time is the fetch's
    assert "await self._client.send(node_id, request)" in answer
    init = inspect.getsource(Fetcher.__init__)
    assert "self._fetch_min_bytes = fetch_min_bytes" in init
    assert "self._fetch_max_wait_ms = fetch_max_wait_ms" in init
    # a request is sent with the two values it holds (pace_fetches sets them there)
    from aiokafka.protocol.fetch import FetchRequest

    held = FetchRequest(1500, 1, 1024, 0, [("t", [(0, 5, 1024)])])
    held._min_bytes, held._max_wait_ms = FETCH_MIN_BYTES, 7
    for version in FetchRequest._CLASSES:  # whichever version the broker speaks
        built = held.build(version)
        assert (built.max_wait_time, built.min_bytes) == (7, FETCH_MIN_BYTES), version


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


class _QueuedCalls:
    """Faust's thread consumer as a seek sees it: each call into the consumer's thread
    is queued and runs when ``run`` says (the thread's turn), and the aiokafka consumer
    records its seeks."""

    def __init__(self, inner) -> None:
        self.queue: list = []
        self.seeks: list[tuple[object, int]] = []
        inner.call_thread = self.call_thread
        inner._ensure_consumer = lambda: self  # the aiokafka consumer
        inner.consumer._read_offset = {}

    def seek(self, tp, offset) -> None:
        self.seeks.append((tp, offset))

    async def position(self, tp) -> int:
        return dict(self.seeks)[tp]

    async def call_thread(self, fun, *args):
        done = asyncio.get_running_loop().create_future()
        self.queue.append((done, fun, args))
        return await done

    async def run(self) -> None:
        """The consumer's thread takes every queued call (its caller may be gone)."""
        while self.queue:
            done, fun, args = self.queue.pop(0)
            try:
                result = await fun(*args)
            except Exception as exc:
                if not done.done():
                    done.set_exception(exc)
            else:
                if not done.done():
                    done.set_result(result)


def _thread_consumer(tmp_path, monkeypatch):
    """The thread consumer of a worker built with RATCHET_WORKER_CONSUMER=thread, its
    calls queued (``_QueuedCalls``) and its rebalance hand-over to Faust a no-op."""
    consumer = _app(WorkerApp, tmp_path).consumer

    async def handed_over(*_args) -> None:
        return None

    monkeypatch.setattr(consumer, "threadsafe_partitions_revoked", handed_over)
    monkeypatch.setattr(consumer, "threadsafe_partitions_assigned", handed_over)
    return consumer._thread, _QueuedCalls(consumer._thread)


def test_a_seek_whose_caller_stopped_waiting_never_runs(tmp_path, monkeypatch):
    """With Faust's consumer thread, a seek that timed out stayed queued and ran later
    (docs/decisions.md, "A full lane parks its partition": left open until session 31).
    Now the caller's leaving expires it: the thread takes it and seeks nothing."""
    async def check() -> None:
        inner, calls = _thread_consumer(tmp_path, monkeypatch)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(inner.seek_wait({"tp-3": 40}), 0.01)
        await calls.run()
        assert calls.seeks == []
        assert inner.consumer._read_offset == {}

        waiting = asyncio.ensure_future(inner.seek_wait({"tp-3": 41}))
        await asyncio.sleep(0)
        await calls.run()
        await waiting
        assert calls.seeks == [("tp-3", 41)]  # one still awaited seeks as before

    asyncio.run(check())


@pytest.mark.parametrize("rebalance", ["revoked", "assigned", "revoked and assigned"])
def test_a_seek_asked_for_before_a_rebalance_does_not_move_the_new_assignment(
        tmp_path, monkeypatch, rebalance):
    """A seek queued before a rebalance and taken by the thread after it (its caller
    still waiting) would move the position the new assignment starts from, past records
    no lane took. It raises ``SeekOutdated`` instead; one asked for afterwards seeks."""
    from streams.consumer_loop import SeekOutdated

    async def check() -> None:
        inner, calls = _thread_consumer(tmp_path, monkeypatch)
        waiting = asyncio.ensure_future(inner.seek_wait({"tp-3": 40}))
        await asyncio.sleep(0)
        if "revoked" in rebalance:
            await inner.on_partitions_revoked({"tp-3"})
        if "assigned" in rebalance:
            await inner.on_partitions_assigned({"tp-3"}, 7)
        await calls.run()
        with pytest.raises(SeekOutdated):
            await waiting
        assert calls.seeks == []

        waiting = asyncio.ensure_future(inner.seek_wait({"tp-3": 40}))
        await asyncio.sleep(0)
        await calls.run()
        await waiting
        assert calls.seeks == [("tp-3", 40)]

    asyncio.run(check())
