"""``ratchet migrate --status`` on a keyspace whose migration lease is held.

It said "a migrator is running now (lease owner X)" for any lease row, a killed
migrator's too, for up to ``LEASE_TTL_S`` (120 s): an operator could not tell whether
to wait, or how long (session 44's review, left; session 45). Now it names the owner,
when the lease was last taken or renewed and when it expires, and whether that owner
still renews it. The age was this version's ``LEASE_TTL_S`` minus the TTL left, so a
lease written with another TTL (another version's) was misread (session 46): the row
now carries the TTL it was written with and its renewal period, and a row without
them (the previous version's) says "unknown". The lease rows are written as a
migrator leaves them: a killed migrator's last renewal is set in the past by the TTL
it would have left.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from datetime import UTC, datetime

import pytest

from infra.migrate import LEASE_TTL_S, RENEW_EVERY_S, apply_migrations, cli_migrate

pytestmark = pytest.mark.integration


@pytest.fixture
def migrated(cassandra_session, settings, unique_name, tmp_path):
    s = dataclasses.replace(settings, keyspace=unique_name("migstat"))
    (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);")
    apply_migrations(cassandra_session, s, tmp_path)
    yield s, tmp_path
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


def _hold_lease(session, ks: str, owner: str, *, renewed_s_ago: int, ttl_s: int = LEASE_TTL_S,
                renew_every_s: float = RENEW_EVERY_S) -> datetime:
    """The lease row as a migrator whose lease lasts ``ttl_s`` and that last renewed it
    ``renewed_s_ago`` seconds ago leaves it (the TTL it has left then)."""
    session.execute(
        f"INSERT INTO {ks}.schema_migrations_lease (id, owner, ttl_s, renew_every_s) "
        f"VALUES ('migrate', %s, %s, %s) USING TTL {ttl_s - renewed_s_ago}",
        (owner, ttl_s, renew_every_s), timeout=30)
    return datetime.fromtimestamp(time.time() - renewed_s_ago, UTC)


def _since(line: str) -> int:
    renewed = re.search(r"renewed at \S+ \S+ UTC \((\d+)s ago\)", line)
    assert renewed is not None, line
    return int(renewed.group(1))


def _lease_line(out: str) -> str:
    lines = [line for line in out.splitlines() if "schema_migrations_lease" in line]
    assert len(lines) == 1, out
    return lines[0]


def test_a_killed_migrators_lease_says_whose_when_renewed_and_when_it_expires(
        cassandra_session, migrated, capsys):
    s, folder = migrated
    written = _hold_lease(cassandra_session, s.keyspace, "killed-owner", renewed_s_ago=70)
    assert cli_migrate(s, folder, status=True) == 0  # up to date: the lease is not a failure
    line = _lease_line(capsys.readouterr().out)
    assert "killed-owner" in line
    assert "a migrator is running now" not in line.lower()
    renewed = re.search(r"renewed at (\S+ \S+) UTC \((\d+)s ago\)", line)
    assert renewed is not None, line
    assert int(renewed.group(2)) >= 70
    at = datetime.strptime(renewed.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    assert abs((at - written).total_seconds()) < 60  # the same moment, not "now"
    expires = re.search(r"expires in (\d+)s", line)
    assert expires is not None and 0 < int(expires.group(1)) <= LEASE_TTL_S - 70, line
    assert re.search(r"can run in \d+s", line), line
    assert "killed" in line


def test_a_running_migrators_lease_says_it_runs_and_when_it_expires(
        cassandra_session, migrated, capsys):
    s, folder = migrated
    _hold_lease(cassandra_session, s.keyspace, "live-owner", renewed_s_ago=0)
    cli_migrate(s, folder, status=True)
    line = _lease_line(capsys.readouterr().out)
    assert "live-owner" in line and "A migrator is running now" in line
    expires = re.search(r"expires in (\d+)s", line)
    assert expires is not None and 0 < int(expires.group(1)) <= LEASE_TTL_S, line


def test_a_lease_without_expiry_says_so_and_how_to_remove_it(
        cassandra_session, migrated, capsys):
    """A row written by hand (no TTL): no migrator can ever take it."""
    s, folder = migrated
    cassandra_session.execute(
        f"INSERT INTO {s.keyspace}.schema_migrations_lease (id, owner) VALUES ('migrate', 'hand')",
        timeout=30)
    cli_migrate(s, folder, status=True)
    line = _lease_line(capsys.readouterr().out)
    assert "hand" in line and "no expiry" in line
    assert f"DELETE FROM {s.keyspace}.schema_migrations_lease WHERE id = 'migrate'" in line


def test_a_lease_written_with_a_longer_ttl_is_read_with_its_own_ttl(
        cassandra_session, migrated, capsys):
    """Another version's lease (600 s, renewed every 150 s), renewed 100 s ago: it was
    read as renewed "0s ago" (120 s minus the 500 s left, floored)."""
    s, folder = migrated
    _hold_lease(cassandra_session, s.keyspace, "long-owner", renewed_s_ago=100, ttl_s=600,
                renew_every_s=150)
    cli_migrate(s, folder, status=True)
    line = _lease_line(capsys.readouterr().out)
    assert 100 <= _since(line) <= 110, line
    assert "A migrator is running now" in line and "every 150s" in line, line


def test_a_lease_written_with_a_shorter_ttl_is_read_with_its_own_ttl(
        cassandra_session, migrated, capsys):
    """A lease of 60 s renewed every 15 s, renewed 40 s ago: it was read as 100 s ago
    (120 s minus the 20 s left); its migrator has missed two renewals."""
    s, folder = migrated
    _hold_lease(cassandra_session, s.keyspace, "short-owner", renewed_s_ago=40, ttl_s=60,
                renew_every_s=15)
    cli_migrate(s, folder, status=True)
    line = _lease_line(capsys.readouterr().out)
    assert 40 <= _since(line) <= 50, line
    assert "Not renewed for" in line and "every 15s" in line and "killed" in line, line


def _previous_versions_lease_table(session, ks: str) -> None:
    """The lease table as ratchet before session 46 made it: an owner, nothing else."""
    session.execute(f"DROP TABLE {ks}.schema_migrations_lease", timeout=60)
    session.execute(f"CREATE TABLE {ks}.schema_migrations_lease (id text PRIMARY KEY, "
                    "owner text)", timeout=60)


def test_the_previous_versions_lease_says_its_age_is_unknown(cassandra_session, migrated,
                                                              capsys):
    """A lease written by the previous version (no stored TTL; 90 s left): it was read
    as renewed 30 s ago by a running migrator, a guess from this version's TTL."""
    s, folder = migrated
    _previous_versions_lease_table(cassandra_session, s.keyspace)
    cassandra_session.execute(
        f"INSERT INTO {s.keyspace}.schema_migrations_lease (id, owner) VALUES ('migrate', "
        "'old-owner') USING TTL 90", timeout=30)
    assert cli_migrate(s, folder, status=True) == 0
    line = _lease_line(capsys.readouterr().out)
    assert "old-owner" in line and "renewed is unknown" in line, line
    assert "still runs is unknown" in line, line
    assert "ago" not in line and "running now" not in line and "killed" not in line, line
    expires = re.search(r"expires in (\d+)s", line)
    assert expires is not None and 0 < int(expires.group(1)) <= 90, line


def test_migrate_over_the_previous_versions_lease_table_stores_the_lease_terms(
        cassandra_session, migrated):
    """The upgrade: the first run of this version adds the columns before it takes the
    lease, so its own lease already carries them."""
    s, folder = migrated
    _previous_versions_lease_table(cassandra_session, s.keyspace)
    (folder / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);")
    seen = []

    def out(line: str) -> None:
        if line.startswith("applied 002"):  # the lease is held still
            seen.append(cassandra_session.execute(
                f"SELECT owner, ttl_s, renew_every_s, TTL(owner) FROM "
                f"{s.keyspace}.schema_migrations_lease WHERE id = 'migrate'",
                timeout=30).one())

    assert [m.version for m in apply_migrations(cassandra_session, s, folder, out=out)] == [2]
    (row,) = seen
    assert row.owner and row.ttl_s == LEASE_TTL_S and row.renew_every_s == RENEW_EVERY_S
    assert 0 < row.ttl_owner <= LEASE_TTL_S


def test_the_lease_line_without_a_server():
    """``describe_lease`` alone: the age is the row's TTL's count, the owner always
    named, and what the row does not say is unknown."""
    from infra.migrate import LeaseRow, describe_lease

    now = datetime(2026, 12, 7, 2, 0, 0, tzinfo=UTC)
    stopped = describe_lease(LeaseRow("o1", 250, 300, 30.0), "ks", now)
    assert "held by o1" in stopped and "renewed at 2026-12-07 01:59:10 UTC (50s ago)" in stopped
    assert "expires in 250s" in stopped and "can run in 250s" in stopped
    assert "Not renewed for 50s" in stopped and "every 30s" in stopped
    assert "A migrator is running now" in describe_lease(LeaseRow("o2", 240, 300, 60.0), "ks", now)
    assert "killed" in describe_lease(LeaseRow("o2", 234, 300, 60.0), "ks", now)
    assert "no owner named" in describe_lease(LeaseRow(None, 100, 120, 30.0), "ks", now)
    for row in (LeaseRow("o3", 100, None, None),  # the previous version's row
                LeaseRow("o3", 100, 60, 30.0)):  # more left than it was written with
        line = describe_lease(row, "ks", now)
        assert "renewed is unknown" in line and "ago" not in line, line
        assert "expires in 100s" in line and "can run in 100s" in line, line
    unknown_period = describe_lease(LeaseRow("o4", 100, 120, None), "ks", now)
    assert "(20s ago)" in unknown_period and "still runs is unknown" in unknown_period


def test_a_run_waiting_for_another_versions_lease_names_its_ttl(cassandra_session, migrated):
    """The waiting line said a killed migrator's lease ends "120s after its last
    renewal", this version's TTL, whatever the holder's (session 46)."""
    s, folder = migrated
    _hold_lease(cassandra_session, s.keyspace, "other-version", renewed_s_ago=597,
                ttl_s=600, renew_every_s=150)  # 3 s left
    said: list[str] = []
    apply_migrations(cassandra_session, s, folder, out=said.append)
    waiting = [line for line in said if line.startswith("waiting for another migrator")]
    # Read with its own TTL (600 s): renewed ~597 s ago, not "120s after" (session 47:
    # the waiting line is --status's description of the lease).
    assert waiting and "120s" not in waiting[0], said
    assert 595 <= _since(waiting[0]) <= 600 and "Not renewed for" in waiting[0], said


class _ColumnsListedEarly:
    """A cluster whose sessions read ``system_schema.columns`` of the lease table as it
    is while another migrator's ``ALTER ... ADD`` is under way: the new columns are
    listed there before the coordinator takes a statement naming them. Two or three
    migrates at once on the previous version's lease table met that window (rreview3,
    session 47: 3 of 6 runs of three at once, one migrate failing "Undefined column
    name ttl_s" on its lease INSERT); here it is held open."""

    def __init__(self, cluster) -> None:
        self._cluster = cluster

    def connect(self):
        return _ListsLeaseTerms(self._cluster.connect())


class _ListsLeaseTerms:
    def __init__(self, session) -> None:
        self._session = session

    def execute(self, query, *args, **kwargs):
        text = getattr(query, "query_string", query)  # a statement (records at SERIAL)
        if "system_schema.columns" in text and "schema_migrations_lease" in text:
            return [(name,) for name in ("id", "owner", "ttl_s", "renew_every_s")]
        return self._session.execute(query, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)


def test_migrate_takes_the_lease_while_the_lease_terms_are_listed_but_not_taken_yet(
        cassandra_cluster, cassandra_session, migrated):
    """The columns ``system_schema`` lists are not yet the columns a statement may
    name: migrate skipped its ``ALTER`` and its lease ``INSERT`` failed with
    ``InvalidRequest`` (a traceback, nothing applied)."""
    s, folder = migrated
    _previous_versions_lease_table(cassandra_session, s.keyspace)
    (folder / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);")
    applied = apply_migrations(_ColumnsListedEarly(cassandra_cluster), s, folder)
    assert [m.version for m in applied] == [2]


def test_three_migrates_at_once_over_the_previous_versions_lease_table(
        cassandra_cluster, cassandra_session, migrated):
    """The upgrade as a deployment runs it, several migrates at once: each ends, one
    applies the migration, none fails."""
    s, folder = migrated
    _previous_versions_lease_table(cassandra_session, s.keyspace)
    (folder / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);")
    ended: list[object] = []

    def migrate() -> None:
        try:
            ended.append([m.version for m in apply_migrations(cassandra_cluster, s, folder)])
        except Exception as exc:  # noqa: BLE001 - the failure is what is asserted
            ended.append(exc)

    runs = [threading.Thread(target=migrate) for _ in range(3)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(timeout=300)
    assert len(ended) == 3 and ended.count([2]) == 1 and ended.count([]) == 2, ended


@pytest.mark.parametrize("every", [float("nan"), float("inf"), float("-inf")])
def test_a_renewal_period_that_is_no_period_is_unknown(every):
    """A row whose ``renew_every_s`` is NaN or infinite (CQL takes both; only a hand
    writes them): it was read as a period, a killed migrator for NaN ("every nans") and
    a running one for infinity; like a period of 0 or less, it says nothing."""
    from infra.migrate import LeaseRow, describe_lease

    now = datetime(2026, 12, 7, 2, 0, 0, tzinfo=UTC)
    line = describe_lease(LeaseRow("o5", 100, 120, every), "ks", now)
    assert "(20s ago)" in line and "still runs is unknown" in line, line
    assert "running now" not in line and "killed" not in line, line


@pytest.mark.parametrize("every", [1e9, 120.0, 115.0])
def test_a_renewal_period_the_ttl_cannot_outlast_is_unknown(every):
    """A row whose ``renew_every_s`` (with the 5 s of slack) is not below its own
    ``ttl_s``: every age the TTL leaves is within one period, so the line said "A
    migrator is running now" of any such lease, a killed migrator's too, as it did for
    infinity (an outside review, session 47). No ratchet migrate writes one (it renews
    every quarter of the TTL); like a period that is no period, it says nothing."""
    from infra.migrate import LeaseRow, describe_lease

    now = datetime(2026, 12, 7, 2, 0, 0, tzinfo=UTC)
    line = describe_lease(LeaseRow("o6", 5, 120, every), "ks", now)
    assert "(115s ago)" in line and "still runs is unknown" in line, line
    assert "running now" not in line and "killed" not in line, line


def test_a_lease_row_without_an_owner_says_what_its_row_does(cassandra_session, migrated,
                                                             capsys):
    """A row written by hand with a TTL but no owner: ``TTL(owner)`` is null, and the
    row was called one "with no expiry" (session 47's review, left; session 48). Its
    other columns' TTL is what the row says; migrate still refuses it at once (no
    migrator wrote it), in words that are true of it."""
    from infra.migrate import MigrationError

    s, folder = migrated
    cassandra_session.execute(
        f"INSERT INTO {s.keyspace}.schema_migrations_lease (id, ttl_s, renew_every_s) "
        f"VALUES ('migrate', {LEASE_TTL_S}, {RENEW_EVERY_S}) USING TTL {LEASE_TTL_S}",
        timeout=30)
    cli_migrate(s, folder, status=True)
    line = _lease_line(capsys.readouterr().out)
    assert "no owner named" in line and "no expiry" not in line, line
    expires = re.search(r"its other columns expire in (\d+)s", line)
    assert expires is not None and 0 < int(expires.group(1)) <= LEASE_TTL_S, line
    assert f"DELETE FROM {s.keyspace}.schema_migrations_lease WHERE id = 'migrate'" in line
    with pytest.raises(MigrationError) as err:
        apply_migrations(cassandra_session, s, folder)
    message = str(err.value)
    assert "names no owner" in message and "never expires" not in message, message
