"""Every statement ratchet prepares names its keyspace (session 45).

Cassandra 4.0 and later answers the prepare of a statement that leaves its keyspace to
the session's ``USE`` with a warning ("`USE <keyspace>` with prepared statements is
considered to be an anti-pattern ..."), logged by cassandra-driver at WARNING: at the
start of a worker or API on a keyspace, once for every statement of the store and the
ledger the server had not prepared yet. ``services/cassandra_cluster.py``,
``keyspace_of``. The real server's side: ``tests/integration/test_cassandra_prepare_warnings.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from services.ledger.cassandra import CassandraLedger
from services.store.cassandra import CassandraCheckpointStore

ROOT = Path(__file__).resolve().parents[2]
TABLE_REFERENCE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+([\w.]+)", re.IGNORECASE)
# Every table a migration creates (infra/migrations/), and the store bench's own.
TABLES = {m.group(1) for path in (ROOT / "infra" / "migrations").glob("*.cql")
          for m in re.finditer(r"CREATE TABLE IF NOT EXISTS (\w+)", path.read_text())}
TABLES |= {"raw_baseline", "schema_migrations", "schema_migrations_lease"}


class _Prepared:
    """What the store and ledger set on a prepared statement, and nothing else."""

    def __init__(self, query: str) -> None:
        self.query_string = query


class RecordingSession:
    """A session connected to ``keyspace`` that prepares by recording the CQL."""

    def __init__(self, keyspace: str | None) -> None:
        self.keyspace = keyspace
        self.prepared: list[str] = []

    def prepare(self, query: str) -> _Prepared:
        self.prepared.append(query)
        return _Prepared(query)

    def execution_profile_clone_update(self, *_args, **_kwargs):
        raise RuntimeError("no profiles here: the backends keep the default")


def _tables(statements: list[str]) -> list[str]:
    return [m.group(1) for cql in statements for m in TABLE_REFERENCE.finditer(cql)]


@pytest.mark.parametrize("backend", [CassandraCheckpointStore, CassandraLedger])
def test_every_statement_a_backend_prepares_names_the_session_keyspace(backend):
    session = RecordingSession("ks_session")
    backend(session)
    tables = _tables(session.prepared)
    assert len(tables) == len(session.prepared) > 10
    unqualified = sorted({t for t in tables if not t.startswith("ks_session.")})
    assert unqualified == []


@pytest.mark.parametrize("backend", [CassandraCheckpointStore, CassandraLedger])
def test_a_keyspace_given_is_the_one_named(backend):
    session = RecordingSession("ks_session")
    backend(session, keyspace="ks_given")
    assert {t.split(".")[0] for t in _tables(session.prepared)} == {"ks_given"}


@pytest.mark.parametrize("backend", [CassandraCheckpointStore, CassandraLedger])
def test_no_keyspace_at_all_is_refused_before_anything_is_prepared(backend):
    from services.cassandra_cluster import NoKeyspace

    session = RecordingSession(None)
    with pytest.raises(NoKeyspace):
        backend(session)
    assert session.prepared == []


def _code_strings(path: Path):
    """(line, text) of each string in ``path``'s code: docstrings left out, an
    f-string's literal parts each on its own."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node.lineno, node.value


def test_no_product_module_names_a_ratchet_table_without_its_keyspace():
    """The benches' raw statements (prepared beside the store's) and any statement
    written later: a table named bare in a string of the product's code. Migrations'
    ``.cql`` files run on purpose in the keyspace (``session.set_keyspace``) and are
    never prepared."""
    found = []
    for folder in ("ratchet", "services", "streams", "infra"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, text in _code_strings(path):
                for m in TABLE_REFERENCE.finditer(text):
                    if m.group(1) in TABLES:
                        found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)}")
    assert found == []
