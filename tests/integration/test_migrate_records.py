"""``ratchet migrate``'s records of applied migrations on a real Cassandra, since they
are written with Paxos and read at SERIAL (session 53), reviewed from outside.

A keyspace an older ratchet migrated holds records written plainly: read at SERIAL they
are the same records. A migration stopped between its statements and its record runs
again (its record absent). A record whose checksum cell is null (damage: a hand-made
row, a cell deleted) ended ``migrate`` and ``--status`` in a ``TypeError`` traceback
(``None[:12]``): now one line naming the record and how to repair it, exit 1, nothing
applied.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from infra.migrate import apply_migrations, cli_migrate

pytestmark = pytest.mark.integration

CORE = "CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);"
MORE = "CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);"


@pytest.fixture
def migrated(cassandra_session, settings, unique_name, tmp_path):
    s = dataclasses.replace(settings, keyspace=unique_name("migrec"))
    (tmp_path / "001_core.cql").write_text(CORE)
    apply_migrations(cassandra_session, s, tmp_path, out=lambda _line: None)
    yield s, tmp_path
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


def _tables(session, ks: str) -> set[str]:
    return {r[0] for r in session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (ks,))}


def test_records_an_older_ratchet_wrote_plainly_read_as_applied(cassandra_session, migrated,
                                                                capsys):
    """An older ratchet's plain ``INSERT`` (no Paxos) is read at SERIAL as it is: the
    keyspace is up to date and nothing is applied again (a guard: it passed before)."""
    s, folder = migrated
    ks = s.keyspace
    cassandra_session.execute(f"DELETE FROM {ks}.schema_migrations WHERE version = 1")
    cassandra_session.execute(
        f"INSERT INTO {ks}.schema_migrations (version, name, checksum, applied_at) "
        "VALUES (1, 'core', %s, toTimestamp(now()))",
        (hashlib.sha256(CORE.encode()).hexdigest(),))
    assert cli_migrate(s, folder, status=True) == 0
    assert "up to date (1 of 1" in capsys.readouterr().out
    assert cli_migrate(s, folder) == 0
    assert "0 migration(s) applied now" in capsys.readouterr().out


def test_a_migration_stopped_before_its_record_runs_again(cassandra_session, migrated, capsys):
    """Its statements ran, its record was never written: the next migrate runs it again
    whole (``IF NOT EXISTS``) and records it (a guard of the documented promise)."""
    s, folder = migrated
    (folder / "002_more.cql").write_text(MORE)
    cassandra_session.execute(f"CREATE TABLE {s.keyspace}.b (k int PRIMARY KEY)")
    assert cli_migrate(s, folder, status=True) == 1
    assert cli_migrate(s, folder) == 0
    assert "applied 002_more.cql" in capsys.readouterr().out
    assert cli_migrate(s, folder, status=True) == 0


@pytest.mark.parametrize("status", [False, True], ids=["migrate", "status"])
def test_a_record_without_its_checksum_is_one_line_not_a_traceback(cassandra_session, migrated,
                                                                   capsys, status):
    s, folder = migrated
    ks = s.keyspace
    (folder / "002_more.cql").write_text(MORE)
    cassandra_session.execute(f"UPDATE {ks}.schema_migrations SET checksum = null "
                              "WHERE version = 1")
    assert cli_migrate(s, folder, status=status) == 1
    out, err = capsys.readouterr()
    said = out if status else err
    line = [x for x in said.splitlines() if "001_core.cql" in x]
    assert len(line) == 1, said
    assert "no checksum" in line[0], line[0]
    assert f"DELETE FROM {ks}.schema_migrations WHERE version = 1" in line[0], line[0]
    assert "b" not in _tables(cassandra_session, ks)  # nothing applied, 002 neither
    if status:
        assert "damaged" in out.splitlines()[-1], out
    else:
        assert err.count("\n") == 1, err
