"""The migration mechanism: file discovery and CQL splitting (pure), then applying a
temporary migrations folder to a fresh keyspace on the real Cassandra."""

from __future__ import annotations

import dataclasses

import pytest

from infra.migrate import (
    ChecksumMismatch,
    MigrationError,
    SchemaAhead,
    apply_migrations,
    cli_migrate,
    discover,
    split_statements,
)
from tests.slow_link import SlowLink


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


@pytest.mark.integration
def test_a_migration_stopped_before_it_was_recorded_can_be_run_again(
    cassandra_session, settings, unique_name, tmp_path
):
    """A migration's statements run before its version is recorded. A migrate Job
    killed in between (or a client timeout while Cassandra went on) left the columns of
    a plain ``ALTER TABLE ... ADD`` without the record, and every re-run then failed:
    "Column with name ... already exists" (found by an outside review of the deployment,
    session 25; migrations 003, 008, 014 and 015 add columns so). A re-run now finishes
    such a migration; a column there with another type is still an error."""
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    try:
        (tmp_path / "001_core.cql").write_text(
            "CREATE TABLE IF NOT EXISTS things (k int PRIMARY KEY, v text);")
        (tmp_path / "002_more.cql").write_text(
            "ALTER TABLE things ADD extra int;\n"
            "ALTER TABLE things ADD (\n    ids list<text>,\n    counts map<text, int>\n);")
        apply_migrations(cassandra_session, s, tmp_path)
        # The Job stopped after 002's statements, before its record.
        cassandra_session.execute(f"DELETE FROM {s.keyspace}.schema_migrations WHERE version = 2")
        assert [m.version for m in apply_migrations(cassandra_session, s, tmp_path)] == [2]
        assert apply_migrations(cassandra_session, s, tmp_path) == []
        # A column of the name but another type is not this migration's: refused.
        (tmp_path / "003_other.cql").write_text("ALTER TABLE things ADD other int;")
        cassandra_session.execute(f"ALTER TABLE {s.keyspace}.things ADD other text")
        with pytest.raises(MigrationError, match="003_other.cql statement 1"):
            apply_migrations(cassandra_session, s, tmp_path)
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


@pytest.mark.integration
def test_a_keyspace_migrated_by_a_newer_version_is_refused_and_nothing_applied(
    cassandra_session, settings, unique_name, tmp_path, capsys
):
    """A keyspace that records a migration this code has no file for was migrated by a
    newer ratchet: an older ``ratchet migrate`` must not run its own files over that
    schema. It printed a warning, applied what it had and exited 0 (an operator's
    review, session 43); now it is a typed failure (exit 1) naming the unknown
    migration, before anything is applied."""
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    try:
        (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS things (k int PRIMARY KEY);")
        apply_migrations(cassandra_session, s, tmp_path)
        cassandra_session.execute(  # what a newer version's migrate recorded
            f"INSERT INTO {s.keyspace}.schema_migrations (version, name, checksum, applied_at) "
            "VALUES (3, 'from_a_newer_version', 'ab', toTimestamp(now()))")
        (tmp_path / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS more (k int PRIMARY KEY);")
        with pytest.raises(SchemaAhead, match="003_from_a_newer_version"):
            apply_migrations(cassandra_session, s, tmp_path)
        assert cli_migrate(s, tmp_path) == 1
        err = capsys.readouterr().err
        assert "003_from_a_newer_version" in err and "newer version" in err
        versions = {r.version for r in cassandra_session.execute(
            f"SELECT version FROM {s.keyspace}.schema_migrations")}
        assert versions == {1, 3}  # 002 was not applied
        tables = {r.table_name for r in cassandra_session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (s.keyspace,))}
        assert "more" not in tables
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


@pytest.mark.integration
def test_a_run_waiting_for_a_killed_migrators_lease_says_so_then_applies(
    cassandra_session, settings, unique_name, tmp_path
):
    """A migrator killed half way leaves its lease until its TTL; the next run waits for
    it. That wait (up to two minutes) printed nothing: an operator saw ``ratchet
    migrate`` hang (an operator's review, session 43). It says whom it waits for."""
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    try:
        apply_migrations(cassandra_session, s, tmp_path)  # keyspace and lease table
        # The killed migrator's lease, a short TTL here, but longer than the run's own
        # start (connect, keyspace, replication checks): with 2 s a loaded machine (load
        # 13 on 2 cores) let it expire first and the run never waited (session 48's review).
        cassandra_session.execute(
            f"INSERT INTO {s.keyspace}.schema_migrations_lease (id, owner) "
            "VALUES ('migrate', 'killed-one') USING TTL 10")
        (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS t (k int PRIMARY KEY);")
        said: list[str] = []
        assert [m.version for m in apply_migrations(cassandra_session, s, tmp_path,
                                                    out=said.append)] == [1]
        assert any("waiting for another migrator (owner killed-one)" in line for line in said)
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


@pytest.mark.integration
def test_a_run_that_lost_its_lease_stops_before_the_next_migration(
    cassandra_session, settings, unique_name, tmp_path
):
    """The lease was taken once, for 120 s, for the whole run: a longer run (DDL waiting
    for schema agreement on a slow cluster) went on applying migrations beside a second
    migrator that had taken the lease after it expired (an operator's review, session
    43). Each migration now renews it first, or the run stops. Simulated: as 001 is
    recorded, another migrator holds the lease."""
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    try:
        (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);")
        (tmp_path / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);")

        def out(line: str) -> None:
            if line.startswith("applied 001"):  # our lease expired; another took it
                cassandra_session.execute(
                    f"UPDATE {s.keyspace}.schema_migrations_lease SET owner = 'other' "
                    "WHERE id = 'migrate'")

        with pytest.raises(MigrationError, match="lost .*schema_migrations_lease .*other"):
            apply_migrations(cassandra_session, s, tmp_path, out=out)
        versions = {r.version for r in cassandra_session.execute(
            f"SELECT version FROM {s.keyspace}.schema_migrations")}
        assert versions == {1}
        lease = cassandra_session.execute(
            f"SELECT owner FROM {s.keyspace}.schema_migrations_lease WHERE id = 'migrate'").one()
        assert lease.owner == "other"  # the other migrator's lease is left alone
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


@pytest.mark.integration
def test_a_statement_longer_than_the_lease_keeps_it_on_the_real_cassandra(
    cassandra_session, cassandra_cluster, settings, unique_name, tmp_path, monkeypatch
):
    """The lease (120 s) was renewed between migrations only: one statement longer than
    it ran without the lease, and a second migrator could take it meanwhile (an
    operator's review, session 43, left). A lease of 2 s here, and a statement held for
    three times that before Cassandra runs it: the lease is renewed while it waits, so a
    second migrator's ``INSERT ... IF NOT EXISTS`` then is refused
    (``tests/unit/test_migrate_lease.py`` has the lost lease, on a stand-in)."""
    from infra import migrate

    ttl_s = 2
    monkeypatch.setattr(migrate, "LEASE_TTL_S", ttl_s)
    monkeypatch.setattr(migrate, "RENEW_EVERY_S", ttl_s / 8, raising=False)
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    seen: dict[str, object] = {}

    class Held:
        """The migrator's own session, its migration statement held back."""

        def __init__(self, session):
            self._session = session

        def __getattr__(self, name):
            return getattr(self._session, name)

        def execute(self, query, *args, **kwargs):
            if isinstance(query, str) and query.startswith("CREATE TABLE IF NOT EXISTS slow"):
                import time

                time.sleep(3 * ttl_s)
                seen["other took it"] = cassandra_session.execute(
                    f"INSERT INTO {s.keyspace}.schema_migrations_lease (id, owner) "
                    "VALUES ('migrate', 'other') IF NOT EXISTS USING TTL 60").was_applied
            if isinstance(query, str) and query.startswith(
                    f"UPDATE {s.keyspace}.schema_migrations_lease"):
                seen["renewals"] = int(seen.get("renewals", 0)) + 1
            return self._session.execute(query, *args, **kwargs)

    class Cluster:
        def connect(self):
            return Held(cassandra_cluster.connect())

    try:
        (tmp_path / "001_slow.cql").write_text("CREATE TABLE IF NOT EXISTS slow (k int PRIMARY KEY);")
        assert [m.version for m in apply_migrations(Cluster(), s, tmp_path)] == [1]
        assert seen["other took it"] is False  # the lease was still ours
        assert int(seen["renewals"]) >= 1
        versions = {r.version for r in cassandra_session.execute(
            f"SELECT version FROM {s.keyspace}.schema_migrations")}
        assert versions == {1}
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


@pytest.mark.integration
def test_migrate_status_says_what_is_applied_and_pending_and_changes_nothing(
    cassandra_session, settings, unique_name, tmp_path, capsys
):
    """``ratchet migrate --status``: the only way to see a keyspace's migrations was
    ``ratchet migrate``, which applies them (and creates the keyspace). The status
    changes nothing and exits 0 only when the keyspace is up to date (an operator's
    review, session 44)."""
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))

    def keyspace_exists() -> bool:
        return cassandra_session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
            (s.keyspace,)).one() is not None

    def versions() -> set[int]:
        return {r.version for r in cassandra_session.execute(
            f"SELECT version FROM {s.keyspace}.schema_migrations")}

    try:
        (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);")
        # Exit 1 is "not up to date"; "cannot reach Cassandra" is 3 since session 53 (a
        # connect that timed out under load printed no status line, session 52).
        assert cli_migrate(s, tmp_path, status=True) == 1
        said = capsys.readouterr()
        assert said.err == "", said.err
        assert f"keyspace {s.keyspace} does not exist" in said.out
        assert not keyspace_exists()

        apply_migrations(cassandra_session, s, tmp_path)
        (tmp_path / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);")
        assert cli_migrate(s, tmp_path, status=True) == 1
        out, err = capsys.readouterr()
        assert err == "", err
        lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
        # The whole output in the message: a run under load once lacked the file's line
        # (a KeyError, session 51) and left no trace of what it printed instead.
        assert "applied" in lines.get("001_core.cql", ""), out
        assert "pending" in lines.get("002_more.cql", ""), out
        assert f"keyspace {s.keyspace}: 1 of 2 migration(s) pending: run `ratchet migrate`" in out
        assert versions() == {1}  # nothing applied

        apply_migrations(cassandra_session, s, tmp_path)
        assert cli_migrate(s, tmp_path, status=True) == 0, capsys.readouterr().err
        assert f"keyspace {s.keyspace}: up to date (2 of 2 migrations applied)" in capsys.readouterr().out
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


def test_replication_shortfalls_name_each_datacenter_short_of_nodes():
    """The pure part of migrate's warning for a replication the cluster cannot hold."""
    from infra.migrate import replication_shortfalls

    simple = {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "3"}
    assert replication_shortfalls(simple, {"dc1": 3}) == []
    (one,) = replication_shortfalls(simple, {"dc1": 1})
    assert "factor 3 in the cluster, which has 1 node(s)" in one and "cannot be reached" in one
    (two,) = replication_shortfalls(simple, {"dc1": 1, "dc2": 1})
    assert "has 2 node(s)" in two and "fails when 1 node(s) are down" in two
    nts = {"class": "NetworkTopologyStrategy", "dc1": "3", "dc2": "2/1"}
    assert replication_shortfalls(nts, {"dc1": 3, "dc2": 2}) == []
    short, _ = replication_shortfalls(nts, {"dc1": 3})
    assert "factor 2 in datacenter dc2, which the cluster does not have" in short
    assert replication_shortfalls({"class": "LocalStrategy"}, {}) == []


NTS = "org.apache.cassandra.locator.NetworkTopologyStrategy"


def test_a_short_datacenter_under_several_is_judged_by_the_quorum_of_all():
    """Session 52 (two real datacenters): with ``RATCHET_DATACENTERS=several`` the store
    reads and commits at QUORUM of all replicas, never a datacenter's LOCAL_QUORUM. dc2
    holding 1 of its 2 replicas leaves 2 of 3: QUORUM (2 of 3) holds, one node down
    fails it. The warning said "a QUORUM (2 of 2) cannot be reached, so the worker and
    the API fail every read and write", which with ``several`` is not so."""
    from infra.migrate import replication_shortfalls

    rep = {"class": NTS, "dc1": "1", "dc2": "2"}
    (only,) = replication_shortfalls(rep, {"dc1": 1, "dc2": 1}, several=True)
    assert only == ("2 of its 3 replicas on nodes (dc2 1 of 2): the QUORUM of all "
                    "datacenters (2 of 3) fails when 1 node(s) are down "
                    "(RATCHET_DATACENTERS=several)")
    assert replication_shortfalls({"class": NTS, "dc1": "1", "dc2": "1"},
                                  {"dc1": 1, "dc2": 1}, several=True) == []


def test_under_one_a_short_datacenter_names_who_fails_and_the_paxos_quorum():
    """With ``one`` a short datacenter's LOCAL_QUORUM fails the workers and APIs in it
    (not those elsewhere), and a datacenter short enough stops every promotion anywhere:
    Paxos is at SERIAL, a quorum of every datacenter's replicas (1 + 1 of 1 + 3 here)."""
    from infra.migrate import replication_shortfalls

    rep = {"class": NTS, "dc1": "1", "dc2": "3"}
    local, paxos = replication_shortfalls(rep, {"dc1": 1, "dc2": 1})
    assert local == ("replication factor 3 in datacenter dc2, which has 1 node(s): its "
                     "LOCAL_QUORUM (2 of 3) cannot be reached, so a worker or an API in dc2 "
                     "fails every read and write")
    assert paxos == ("2 of its 4 replicas on nodes (dc2 1 of 3): the QUORUM of all "
                     "datacenters (3 of 4) cannot be reached, so every promotion (Paxos at "
                     "SERIAL) fails")


def test_a_datacenter_the_cluster_lacks_is_named_as_such():
    """A datacenter named in the replication that no node is in (a typo: 'dc3' for
    'dc2') was "which has 0 node(s)", as if nodes were yet to come; it is named as one
    the cluster does not have, with those it has (session 52's review, rrevv)."""
    from infra.migrate import replication_shortfalls

    rep = {"class": NTS, "dc1": "3", "dc3": "3"}
    nodes = {"dc1": 3, "dc2": 3}
    local, left_out, paxos = replication_shortfalls(rep, nodes)
    assert left_out.startswith("no replica in datacenter dc2, which has 3 node(s)")
    assert local.startswith("replication factor 3 in datacenter dc3, which the cluster does "
                            "not have (its datacenters: dc1, dc2): its LOCAL_QUORUM")
    assert "(dc3 0 of 3, no such datacenter)" in paxos
    (only,) = replication_shortfalls(rep, nodes, several=True)
    assert "(dc3 0 of 3, no such datacenter)" in only


@pytest.mark.parametrize("several", [False, True])
@pytest.mark.parametrize("rep", [
    {"class": NTS, "dc1": "0"}, {"class": NTS},
    {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "0"}])
def test_no_replica_anywhere_is_warned_in_both_modes(rep, several):
    """Replication factor 0 everywhere: every read and write fails, and migrate said
    nothing (session 52's review, rrevv)."""
    from infra.migrate import replication_shortfalls

    (only,) = replication_shortfalls(rep, {"dc1": 3}, several)
    assert only == ("replication factor 0 in every datacenter: no node holds its data, "
                    "so every read and write fails")


def test_under_one_a_datacenter_without_replicas_fails_its_workers_and_apis():
    """With ``one`` the store reads and commits at LOCAL_QUORUM: a worker or an API in a
    datacenter the replication leaves out (RF 0, or not named) has no replica there to
    reach and fails every read and write. With ``several`` (QUORUM) it does not."""
    from infra.migrate import replication_shortfalls

    for rep in ({"class": NTS, "dc1": "3"}, {"class": NTS, "dc1": "3", "dc2": "0"}):
        (only,) = replication_shortfalls(rep, {"dc1": 3, "dc2": 3})
        assert only == ("no replica in datacenter dc2, which has 3 node(s): a worker or an "
                        "API in dc2 fails every read and write (its LOCAL_QUORUM has none "
                        "to reach)")
        assert replication_shortfalls(rep, {"dc1": 3, "dc2": 3}, several=True) == []


def test_under_one_simple_strategy_over_several_datacenters_is_warned():
    """SimpleStrategy places replicas without regard to datacenters, so with ``one``
    (LOCAL_QUORUM of the keyspace's factor in the coordinator's datacenter) a partition
    with fewer than a quorum of its replicas in a worker's datacenter fails there. With
    ``several`` (QUORUM of all) it holds."""
    from infra.migrate import replication_shortfalls

    simple = {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "3"}
    (only,) = replication_shortfalls(simple, {"dc1": 3, "dc2": 3})
    assert only == ("SimpleStrategy over 2 datacenters (dc1, dc2): it places the 3 replicas "
                    "without regard to datacenters, so a worker or an API fails the reads "
                    "and writes of a partition with fewer than 2 of them in its own "
                    "datacenter (LOCAL_QUORUM); NetworkTopologyStrategy places them per "
                    "datacenter")
    assert replication_shortfalls(simple, {"dc1": 3, "dc2": 3}, several=True) == []
    assert replication_shortfalls(simple, {"dc1": 3}) == []


@pytest.mark.integration
def test_migrate_status_through_a_slow_cassandra_says_the_status_not_cannot_reach(
    cassandra_session, settings, unique_name, tmp_path, capsys
):
    """Under the shared Cassandra's load ``--status`` printed no file's line (session
    51's KeyError, session 52's again): its ``connect`` failed "cannot reach Cassandra"
    (on stderr, exit 1 like "pending"), because the driver gives the control
    connection's own queries (the whole cluster's schema: ~700 tables here) 2 s by
    default. Answers 2.5 s late each, still well within every statement's timeout."""
    s = dataclasses.replace(settings, keyspace=unique_name("mig"))
    link = SlowLink(settings.cassandra_hosts[0], settings.cassandra_port, delay_s=2.5)
    try:
        (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);")
        apply_migrations(cassandra_session, s, tmp_path)
        (tmp_path / "002_more.cql").write_text("CREATE TABLE IF NOT EXISTS b (k int PRIMARY KEY);")
        capsys.readouterr()
        slow = dataclasses.replace(s, cassandra_hosts=("127.0.0.1",), cassandra_port=link.port)
        code = cli_migrate(slow, tmp_path, status=True)
        said = capsys.readouterr()
        assert code == 1, said
        assert said.err == "", said.err
        assert "001_core.cql" in said.out and "002_more.cql" in said.out, said.out
        assert f"keyspace {s.keyspace}: 1 of 2 migration(s) pending" in said.out, said.out
    finally:
        link.close()
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)
