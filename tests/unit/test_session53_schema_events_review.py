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


class _Metadata:
    """cassandra-driver's refreshes as they behave: a table's adds nothing to a keyspace
    the metadata lacks; a keyspace's adds it (its tables empty)."""

    def __init__(self) -> None:
        self.keyspaces: dict = {}
        self.asked: list[str] = []

    def refresh_keyspace_metadata(self, ks):
        self.asked.append(f"keyspace {ks}")
        self.keyspaces.setdefault(ks, SimpleNamespace(tables={}))

    def refresh_table_metadata(self, ks, table):
        self.asked.append(f"table {ks}.{table}")
        if ks in self.keyspaces:
            column = SimpleNamespace(cql_type="text")
            self.keyspaces[ks].tables[table] = SimpleNamespace(columns={"note": column})


def test_a_keyspace_the_migrators_metadata_lacks_is_read_not_a_keyerror():
    metadata = _Metadata()
    cluster = SimpleNamespace(metadata=metadata,
                              refresh_keyspace_metadata=metadata.refresh_keyspace_metadata,
                              refresh_table_metadata=metadata.refresh_table_metadata)
    session = SimpleNamespace(cluster=cluster)
    stmt = "ALTER TABLE turns ADD IF NOT EXISTS note text"
    assert _column_mismatches(session, "made_elsewhere", stmt) == []
    assert metadata.asked == ["keyspace made_elsewhere", "table made_elsewhere.turns"]
