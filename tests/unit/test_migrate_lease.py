"""The migration lease held while one statement runs (``infra/migrate.py``), against an
in-memory stand-in for Cassandra: the lease row's LWTs with real TTLs (short here),
``schema_migrations``, and migration statements that take as long as a test wants.

The lease (120 s) was renewed between migrations only: a single statement longer than
it (DDL waiting for schema agreement on a slow cluster) ran without the lease, and a
second migrator could take it meanwhile (an operator's review, session 43, left).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from types import SimpleNamespace

import pytest

from infra import migrate
from infra.migrate import MigrationError, apply_migrations
from ratchet.settings import Settings

KS = "leaseks"
TTL_S = 1  # the lease's TTL in these tests (seconds)


class Result(list):
    def __init__(self, rows=(), applied=True, columns=()):
        super().__init__(rows)
        self.was_applied = applied
        self.column_names = list(columns)

    def one(self):
        return self[0] if self else None


class FakeCassandra:
    """What ``apply_migrations`` asks of a session. A statement of a migration that
    contains ``/*slow*/`` calls ``on_slow`` (the test's doing) before it returns."""

    def __init__(self, on_slow=lambda cassandra: None):
        self.lock = threading.Lock()
        self.lease: tuple[str, float] | None = None  # owner, expires (monotonic)
        # The TTL and renewal period the lease row stores (another migrator's may differ
        # from this run's; a TTL of None: a row written by hand without one).
        self.terms: tuple[int | None, float | None] = (TTL_S, TTL_S / 10)
        self.recorded: dict[int, SimpleNamespace] = {}
        # Records a plain read (the driver's LOCAL_ONE) misses: the replica it reads
        # dropped their write. A SERIAL read (Paxos, a quorum) sees every record.
        self.stale: set[int] = set()
        self.ran: list[str] = []
        self.renewals: list[tuple[str, bool]] = []  # (owner, applied) per renewal asked
        self.fail_renewals = False
        self.on_slow = on_slow
        self.cluster = self

    # the Cluster's side
    def connect(self):
        return self

    def shutdown(self):
        pass

    def set_keyspace(self, ks):
        assert ks == KS

    def holder(self) -> str | None:
        if self.lease is not None and self.lease[1] > time.monotonic():
            return self.lease[0]
        return None

    def take(self, owner: str) -> bool:
        """Another migrator's ``INSERT ... IF NOT EXISTS`` of the lease."""
        with self.lock:
            if self.holder() is not None:
                return False
            self.lease = (owner, time.monotonic() + TTL_S)
            return True

    def execute(self, query, params=(), timeout=None):
        from cassandra import ConsistencyLevel

        serial = getattr(query, "consistency_level", None) == ConsistencyLevel.SERIAL
        query = getattr(query, "query_string", query)  # a statement: its text
        q = " ".join(query.split())
        if q.startswith(("CREATE KEYSPACE", f"CREATE TABLE IF NOT EXISTS {KS}.")):
            return Result()
        if q.startswith("SELECT replication FROM system_schema.keyspaces"):
            return Result()
        if q.startswith(f"SELECT ttl_s, renew_every_s FROM {KS}.schema_migrations_lease"):
            return Result()  # the lease table takes the lease's terms
        if q.startswith(f"INSERT INTO {KS}.schema_migrations_lease"):
            with self.lock:
                if self.holder() is None:
                    self.lease = (params[0], time.monotonic() + TTL_S)
                    return Result()
                return Result([SimpleNamespace(owner=self.holder())], False, ["owner"])
        if q.startswith(f"SELECT owner, TTL(owner), ttl_s, renew_every_s FROM {KS}."):
            with self.lock:
                holder = self.holder()
                if holder is None:
                    return Result()
                ttl_s, every = self.terms
                left = None if ttl_s is None else max(1, round(self.lease[1] - time.monotonic()))
                return Result([(holder, left, ttl_s, every)])
        if q.startswith(f"UPDATE {KS}.schema_migrations_lease"):
            if self.fail_renewals:
                raise TimeoutError("the renewal timed out (a busy node)")
            with self.lock:
                applied = self.holder() == params[1]
                self.renewals.append((params[1], applied))
                if applied:
                    self.lease = (params[0], time.monotonic() + TTL_S)
                    return Result()
                holder = self.holder()
                return Result([SimpleNamespace(owner=holder)] if holder else [], False,
                              ["owner"] if holder else [])
        if q.startswith(f"DELETE FROM {KS}.schema_migrations_lease"):
            with self.lock:
                if self.holder() == params[0]:
                    self.lease = None
            return Result()
        if q.startswith(f"SELECT version, name, checksum FROM {KS}.schema_migrations "
                        "WHERE version = %s"):
            assert serial, q  # one record, read as Paxos wrote it
            row = self.recorded.get(params[0])
            return Result([row] if row is not None else [])
        if q.startswith(f"SELECT version, name, checksum FROM {KS}.schema_migrations"):
            seen = [r for v, r in self.recorded.items() if serial or v not in self.stale]
            return Result(seen)
        if q.startswith(f"INSERT INTO {KS}.schema_migrations "):
            version, name, checksum = params
            if q.endswith("IF NOT EXISTS") and version in self.recorded:
                return Result([self.recorded[version]], False)
            self.recorded[version] = SimpleNamespace(version=version, name=name,
                                                     checksum=checksum)
            return Result()
        if q.startswith("CREATE TABLE"):
            if "/*slow*/" in query:
                self.on_slow(self)
            self.ran.append(q)
            return Result()
        raise AssertionError(f"unexpected statement: {q}")


@pytest.fixture
def short_lease(monkeypatch):
    """A lease of ``TTL_S``, renewed ten times as often."""
    monkeypatch.setattr(migrate, "LEASE_TTL_S", TTL_S)
    monkeypatch.setattr(migrate, "RENEW_EVERY_S", TTL_S / 10, raising=False)


@pytest.fixture
def settings():
    return dataclasses.replace(Settings.from_env({}), keyspace=KS)


def _slow_migration(folder, second: bool = False):
    # The marker is quoted: ``split_statements`` drops comments.
    text = "CREATE TABLE a (k int PRIMARY KEY, note text) WITH comment = '/*slow*/';\n"
    if second:
        text += "CREATE TABLE b (k int PRIMARY KEY);\n"
    (folder / "001_slow.cql").write_text(text)


def test_a_statement_longer_than_the_lease_keeps_it_while_it_runs(short_lease, settings,
                                                                  tmp_path):
    """A statement that runs three times the lease's TTL: the lease is renewed while it
    runs, so another migrator trying then is refused; the migration is applied and
    recorded."""
    seen = {}

    def slow(cassandra):
        time.sleep(3 * TTL_S)
        ours = cassandra.holder()
        seen["renewed"] = sum(1 for owner, applied in cassandra.renewals
                              if applied and owner == ours)
        seen["other took it"] = cassandra.take("other")

    cassandra = FakeCassandra(on_slow=slow)
    _slow_migration(tmp_path)
    applied = apply_migrations(cassandra, settings, tmp_path)
    assert seen["other took it"] is False  # the lease was still ours
    assert seen["renewed"] >= 1
    assert [m.version for m in applied] == [1] and set(cassandra.recorded) == {1}
    assert cassandra.holder() is None  # released at the end


def test_a_lease_taken_while_a_statement_runs_stops_the_run_before_the_next(
        short_lease, settings, tmp_path):
    """Another migrator holds the lease (ours was lost) while statement 1 runs: a
    renewal finds it so, and the run stops before statement 2 with a typed error naming
    the holder and the statement not run; the migration is not recorded and the other
    migrator's lease is left alone."""

    def slow(cassandra):
        with cassandra.lock:
            cassandra.lease = ("other", time.monotonic() + 60)
        deadline = time.monotonic() + 10  # a renewal refused, or give up (the old code)
        while time.monotonic() < deadline and not any(
                not applied for _owner, applied in cassandra.renewals):
            time.sleep(0.01)

    cassandra = FakeCassandra(on_slow=slow)
    _slow_migration(tmp_path, second=True)
    with pytest.raises(getattr(migrate, "LeaseLost", MigrationError)) as err:
        apply_migrations(cassandra, settings, tmp_path)
    assert "held now by other" in str(err.value)
    assert "001_slow.cql statement 2" in str(err.value)
    assert [q for q in cassandra.ran if q.startswith("CREATE TABLE b")] == []
    assert cassandra.recorded == {}
    assert cassandra.holder() == "other"


def test_a_lease_that_could_not_be_renewed_for_its_ttl_stops_the_run(short_lease, settings,
                                                                     tmp_path):
    """Every renewal fails (a timeout each) while statement 1 runs longer than the TTL:
    the lease may be anyone's now, so the run stops before statement 2."""

    def slow(cassandra):
        cassandra.fail_renewals = True
        time.sleep(2 * TTL_S)

    cassandra = FakeCassandra(on_slow=slow)
    _slow_migration(tmp_path, second=True)
    with pytest.raises(MigrationError, match="not renewed for .*statement 2"):
        apply_migrations(cassandra, settings, tmp_path)
    assert [q for q in cassandra.ran if q.startswith("CREATE TABLE b")] == []
    assert cassandra.recorded == {}


# --- Waiting for another migrator's lease (session 46's review, left; session 47) ------

def _other_migrator(cassandra, runs_s: float, ttl_s: float = 5 * TTL_S) -> threading.Thread:
    """Another migrator that holds the lease for ``runs_s`` with a TTL of ``ttl_s`` (five
    times this run's), renewing it as it goes, then releases it."""
    with cassandra.lock:
        cassandra.lease = ("other", time.monotonic() + ttl_s)
        cassandra.terms = (int(ttl_s), ttl_s / 4)

    def run():
        ends = time.monotonic() + runs_s
        while time.monotonic() < ends:
            time.sleep(ttl_s / 4)
            with cassandra.lock:
                cassandra.lease = ("other", time.monotonic() + ttl_s)
        with cassandra.lock:
            cassandra.lease = None

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_running_migrator_with_a_longer_lease_is_waited_for_until_it_is_done(
        short_lease, settings, tmp_path):
    """A running migrator whose lease (8 s here) outlasts this run's own TTL (1 s here;
    120 s against a 600 s lease for real), holding it 4 s: the run waited this
    version's TTL and gave up, exit 1, while the other went on. It waits while the lease
    is held, saying so with the lease's own terms, then applies. (8 s: its renewal
    period, a quarter, plus --status's 5 s of slack stays below the TTL; at 5 s no age
    could tell a running migrator from a killed one, which reads "unknown".)"""
    cassandra = FakeCassandra()
    other = _other_migrator(cassandra, runs_s=4 * TTL_S, ttl_s=8 * TTL_S)
    _slow_migration(tmp_path)
    said: list[str] = []
    applied = apply_migrations(cassandra, settings, tmp_path, out=said.append)
    other.join()
    assert [m.version for m in applied] == [1] and set(cassandra.recorded) == {1}
    waiting = [line for line in said if line.startswith("waiting for another migrator")]
    assert waiting and "(owner other)" in waiting[0], said
    assert "--wait SECONDS" in waiting[0] and "A migrator is running now" in waiting[0], said


def test_wait_bounds_the_wait_and_nothing_is_applied(short_lease, settings, tmp_path):
    """``--wait 0``: another migrator holds the lease, so the run stops at once, naming
    the holder, applying nothing; the other's lease is left alone."""
    cassandra = FakeCassandra()
    other = _other_migrator(cassandra, runs_s=2 * TTL_S)
    _slow_migration(tmp_path)
    with pytest.raises(MigrationError) as err:
        apply_migrations(cassandra, settings, tmp_path, lease_wait_s=0)
    assert cassandra.holder() == "other"
    other.join()
    message = str(err.value)
    assert "--wait 0" in message and "held by other" in message, message
    assert "Nothing was applied" in message and cassandra.recorded == {}


def test_a_lease_that_never_expires_is_refused_at_once_naming_its_delete(
        short_lease, settings, tmp_path):
    """A lease row without a TTL (by hand) never ends: waiting for it cannot help, so
    the run stops at once with the statement that removes it."""
    cassandra = FakeCassandra()
    cassandra.lease = ("hand", float("inf"))
    cassandra.terms = (None, None)
    _slow_migration(tmp_path)
    with pytest.raises(MigrationError) as err:
        apply_migrations(cassandra, settings, tmp_path)
    message = str(err.value)
    assert "never expires" in message, message
    assert f"DELETE FROM {KS}.schema_migrations_lease WHERE id = 'migrate'" in message
    assert cassandra.recorded == {}


@pytest.mark.parametrize("lease,waited,wait_s,gives_up", [
    (migrate.LeaseRow("o", 550, 600, 150.0), 300, None, False),  # held: wait on
    (migrate.LeaseRow("o", 30, None, None), 300, None, False),  # an older version's: ends
    (migrate.LeaseRow("o", 550, 600, 150.0), 10, 10, True),  # --wait 10 spent
    (migrate.LeaseRow("o", 550, 600, 150.0), 9, 10, False),
    (migrate.LeaseRow("o", None, None, None), 0, None, True),  # never expires
    (None, 300, None, False),  # held, its row not read: wait on
    (None, 0, 0, True),  # ... but --wait 0 is spent
])
def test_lease_wait_verdict(lease, waited, wait_s, gives_up):
    assert (migrate.lease_wait_verdict(lease, waited, wait_s) is not None) is gives_up


# --- Ctrl-C at the take, and a refused take whose row is not read (session 47) ------

class InterruptedTake(FakeCassandra):
    """Ctrl-C lands while the lease's ``INSERT`` is answered: Cassandra applied it (a
    lease that outlives the test: only a release ends it), the run never learns so."""

    def execute(self, query: str, params=(), timeout=None):
        result = super().execute(query, params, timeout)
        if " ".join(query.split()).startswith(f"INSERT INTO {KS}.schema_migrations_lease"):
            with self.lock:
                self.lease = (self.lease[0], float("inf"))
            raise KeyboardInterrupt
        return result


def test_ctrl_c_while_the_lease_is_taken_releases_it(short_lease, settings, tmp_path):
    """The take's ``INSERT`` applied, then Ctrl-C: the run stopped before its ``finally``
    that releases the lease, so the lease stayed its (for ``LEASE_TTL_S``, 120 s: the
    next migrate, a Job's retry, waited that long). It is released on the way out."""
    cassandra = InterruptedTake()
    _slow_migration(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        apply_migrations(cassandra, settings, tmp_path)
    assert cassandra.holder() is None
    assert cassandra.recorded == {}


class UnreadLease(FakeCassandra):
    """The lease's ``INSERT ... IF NOT EXISTS`` is refused (the Paxos round sees a
    holder) but the plain read that follows never sees the row (a replica behind the
    LWT's, read at the driver's LOCAL_ONE). Stops the test after 500 takes."""

    def __init__(self):
        super().__init__()
        self.lease = ("other", float("inf"))
        self.takes = 0

    def execute(self, query: str, params=(), timeout=None):
        q = " ".join(query.split())
        if q.startswith(f"INSERT INTO {KS}.schema_migrations_lease"):
            self.takes += 1
            if self.takes > 500:
                raise AssertionError("500 takes without a pause or the --wait bound")
        if q.startswith(f"SELECT owner, TTL(owner), ttl_s, renew_every_s FROM {KS}."):
            return Result()
        return super().execute(query, params, timeout)


def test_a_refused_take_whose_row_is_not_read_keeps_the_wait_bound(short_lease, settings,
                                                                   tmp_path):
    """A take refused while its row reads as absent was tried again at once, for ever:
    no pause, no line, and ``--wait`` never checked (it was checked only against a row
    read). Now it is tried again at once one time, then waited for as a held lease."""
    cassandra = UnreadLease()
    _slow_migration(tmp_path)
    with pytest.raises(MigrationError) as err:
        apply_migrations(cassandra, settings, tmp_path, lease_wait_s=0)
    message = str(err.value)
    assert "--wait 0" in message and "Nothing was applied" in message, message
    assert cassandra.takes <= 3 and cassandra.recorded == {}


# --- Ctrl-C while applying, then a release that fails (session 48) -----------------

class ReleaseFails(FakeCassandra):
    """The lease's release (its ``DELETE``) fails as the driver fails a request that
    does not reach Cassandra; a migration's ``/*slow*/`` statement is where Ctrl-C
    lands (``on_slow``)."""

    def execute(self, query, params=(), timeout=None):
        text = getattr(query, "query_string", query)
        if " ".join(text.split()).startswith(f"DELETE FROM {KS}.schema_migrations_lease"):
            raise TimeoutError("the release timed out (Cassandra away)")
        return super().execute(query, params, timeout)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, MigrationError])
def test_a_failed_release_never_hides_why_the_run_stopped(short_lease, settings, tmp_path,
                                                          raised):
    """Ctrl-C (or any failure) while a migration ran, then the lease's release fails:
    the release's error replaced the ``KeyboardInterrupt``, and ``ratchet migrate``
    said "cannot reach Cassandra", exit 1, instead of its interrupted line and 130 (an
    outside review, session 48). The run's own failure is the one raised; the lease is
    left to its TTL."""
    def stop(cassandra):
        raise KeyboardInterrupt if raised is KeyboardInterrupt else MigrationError("bad")

    cassandra = ReleaseFails(on_slow=stop)
    _slow_migration(tmp_path)
    with pytest.raises(raised):
        apply_migrations(cassandra, settings, tmp_path)
    assert cassandra.recorded == {}


def test_a_release_that_fails_after_a_run_that_applied_is_a_warning(short_lease, settings,
                                                                     tmp_path):
    """A run that applied everything and could not release its lease raised the
    release's error, and ``ratchet migrate`` said "cannot reach Cassandra", exit 1,
    although the schema was up to date (session 48's operator leftovers, left). It
    returns what it applied and warns: the lease stays held until its TTL ends."""
    cassandra = ReleaseFails()
    _slow_migration(tmp_path)
    said: list[str] = []
    applied = apply_migrations(cassandra, settings, tmp_path, out=said.append)
    assert [m.version for m in applied] == [1] and list(cassandra.recorded) == [1]
    (warning,) = [line for line in said if line.startswith("warning: ")]
    assert (f"could not release the lease {KS}.schema_migrations_lease (TimeoutError: the "
            f"release timed out (Cassandra away)); it stays held until its TTL ends (at most "
            f"{migrate.LEASE_TTL_S} s)") in warning, warning


# --- a record one replica missed (session 53) ------------------------------------------

def test_a_record_a_replica_missed_is_not_applied_again(short_lease, settings, tmp_path):
    """The records were read and written at the driver's LOCAL_ONE under
    ``RATCHET_DATACENTERS=one``: a record one replica of three acknowledged, read by the
    next migrate from a replica that dropped its write, ran the migration again whole
    (a migration need not be idempotent). Read at SERIAL now, written with Paxos: the
    record is seen, nothing is re-run."""
    (tmp_path / "001_a.cql").write_text("CREATE TABLE a (k int PRIMARY KEY);")
    (tmp_path / "002_b.cql").write_text("CREATE TABLE b (k int PRIMARY KEY);")
    cassandra = FakeCassandra()
    assert [m.version for m in apply_migrations(cassandra, settings, tmp_path)] == [1, 2]
    cassandra.stale = {1}  # the replica a plain read reaches lacks 001's record
    cassandra.ran.clear()
    assert apply_migrations(cassandra, settings, tmp_path) == []
    assert cassandra.ran == []


class RecordedMeanwhile(FakeCassandra):
    """Another migrator (its lease taken once this run's had lapsed unseen) recorded the
    migration, from a file of other bytes, between this run's lease check and its
    record."""

    def __init__(self, checksum: str):
        super().__init__()
        self.theirs = checksum

    def execute(self, query, params=(), timeout=None):
        q = " ".join(getattr(query, "query_string", query).split())
        if q.startswith(f"INSERT INTO {KS}.schema_migrations ") and params[0] not in self.recorded:
            self.recorded[params[0]] = SimpleNamespace(version=params[0], name=params[1],
                                                       checksum=self.theirs)
        return super().execute(query, params, timeout)


def test_a_record_another_migrator_wrote_with_another_checksum_is_not_taken_as_ours(
        short_lease, settings, tmp_path):
    """The record's ``INSERT ... IF NOT EXISTS`` not applied was taken as this run's own
    earlier attempt: the run said ``applied`` and exit 0, the keyspace recording another
    file's checksum (the next migrate's ``ChecksumMismatch``). Now the row it found is
    compared: another checksum stops the run, naming both."""
    (tmp_path / "001_a.cql").write_text("CREATE TABLE a (k int PRIMARY KEY);")
    cassandra = RecordedMeanwhile("f" * 64)
    said: list[str] = []
    with pytest.raises(MigrationError) as stop:
        apply_migrations(cassandra, settings, tmp_path, out=said.append)
    assert "001_a.cql" in str(stop.value) and "ffffffffffff" in str(stop.value), stop.value
    assert not any(line.startswith("applied 001_a.cql") for line in said), said


def test_a_record_found_with_this_runs_checksum_is_this_runs(short_lease, settings, tmp_path):
    """The same checksum (this run's own attempt, its answer lost and retried; or the
    same file applied by another run): applied, as before (a guard)."""
    path = tmp_path / "001_a.cql"
    path.write_text("CREATE TABLE a (k int PRIMARY KEY);")
    cassandra = RecordedMeanwhile(migrate.discover(tmp_path)[0].checksum)
    assert [m.version for m in apply_migrations(cassandra, settings, tmp_path)] == [1]
