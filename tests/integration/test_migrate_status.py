"""``ratchet migrate --status`` on a keyspace whose migration lease is held.

It said "a migrator is running now (lease owner X)" for any lease row, a killed
migrator's too, for up to ``LEASE_TTL_S`` (120 s): an operator could not tell whether
to wait, or how long (session 44's review, left; session 45). Now it names the owner,
when the lease was last taken or renewed and when it expires, and whether that owner
still renews it. The lease rows are written as ``ratchet migrate`` writes them (owner,
TTL); a killed migrator's last renewal is set in the past with ``USING TIMESTAMP``
by the TTL it would have left.
"""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import UTC, datetime

import pytest

from infra.migrate import LEASE_TTL_S, apply_migrations, cli_migrate

pytestmark = pytest.mark.integration


@pytest.fixture
def migrated(cassandra_session, settings, unique_name, tmp_path):
    s = dataclasses.replace(settings, keyspace=unique_name("migstat"))
    (tmp_path / "001_core.cql").write_text("CREATE TABLE IF NOT EXISTS a (k int PRIMARY KEY);")
    apply_migrations(cassandra_session, s, tmp_path)
    yield s, tmp_path
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {s.keyspace}", timeout=60)


def _hold_lease(session, ks: str, owner: str, *, renewed_s_ago: int) -> datetime:
    """The lease row as a migrator that last renewed it ``renewed_s_ago`` seconds ago
    leaves it (the TTL it has left then)."""
    session.execute(
        f"INSERT INTO {ks}.schema_migrations_lease (id, owner) VALUES ('migrate', %s) "
        f"USING TTL {LEASE_TTL_S - renewed_s_ago}", (owner,), timeout=30)
    return datetime.fromtimestamp(time.time() - renewed_s_ago, UTC)


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


def test_the_lease_line_without_a_server():
    """``describe_lease`` alone: the age is the TTL's count, the owner always named."""
    from infra.migrate import RENEW_EVERY_S, describe_lease

    now = datetime(2026, 12, 7, 2, 0, 0, tzinfo=UTC)
    stopped = describe_lease("o1", LEASE_TTL_S - 50, "ks", now)
    assert "held by o1" in stopped and "renewed at 2026-12-07 01:59:10 UTC (50s ago)" in stopped
    assert f"expires in {LEASE_TTL_S - 50}s" in stopped and "killed" in stopped
    running = describe_lease("o2", LEASE_TTL_S - int(RENEW_EVERY_S), "ks", now)
    assert "A migrator is running now" in running
    assert "no owner named" in describe_lease(None, LEASE_TTL_S, "ks", now)


def test_a_lease_with_a_longer_ttl_than_migrate_writes_is_not_called_a_running_migrator():
    """``ratchet migrate`` writes its lease with ``LEASE_TTL_S`` at every take and
    renewal, so a TTL left above it was written otherwise (by hand): its age cannot be
    told from it. It read as renewed 0 s ago, "A migrator is running now" (an outside
    review, session 46); now it is named as not ratchet's, with its expiry."""
    from infra.migrate import describe_lease

    now = datetime(2026, 12, 7, 2, 0, 0, tzinfo=UTC)
    line = describe_lease("hand", 86_400, "ks", now)
    assert "A migrator is running now" not in line
    assert "held by hand" in line and "not written by ratchet migrate" in line
    assert "expires in 86400s" in line
    assert "DELETE FROM ks.schema_migrations_lease WHERE id = 'migrate'" in line
