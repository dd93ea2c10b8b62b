"""The migration mechanism: file discovery and CQL splitting (pure), then applying a
temporary migrations folder to a fresh keyspace on the real Cassandra."""

from __future__ import annotations

import dataclasses

import pytest

from infra.migrate import (
    ChecksumMismatch,
    MigrationError,
    apply_migrations,
    discover,
    split_statements,
)


def test_split_statements_ignores_semicolons_in_comments_strings_and_blocks():
    cql = """
    -- a comment; with a semicolon
    CREATE TABLE a (k int PRIMARY KEY, v text);  // trailing; comment
    /* block; comment */
    INSERT INTO a (k, v) VALUES (1, 'it''s; fine');
    CREATE FUNCTION f(x int) CALLED ON NULL INPUT RETURNS int LANGUAGE java AS $$ return x; $$;
    ;
    """
    assert split_statements(cql) == [
        "CREATE TABLE a (k int PRIMARY KEY, v text)",
        "INSERT INTO a (k, v) VALUES (1, 'it''s; fine')",
        "CREATE FUNCTION f(x int) CALLED ON NULL INPUT RETURNS int LANGUAGE java AS $$ return x; $$",
    ]


def test_discover_orders_by_version_and_checksums(tmp_path):
    (tmp_path / "010_later.cql").write_text("CREATE TABLE b (k int PRIMARY KEY);")
    (tmp_path / "002_first.cql").write_text("CREATE TABLE a (k int PRIMARY KEY);")
    found = discover(tmp_path)
    assert [(m.version, m.name) for m in found] == [(2, "first"), (10, "later")]
    assert len(found[0].checksum) == 64 and found[0].checksum != found[1].checksum
    assert discover(tmp_path / "missing") == []


@pytest.mark.parametrize("names", [["1_short.cql"], ["001-dash.cql"], ["001_a.cql", "001_b.cql"]])
def test_discover_rejects_bad_names_and_duplicate_versions(tmp_path, names):
    for name in names:
        (tmp_path / name).write_text("SELECT now() FROM system.local;")
    with pytest.raises(MigrationError):
        discover(tmp_path)


@pytest.mark.integration
def test_apply_is_idempotent_recorded_and_refuses_edited_migrations(
    cassandra_session, settings, unique_name, tmp_path
):
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    try:
        # no files yet: only the keyspace and schema_migrations are created
        assert apply_migrations(cassandra_session, s, tmp_path) == []
        tables = {r.table_name for r in cassandra_session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (s.keyspace,))}
        assert "schema_migrations" in tables

        (tmp_path / "001_core.cql").write_text(
            "CREATE TABLE IF NOT EXISTS things (k int PRIMARY KEY, v text);\n"
            "INSERT INTO things (k, v) VALUES (1, 'one; really');\n")
        applied = apply_migrations(cassandra_session, s, tmp_path)
        assert [m.version for m in applied] == [1]
        assert cassandra_session.execute(
            f"SELECT v FROM {s.keyspace}.things WHERE k = 1").one().v == "one; really"

        (tmp_path / "002_more.cql").write_text("ALTER TABLE things ADD extra int;")
        assert [m.version for m in apply_migrations(cassandra_session, s, tmp_path)] == [2]
        assert apply_migrations(cassandra_session, s, tmp_path) == []  # nothing left to do

        rows = sorted(cassandra_session.execute(
            f"SELECT version, name, checksum, applied_at FROM {s.keyspace}.schema_migrations"))
        assert [(r.version, r.name) for r in rows] == [(1, "core"), (2, "more")]
        assert all(len(r.checksum) == 64 and r.applied_at for r in rows)
        # the caller's session keeps its own current keyspace
        assert cassandra_session.keyspace != s.keyspace

        (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS other (k int PRIMARY KEY);")
        with pytest.raises(ChecksumMismatch, match="001_core.cql"):
            apply_migrations(cassandra_session, s, tmp_path)
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)
