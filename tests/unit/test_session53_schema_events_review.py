"""Session 53's schema events setting and test mends, reviewed from outside (docs/
decisions.md, same title).

- docs/operations.md's settings table held ``RATCHET_CASSANDRA_LOCAL_DC`` twice: the
  merge of ``RATCHET_CASSANDRA_SCHEMA_EVENTS`` brought back the row as it was before
  ``migrate --status`` exited 3 on an unknown local datacenter, beside the new one; a
  gateway built from docs/ read two answers. Each variable has one row.
- The warnings that tell an operator to ``ALTER KEYSPACE`` (``ratchet migrate``'s) did
  not say that running workers and APIs keep routing by the replication they read at
  their start (``RATCHET_CASSANDRA_SCHEMA_EVENTS=ignore``, the default): they now say
  to restart them.
- ``ratchet migrate``'s column check of an ``ALTER TABLE ... ADD`` read
  ``metadata.keyspaces[ks]`` after refreshing the table only: a keyspace another
  migrator made after this one connected, whose schema event the driver did not act on
  (no schema agreement), was a ``KeyError`` traceback. The keyspace is refreshed first.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from infra.migrate import _column_mismatches, _replication_differs, _replication_warning
from ratchet.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _settings_rows() -> list[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("## Settings (environment", 1)[1].split("\n## ", 1)[0]
    return [line for line in table.splitlines() if line.startswith("| `RATCHET_")]


def test_each_setting_has_one_row_in_the_operations_table():
    names = Counter(re.findall(r"`(RATCHET_\w+)`", row.split("|")[1])[0]
                    for row in _settings_rows())
    assert names["RATCHET_CASSANDRA_SCHEMA_EVENTS"] == 1
    assert [name for name, n in names.items() if n > 1] == []


def test_the_local_dc_row_gives_status_its_exit_3():
    (row,) = [r for r in _settings_rows() if r.startswith("| `RATCHET_CASSANDRA_LOCAL_DC`")]
    assert "`--status` exit 3" in row


class _Session:
    """What the two warnings read: the keyspace's replication and the nodes."""

    def __init__(self, replication: dict, datacenters: list[str]) -> None:
        self._row = (replication,)
        hosts = [SimpleNamespace(datacenter=dc) for dc in datacenters]
        self.cluster = SimpleNamespace(metadata=SimpleNamespace(all_hosts=lambda: hosts))

    def execute(self, *_args, **_kwargs):
        return SimpleNamespace(one=lambda: self._row)


SIMPLE_1 = {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "1"}
SIMPLE_3 = {"class": "org.apache.cassandra.locator.SimpleStrategy", "replication_factor": "3"}


def test_migrates_alter_keyspace_hints_say_to_restart_workers_and_apis():
    wanted = Settings.from_env({
        "RATCHET_REPLICATION": "{'class': 'SimpleStrategy', 'replication_factor': 3}"})
    differs = _replication_differs(_Session(SIMPLE_1, ["dc1"]), wanted)
    short = _replication_warning(_Session(SIMPLE_3, ["dc1"]), "ratchet")
    for line in (differs, short):
        assert line is not None and "ALTER KEYSPACE" in line, line
        assert "restart the workers and APIs" in line, line


class _Columns:
    """A session whose driver metadata knows no keyspace (another migrator made it after
    this one connected, its schema event skipped) and whose ``system_schema.columns``
    holds the table's columns: the check reads the latter."""

    cluster = SimpleNamespace(metadata=SimpleNamespace(keyspaces={}))

    def __init__(self, columns: dict[str, str]) -> None:
        self.columns, self.asked = columns, []

    def execute(self, query, params=(), timeout=None):
        self.asked.append((query, params))
        assert "system_schema.columns" in query, query
        return [SimpleNamespace(column_name=n, type=t) for n, t in self.columns.items()]


def test_a_keyspace_the_migrators_metadata_lacks_is_read_not_a_keyerror():
    session = _Columns({"note": "text", "tenant_id": "text"})
    stmt = "ALTER TABLE turns ADD IF NOT EXISTS note text"
    assert _column_mismatches(session, "made_elsewhere", stmt) == []
    assert [params for _, params in session.asked] == [("made_elsewhere", "turns")]


def test_the_column_check_never_waits_on_a_driver_metadata_refresh():
    """A refresh waits for schema agreement and raises "Table metadata was not
    refreshed" on a busy node (a whole test session's keyspace failed so, session 53):
    the check reads ``system_schema`` and calls no refresh."""
    session = _Columns({"note": "int"})
    session.cluster = SimpleNamespace(metadata=SimpleNamespace(keyspaces={}),
                                      refresh_table_metadata=_no_refresh,
                                      refresh_keyspace_metadata=_no_refresh)
    stmt = "ALTER TABLE turns ADD IF NOT EXISTS note text"
    assert _column_mismatches(session, "ks", stmt) == [
        "turns.note is int, the migration wants text"]


def _no_refresh(*_args):
    raise AssertionError("Table metadata was not refreshed")
