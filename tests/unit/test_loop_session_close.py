"""``LoopSession.close`` while a request is under way (services/cassandra_loop.py): at
shutdown a request awaiting its statement's preparation, or its next page, found the
session gone and called ``None.execute`` (``AttributeError``, found by an outside review
in session 46), where every caller expects a driver failure (``LoopRequestFailed``:
the store and ledger then say ``StoreUnavailable``). A statement prepared on the closed
session must not be kept for the next one either."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from cassandra import ConsistencyLevel

from ratchet.settings import Settings
from services import cassandra_loop
from services.cassandra_loop import LoopRequestFailed, LoopSession


class _Request:
    def __init__(self) -> None:
        self.statements: list[object] = []

    def bind_list(self, values) -> None:
        pass

    def set_consistency(self, level) -> None:
        pass

    def set_serial_consistency(self, level) -> None:
        pass

    def set_retry_policy(self, policy) -> None:
        pass

    def set_page_state(self, state) -> None:
        pass

    def add_statement(self, statement) -> None:
        self.statements.append(statement)


class _Page:
    def __init__(self, more: bool) -> None:
        self._more = more

    def columns_names(self):
        return ["k"]

    def __iter__(self):
        return iter([SimpleNamespace(as_tuple=lambda: ("row",))])

    def has_more_pages(self) -> bool:
        return self._more

    def page_state(self) -> bytes:
        return b"next"


class _DriverSession:
    """Prepares only once ``release`` is set; answers one page with more to come, then
    waits on ``next_page`` for the second."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.next_page = asyncio.Event()
        self.preparing = asyncio.Event()
        self.sent: list[object] = []
        self.closed = False

    async def create_prepared(self, query: str):
        self.preparing.set()
        await self.release.wait()
        return SimpleNamespace(bind=_Request)

    async def execute(self, request):
        if self.closed:
            raise AssertionError("a request sent on a closed session")
        self.sent.append(request)
        if len(self.sent) == 1:
            return _Page(more=True)
        return _Page(more=False)

    async def execute_batch(self, batch):
        if self.closed:
            raise AssertionError("a batch sent on a closed session")
        self.sent.append(batch)
        return _Page(more=False)

    async def close(self) -> None:
        self.closed = True


def _statement(name: str) -> SimpleNamespace:
    return SimpleNamespace(query_string=name, consistency_level=ConsistencyLevel.LOCAL_QUORUM,
                           serial_consistency_level=None, fetch_size=None)


def _connected() -> tuple[LoopSession, _DriverSession]:
    session, driver = LoopSession(Settings.from_env({})), _DriverSession()
    session._session = driver  # connected: no cluster is built
    return session, driver


async def _close_while_preparing(session: LoopSession, driver: _DriverSession, request):
    task = asyncio.ensure_future(request)
    await driver.preparing.wait()
    await session.close()
    driver.release.set()
    with pytest.raises(LoopRequestFailed) as failed:
        await task
    assert not failed.value.permanent  # a request the driver could not send
    assert str(failed.value).startswith("SessionClosed:")
    assert driver.sent == []
    assert session._prepared == {}  # prepared on the closed session: not kept


def test_a_close_while_a_request_awaits_its_preparation_fails_the_request():
    session, driver = _connected()
    asyncio.run(_close_while_preparing(session, driver,
                                       session.execute(_statement("q"), ("a",))))


def test_a_close_while_a_batch_awaits_its_preparation_fails_the_batch(monkeypatch):
    session, driver = _connected()
    monkeypatch.setattr(cassandra_loop.acsylla, "create_batch_logged", _Request)
    parts = [(_statement("q1"), ("a",)), (_statement("q2"), ("b",))]
    asyncio.run(_close_while_preparing(session, driver, session.execute_batch(
        parts, consistency=ConsistencyLevel.LOCAL_QUORUM)))


def test_a_close_between_two_pages_fails_the_read():
    session, driver = _connected()
    driver.release.set()
    real_execute = driver.execute

    async def first_page_then_close(request):
        page = await real_execute(request)
        if len(driver.sent) == 1:
            await session.close()  # the shutdown comes while the first page is read
        return page

    driver.execute = first_page_then_close

    async def read() -> None:
        with pytest.raises(LoopRequestFailed) as failed:
            await session.execute(_statement("q"), ("a",))
        assert str(failed.value).startswith("SessionClosed:")

    asyncio.run(read())
    assert len(driver.sent) == 1  # the second page was never asked of the closed session


class _SlowConnect:
    """A connect that ends only once ``release`` is set, giving a fresh driver session."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.connecting = asyncio.Event()
        self.made: list[_DriverSession] = []

    async def __call__(self) -> _DriverSession:
        self.connecting.set()
        await self.release.wait()
        driver = _DriverSession()
        driver.release.set()
        self.made.append(driver)
        return driver


def test_a_close_while_a_request_connects_fails_it_and_keeps_no_session():
    """At shutdown a request may still be connecting (Cassandra slow or away): the
    close found no session and returned, then the connect ended and kept a session
    nobody would close, and the request ran on it after the close."""
    session, connect = LoopSession(Settings.from_env({})), _SlowConnect()
    session._connect = connect  # type: ignore[method-assign]

    async def scenario() -> None:
        first = asyncio.ensure_future(session.execute(_statement("q"), ("a",)))
        await connect.connecting.wait()
        waiting = asyncio.ensure_future(session.execute(_statement("q"), ("b",)))
        await asyncio.sleep(0)  # one turn of the loop: the second request now waits
        assert not waiting.done()  # for the first one's connect (its lock)
        await session.close()
        connect.release.set()
        for request in (first, waiting):
            with pytest.raises(LoopRequestFailed) as failed:
                await request
            assert str(failed.value).startswith("SessionClosed:")
            assert not failed.value.permanent
        assert len(connect.made) == 1  # the waiting request did not connect again
        assert connect.made[0].closed and connect.made[0].sent == []
        assert session._session is None
        # A request after the close connects again, as ``close`` promises.
        read = await session.execute(_statement("q"), ("c",))
        assert read.rows == (("row",), ("row",))  # the fake driver's two pages
        assert len(connect.made) == 2 and not connect.made[1].closed

    asyncio.run(scenario())
