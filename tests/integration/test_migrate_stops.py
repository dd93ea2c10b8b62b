"""``ratchet migrate`` stopped by a signal, as a real process against the real Cassandra
(a keyspace of each test's own).

SIGTERM (how Kubernetes stops a Job's pod) was Python's default death: exit 143 with no
``finally``, the lease left held for its TTL (120 s), the Job's next attempt waiting that
long. A stop during the lease's release said nothing of the lease it may leave (session
47's review, left; session 48). Where the moment cannot be reached by timing alone, a
stand-in holds the run there (``_apply`` blocking once the lease is taken; the release's
``DELETE`` sent, then the signal): the lease, its take and its release are Cassandra's.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from streams.testing import ROOT
from tests.processes import as_from_a_terminal, blank_free, cli_env, stop_when_said

pytestmark = pytest.mark.integration

# The run held where the test wants it, then ``ratchet migrate`` as the CLI runs it.
_HELD = """
import os, signal, sys, time
import infra.migrate as m

def holding(*_args, **_kwargs):  # the lease is this run's now
    print("holding the lease", flush=True)
    time.sleep(120)

def stopped_while_releasing(session, ks, owner):  # the DELETE sent, then the signal
    sent = session.execute_async(
        f"DELETE FROM {{ks}}.schema_migrations_lease WHERE id = 'migrate' IF owner = %s",
        (owner,))
    os.kill(os.getpid(), signal.SIG{signal})
    sent.result()

def failing(*_args, **_kwargs):  # the run fails while it holds the lease
    raise m.MigrationError("a stand-in failure of the run")

def ensuring(*_args, **_kwargs):  # connected, before the lease
    print("making the keyspace", flush=True)
    time.sleep(120)

if "{where}" == "applying":
    m._apply = holding
if "{where}" == "connecting":
    m._ensure_keyspace = ensuring
if "releasing" in "{where}":
    m._release_lease = stopped_while_releasing
if "failed" in "{where}":
    m._apply = failing
if "mismatch" in "{where}":  # the first ALTER TABLE ADD (003) finds a stand-in mismatch
    m._column_mismatches = lambda _s, _ks, stmt: (
        None if m._ADD.match(stmt) is None else ["a stand-in mismatch"])
if "shutting down" in "{where}":  # a stop as the session closes (after the others)
    from cassandra.cluster import Session
    closing = Session.shutdown
    def stopped_while_closing(self):
        Session.shutdown = closing
        os.kill(os.getpid(), signal.SIG{signal})
        closing(self)
    Session.shutdown = stopped_while_closing
from ratchet.cli import main
main(["migrate"])
"""


def _lease_owner(session, ks: str) -> str | None:
    row = session.execute(f"SELECT owner FROM {ks}.schema_migrations_lease WHERE id = 'migrate'",
                          timeout=30).one()
    return None if row is None else row.owner


def _run_held(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``script`` run to its end, SIGINT as a terminal's shell leaves it (the default):
    a run started in the background ignores SIGINT, and so did the script, whose
    Ctrl-C then did nothing (exit 0, no line; a background CI run, session 49)."""
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=180,
                          preexec_fn=as_from_a_terminal)


def _stop_when_said(args: list[str], env: dict[str, str], said: str,
                    sig: signal.Signals) -> tuple[int, list[str]]:
    """Start ``args``, send ``sig`` once its stdout says ``said``: its exit code and
    non-blank stderr lines."""
    code, _, err = stop_when_said(args, env, said, sig, timeout_s=90)
    return code, blank_free(err)


def test_sigterm_while_holding_the_lease_releases_it_and_exits_143(own, cassandra_session):
    """Before: killed by the signal (returncode -15), no line, the lease this run's for
    120 s more."""
    script = _HELD.format(signal="INT", where="applying")
    code, lines = _stop_when_said([sys.executable, "-c", script], cli_env(own),
                                  "holding the lease", signal.SIGTERM)
    assert code == 143, lines
    # The stand-in holds the lease and applies nothing: none recorded, none under way.
    assert lines == ["ratchet migrate: terminated (SIGTERM): stopped; no migration was "
                     "recorded by this run, none was under way; `ratchet migrate --status` "
                     "says what is left, `ratchet migrate` finishes"], lines
    assert _lease_owner(cassandra_session, own.keyspace) is None  # released


def test_sigterm_while_waiting_for_another_migrators_lease_leaves_it_alone(
        own, cassandra_session):
    """No stand-in: ``ratchet migrate`` itself, waiting for another owner's lease."""
    from infra.migrate import LEASE_TTL_S, RENEW_EVERY_S

    subprocess.run([sys.executable, "-m", "ratchet.cli", "migrate"], env=cli_env(own), cwd=ROOT,
                   check=True, capture_output=True, timeout=180)
    cassandra_session.execute(
        f"INSERT INTO {own.keyspace}.schema_migrations_lease (id, owner, ttl_s, renew_every_s) "
        f"VALUES ('migrate', 'another', {LEASE_TTL_S}, {RENEW_EVERY_S}) USING TTL {LEASE_TTL_S}",
        timeout=30)
    code, lines = _stop_when_said([sys.executable, "-m", "ratchet.cli", "migrate"], cli_env(own),
                                  "waiting for another migrator", signal.SIGTERM)
    assert code == 143, lines
    assert len(lines) == 1 and lines[0].startswith(
        "ratchet migrate: terminated (SIGTERM): stopped; "), lines
    # It said "what it applied stays applied", nothing having been (session 48's review).
    assert ("no migration was applied (stopped while waiting for another migrator's lease, "
            "which it left alone)") in lines[0], lines
    assert "stays applied" not in lines[0], lines
    assert _lease_owner(cassandra_session, own.keyspace) == "another"


def test_a_stop_before_the_lease_says_no_migration_was_applied(own, cassandra_session):
    """Connected, making the keyspace (before the lease): the line said "what it applied
    stays applied, a migration it was applying is not recorded", nothing having been
    applied (session 48's review)."""
    script = _HELD.format(signal="INT", where="connecting")
    code, lines = _stop_when_said([sys.executable, "-c", script], cli_env(own),
                                  "making the keyspace", signal.SIGTERM)
    assert code == 143, lines
    assert len(lines) == 1 and lines[0].startswith(
        "ratchet migrate: terminated (SIGTERM): stopped; no migration was applied "
        "(stopped before taking the lease)"), lines
    assert "stays applied" not in lines[0], lines


@pytest.mark.parametrize("sig,how,code", [("INT", "interrupted (Ctrl-C)", 130),
                                          ("TERM", "terminated (SIGTERM)", 143)])
def test_a_stop_during_the_release_says_the_lease_may_stay_held(own, sig, how, code):
    """Before: the Ctrl-C line said nothing of the lease, which stayed held for its TTL
    (the next run waited 120 s here); SIGTERM killed the process."""
    script = _HELD.format(signal=sig, where="releasing")
    done = _run_held(script, cli_env(own))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"ratchet migrate: {how}: stopped; "), lines
    assert (f"stopped while releasing its lease {own.keyspace}.schema_migrations_lease, "
            "which may stay held until its TTL ends (at most 120 s)") in lines[0], lines
    # Every migration was applied and recorded: it said "a migration it was applying is
    # not recorded" (session 48's review).
    assert "stopped; every migration is applied and recorded, the schema up to date" in lines[0], \
        lines
    assert "not recorded" not in lines[0], lines


def test_a_stop_after_the_release_was_stopped_keeps_the_lease_note(own):
    """Ctrl-C pressed on: the release stopped (``LeaseLeft``), then another stop as the
    session closed replaced it, and the line no longer said the lease may stay held
    (session 48's review)."""
    script = _HELD.format(signal="INT", where="releasing, then shutting down")
    done = _run_held(script, cli_env(own))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 130, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("ratchet migrate: interrupted (Ctrl-C): "), lines
    assert "stopped while releasing its lease" in lines[0], lines


@pytest.mark.parametrize("sig,how,code", [("INT", "interrupted (Ctrl-C)", 130),
                                          ("TERM", "terminated (SIGTERM)", 143)])
def test_a_stop_after_a_successful_release_says_the_schema_is_up_to_date(
        own, cassandra_session, sig, how, code):
    """Every migration applied and recorded and the lease released, then a stop as the
    session closed: the line said a migration "is not recorded" (session 48's review)."""
    script = _HELD.format(signal=sig, where="shutting down")
    done = _run_held(script, cli_env(own))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == code, done.stderr[-2000:]
    assert lines == [f"ratchet migrate: {how}: stopped; every migration is applied and "
                     "recorded, the schema up to date; its lease was released"], lines
    assert _lease_owner(cassandra_session, own.keyspace) is None


@pytest.mark.parametrize("where", ["failed, releasing", "failed, shutting down",
                                   "failed, releasing, then shutting down"])
def test_a_failed_runs_line_survives_a_stop_as_its_session_closes(own, where):
    """A run that failed (a checksum mismatch, a lost lease, Cassandra timing out), then
    a stop while its lease was released (a Job's deadline, Ctrl-C): the failure was said
    nowhere, only the stop's line (session 48's review). The run's failure is the one the
    operator must act on; the stop's line follows it. The same when the stop comes as
    its session closed (after its release, or after a stop of the release too): the
    failure's line was lost (session 48's review, left; session 49)."""
    script = _HELD.format(signal="TERM", where=where)
    done = _run_held(script, cli_env(own))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 143, done.stderr[-2000:]
    assert len(lines) == 2, lines
    assert lines[0] == "ratchet migrate failed: a stand-in failure of the run", lines
    assert lines[1].startswith("ratchet migrate: terminated (SIGTERM): stopped; "), lines
    assert ("stopped while releasing its lease" in lines[1]) == ("releasing" in where), lines


def test_a_stop_after_a_failure_before_any_migration_says_none_was_under_way(
        own, cassandra_session):
    """A run that failed holding the lease before its first migration (the keyspace
    records a newer one: ``SchemaAhead``, "Nothing was applied"), then SIGTERM as its
    session closed: the stop's line said "a migration it was applying is not recorded
    and is re-run whole", none having been (session 49's review, left; session 50)."""
    subprocess.run([sys.executable, "-m", "ratchet.cli", "migrate"], env=cli_env(own), cwd=ROOT,
                   check=True, capture_output=True, timeout=180)
    cassandra_session.execute(
        f"INSERT INTO {own.keyspace}.schema_migrations (version, name, checksum) "
        "VALUES (999, 'from_a_newer_ratchet', 'x')", timeout=30)
    done = _run_held(_HELD.format(signal="TERM", where="shutting down"), cli_env(own))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 143, done.stderr[-2000:]
    assert len(lines) == 2 and "999_from_a_newer_ratchet" in lines[0], lines
    assert lines[1] == (
        "ratchet migrate: terminated (SIGTERM): stopped; no migration was recorded by "
        "this run, none was under way; `ratchet migrate --status` says what is left, "
        "`ratchet migrate` finishes once the failure above is dealt with"), lines


def test_a_stop_after_a_failure_in_a_migration_names_it_and_those_recorded(own):
    """A statement of 003 fails (a stand-in column mismatch) after 001 and 002 were
    recorded, then SIGTERM as the session closes: the line names what stays and the
    migration that is re-run whole."""
    done = _run_held(_HELD.format(signal="TERM", where="mismatch, shutting down"),
                     cli_env(own))
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 143, done.stderr[-2000:]
    assert len(lines) == 3 and "a stand-in mismatch" in lines[0], lines  # + its statement
    assert lines[2] == (
        "ratchet migrate: terminated (SIGTERM): stopped; 001_core.cql, 002_ledger.cql "
        "applied and recorded by this run (they stay); 003_ledger_owners.cql was under "
        "way and is not recorded: it is re-run whole; `ratchet migrate --status` says "
        "what is left, `ratchet migrate` finishes once the failure above is dealt with"), lines
