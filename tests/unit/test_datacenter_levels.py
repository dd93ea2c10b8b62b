"""``RATCHET_DATACENTERS``: the consistency levels of workers and APIs in one datacenter
or in several (session 51).

With ``one`` (the default) every level is today's: the store reads and commits at
LOCAL_QUORUM, Paxos at SERIAL, statements without a level at the driver's LOCAL_ONE. With
``several`` every read a decision or a gateway relies on must overlap a commit made in
any datacenter: the store reads and commits at QUORUM (SERIAL reads stay SERIAL, never
LOCAL_SERIAL), and so do the start's schema check and ``migrate``. The ledger is at
QUORUM and SERIAL in both. A stand-in for cassandra-driver's session records what each
statement is prepared and executed at (as tests/unit/test_plain_write_levels.py).
docs/decisions.md, "Workers and APIs in several datacenters, as a setting".
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from cassandra import ConsistencyLevel as CL
from click.testing import CliRunner

import services.api.server as api_server
import streams.worker as worker
from ratchet.cli import main
from ratchet.settings import Settings, SettingsError
from services.cassandra_cluster import open_cluster, store_levels
from services.ledger.cassandra import CassandraLedger
from services.store.cassandra import CassandraCheckpointStore
from services.store.statements import StoreStatements
from tests.unit.test_plain_write_levels import RecordingSession

ONE, SEVERAL = Settings(), Settings(datacenters="several")
# What each setting implies for the store: (reads, commits), Paxos at SERIAL in both.
EXPECTED = {"one": (CL.LOCAL_QUORUM, CL.LOCAL_QUORUM), "several": (CL.QUORUM, CL.QUORUM)}
NAME = CL.value_to_name


class _Empty:
    """A result without rows (what every read of an empty table answers)."""

    was_applied = True

    def one(self):
        return None

    def __iter__(self):
        return iter(())


class Session(RecordingSession):
    def execute(self, statement, params=None, **kwargs):
        super().execute(statement, params, **kwargs)
        return _Empty()


def _store(settings: Settings) -> tuple[CassandraCheckpointStore, Session]:
    session = Session()
    return CassandraCheckpointStore(session, **store_levels(settings)), session


def _levels(store: CassandraCheckpointStore) -> dict[str, str]:
    """Every prepared statement of the store, by its name, at its level."""
    return {name: NAME[statement.consistency_level]
            for name, statement in vars(store.cql).items() if hasattr(statement, "query_string")}


def test_the_setting_is_one_by_default_and_an_unknown_value_is_refused():
    assert Settings.from_env({}).datacenters == "one"
    assert Settings.from_env({"RATCHET_DATACENTERS": "several"}).datacenters == "several"
    for value in ("two", "Several", "2"):
        with pytest.raises(SettingsError, match="RATCHET_DATACENTERS"):
            Settings.from_env({"RATCHET_DATACENTERS": value})


def test_the_cli_refuses_an_unknown_value_in_one_line_before_connecting():
    result = CliRunner().invoke(main, ["migrate"], env={"RATCHET_DATACENTERS": "two"})
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "Error: RATCHET_DATACENTERS='two' is not one of one, several")


def test_one_keeps_every_statement_at_todays_level():
    """``one`` is the store as its constructor's defaults made it: statement by statement."""
    store, _ = _store(ONE)
    today = CassandraCheckpointStore(Session())
    assert _levels(store) == _levels(today)
    assert {"LOCAL_QUORUM", "SERIAL", "QUORUM"} == set(_levels(store).values())


@pytest.mark.parametrize("settings", [ONE, SEVERAL], ids=["one", "several"])
def test_each_store_statement_is_prepared_at_the_level_the_setting_implies(settings):
    read, write = EXPECTED[settings.datacenters]
    store, session = _store(settings)
    for name, statement in vars(store.cql).items():
        if not hasattr(statement, "query_string"):
            continue
        level, cql = statement.consistency_level, statement.query_string
        if getattr(statement, "is_idempotent", True) is False:  # an LWT: its commit
            assert level == write, name
        elif cql.startswith("SELECT"):
            assert level in (read, CL.SERIAL), name
        else:  # the facts mark, a plain write a Paxos condition reads
            assert (name, level) == ("set_mark", CL.QUORUM)
    if settings is SEVERAL:
        assert not {"LOCAL_QUORUM", "LOCAL_SERIAL", "LOCAL_ONE"} & set(_levels(store).values())


@pytest.mark.parametrize("settings", [ONE, SEVERAL], ids=["one", "several"])
def test_reads_and_the_promotion_batch_are_executed_at_the_setting_s_levels(
        settings, monkeypatch):
    read, write = EXPECTED[settings.datacenters]
    store, session = _store(settings)
    store.read_head("t1", "conv-1")  # the API's head
    store.head("t1", "conv-1")  # a decision's: linearizable whatever the setting
    assert [level for _, _, level in session.executed] == [read, CL.SERIAL]
    # The batch as the store builds it for every promotion (its parts aside).
    monkeypatch.setattr(store, "_batch_parts", lambda *args: [])
    batch = store._batch(None, None, None, uuid.uuid4(), None)
    assert (batch.consistency_level, batch.serial_consistency_level) == (write, CL.SERIAL)


def test_the_ledger_overlaps_any_datacenter_s_commit_whatever_the_setting():
    """The ledger takes no levels: it is at QUORUM and SERIAL already (a guard)."""
    session = Session()
    CassandraLedger(session)
    assert {NAME[s.consistency_level] for s in session.prepared} == {"QUORUM", "SERIAL"}


def test_statements_without_a_level_follow_the_setting():
    """The start's schema check reads at the cluster's default level: a worker in a
    second datacenter must see a migration recorded from the first."""
    assert open_cluster(ONE).profile_manager.default.consistency_level == CL.LOCAL_ONE
    assert open_cluster(SEVERAL).profile_manager.default.consistency_level == CL.QUORUM


@pytest.mark.parametrize("settings", [ONE, SEVERAL], ids=["one", "several"])
def test_migrate_reads_and_records_at_the_setting_s_level(settings, monkeypatch):
    import cassandra.cluster

    from infra import migrate

    built = {}

    class Stop(Exception):
        pass

    def cluster(*_args, execution_profiles, **_kwargs):
        built.update(execution_profiles)
        raise Stop

    monkeypatch.setattr(cassandra.cluster, "Cluster", cluster)
    with pytest.raises(Stop):
        migrate.cli_migrate(settings)
    [profile] = built.values()
    assert profile.consistency_level == {"one": CL.LOCAL_ONE,
                                         "several": CL.QUORUM}[settings.datacenters]


class _Cluster:
    def __init__(self) -> None:
        self.session = Session()

    def connect(self, _keyspace=None):
        return self.session

    def shutdown(self) -> None:
        pass


def _read_head_level(store) -> int:
    assert isinstance(store.cql, StoreStatements)
    return store.cql.read_head.consistency_level


@pytest.mark.parametrize("settings", [ONE, SEVERAL], ids=["one", "several"])
def test_the_worker_builds_its_store_at_the_setting_s_levels(settings, monkeypatch):
    settings = Settings(datacenters=settings.datacenters, loop_driver="cassandra-driver")
    monkeypatch.setattr(worker, "open_cluster", lambda *_a, **_k: _Cluster())
    monkeypatch.setattr(worker, "check_schema", lambda *_a: None)
    monkeypatch.setattr(worker.RegistryCodec, "connect", lambda *_a: SimpleNamespace())
    monkeypatch.setattr(worker, "ensure_topics", lambda *_a: SimpleNamespace())
    monkeypatch.setattr(worker, "PromotionProcessor",
                        lambda store, *_a, **_k: SimpleNamespace(store=store))
    runtime, _ = worker.build_runtime(settings)
    assert _read_head_level(runtime.processor.store) == EXPECTED[settings.datacenters][0]


@pytest.mark.parametrize("settings", [ONE, SEVERAL], ids=["one", "several"])
def test_the_api_builds_its_store_at_the_setting_s_levels(settings, monkeypatch):
    settings = Settings(datacenters=settings.datacenters, loop_driver="cassandra-driver")

    class Stop(Exception):
        pass

    def stop_after_the_store(*_args, **_kwargs):
        raise Stop

    monkeypatch.setattr(api_server, "open_cluster", lambda *_a, **_k: _Cluster())
    monkeypatch.setattr(api_server, "check_schema", lambda *_a: None)
    monkeypatch.setattr(api_server, "CassandraLedger", stop_after_the_store)
    process = api_server.ApiProcess.__new__(api_server.ApiProcess)
    process.cluster = _Cluster()
    with pytest.raises(Stop):
        process._start(settings)
    assert _read_head_level(process.store) == EXPECTED[settings.datacenters][0]
