"""``LoopSession`` sends each request at its statement's own consistency levels
(services/cassandra_loop.py: "same CQL, same consistency levels" as cassandra-driver's),
never the C++ driver's defaults (LOCAL_ONE; and no serial level of its own). A stand-in
for the driver's session records what each request was given: on the one-node test
cluster every level reads and writes the same replica, so only this shows it (a
mutation review, session 45: a level left unset passed every other test)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import acsylla
from cassandra import ConsistencyLevel

from ratchet.settings import Settings
from services import cassandra_loop
from services.cassandra_loop import LoopSession


class _Request:
    """A bound statement or a batch: what it was set to."""

    def __init__(self) -> None:
        self.set: dict[str, object] = {}
        self.added: list[_Request] = []

    def bind_list(self, values) -> None:
        self.set["values"] = values

    def set_consistency(self, level) -> None:
        self.set["consistency"] = level

    def set_serial_consistency(self, level) -> None:
        self.set["serial"] = level

    def set_retry_policy(self, policy) -> None:
        self.set["retry"] = policy

    def add_statement(self, statement) -> None:
        self.added.append(statement)


class _Answer:
    def columns_names(self):
        return ["[applied]"]

    def __iter__(self):
        return iter([SimpleNamespace(as_tuple=lambda: (True,))])

    def has_more_pages(self) -> bool:
        return False


class _DriverSession:
    def __init__(self) -> None:
        self.sent: list[_Request] = []

    async def create_prepared(self, query: str):
        return SimpleNamespace(bind=_Request)

    async def execute(self, request):
        self.sent.append(request)
        return _Answer()

    async def execute_batch(self, batch):
        self.sent.append(batch)
        return _Answer()


def _read(level) -> int:
    """What the driver's binding reads of the level it is given (its ``.value`` only:
    ``test_every_level_is_the_drivers_own_value``)."""
    return level.value


def _statement(consistency: int, serial: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(query_string=f"q{consistency}{serial}", consistency_level=consistency,
                           serial_consistency_level=serial, fetch_size=None)


def _session() -> tuple[LoopSession, _DriverSession]:
    session, driver = LoopSession(Settings.from_env({})), _DriverSession()
    session._session = driver  # connected: no cluster is built
    return session, driver


def test_a_request_is_sent_at_its_statements_levels():
    session, driver = _session()
    read = _statement(ConsistencyLevel.LOCAL_QUORUM)
    serial_read = _statement(ConsistencyLevel.SERIAL)
    lwt = _statement(ConsistencyLevel.LOCAL_QUORUM)  # its serial level given by the caller

    async def send() -> None:
        await session.execute(read, ("a",))
        await session.execute(serial_read, ("a",))
        await session.execute(lwt, ("a",), serial_consistency=ConsistencyLevel.SERIAL)

    asyncio.run(send())
    sent = [request.set for request in driver.sent]
    assert [_read(s.get("consistency")) for s in sent] == [
        acsylla.Consistency.LOCAL_QUORUM.value, acsylla.Consistency.SERIAL.value,
        acsylla.Consistency.LOCAL_QUORUM.value]
    assert _read(sent[2]["serial"]) == acsylla.Consistency.SERIAL.value
    assert {s["retry"] for s in sent} == {"fallthrough"}  # never re-sent by the driver


def test_a_batch_is_sent_at_the_levels_asked_for(monkeypatch):
    session, driver = _session()
    monkeypatch.setattr(cassandra_loop.acsylla, "create_batch_logged", _Request)
    parts = [(_statement(ConsistencyLevel.LOCAL_QUORUM), ("a",)),
             (_statement(ConsistencyLevel.LOCAL_QUORUM), ("b",))]
    runner = asyncio.Runner()  # the session serves the loop it first ran on
    for serial in (ConsistencyLevel.SERIAL, ConsistencyLevel.LOCAL_SERIAL):
        answer = runner.run(session.execute_batch(
            parts, consistency=ConsistencyLevel.LOCAL_QUORUM, serial_consistency=serial))
        assert answer.was_applied
        batch = driver.sent[-1]
        assert len(batch.added) == 2
        assert _read(batch.set["consistency"]) == acsylla.Consistency.LOCAL_QUORUM.value
        assert _read(batch.set["serial"]) == getattr(acsylla.Consistency,
                                                     ConsistencyLevel.value_to_name[serial]).value
        assert batch.set["retry"] == "fallthrough"
    runner.close()


def test_every_level_is_the_drivers_own_value():
    """The levels handed to the driver are plain holders of the enum's value (session
    46: the enum's ``value`` is a property, two Python calls per read): each is the
    value of the driver's level of the same name, and the real binding takes it."""
    assert cassandra_loop._CONSISTENCY  # every level cassandra-driver names, if acsylla has it
    for value, name in ConsistencyLevel.value_to_name.items():
        if not hasattr(acsylla.Consistency, name):
            continue
        level = cassandra_loop._CONSISTENCY[value]
        assert level.value == getattr(acsylla.Consistency, name).value, name
        statement = acsylla.create_statement("SELECT now() FROM system.local")
        statement.set_consistency(level)  # the binding reads .value; raises otherwise
        statement.set_serial_consistency(level)
        batch = acsylla.create_batch_logged()
        batch.set_consistency(level)
        batch.set_serial_consistency(level)
    assert len(cassandra_loop._CONSISTENCY) == sum(
        hasattr(acsylla.Consistency, name) for name in ConsistencyLevel.value_to_name.values())
