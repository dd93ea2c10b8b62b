"""Numbered CQL migrations (``ratchet migrate``), applied once each and recorded.

Files are ``infra/migrations/NNN_name.cql`` (``NNN`` = version, applied in order).
Rules for their authors:

1. Statements are separated by ``;``. Comments (``--``, ``//``, ``/* */``) are allowed.
2. They run with the settings' keyspace as the current keyspace: write ``CREATE TABLE
   heads (...)``, never a hard-coded keyspace name (tests use their own keyspaces).
3. Use ``IF NOT EXISTS`` in DDL: a migration that fails half-way is re-run whole.
4. Never edit an applied migration: its sha256 is recorded and a changed checksum is
   an error. Add a new file instead.

``apply_migrations`` creates the keyspace with ``settings.replication`` and the
``schema_migrations`` table (version, name, checksum, applied_at), takes a short LWT
lease so two migrators never run DDL at once, then applies what is missing. The lease
(``LEASE_TTL_S``) is renewed every ``RENEW_EVERY_S`` by a thread while the run goes
on, statements included, and before each migration; lost, the run stops before its
next statement (``LeaseLost``). The lease row carries its TTL and renewal period
(``ttl_s``, ``renew_every_s``): ``--status`` reads another version's lease by its own.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ratchet.settings import Settings
from ratchet.stops import LeaseLeft, MigrateProgress

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
_FILE = re.compile(r"^(\d{3,})_([A-Za-z0-9_]+)\.cql$")
_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
LEASE_TTL_S = 120
# How often the lease is renewed while a run holds it: a quarter of its TTL, so three
# renewals in a row can fail (a busy node) before it expires.
RENEW_EVERY_S = 30.0
# How long the lease's release may take (an LWT): a Job's grace period after SIGTERM
# must outlast it (deploy/k8s/migrate-job.yaml) or the kill leaves the lease to its TTL.
RELEASE_TIMEOUT_S = 30
# How long a renewal may take: a stop waits for one in flight before the release, so the
# grace period must outlast both.
RENEW_TIMEOUT_S = 30


class MigrationError(RuntimeError):
    """The migrations cannot be applied; the message says which file and why."""


class ChecksumMismatch(MigrationError):
    """An applied migration's file was edited afterwards."""


class LeaseLost(MigrationError):
    """This run no longer holds the migration lease (another migrator took it, or it
    could not be renewed before its TTL): it stopped before its next statement."""


class SchemaAhead(MigrationError):
    """The keyspace records migrations this ratchet has no file for: a newer version
    migrated it, and this one does not know what they changed."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    checksum: str  # sha256 hex of the file's bytes
    statements: tuple[str, ...]


def split_statements(text: str) -> list[str]:
    """Split CQL on ``;`` outside quotes, ``$$`` blocks and comments; drop comments."""
    out: list[str] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c, two = text[i], text[i : i + 2]
        if two in ("--", "//"):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif two == "/*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif two == "$$":
            j = text.find("$$", i + 2)
            j = n if j < 0 else j + 2
            buf.append(text[i:j])
            i = j
        elif c in ("'", '"'):
            j = i + 1
            while j < n:
                if text[j] == c and text[j + 1 : j + 2] == c:
                    j += 2  # doubled quote escapes itself
                elif text[j] == c:
                    break
                else:
                    j += 1
            buf.append(text[i : j + 1])
            i = j + 1
        elif c == ";":
            out.append("".join(buf))
            buf = []
            i += 1
        else:
            buf.append(c)
            i += 1
    out.append("".join(buf))
    return [" ".join(s.split()) for s in out if s.strip()]


def discover(folder: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations in ``folder`` ordered by version; malformed names are an error."""
    found: dict[int, Migration] = {}
    for path in sorted(folder.glob("*.cql")) if folder.is_dir() else []:
        m = _FILE.match(path.name)
        if not m:
            raise MigrationError(f"{path}: migration files must be named NNN_name.cql")
        version = int(m.group(1))
        if version in found:
            raise MigrationError(f"{path} and {found[version].path} share version {version}")
        raw = path.read_bytes()
        found[version] = Migration(version, m.group(2), path, hashlib.sha256(raw).hexdigest(),
                                   tuple(split_statements(raw.decode("utf-8"))))
    return [found[v] for v in sorted(found)]


# After an ALTER KEYSPACE: a running worker's or API's cassandra-driver routes by the
# replication it read at its start (RATCHET_CASSANDRA_SCHEMA_EVENTS=ignore, the default:
# slower, never wrong) until it restarts (session 53's outside review).
_RESTART = ("then restart the workers and APIs (they route by the replication read at "
            "their start)")


def _replication_differs(session, settings: Settings) -> str | None:
    """What to tell an operator whose keyspace (made earlier, or by hand) has another
    replication than ``RATCHET_REPLICATION``: migrate creates a keyspace with it but
    never changes an existing one (that needs a repair), and said nothing (an outside
    review, session 26). None when they agree or the setting cannot be read as a map."""
    import ast

    try:
        wanted = ast.literal_eval(settings.replication)
    except (ValueError, SyntaxError):
        return None
    row = session.execute("SELECT replication FROM system_schema.keyspaces WHERE "
                          "keyspace_name = %s", (settings.keyspace,), timeout=30).one()
    if not isinstance(wanted, dict) or row is None:
        return None

    def normal(replication: dict) -> dict[str, str]:
        return {k: str(v).rsplit(".", 1)[-1] if k == "class" else str(v)
                for k, v in replication.items()}

    have, want = normal(dict(row[0])), normal(wanted)
    if have == want:
        return None
    if (want.get("class") == have.get("class") == "NetworkTopologyStrategy"
            and set(want) == {"class", "replication_factor"} and len(have) > 1
            and all(v == want["replication_factor"] for k, v in have.items() if k != "class")):
        return None  # Cassandra stores a plain replication_factor per datacenter
    return (f"keyspace {settings.keyspace!r} has replication {have}, but "
            f"RATCHET_REPLICATION is {want}: migrate never changes an existing "
            f"keyspace's replication. To change it: ALTER KEYSPACE {settings.keyspace} WITH "
            f"replication = {settings.replication}, then a full repair on every node; "
            f"{_RESTART}")


def replication_shortfalls(replication: dict, nodes_by_dc: dict[str, int],
                           several: bool = False) -> list[str]:
    """Where ``replication`` (a keyspace's, as ``system_schema`` stores it) asks for more
    replicas than the cluster has nodes (``nodes_by_dc``), one phrase each. Such a
    keyspace is made without complaint (Cassandra's warning at ``CREATE KEYSPACE`` is
    not shown) and migrates, and then the worker and the API fail with Unavailable (an
    operator's review, session 46). Strategies other than these two are not judged.

    With ``NetworkTopologyStrategy`` two quorums matter (session 52, the first run on
    two datacenters): each datacenter's own (``LOCAL_QUORUM``: the store's reads and
    commits with ``RATCHET_DATACENTERS=one``, ``several`` False) and the quorum of all
    the replicas of every datacenter (``SERIAL`` for every promotion's Paxos, ``QUORUM``
    for the ledger, and for every read and commit with ``several``). With ``several``
    no ``LOCAL_QUORUM`` is used, so a short datacenter is judged by the second alone."""
    kind = str(replication.get("class", "")).rsplit(".", 1)[-1]
    none = ["replication factor 0 in every datacenter: no node holds its data, so every "
            "read and write fails"]
    if kind == "SimpleStrategy":
        rf = _factor(replication.get("replication_factor"))
        nodes = sum(nodes_by_dc.values())
        if rf == 0:
            return none
        if rf is None:
            return []
        if nodes < rf:
            return [f"replication factor {rf} in the cluster, which has {nodes} node(s): "
                    + _fate("a QUORUM", rf, nodes, "the worker and the API fail every read "
                            "and write")]
        if len(nodes_by_dc) > 1 and not several:
            # LOCAL_QUORUM of a SimpleStrategy keyspace is a quorum of its whole factor,
            # counted in the coordinator's datacenter alone (session 52's review).
            return [f"SimpleStrategy over {len(nodes_by_dc)} datacenters "
                    f"({', '.join(sorted(nodes_by_dc))}): it places the {rf} replicas "
                    "without regard to datacenters, so a worker or an API fails the reads "
                    f"and writes of a partition with fewer than {rf // 2 + 1} of them in its "
                    "own datacenter (LOCAL_QUORUM); NetworkTopologyStrategy places them "
                    "per datacenter"]
        return []
    if kind != "NetworkTopologyStrategy":
        return []
    factors = {dc: _factor(rf) for dc, rf in replication.items() if dc != "class"}
    factors = {dc: rf for dc, rf in factors.items() if rf is not None}
    if not any(factors.values()):
        return none
    known = ", ".join(sorted(nodes_by_dc))

    def where(dc: str) -> str:
        nodes = nodes_by_dc.get(dc)
        return (f"which has {nodes} node(s)" if nodes is not None else
                f"which the cluster does not have (its datacenters: {known})")

    out = []
    if not several:
        for dc, rf in factors.items():
            nodes = nodes_by_dc.get(dc, 0)
            if nodes < rf:
                out.append(f"replication factor {rf} in datacenter {dc}, {where(dc)}: "
                           + _fate("its LOCAL_QUORUM", rf, nodes,
                                   f"a worker or an API in {dc} fails every read and write"))
        # A datacenter with nodes but no replica: LOCAL_QUORUM there has none to reach.
        for dc, nodes in sorted(nodes_by_dc.items()):
            if not factors.get(dc):
                out.append(f"no replica in datacenter {dc}, which has {nodes} node(s): a "
                           f"worker or an API in {dc} fails every read and write (its "
                           "LOCAL_QUORUM has none to reach)")
    total = sum(factors.values())
    held = sum(min(rf, nodes_by_dc.get(dc, 0)) for dc, rf in factors.items())
    if held < total:
        short = ", ".join(f"{dc} {min(rf, nodes_by_dc.get(dc, 0))} of {rf}"
                          + ("" if dc in nodes_by_dc else ", no such datacenter")
                          for dc, rf in factors.items() if nodes_by_dc.get(dc, 0) < rf)
        what = ("every worker and API fails every read and write" if several else
                "every promotion (Paxos at SERIAL) fails")
        out.append(f"{held} of its {total} replicas on nodes ({short}): "
                   + _fate("the QUORUM of all datacenters", total, held, what)
                   + (" (RATCHET_DATACENTERS=several)" if several else ""))
    return out


def _factor(rf: object) -> int | None:
    """A replication factor as ``system_schema`` stores it: ``"3/1"`` is 3 replicas, 1
    transient; None for anything else."""
    try:
        return int(str(rf).split("/")[0])
    except ValueError:
        return None


def _fate(level: str, rf: int, replicas: int, what: str) -> str:
    """What ``replicas`` of ``rf`` mean for a quorum of ``rf``."""
    quorum = rf // 2 + 1
    if replicas < quorum:
        return f"{level} ({quorum} of {rf}) cannot be reached, so {what}"
    return f"{level} ({quorum} of {rf}) fails when {replicas - quorum + 1} node(s) are down"


def _replication_warning(session, ks: str, several: bool = False) -> str | None:
    """The warning for ``replication_shortfalls`` of keyspace ``ks`` (None: none, or no
    such keyspace)."""
    row = session.execute("SELECT replication FROM system_schema.keyspaces WHERE "
                          "keyspace_name = %s", (ks,), timeout=30).one()
    if row is None:
        return None
    nodes_by_dc: dict[str, int] = {}
    for host in session.cluster.metadata.all_hosts():
        nodes_by_dc[host.datacenter] = nodes_by_dc.get(host.datacenter, 0) + 1
    short = replication_shortfalls(dict(row[0]), nodes_by_dc, several)
    if not short:
        return None
    return (f"keyspace {ks} has {'; '.join(short)} (until nodes are added; else "
            f"ALTER KEYSPACE {ks} WITH replication = ..., then a full repair, and fix "
            f"RATCHET_REPLICATION; {_RESTART})")


def _several(settings: Settings) -> bool:
    from services.cassandra_cluster import several_datacenters  # noqa: PLC0415 - driver

    return several_datacenters(settings)


def _ensure_keyspace(session, settings: Settings) -> None:
    if not _IDENT.match(settings.keyspace):
        raise MigrationError(f"keyspace {settings.keyspace!r} is not a valid CQL identifier")
    ks = settings.keyspace
    session.execute(f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {settings.replication}",
                    timeout=60)
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.schema_migrations (version int PRIMARY KEY, "
        "name text, checksum text, applied_at timestamp)", timeout=60)
    session.execute(
        f"CREATE TABLE IF NOT EXISTS {ks}.schema_migrations_lease (id text PRIMARY KEY, "
        "owner text, ttl_s int, renew_every_s double)", timeout=60)
    if not _lease_terms_taken(session, ks):
        # A lease table made before session 46 (owner only): the lease's own terms are
        # added before the lease is taken, so every lease this version writes carries
        # them (a numbered migration runs only once the lease is held). Another migrate
        # may be adding them now: ``IF NOT EXISTS`` leaves its columns as they are.
        session.execute(
            f"ALTER TABLE {ks}.schema_migrations_lease ADD IF NOT EXISTS "
            "(ttl_s int, renew_every_s double)", timeout=60)
        deadline = time.monotonic() + 60
        while not _lease_terms_taken(session, ks):
            if time.monotonic() > deadline:
                raise MigrationError(
                    f"{ks}.schema_migrations_lease: its columns ttl_s and renew_every_s "
                    "were added but are still refused after 60s (schema disagreement?)")
            time.sleep(0.2)


def _lease_terms_taken(session, ks: str) -> bool:
    """Whether the coordinator takes a statement naming the lease's terms (``ttl_s``,
    ``renew_every_s``). Asked of the table itself, not of ``system_schema.columns``,
    which lists a column another migrate's ``ALTER`` is adding before the table takes
    it: two migrates at once over the previous version's table, the one that found the
    columns listed skipped the ``ALTER``, and its lease ``INSERT`` failed "Undefined
    column name ttl_s" (an outside review, session 47)."""
    from cassandra import InvalidRequest

    try:
        session.execute(f"SELECT ttl_s, renew_every_s FROM {ks}.schema_migrations_lease "
                        "WHERE id = 'migrate'", timeout=30)
    except InvalidRequest:
        return False
    return True


def _acquire_lease(session, ks: str, owner: str, wait_s: float | None,
                   out: Callable[[str], None] = lambda _msg: None,
                   progress: MigrateProgress | None = None) -> float:
    """Take the lease, waiting for another migrator's for as long as it holds it (a
    running one renews it; a killed one's expires by its own TTL), or at most
    ``wait_s`` (``--wait``), saying so every 15 s. It waited at most this version's
    ``LEASE_TTL_S`` whatever the holder's lease: a running migrator with a longer lease,
    or a long migration, made this run give up while it went on (session 46's review,
    left; session 47). Returns when (``time.monotonic``) the request that took it was
    sent: its TTL runs from no earlier."""
    started = time.monotonic()
    next_word = started
    unseen = False  # the last take was refused and its row then read as absent
    while True:
        sent = time.monotonic()
        rs = session.execute(
            f"INSERT INTO {ks}.schema_migrations_lease (id, owner, ttl_s, renew_every_s) "
            f"VALUES ('migrate', %s, {LEASE_TTL_S}, {float(RENEW_EVERY_S)!r}) "
            f"IF NOT EXISTS USING TTL {LEASE_TTL_S}", (owner,), timeout=30)
        if rs.was_applied:
            return sent
        lease = _read_lease(session, ks)
        if lease is None and not unseen:
            unseen = True
            continue  # released or expired since: try again at once
        # Refused twice and read as absent both times: the plain read (LOCAL_ONE) sees
        # a replica behind the LWT's. It was tried again at once for ever, with no line
        # and no --wait (an outside review, session 47): now waited for as held.
        unseen = lease is None
        waited = time.monotonic() - started
        held = f"{ks}.schema_migrations_lease"
        said = (describe_lease(lease, ks) if lease is not None else
                "the lease's INSERT was refused, but its row reads as absent (a replica "
                "behind the lease's; `ratchet migrate --status` shows it once it reads)")
        verdict = lease_wait_verdict(lease, waited, wait_s)
        if verdict is not None:
            raise MigrationError(f"cannot take {held}, {verdict}. Nothing was applied. {said}")
        if progress is not None:
            progress.phase = "waiting"
        if time.monotonic() >= next_word:
            bound = (f"at most {wait_s:g}s (--wait)" if wait_s is not None else
                     "for as long as it holds the lease (`ratchet migrate --wait SECONDS` "
                     "bounds the wait)")
            whose = lease.owner if lease is not None else "unknown"
            out(f"waiting for another migrator (owner {whose}) to finish, "
                f"{waited:.0f}s so far, {bound}; Ctrl-C stops this run, nothing applied: "
                f"{said}")
            next_word += 15
        time.sleep(1)


def lease_wait_verdict(lease: LeaseRow | None, waited_s: float,
                       wait_s: float | None) -> str | None:
    """Whether a run that has waited ``waited_s`` for ``lease`` gives up: None to wait on,
    else why not. A lease with a TTL ends: its migrator finishes and releases it, or
    stops renewing it (killed) and it expires, so by default the run waits as long as
    the lease is held. A lease without one never expires (not written by ratchet
    migrate): waiting cannot end it. ``wait_s`` (``--wait``) bounds the wait. ``lease``
    None: held (its take refused) but its row not read, waited for as one with a TTL."""
    if lease is not None and lease.owner is None:
        return ("whose row names no owner (not written by ratchet migrate): waiting for it "
                "may never end")
    if lease is not None and lease.ttl_left_s is None:
        return "which never expires: waiting cannot end it"
    if wait_s is not None and waited_s >= wait_s:
        return (f"still held after {waited_s:.0f}s of waiting (--wait {wait_s:g}; without "
                "--wait, `ratchet migrate` waits for as long as it is held)")
    return None


def _read_lease(session, ks: str) -> LeaseRow | None:
    """The lease row with the TTL it has left (None: nobody holds it). The bootstrap
    added ``ttl_s`` and ``renew_every_s`` to the table before any lease is taken."""
    row = session.execute(
        f"SELECT owner, TTL(owner), ttl_s, renew_every_s FROM {ks}.schema_migrations_lease "
        "WHERE id = 'migrate'", timeout=30).one()
    if row is None:
        return None
    lease = LeaseRow(*row)
    return lease if lease.owner is not None else _with_columns_ttl(session, ks, lease)


def _with_columns_ttl(session, ks: str, lease: LeaseRow) -> LeaseRow:
    """``lease``, a row without an owner (by hand: ``TTL(owner)`` is null), with the TTL
    its other columns have left: what the row says of its expiry (session 48)."""
    row = session.execute(
        f"SELECT TTL(ttl_s), TTL(renew_every_s) FROM {ks}.schema_migrations_lease "
        "WHERE id = 'migrate'", timeout=30).one()
    left = [ttl for ttl in (row or ()) if ttl is not None]
    return replace(lease, columns_ttl_left_s=max(left) if left else None)


def _renew_lease(session, ks: str, owner: str) -> str | None:
    """Hold the lease another ``LEASE_TTL_S``; None when renewed, else who holds it now
    (``"nobody"``: it expired)."""
    rs = session.execute(
        f"UPDATE {ks}.schema_migrations_lease USING TTL {LEASE_TTL_S} SET owner = %s, "
        f"ttl_s = {LEASE_TTL_S}, renew_every_s = {float(RENEW_EVERY_S)!r} "
        "WHERE id = 'migrate' IF owner = %s", (owner, owner), timeout=RENEW_TIMEOUT_S)
    if rs.was_applied:
        return None
    holder = rs.one().owner if "owner" in rs.column_names else None
    return holder or "nobody"


class _LeaseKeeper:
    """Keeps this run's lease while it runs: a thread renews it every
    ``RENEW_EVERY_S``, and ``check`` (before each statement) raises ``LeaseLost`` once
    a renewal found another holder, or none succeeded for ``LEASE_TTL_S``.

    The lease was renewed only between migrations, so one statement longer than its
    TTL (DDL waiting for schema agreement on a slow cluster) ran on without it while a
    second migrator could take it (an operator's review, session 43, left; session 44).
    """

    def __init__(self, session, ks: str, owner: str, taken_at: float) -> None:
        self.session, self.ks, self.owner = session, ks, owner
        # When the last request that took or renewed the lease was sent (its TTL runs
        # from no earlier).
        self.renewed_at = taken_at
        self.renewals = 0
        self.lost: str | None = None  # why this run no longer holds the lease
        self.last_error: Exception | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="migrate-lease", daemon=True)

    def __enter__(self) -> _LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while self.lost is None and not self._done.wait(RENEW_EVERY_S):
            self.renew()

    def renew(self) -> None:
        """One renewal; a failed request is tried again at the next one (the lease is
        lost only once ``LEASE_TTL_S`` passed without a renewal, ``check``)."""
        sent = time.monotonic()
        try:
            holder = _renew_lease(self.session, self.ks, self.owner)
        except Exception as exc:  # the driver's errors: unknown, tried again
            self.last_error = exc
            return
        if holder is None:
            self.renewed_at = max(self.renewed_at, sent)
            self.renewals += 1
        elif self.lost is None:
            self.lost = f"held now by {holder}"

    def check(self, before: str) -> None:
        """Raise ``LeaseLost`` (naming ``before``, the step not taken) unless the lease
        is still this run's."""
        why = self.lost
        unrenewed = time.monotonic() - self.renewed_at
        if why is None and unrenewed >= LEASE_TTL_S:
            why = (f"not renewed for {unrenewed:.0f}s, its TTL is {LEASE_TTL_S}s (last "
                   f"error: {self.last_error!r})")
        if why is not None:
            raise LeaseLost(
                f"lost {self.ks}.schema_migrations_lease ({why}): stopped before {before}, "
                "so that two migrators never run at once; what ran before it stays "
                "(a migration is re-run whole). Run `ratchet migrate` again")


def _release_lease(session, ks: str, owner: str) -> None:
    session.execute(f"DELETE FROM {ks}.schema_migrations_lease WHERE id = 'migrate' IF owner = %s",
                    (owner,), timeout=RELEASE_TIMEOUT_S)


def _release(session, ks: str, owner: str) -> Exception | None:
    """``_release_lease`` on the way out: None once released, else the driver's error,
    the lease left to its TTL. After a failed take or run that failure is the one the
    caller raises; after a run that applied, the schema is up to date and the caller
    warns (session 48). A stop (Ctrl-C, SIGTERM) during the release is ``LeaseLeft``;
    the failure it came after is in ``MigrateProgress`` (session 48's review; session
    49: a further stop replaced the ``LeaseLeft`` that carried it)."""
    try:
        _release_lease(session, ks, owner)
    except Exception as exc:  # the driver's errors
        return exc
    except BaseException as stop:
        raise LeaseLeft(f"{ks}.schema_migrations_lease") from stop
    return None


def _note_failure(progress: MigrateProgress, exc: BaseException) -> None:
    """Keep the run's first failure (not a stop) for the CLI's stop line."""
    if isinstance(exc, Exception) and progress.failure is None:
        progress.failure = exc


def release_failed_warning(ks: str, exc: Exception) -> str:
    """What a run that applied every migration says when its lease's release failed:
    the schema is up to date, only the next migrate may wait (docs/operations.md)."""
    return (f"warning: could not release the lease {ks}.schema_migrations_lease "
            f"({type(exc).__name__}: {exc}); it stays held until its TTL ends (at most "
            f"{LEASE_TTL_S} s): a `ratchet migrate` started sooner waits for it, "
            "`ratchet migrate --status` shows it. Nothing else is affected")


def apply_migrations(session_or_cluster, settings: Settings, folder: Path = MIGRATIONS_DIR,
                     out: Callable[[str], None] = lambda _msg: None,
                     lease_wait_s: float | None = None,
                     progress: MigrateProgress | None = None) -> list[Migration]:
    """Create the keyspace and apply every migration not applied yet; return those applied.

    Accepts a cassandra-driver ``Cluster`` or ``Session``; a session of its own is used
    so the caller's current keyspace is left unchanged. Raises ``ChecksumMismatch`` when
    an applied migration's file changed, ``SchemaAhead`` (before applying anything) when
    the keyspace records a migration this code has no file for, ``MigrationError`` for
    other problems. Another migrator's lease is waited for as long as it is held, or at
    most ``lease_wait_s`` (``_acquire_lease``). ``progress``: kept up to date for the
    CLI's stop line (``MigrateProgress``).
    """
    progress = MigrateProgress() if progress is None else progress
    migrations = discover(folder)
    cluster = getattr(session_or_cluster, "cluster", session_or_cluster)
    session = cluster.connect()
    ks, owner = settings.keyspace, uuid.uuid4().hex
    try:
        _ensure_keyspace(session, settings)
        for warning in (_replication_differs(session, settings),
                        _replication_warning(session, ks, _several(settings))):
            if warning:
                out(f"warning: {warning}")
        try:
            taken_at = _acquire_lease(session, ks, owner, wait_s=lease_wait_s, out=out,
                                      progress=progress)
        except BaseException as failure:
            # Ctrl-C (or a lost answer) while the take was answered: Cassandra may have
            # applied it, and the lease stayed this run's for its TTL, the next migrate
            # waiting that long (an outside review, session 47). Ours or nobody's.
            _note_failure(progress, failure)
            _release(session, ks, owner)
            raise
        progress.phase = "applying"
        try:
            with _LeaseKeeper(session, ks, owner, taken_at) as lease:
                applied = _apply(session, settings, migrations, folder, lease, out,
                                 progress)
        except BaseException as failure:
            # The run's own failure (Ctrl-C included) is the one raised: a release that
            # failed too replaced it, and an interrupted run said "cannot reach
            # Cassandra", exit 1 (an outside review, session 48). Left to its TTL then.
            _note_failure(progress, failure)
            _release(session, ks, owner)
            raise
        progress.phase = "applied"
        # After a run that applied: the schema is up to date whatever the release's
        # fate. A release that failed was "cannot reach Cassandra", exit 1 (session 48's
        # operator leftovers, left): a warning now, the lease left to its TTL.
        failed = _release(session, ks, owner)
        if failed is not None:
            out(release_failed_warning(ks, failed))
        else:
            progress.phase = "released"
        return applied
    except Exception as failure:  # before the lease (the keyspace, its tables)
        _note_failure(progress, failure)
        raise
    finally:
        session.shutdown()


def _apply(session, settings: Settings, migrations: list[Migration], folder: Path,
           lease: _LeaseKeeper, out: Callable[[str], None],
           progress: MigrateProgress) -> list[Migration]:
    """What ``apply_migrations`` does while it holds the lease; ``progress`` names the
    migration under way and those recorded (the stop line's facts)."""
    ks = settings.keyspace
    applied = _records(session, ks, "version, name, checksum", migrations)
    unknown = sorted(set(applied) - {m.version for m in migrations})
    if unknown:
        # Was a warning, and the older migrations then ran over a newer schema
        # with exit 0 (an operator's review, session 43): fail closed.
        names = ", ".join(f"{v:03d}_{applied[v].name}" for v in unknown)
        raise SchemaAhead(
            f"keyspace {ks} records migration(s) {names}, which this ratchet does "
            f"not have (its newest is {migrations[-1].path.name if migrations else 'none'}"
            f", in {folder}): the keyspace was migrated by a newer version; run that "
            "version's `ratchet migrate`, never an older one. Nothing was applied")
    for m in migrations:
        done = applied.get(m.version)
        if done is not None and done.checksum is None:
            raise MigrationError(damaged_record(ks, m))
        if done is not None and done.checksum != m.checksum:
            raise ChecksumMismatch(
                f"{m.path.name} was applied to keyspace {ks} with checksum "
                f"{done.checksum[:12]}… but the file now has {m.checksum[:12]}…: "
                "never edit an applied migration, add a new one")
    todo = [m for m in migrations if m.version not in applied]
    session.set_keyspace(ks)
    for m in todo:
        lease.renew()  # a lease taken meanwhile stops the run here, not later
        t = time.monotonic()
        progress.under_way, progress.recording = m.path.name, False
        for i, stmt in enumerate(m.statements, 1):
            lease.check(f"{m.path.name} statement {i}")
            try:
                session.execute(stmt, timeout=120)
            except Exception as exc:
                if _columns_already_added(session, ks, stmt, exc):
                    out(f"{m.path.name} statement {i}: its columns are there already "
                        "(an earlier run stopped before recording the migration)")
                    continue
                raise MigrationError(
                    f"{m.path.name} statement {i} failed: {exc}\n  {stmt}") from exc
            # ``ADD IF NOT EXISTS`` succeeds over a column of another type: the
            # types are checked here, or the worker dead-lettered every turn
            # later (an outside review, session 26).
            wrong = _column_mismatches(session, ks, stmt)
            if wrong:
                raise MigrationError(
                    f"{m.path.name} statement {i}: {'; '.join(wrong)} (a column made "
                    f"by hand or by another version; fix the table, then run "
                    f"`ratchet migrate` again)\n  {stmt}")
        lease.check(f"recording {m.path.name}")
        progress.recording = True  # from here its record may be written, answer or not
        # Paxos (SERIAL), as the reads of ``_records``: at the driver's LOCAL_ONE a
        # record one replica acknowledged could be missed by the next migrate, which ran
        # the migration again whole (session 53). Not applied: this run's own record,
        # its answer lost and the request retried (the lease excludes any other).
        # Not applied with another checksum: a migrator whose lease was taken once this
        # run's had lapsed unseen recorded another file's bytes; it was taken as this
        # run's own, "applied", exit 0 (an outside review, session 53).
        rs = session.execute(
            f"INSERT INTO {ks}.schema_migrations (version, name, checksum, applied_at) "
            "VALUES (%s, %s, %s, toTimestamp(now())) IF NOT EXISTS",
            (m.version, m.name, m.checksum), timeout=30)
        found = None if rs.was_applied else rs.one()
        theirs = getattr(found, "checksum", m.checksum)
        if theirs != m.checksum:
            raise ChecksumMismatch(
                f"{m.path.name}: its statements ran, but keyspace {ks} records it meanwhile "
                f"with checksum {str(theirs)[:12]}… (another migrator, its lease taken "
                f"once this run's had lapsed), this file has {m.checksum[:12]}…: two "
                "versions of the migration; `ratchet migrate --status` shows the records")
        progress.recorded.append(m.path.name)
        progress.under_way = None
        out(f"applied {m.path.name} ({len(m.statements)} statements, "
            f"{time.monotonic() - t:.1f}s)")
    return todo


def damaged_record(ks: str, m: Migration) -> str:
    """The line of ``m``'s record that has no checksum (damage: a row made or cut by
    hand). It ended ``migrate`` and ``--status`` in a ``TypeError`` traceback (an outside
    review, session 53). Whether the migration ran is not known: its record goes, and
    the next migrate runs it again whole (rule 3: ``IF NOT EXISTS``)."""
    return (f"{m.path.name}: its record in keyspace {ks} has no checksum (a damaged "
            f"record: whether its statements ran is not known); remove it, `DELETE FROM "
            f"{ks}.schema_migrations WHERE version = {m.version}`, then run `ratchet "
            "migrate`, which applies it again")


def _records(session, ks: str, columns: str, migrations: list[Migration]) -> dict:
    """The keyspace's records of applied migrations (``columns`` of each row, by
    version): each migration of ``migrations`` read at SERIAL, the records are written
    with Paxos (``_apply``), so the newest is seen through any replica, in one
    datacenter or several, whatever ``RATCHET_DATACENTERS``; the rest (a newer version's
    migrations, ``SchemaAhead``) by a plain read of the table (SERIAL reads one
    partition). At the driver's LOCAL_ONE, both modes' level for the records until
    session 53 under ``one``, a record one replica of three acknowledged could be missed
    by the next migrate, which applied the migration again whole; Paxos needs the
    replicas the cluster has, as the lease does (a keyspace's replication factor above
    its nodes still migrates, with its warning), where a LOCAL_QUORUM would not."""
    from cassandra import ConsistencyLevel
    from cassandra.query import SimpleStatement

    rows = {r.version: r for r in session.execute(
        f"SELECT {columns} FROM {ks}.schema_migrations", timeout=30)}
    one = SimpleStatement(f"SELECT {columns} FROM {ks}.schema_migrations WHERE version = %s",
                          consistency_level=ConsistencyLevel.SERIAL)
    for m in migrations:
        row = session.execute(one, (m.version,), timeout=30).one()
        if row is None:
            rows.pop(m.version, None)
        else:
            rows[m.version] = row
    return rows


_ADD = re.compile(r"^\s*ALTER\s+TABLE\s+(\w+)\s+ADD\s+\(?(.*?)\)?\s*;?\s*$",
                  re.IGNORECASE | re.DOTALL)


def _columns_already_added(session, ks: str, stmt: str, exc: Exception) -> bool:
    """Whether ``stmt``, an ``ALTER TABLE t ADD`` that Cassandra refused because a
    column exists, had in fact been applied: every column it adds is in the table with
    the type it names. A migration's statements run before its version is recorded, so a
    run stopped in between (a killed Job, a client timeout while the server went on)
    leaves the columns of a migration not marked applied; a re-run must be able to
    finish it. A column of another type is still an error."""
    if "already exists" not in str(exc):
        return False
    return _column_mismatches(session, ks, stmt) == []


def _column_mismatches(session, ks: str, stmt: str) -> list[str] | None:
    """For an ``ALTER TABLE t ADD [IF NOT EXISTS] ...``: each column it adds that the
    table lacks or holds with another type, described (``[]``: all there, as written);
    None for any other statement."""
    m = _ADD.match(stmt)
    if m is None:
        return None
    body = re.sub(r"^\s*IF\s+NOT\s+EXISTS\s+", "", m.group(2), flags=re.IGNORECASE).strip()
    body = body.removeprefix("(").strip()
    # Read from ``system_schema.columns``, not the driver's metadata: a refresh of that
    # waits for schema agreement and raises "Table metadata was not refreshed" when it
    # is not reached in time (seen under load, session 53: a whole test session's
    # migrated keyspace failed with it), and a keyspace another migrator made after
    # this one connected was a KeyError there (session 53's outside review).
    rows = session.execute(
        "SELECT column_name, type FROM system_schema.columns "
        "WHERE keyspace_name = %s AND table_name = %s", (ks, m.group(1)), timeout=30)
    columns = {row.column_name: row.type for row in rows}
    wanted = [c.strip().split(None, 1) for c in _split_columns(body)]
    if not columns or not wanted or any(len(w) != 2 for w in wanted):
        return [f"cannot read the columns of {m.group(1)}"]
    wrong = []
    for name, kind in wanted:
        kind = re.sub(r"\s+STATIC\s*$", "", kind.strip(), flags=re.IGNORECASE)
        held = columns.get(name)
        if held is None:
            wrong.append(f"{m.group(1)}.{name} is missing")
        elif held.replace(" ", "").lower() != kind.replace(" ", "").lower():
            wrong.append(f"{m.group(1)}.{name} is {held}, the migration wants {kind}")
    return wrong


def _split_columns(text: str) -> list[str]:
    """``a int, b map<text, int>`` -> its column definitions (commas inside <> kept)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


class SchemaBehind(Exception):
    """The keyspace lacks migrations this ratchet needs: ``str()`` names them."""


def check_schema(session, keyspace: str, folder: Path = MIGRATIONS_DIR) -> None:
    """Raise ``SchemaBehind`` unless every migration of ``folder`` is recorded in
    ``keyspace``. A worker or API on a keyspace one migration behind failed later, on
    its first statement naming a new column, with a driver's traceback (found by an
    outside review, session 25); the operator's line names ``ratchet migrate``."""
    from cassandra import InvalidRequest

    wanted = {m.version: m.path.name for m in discover(folder)}
    try:
        rows = session.execute(f"SELECT version FROM {keyspace}.schema_migrations",
                               timeout=30)
    except InvalidRequest as exc:
        # A keyspace created by hand (e.g. by a DBA, for its replication) and never
        # migrated: no schema_migrations table (an outside review, session 26).
        raise SchemaBehind(f"keyspace {keyspace!r} has no ratchet schema (created but never "
                           f"migrated: {exc}): run `ratchet migrate` first") from exc
    missing = sorted(set(wanted) - {r[0] for r in rows})
    if missing:
        names = ", ".join(wanted[v] for v in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise SchemaBehind(f"keyspace {keyspace!r} lacks {len(missing)} migration(s) this "
                           f"version needs ({names}): run `ratchet migrate` first")


def migration_status(session_or_cluster, settings: Settings, folder: Path = MIGRATIONS_DIR,
                     out: Callable[[str], None] = print) -> int:
    """Say which of ``folder``'s migrations the keyspace records and which it lacks,
    changing nothing (no keyspace created, no lease taken); 0 only when it is up to
    date. Until now ``ratchet migrate`` itself was the only way to look, and it applies
    what is missing (an operator's review, session 44)."""
    migrations = discover(folder)
    ks = settings.keyspace
    if not _IDENT.match(ks):
        raise MigrationError(f"keyspace {ks!r} is not a valid CQL identifier")
    cluster = getattr(session_or_cluster, "cluster", session_or_cluster)
    session = cluster.connect()
    try:
        tables = {r[0] for r in session.execute(
            "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (ks,),
            timeout=30)}
        exists = bool(tables) or session.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
            (ks,), timeout=30).one() is not None
        if not exists:
            out(f"keyspace {ks} does not exist: `ratchet migrate` creates it and applies "
                f"all {len(migrations)} migration(s)")
            return 1
        if "schema_migrations" not in tables:
            out(f"keyspace {ks} exists but was never migrated (no schema_migrations table): "
                "run `ratchet migrate`")
            return 1
        rows = _records(session, ks, "version, name, checksum, applied_at", migrations)
        short = _replication_warning(session, ks, _several(settings))
        if short:
            out(f"warning: {short}")
        lease = None
        if "schema_migrations_lease" in tables:
            # The TTL left is Cassandra's count; with the TTL the row was written with,
            # how long ago that was follows (``describe_lease``). A lease table of a
            # version before session 46 has no such column: its rows are read without.
            stored = _lease_terms_taken(session, ks)
            row = session.execute(
                f"SELECT owner, TTL(owner){', ttl_s, renew_every_s' if stored else ''} "
                f"FROM {ks}.schema_migrations_lease WHERE id = 'migrate'", timeout=30).one()
            if row is not None:
                lease = LeaseRow(*row) if stored else LeaseRow(row[0], row[1], None, None)
                if stored and lease.owner is None:
                    lease = _with_columns_ttl(session, ks, lease)
    finally:
        session.shutdown()

    def when(row) -> str:
        return f"{row.applied_at:%Y-%m-%d %H:%M:%S} UTC" if row.applied_at else "at an unknown time"

    pending, changed, damaged = [], [], []
    for m in migrations:
        row = rows.get(m.version)
        if row is None:
            pending.append(m)
            out(f"  {m.path.name:<40} pending")
        elif row.checksum is None:
            damaged.append(m)
            out(f"  {damaged_record(ks, m)}")
        elif row.checksum != m.checksum:
            changed.append(m)
            out(f"  {m.path.name:<40} applied {when(row)}, but the file was edited since "
                f"(checksum {row.checksum[:12]}… then, {m.checksum[:12]}… now)")
        else:
            out(f"  {m.path.name:<40} applied {when(row)}")
    unknown = sorted(set(rows) - {m.version for m in migrations})
    for v in unknown:
        out(f"  {f'{v:03d}_{rows[v].name}':<40} applied {when(rows[v])}, no file here "
            "(a newer version's)")
    if lease is not None:
        out(describe_lease(lease, ks))
    total = len(migrations)
    if unknown:
        out(f"keyspace {ks}: migrated by a newer version ({len(unknown)} migration(s) this "
            "ratchet has no file for): run that version's `ratchet migrate`")
    elif damaged:
        out(f"keyspace {ks}: {len(damaged)} damaged record(s) (no checksum): remove each, "
            "then run `ratchet migrate`")
    elif changed:
        out(f"keyspace {ks}: {len(changed)} applied migration(s) edited since: never edit an "
            "applied migration, add a new one")
    elif pending:
        out(f"keyspace {ks}: {len(pending)} of {total} migration(s) pending: run "
            "`ratchet migrate`")
    else:
        out(f"keyspace {ks}: up to date ({total} of {total} migrations applied)")
    return 1 if unknown or damaged or changed or pending else 0


@dataclass(frozen=True)
class LeaseRow:
    """The lease row as ``--status`` reads it.

    ``ttl_left_s``: ``TTL(owner)``, the seconds Cassandra keeps it still (None: no TTL,
    it never expires). ``ttl_s``, ``renew_every_s``: the TTL it was written with and how
    often its migrator renews it, stored with it since session 46 (None: a row of an
    earlier version, or written by hand)."""

    owner: str | None
    ttl_left_s: int | None
    ttl_s: int | None
    renew_every_s: float | None
    # A row without an owner only (``TTL(owner)`` is null then): the longest TTL its
    # other columns have left (None: none has one, or not read).
    columns_ttl_left_s: int | None = None


def describe_lease(lease: LeaseRow, ks: str, now: datetime | None = None) -> str:
    """What ``--status`` says of the lease row: whose it is, when it was last taken or
    renewed, when it expires and whether its migrator still runs, each from the row.

    It said "a migrator is running now" for a killed migrator's lease too (session 44's
    review, left; session 45), then took the age from this version's ``LEASE_TTL_S``,
    so a lease written with another TTL was misread (session 46). Every take and
    renewal writes ``ttl_s`` with the lease's TTL, so it was written ``ttl_s -
    ttl_left_s`` seconds ago by Cassandra's own count (no client clock compared with
    another); a migrator that renews every ``renew_every_s`` and has not for longer
    (5 s of slack) has most likely stopped. What the row does not say is "unknown",
    never this version's constants."""
    now = now or datetime.now(UTC)
    if lease.owner is None:
        # ``TTL(owner)`` of a null owner is null whatever the row's TTL: it was called
        # "with no expiry" (session 47's review, left; session 48). The row marker's own
        # TTL cannot be read in CQL, so whether the row goes with its columns is unknown.
        left = lease.columns_ttl_left_s
        expiry = (f"its other columns expire in {left}s, and the row with them if it was "
                  "inserted with that TTL (which CQL cannot read)" if left is not None else
                  "none of its columns has a TTL (whether the row has one cannot be read)")
        return (f"lease {ks}.schema_migrations_lease: its row has no owner named (written by "
                f"hand: ratchet migrate always names one); {expiry}. No migrator can take "
                "the lease while the row exists, and `ratchet migrate` stops at once rather "
                "than wait for a row no migrator wrote. Once sure no migrator runs: DELETE "
                f"FROM {ks}.schema_migrations_lease WHERE id = 'migrate'")
    owner = lease.owner
    ttl_left = lease.ttl_left_s
    if ttl_left is None:
        return (f"lease {ks}.schema_migrations_lease held by {owner} with no expiry (not "
                "written by ratchet migrate, whose lease always has one): no migrator "
                "can take it until it is deleted. Once sure no migrator runs: DELETE FROM "
                f"{ks}.schema_migrations_lease WHERE id = 'migrate'")
    wait = (f"`ratchet migrate` can run in {ttl_left}s, when the lease expires (started "
            "sooner, it waits for that)")
    if lease.ttl_s is None or not 0 < ttl_left <= lease.ttl_s:
        why = ("the row does not say with which TTL it was written: a ratchet migrate "
               "before session 46, or a hand, wrote it" if lease.ttl_s is None else
               f"the row says it was written with a TTL of {lease.ttl_s}s, but "
               f"{ttl_left}s are left: not written by ratchet migrate")
        return (f"lease {ks}.schema_migrations_lease held by {owner}: expires in "
                f"{ttl_left}s unless renewed; when it was last taken or renewed is unknown "
                f"({why}), so whether its migrator still runs is unknown. If it runs, "
                f"`ratchet migrate` waits for it; if not, {wait}")
    since = lease.ttl_s - ttl_left
    at = now - timedelta(seconds=since)
    head = (f"lease {ks}.schema_migrations_lease held by {owner}: last taken or renewed at "
            f"{at:%Y-%m-%d %H:%M:%S} UTC ({since}s ago), expires in {ttl_left}s unless "
            "renewed")
    every = lease.renew_every_s
    # 0 or less, NaN or infinite (CQL takes both; only a hand writes them) is no period:
    # NaN read as a killed migrator, infinity as a running one (session 47). Nor is one
    # the row's TTL cannot outlast (with the slack): every age it leaves reads running.
    if every is None or not 0 < every < math.inf or every + 5 >= lease.ttl_s:
        return (f"{head}. Whether its migrator still runs is unknown (the row does not say "
                f"how often it renews the lease): if it runs, `ratchet migrate` waits for "
                f"it; if not, {wait}")
    if since <= every + 5:
        return (f"{head}. A migrator is running now (it renews the lease every "
                f"{every:g}s while it runs): `ratchet migrate` waits for it")
    return (f"{head}. Not renewed for {since}s, while a running migrator renews it every "
            f"{every:g}s: its migrator was most likely stopped or killed (or cannot "
            f"reach Cassandra). {wait}")


# ``ratchet migrate --status``'s exit code when Cassandra cannot be reached (or resolved):
# not 1, "the keyspace is not up to date", which a script reads as "run migrate" (it was
# 1 for both until session 53; stderr told them apart). 2 is click's usage error.
STATUS_UNREACHABLE = 3


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says Cassandra could not be reached (or did not answer in time),
    not that it answered and refused: ``failure_line``'s "cannot reach"."""
    from cassandra import DriverException, RequestExecutionException, RequestValidationException
    from cassandra.cluster import NoHostAvailable
    from cassandra.protocol import ErrorMessage

    if isinstance(exc, MigrationError | ErrorMessage | RequestValidationException):
        return False
    return isinstance(exc, NoHostAvailable | RequestExecutionException | DriverException
                      | OSError)


def failure_line(exc: Exception, settings: Settings) -> str | None:
    """The line of a failure of ``ratchet migrate``, None for one it does not expect (a
    bug: its traceback)."""
    from cassandra import RequestValidationException
    from cassandra.protocol import ErrorMessage

    hosts = f"{','.join(settings.cassandra_hosts)}:{settings.cassandra_port}"
    if isinstance(exc, MigrationError):
        return f"ratchet migrate failed: {exc}"
    if isinstance(exc, ErrorMessage | RequestValidationException):
        # Cassandra answered and refused: the statement, the keyspace (a system one)
        # or the credentials, never "cannot reach" (an outside review, session 26).
        return (f"ratchet migrate failed: Cassandra at {hosts} refused a statement: "
                f"{exc} (RATCHET_KEYSPACE={settings.keyspace!r}, RATCHET_REPLICATION="
                f"{settings.replication!r}?)")
    if unreachable(exc):
        return (f"ratchet migrate: cannot reach Cassandra at {hosts} ({exc}); check "
                f"RATCHET_CASSANDRA_HOSTS and RATCHET_CASSANDRA_PORT (on this machine: "
                f"is `ratchet infra up` running?)")
    return None


def cli_migrate(settings: Settings, folder: Path = MIGRATIONS_DIR, *, status: bool = False,
                wait_s: float | None = None, progress: MigrateProgress | None = None) -> int:
    """``ratchet migrate`` (``status``: ``ratchet migrate --status``, ``migration_status``;
    ``wait_s``: ``--wait``, how long another migrator's lease is waited for;
    ``progress``: the CLI's, read by its stop line)."""
    import logging

    from cassandra import UnresolvableContactPoints
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy

    from services.cassandra_cluster import connect_options, default_level

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    hosts = f"{','.join(settings.cassandra_hosts)}:{settings.cassandra_port}"
    # Several datacenters: the migrations recorded (and the lease) read and written at
    # QUORUM, so that a worker's or an API's start in another one sees them.
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60,
                               consistency_level=default_level(settings))
    try:
        cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port,
                          protocol_version=5,
                          # The driver gives the control connection's queries (the
                          # whole cluster's schema, every keyspace's tables) 2 s: a busy
                          # node with many keyspaces took longer and `--status` said
                          # "cannot reach Cassandra" (session 52). 20 s, as every process.
                          **connect_options(),
                          execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    except UnresolvableContactPoints:
        print(f"ratchet migrate: cannot reach Cassandra at {hosts}: no host name resolves; "
              f"check RATCHET_CASSANDRA_HOSTS", file=sys.stderr, flush=True)
        return STATUS_UNREACHABLE if status else 1
    progress = MigrateProgress() if progress is None else progress
    try:
        if status:
            return migration_status(cluster, settings, folder, out=print)
        applied = apply_migrations(cluster, settings, folder, out=print, lease_wait_s=wait_s,
                                   progress=progress)
    except Exception as exc:
        said = failure_line(exc, settings)
        if said is None:
            raise
        print(said, file=sys.stderr, flush=True)
        progress.failure_said = True
        return STATUS_UNREACHABLE if status and unreachable(exc) else 1
    finally:
        cluster.shutdown()
    total = len(discover(folder))
    print(f"keyspace {settings.keyspace}: {len(applied)} migration(s) applied now, "
          f"{total} in total, schema up to date")
    return 0
