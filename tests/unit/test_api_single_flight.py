"""Concurrent full reads of one history share one read (services/api/flights.py),
session 44.

N requests for a response the cache does not hold yet each read and verified its
history from the store (left open in session 43). Now requests whose read has not begun
share it, an error reaches each of them and is not kept, and a request that arrives
after a read began does not take that read's answer (a promotion it was told of may
have come after it): it shares the next read. The store's full read is gated: it reads
at once (the snapshot) and answers when the test opens the gate, as a Cassandra round
trip would; ``read_history`` counts the store's full reads."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from services.api import flights
from services.api.flights import SingleFlight
from services.store.base import StoreUnavailable
from services.store.hints import _Hints
from tests.unit.test_api_cache import CachingStack
from tests.unit.test_api_http import FP, message, uid

N = 10


class Gated:
    """The store's full reads answer when ``gate`` opens; ``fail`` makes them raise."""

    def __init__(self, stack: CachingStack) -> None:
        self.gate = asyncio.Event()
        self.fail: Exception | None = None
        real = stack.store.read_history_async

        async def gated(*args, **kwargs):
            result = await real(*args, **kwargs)  # read now: this is its snapshot
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
            return result

        stack.store.read_history_async = gated


async def _progress() -> None:
    """Lets every started request run up to where it waits (no wall clock)."""
    for _ in range(50):
        await asyncio.sleep(0)


def _history(stack: CachingStack, tenant: str, rid: str):
    return stack.service.response_history(tenant, rid, FP, 0)


def test_concurrent_cold_reads_of_one_response_share_one_store_read():
    """Ten requests for a response not cached yet, the first of them cancelled (its
    client left) once the read is under way: one store read answers the nine others."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))

    async def run():
        gated = Gated(stack)
        before = stack.reads.get("read_history", 0)
        requests = [asyncio.ensure_future(_history(stack, tenant, rid)) for _ in range(N)]
        await _progress()
        requests[0].cancel()
        await _progress()
        gated.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await requests[0]
        answers = await asyncio.gather(*requests[1:])
        return answers, stack.reads.get("read_history", 0) - before

    answers, reads = asyncio.run(run())
    assert {a.outcome for a in answers} == {"certified"}
    assert len({a.payload for a in answers}) == 1
    assert reads <= 2, f"{N} concurrent cold reads made {reads} store reads"


def test_a_failed_shared_read_fails_every_request_that_shared_it_and_is_not_kept():
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))

    async def run():
        gated = Gated(stack)
        gated.fail = StoreUnavailable("cassandra timed out", retryable=True)
        before = stack.reads.get("read_history", 0)
        requests = [asyncio.ensure_future(_history(stack, tenant, rid)) for _ in range(N)]
        await _progress()
        gated.gate.set()
        results = await asyncio.gather(*requests, return_exceptions=True)
        shared = stack.reads.get("read_history", 0) - before
        gated.fail = None
        again = await _history(stack, tenant, rid)  # read again: the failure is not kept
        return results, shared, again, stack.reads.get("read_history", 0) - before

    results, shared, again, reads = asyncio.run(run())
    assert all(isinstance(r, StoreUnavailable) for r in results), results
    assert shared == 1, f"{N} concurrent reads made {shared} store reads"
    assert again.outcome == "certified" and reads == 2


def test_a_request_after_a_read_began_shares_the_next_read_not_that_ones_answer():
    """A read began before the response was promoted (it finds nothing); two requests
    arrive after the promotion: they are answered from one read begun after them
    (certified), never from the read that began before (a woken waiter would read "not
    found" again and sleep to its deadline)."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = "resp_" + uid("r")

    async def run():
        gated = Gated(stack)
        before = stack.reads.get("read_history", 0)
        early = asyncio.ensure_future(_history(stack, tenant, rid))
        await _progress()  # its read began: nothing promoted
        stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),),
                      response_id=rid)
        late = [asyncio.ensure_future(_history(stack, tenant, rid)) for _ in range(2)]
        await _progress()
        gated.gate.set()
        return (await early, await asyncio.gather(*late),
                stack.reads.get("read_history", 0) - before)

    early, late, reads = asyncio.run(run())
    assert early.reason == "NOT_FOUND"
    assert [a.outcome for a in late] == ["certified", "certified"]
    assert reads == 2, f"3 requests made {reads} store reads (one began before two)"


def test_concurrent_cold_reads_of_one_conversation_share_at_most_two_store_reads(monkeypatch):
    """The same on the Conversation endpoint. Each request first tries an extension
    in the thread pool, so some may come back after the first read began: those share
    the next read (at most two in all, where each request read once)."""
    # Sharing, not overtaking (tested below): a read gated while the requests come
    # back from the pool is not overtaken, however long a loaded machine takes.
    monkeypatch.setattr(flights, "OVERTAKE_AFTER_S", 3600.0)
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    for seq in range(3):
        stack.promote(tenant, conv, seq, (message(f"turn {seq}", item_id=uid("msg")),))

    arrived = 0
    real_run = SingleFlight.run

    async def counted_run(self, key, read):
        nonlocal arrived
        arrived += 1
        return await real_run(self, key, read)

    monkeypatch.setattr(SingleFlight, "run", counted_run)

    async def run():
        gated = Gated(stack)
        before = stack.reads.get("read_history", 0)
        requests = [asyncio.ensure_future(stack.service.conversation_history(tenant, conv, FP))
                    for _ in range(N)]
        # Every request's extension attempt comes back from the thread pool before the
        # gate opens (on a loaded machine some came back after the second read began,
        # and made a third: a test of the machine, not of the sharing).
        for _ in range(30_000):
            if arrived == N:
                break
            await asyncio.sleep(0.001)
        assert arrived == N, f"{arrived} of {N} requests reached the shared read"
        gated.gate.set()
        answers = await asyncio.gather(*requests)
        return answers, stack.reads.get("read_history", 0) - before

    answers, reads = asyncio.run(run())
    assert {a.outcome for a in answers} == {"certified"}
    assert len({a.payload for a in answers}) == 1
    assert reads <= 2, f"{N} concurrent cold reads made {reads} store reads"


def test_a_request_whose_hint_differs_does_not_take_another_hints_read():
    """A response promoted before migration 007 has no claim: only a request naming its
    partition (``partition_key``) finds it. A request without the hint and one with it,
    concurrent: each is answered by a read made with its own hint (keyed by the hint
    too), so the hinted one is certified, not the unhinted read's 404."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))
    del stack.store._claims[(tenant, rid)]  # as before migration 007
    stack.store._hints.locations = _Hints(64)  # another replica's store: it saw nothing

    async def run():
        gated = Gated(stack)
        unhinted = asyncio.ensure_future(_history(stack, tenant, rid))
        hinted = asyncio.ensure_future(
            stack.service.response_history(tenant, rid, FP, 0, partition_key=conv))
        await _progress()
        gated.gate.set()
        return await unhinted, await hinted

    unhinted, hinted = asyncio.run(run())
    assert unhinted.status_code == 404
    assert hinted.outcome == "certified", hinted


# -- each request's own exception (session 45) ---------------------------------------


def test_each_request_that_shared_a_failed_read_raises_an_exception_of_its_own():
    """One exception object was raised in every request that joined a failed read: its
    traceback was the last raise's (a request's log showed another's frames), and a
    request raising it inside an ``except`` set its ``__context__`` for all. Now each
    gets its own: the read's type, message, attributes and frames, plus its own frames;
    the Nth request's traceback is no longer than the first's."""
    stack = CachingStack(cache_bytes=64 << 20)
    tenant, conv = uid("tenant"), uid("conv")
    rid = stack.promote(tenant, conv, 0, (message("hello", item_id=uid("msg")),))
    caught: list[tuple[BaseException, int]] = []

    async def request(inside_handler: bool) -> None:
        try:
            if inside_handler:  # e.g. a request served while handling its own error
                try:
                    raise KeyError("this request's own")
                except KeyError:
                    await _history(stack, tenant, rid)
            else:
                await _history(stack, tenant, rid)
        except StoreUnavailable as exc:
            caught.append((exc, len(traceback.extract_tb(exc.__traceback__))))

    async def run():
        gated = Gated(stack)
        gated.fail = StoreUnavailable("cassandra timed out", retryable=True, operation="read")
        requests = [asyncio.ensure_future(request(inside_handler=i == 0)) for i in range(N)]
        await _progress()
        gated.gate.set()
        await asyncio.gather(*requests)

    asyncio.run(run())
    assert len(caught) == N
    errors = [exc for exc, _ in caught]
    assert len({id(exc) for exc in errors}) == N, "one object raised in every request"
    assert all(str(e) == "cassandra timed out" and e.retryable and e.operation == "read"
               for e in errors)
    # each traceback, looked at once every request raised, is the one it was raised with
    lengths_now = [len(traceback.extract_tb(exc.__traceback__)) for exc in errors]
    assert lengths_now == [n for _, n in caught]
    assert lengths_now[-1] <= lengths_now[0]
    # the read's own frame is in each (where it failed), and only the first request's
    # handled KeyError is its context
    assert all(any(f.name == "gated" for f in traceback.extract_tb(e.__traceback__))
               for e in errors)
    with_key_error = [e for e in errors if isinstance(e.__context__, KeyError)]
    assert len(with_key_error) == 1


def test_the_nth_requests_traceback_is_no_longer_than_the_firsts_at_any_depth():
    """Requests calling from different depths: each traceback is its own depth's, not
    the deepest one's (with one shared object the first request's exception showed the
    last raise's frames once that had raised)."""
    flights: SingleFlight[int] = SingleFlight("response")
    gate = asyncio.Event()
    seen: list[tuple[BaseException, int]] = []

    async def read() -> int:
        await gate.wait()
        raise RuntimeError("the read failed")

    async def nested(depth: int) -> int:
        if depth == 0:
            return await flights.run("key", read)
        return await nested(depth - 1)

    async def request(depth: int) -> None:
        try:
            await nested(depth)
        except RuntimeError as exc:
            seen.append((exc, len(traceback.extract_tb(exc.__traceback__))))

    async def run():
        requests = [asyncio.ensure_future(request(depth)) for depth in range(5)]
        await _progress()
        gate.set()
        await asyncio.gather(*requests)

    asyncio.run(run())
    at_raise = [n for _, n in seen]
    assert at_raise == sorted(at_raise) and len(set(at_raise)) == 5  # one per depth
    assert [len(traceback.extract_tb(e.__traceback__)) for e, _ in seen] == at_raise



class _Slotted(Exception):
    """An exception whose attribute lives in a slot, not in ``__dict__``."""

    __slots__ = ("where",)

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


class _OwnInitOSError(OSError):
    """An ``OSError`` with an ``__init__`` of its own: its errno is set there."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)


def _state(exc: BaseException) -> dict[str, object]:
    """What a handler or a log line can read of an exception: its text and every
    attribute (C-level fields and slots included; None for one that cannot be read)."""
    seen = {name: getattr(exc, name, None) for name in dir(exc) if not name.startswith("__")}
    return {"str": str(exc), "repr": repr(exc),
            **{name: value for name, value in seen.items() if not callable(value)}}


@pytest.mark.parametrize(("error", "copied"), [
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), True),
    (_OwnInitOSError(32, "Broken pipe"), True),
    (ImportError("no module", name="missing_module", path="/nowhere"), True),
    (SyntaxError("bad", ("f.py", 1, 2, "text")), True),
    (_Slotted("failed", where="the read"), False),  # no copy reads as it: shared
], ids=lambda param: type(param).__name__)
def test_every_request_reads_the_shared_reads_error_as_the_read_raised_it(error, copied):
    """An exception whose state is not its ``args`` and ``__dict__`` (fields set by its
    ``__init__`` in C, a slot) was copied without it (``__new__`` with the args): a
    request raised a ``UnicodeDecodeError`` or an ``OSError`` whose message was empty,
    an ``ImportError`` that named no module, an exception whose slot could not be read
    (an outside review, session 46). Each request's exception reads as the read's: a
    copy of its own built by ``copy.copy`` (with its ``__init__``) where the bare copy
    lacks a field, the read's own object where no copy reads as it."""
    flights: SingleFlight[int] = SingleFlight("response")
    gate = asyncio.Event()
    seen: list[BaseException] = []

    async def read() -> int:
        await gate.wait()
        raise error

    async def request() -> None:
        try:
            await flights.run("key", read)
        except type(error) as exc:
            seen.append(exc)

    async def run():
        requests = [asyncio.ensure_future(request()) for _ in range(3)]
        await _progress()
        gate.set()
        await asyncio.gather(*requests)

    expected = _state(error)
    asyncio.run(run())
    assert len(seen) == 3
    assert all(type(exc) is type(error) for exc in seen)
    assert [_state(exc) for exc in seen] == [expected] * 3
    assert len({id(exc) for exc in seen}) == (3 if copied else 1)


# -- a stuck read does not hold the requests after it (session 45) -------------------

BOUND_S = 0.05  # the tests' OVERTAKE_AFTER_S
LONG_S = 10.0  # a deadline that only a request held by a stuck read reaches


class Reads:
    """Reads of one key that each wait for their own release; ``begun`` in order."""

    def __init__(self) -> None:
        self.begun: list[asyncio.Event] = []
        self.began = asyncio.Event()

    async def read(self) -> int:
        release = asyncio.Event()
        self.begun.append(release)
        index = len(self.begun)
        self.began.set()
        await release.wait()
        return index

    async def until_begun(self, count: int) -> None:
        while len(self.begun) < count:
            self.began.clear()
            await asyncio.wait_for(self.began.wait(), LONG_S)


def test_a_request_behind_a_stuck_read_begins_its_own_after_the_bound():
    """Read 1 never ends (stuck until the driver's timeout); a request arriving after it
    began used to wait for it to end before its own began. Now its read begins once it
    waited ``OVERTAKE_AFTER_S``: it is answered while read 1 still runs, by a read begun
    after it arrived (never read 1's answer)."""
    flights: SingleFlight[int] = SingleFlight("response", overtake_after_s=BOUND_S)

    async def run():
        reads = Reads()
        first = asyncio.ensure_future(flights.run("key", reads.read))
        await reads.until_begun(1)
        late = asyncio.ensure_future(flights.run("key", reads.read))
        await reads.until_begun(2)
        reads.begun[1].set()
        answer = await asyncio.wait_for(late, LONG_S)
        stuck = not first.done()
        reads.begun[0].set()
        return answer, stuck, await first, len(flights)

    answer, stuck, first, left = asyncio.run(run())
    assert (answer, first) == (2, 1)
    assert stuck  # answered while read 1 still ran
    assert left == 0


def test_reads_of_one_key_running_at_once_are_two_at_most_and_each_begins_after_its_requests():
    """The cost of not waiting: while reads are stuck, a key gets a second read beside
    the first (before: one, the others queued behind it), never a third; requests
    arriving after the second began share a third, begun only once one of the two
    ended. Every request's answer comes from a read begun after it arrived."""
    flights: SingleFlight[int] = SingleFlight("conversation", overtake_after_s=BOUND_S)

    async def run():
        reads = Reads()
        waves: list[tuple[int, list[asyncio.Future]]] = []  # (reads begun at arrival, requests)

        def wave() -> None:
            waves.append((len(reads.begun), [
                asyncio.ensure_future(flights.run("key", reads.read)) for _ in range(3)]))

        wave()
        await reads.until_begun(1)
        wave()  # behind read 1: overtakes it after the bound
        await reads.until_begun(2)
        wave()  # behind read 2, with two running: waits for one to end
        await asyncio.sleep(BOUND_S * 20)
        running_while_stuck = len(reads.begun)
        reads.begun[0].set()  # read 1 ends: the third may begin
        await reads.until_begun(3)
        for release in reads.begun:
            release.set()
        answers = [(before, await asyncio.gather(*requests)) for before, requests in waves]
        return running_while_stuck, answers, len(reads.begun)

    running_while_stuck, answers, total = asyncio.run(run())
    assert running_while_stuck == 2
    assert total == 3
    for begun_before, values in answers:
        assert len(set(values)) == 1 and values[0] > begun_before  # a read begun after it
