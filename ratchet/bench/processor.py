"""Promotion processor throughput, end to end, beside its raw baselines, in one run.

``python -m ratchet.bench.processor [--turns N] [--per-conversation K] [--raw N]
[--throughput-rounds R] [--latency-turns N] [--latency-rounds R] [--profile]
[--profile-only] [--rss]``

One table, measured in the same run on the same servers (the load average is printed
with it, the machine is shared):

* **raw Kafka**: N pre-encoded ``TurnCompleted`` records produced (confluent-kafka,
  as the gateway does) to a fresh 12-partition topic, then read back by ONE aiokafka
  consumer: aiokafka is what the worker consumes with (faust-streaming runs on it).
* **raw Cassandra LWT**: N single-row ``INSERT ... IF NOT EXISTS`` (~1 KiB) with 12
  in flight (12 threads, blocking driver calls: the worker's 12 lanes each run their
  promotion in a pool thread), in a keyspace of its own (created, then dropped). The
  promotion is one Paxos round per turn, so this is the ceiling of "one LWT per
  turn" on this box, whatever the processor does around it.
* **raw pipeline** (four rows, see ``raw_pipeline``): the baselines composed into the
  least a processor of this design does per turn, with none of ratchet's code: consume
  -> one LWT -> publish -> commit, 12 in-order lanes with the worker's lane window;
  then with two LWTs per turn (the response id's claim, then the promotion); then with
  the one read no design can skip; then with ratchet's request shape (read beside the
  claim LWT, LWT, status write). Each is timed from its consumer's join to its last
  event done, as the worker is started before its own clock runs. The floor under the
  end-to-end figure: a target above it is out of reach here.
* **floor 0** (``faust_pipeline``): the Faust app alone (``ratchet.bench.faust_floor``:
  consume -> publish -> ack, no storage) on a backlog, and paced at the latency runs'
  rate: what the stream stack costs per record before ratchet does anything.
* **end to end**: one ``ratchet worker`` (subprocess, 12 partitions, own topic prefix
  and consumer group). After a warm-up turn, N pre-encoded turns over N/K
  conversations are produced (round by round, so each conversation's turns stay in
  order) and the clock stops when N outcomes are on the outcome topics. Target:
  >= 500 promoted turns/s. Reported with the worker's CPU seconds and RSS.
* **driver A/B**: the raw LWT row again with acsylla (the C++ driver's asyncio
  wrapper), when it is installed: the CPU the Python driver spends per request.
* **against the floors**: ratchet's turns/s and summed CPU per turn (worker +
  Cassandra + Kafka) divided by floor 1's and floor 1b's, in ``--throughput-rounds``
  rounds (floors 1 and 1b, then ratchet's backlog; each round's ratios printed, the
  verdict on the medians of the rounds' ratios), and the latency produce ->
  outcome consumed (p50/p99) of ratchet and of floors 1 and 1b, all fed at half of
  ratchet's measured maximum rate (the median round's) (``--latency-turns`` each, 0 = skip); ratchet and
  floor 1 alternate ``--latency-rounds`` times (each round's p99s and ratio printed,
  the verdict on the median of the rounds' ratios), each run after Cassandra and Kafka are quiet
  (``settle``), so a slow minute of the shared machine falls on both lines, the paced
  floors in processes of their own (``PacedFloor``; their cores at that rate printed
  beside ratchet's, counted from each run's join); then ratchet again with a
  ``ratchet api`` beside the worker and, for each turn, a GET with ``wait_ms`` sent
  right after its produce: produce -> outcome consumed and produce -> HTTP
  ``certified`` of the same turns (``ratchet.bench.http_wait``; the floor has no API:
  its row to compare with is produce -> outcome consumed), and the client's overhead
  on a response already promoted.
* **where the time goes** (``--profile``, or ``--profile-only`` without the rest): the
  processor core (decode, validate, ledger + store on Cassandra, encode) for 300 turns
  in this process, K per conversation in round order like the end-to-end run: the
  Cassandra requests per turn by statement, the CPU of the calling thread per turn,
  and a pyinstrument (wall-clock) profile. For the real worker's CPU, attach py-spy to
  it (``py-spy record --gil --pid <worker pid>``).
* **memory** (``--rss``): the REAL worker's RSS (``/proc/<pid>``) after 1k, then after
  100k distinct conversations, one turn each (target: at most 2x). At the end-to-end
  rate this takes 100k / (turns/s): ~30 min at 60 turns/s on the shared 2-core box.

The outcome counter reads raw messages without decoding them, is paused outside its
waits and fetches every 10 ms, and the bench's rig runs no decoding collector: the
bench process and the broker spend as little as a floor's own count on watching the
worker (``OutcomeCounter``).

Every measured window starts once Cassandra and Kafka are quiet (``settle``): a floor's
keyspace drop flushes every dirty memtable and compactions follow, which would land in
the next window. Each window also reads the servers' threads, and the table shows what
their JIT compilers and Cassandra's flushes and compactions took of its CPU columns
(``BACKGROUND_THREADS``); the summary adds the CPU ratio without them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from ratchet.bench.args import non_negative_int, positive_int
from ratchet.bench.http_wait import MAX_IN_FLIGHT, HttpWaits, WaitFigures
from ratchet.samples import make_turn
from ratchet.settings import Settings
from schemas.avro import encode_key
from streams.testing import Rig, WorkerProcess, isolated_settings

RAW_LWT_IN_FLIGHT = 12  # the worker's 12 lanes, one blocking promotion each


def say(msg: str) -> None:
    """Progress on stderr, so the table on stdout stays clean."""
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


# --- process accounting ------------------------------------------------------------------


def _stat_cpu(stat: str) -> float:
    """User + system CPU seconds from the text of a /proc ``stat`` file."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a live process, from /proc."""
    cpu = _stat_cpu(Path(f"/proc/{pid}/stat").read_text())
    rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return cpu, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def server_pids(settings: Settings) -> dict[str, int]:
    """Pids of the local Cassandra and Kafka (read only: for their CPU seconds)."""
    pids: dict[str, int] = {}
    try:
        from infra.launcher import server_status

        for name in ("cassandra", "kafka"):
            pid = server_status(settings, name).pid
            if pid and Path(f"/proc/{pid}/stat").exists():
                pids[name] = pid
    except Exception as exc:  # noqa: BLE001 - servers ratchet did not start: no CPU column
        say(f"server pids unknown ({exc}); their CPU is not reported")
    return pids


# The servers' threads whose work a window catches without its requests causing it
# there: the JVMs' JIT compilers (a warm-up cost: a long-running server compiled its
# hot paths long ago) and Cassandra's flushes and compactions (caused by every write
# before the window too, run when a memtable fills). By thread name, as the JVM sets it.
BACKGROUND_THREADS = {
    "jit": ("C1 CompilerThre", "C2 CompilerThre"),
    "compaction": ("CompactionExec", "MemtableFlushWr", "PerDiskMemtable",
                   "MemtablePostFlu"),
}
JVM_SERVERS = ("cassandra", "kafka")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each live thread's (name, CPU seconds), from /proc/<pid>/task."""
    threads: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        threads[int(task.name)] = (stat[stat.index("(") + 1:stat.rindex(")")],
                                   _stat_cpu(stat))
    return threads


def background_cpu(before: dict[int, tuple[str, float]],
                   after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds of ``BACKGROUND_THREADS`` between two ``thread_cpu`` snapshots, by
    kind. A thread that ended between them is missed: a lower bound."""
    spent = dict.fromkeys(BACKGROUND_THREADS, 0.0)
    for tid, (name, cpu) in after.items():
        for kind, prefixes in BACKGROUND_THREADS.items():
            if name.startswith(prefixes):
                spent[kind] += cpu - before.get(tid, (name, 0.0))[1]
    return spent


def add_into(total: dict[str, float], more: dict[str, float]) -> None:
    """Add ``more``'s seconds to ``total``'s, key by key (windows summed over runs)."""
    for key, seconds in more.items():
        total[key] = total.get(key, 0.0) + seconds


@dataclass
class CpuWindow:
    """CPU seconds of a few processes over one measured interval, and how much of the
    servers' went to their background threads (``background_s``)."""

    pids: dict[str, int]
    start_cpu: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)
    background_s: dict[str, float] = field(default_factory=dict)
    start_threads: dict[str, dict] = field(default_factory=dict)
    t0: float = 0.0
    seconds: float = 0.0

    def __enter__(self) -> CpuWindow:
        # Snapshot the servers' threads first: reading ~150 /proc files is not the run's.
        self.start_threads = {n: self._threads(p) for n, p in self.pids.items()
                              if n in JVM_SERVERS}
        self.start_cpu = {n: self._cpu(p) for n, p in self.pids.items()}
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.t0
        for name, pid in self.pids.items():
            cpu, rss = self._stats(pid)
            self.cpu_s[name] = cpu - self.start_cpu[name]
            self.rss_mb[name] = rss
        self.background_s = dict.fromkeys(BACKGROUND_THREADS, 0.0)
        for name, before in self.start_threads.items():
            add_into(self.background_s, background_cpu(before, self._threads(self.pids[name])))

    @staticmethod
    def _threads(pid: int) -> dict[int, tuple[str, float]]:
        try:
            return thread_cpu(pid)
        except OSError:  # a server that is gone: its CPU column says so already
            return {}

    @staticmethod
    def _stats(pid: int) -> tuple[float, float]:
        if pid == os.getpid():
            t = os.times()
            return t.user + t.system, proc_stats(pid)[1]
        return proc_stats(pid)

    def _cpu(self, pid: int) -> float:
        return self._stats(pid)[0]


@dataclass(frozen=True)
class Row:
    """One line of the table: a rate, with who burnt how much CPU for it."""

    name: str
    count: int
    seconds: float
    cpu_s: dict[str, float]
    rss_mb: float | None = None
    unit: str = "records"
    # The servers' JIT and compaction threads' share of ``cpu_s`` (see CpuWindow).
    background_s: dict[str, float] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0

    def cpu_ms_per_op(self, who: str) -> float | None:
        cpu = self.cpu_s.get(who)
        return None if cpu is None or not self.count else cpu * 1000 / self.count

    def core_share(self, who: str) -> float | None:
        cpu = self.cpu_s.get(who)
        return None if cpu is None or not self.seconds else cpu / self.seconds


COLUMNS = ("client", "cassandra", "kafka")


def format_table(rows: list[Row], load_before: str) -> str:
    def cell(row: Row, who: str) -> str:
        share, per_op = row.core_share(who), row.cpu_ms_per_op(who)
        if share is None:
            return "-"
        return f"{share:.2f}" if per_op is None else f"{share:.2f} ({per_op:.2f})"

    lines = [
        f"load average {load_before} before, {load_average()} after; {os.cpu_count()} cores",
        "CPU columns: cores used during the run (ms of CPU per op); client = the bench "
        "process, or the worker for end to end",
        f"{'measure':<54} {'n':>6} {'s':>6} {'ops/s':>7} "
        + " ".join(f"{c:>14}" for c in COLUMNS) + f" {'RSS MB':>7}",
    ]
    for r in rows:
        rss = "-" if r.rss_mb is None else f"{r.rss_mb:.0f}"
        lines.append(
            f"{r.name:<54} {r.count:>6} {r.seconds:>6.1f} {r.per_second:>7.0f} "
            + " ".join(f"{cell(r, c):>14}" for c in COLUMNS) + f" {rss:>7}"
        )
    return "\n".join(lines)


# A window whose servers' JIT took this much CPU per op ran on servers still warming
# up: the first run after Cassandra's start showed 0.37-0.73 ms per op in every window,
# warm runs 0.00-0.13 (docs/benchmarks.md, "A slower host").
JIT_WARM_MS = 0.15


def background_lines(rows: list[Row]) -> list[str]:
    """Of the servers' CPU in each row, what their JIT compilers and their flushes and
    compactions took (ms per op, already in the columns): a row measured while a server
    still compiles its hot paths, or while a compaction runs, pays for work its
    requests did not cause there."""
    lines = ["of the servers' CPU above, their JIT compilers and their flushes and "
             "compactions (ms per op; threads that ended inside a window are missed):"]
    for r in rows:
        if r.background_s and r.count:
            parts = ", ".join(f"{kind} {cpu * 1000 / r.count:.2f}"
                              for kind, cpu in r.background_s.items())
            lines.append(f"  {r.name:<54} {parts}")
    warming = [(r.background_s["jit"] * 1000 / r.count, r.name) for r in rows
               if r.count and r.background_s.get("jit", 0.0) * 1000 / r.count >= JIT_WARM_MS]
    if warming:
        worst, name = max(warming)
        lines.append(
            f"WARNING: the servers' JIT compilers were busy in {len(warming)} window(s) (up "
            f"to {worst:.2f} ms per op, in '{name}'): a server started recently still "
            "compiles its hot paths, so this run is not comparable with a warm one. Run "
            "the bench again."
        )
    return lines if len(lines) > 1 else []


def summed_request_cpu_ms(row: Row) -> float:
    """``summed_cpu_ms`` without the servers' background threads (JIT compilers, flushes
    and compactions): the CPU the requests cost where they ran. A compaction is caused
    by all earlier writes and runs in whichever window a memtable fills, so it can land
    whole in a 1-second floor run (0.3-1.0 ms per turn seen) or in ratchet's."""
    background = sum(row.background_s.values())
    return summed_cpu_ms(row) - (background * 1000 / row.count if row.count else 0.0)


def _uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


# --- raw Kafka ---------------------------------------------------------------------------


def raw_kafka(settings: Settings, value: bytes, records: int,
              pids: dict[str, int]) -> tuple[Row, Row]:
    """Produce ``records`` copies of one encoded turn (distinct keys) to a fresh
    12-partition topic with confluent-kafka, then read them with one aiokafka consumer."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{settings.topic_prefix}raw-baseline"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=settings.partitions,
                                  replication_factor=1)])[topic].result(30)
    try:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                             "enable.idempotence": True, "linger.ms": 5})
        keys = [encode_key(f"conv_{i:08d}") for i in range(records)]
        who = {"client": os.getpid(), **pids}
        with CpuWindow(who) as produced:
            for key in keys:
                while True:
                    try:
                        producer.produce(topic, value=value, key=key)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if producer.flush(60):
                raise RuntimeError("raw baseline: records not delivered")
        say(f"raw Kafka: produced {records} in {produced.seconds:.1f} s")
        with CpuWindow(who) as consumed:
            got = asyncio.run(_aiokafka_read(settings, topic, records))
        say(f"raw Kafka: consumed {got} in {consumed.seconds:.1f} s")
        return (
            Row("raw Kafka produce (confluent-kafka, acks=all)", records, produced.seconds,
                produced.cpu_s),
            Row("raw Kafka consume (1 aiokafka consumer)", got, consumed.seconds,
                consumed.cpu_s),
        )
    finally:
        _delete_topics(admin, [topic])


_deferred_topics: list[tuple[object, list[str]]] | None = None


def _delete_topics(admin, topics: list[str]) -> None:
    """Delete now, or at the end of the bench's run (``deferred_topic_deletion``): a
    broker removes a deleted topic's files later (a minute by default,
    ``file.delete.delay.ms``), at up to a core of Kafka's CPU, in another line's run."""
    if _deferred_topics is None:
        admin.delete_topics(topics)
    else:
        _deferred_topics.append((admin, topics))


@contextlib.contextmanager
def deferred_topic_deletion():
    """Scratch topics deleted when the block ends, not while other lines measure."""
    global _deferred_topics
    _deferred_topics = []
    try:
        yield
    finally:
        pending, _deferred_topics = _deferred_topics, None
        for admin, topics in pending:
            admin.delete_topics(topics)


async def _aiokafka_read(settings: Settings, topic: str, records: int) -> int:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTP

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([AioTP(topic, p) for p in range(settings.partitions)])
        got = 0
        deadline = time.monotonic() + 60
        while got < records and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            got += sum(len(b) for b in batches.values())
        return got
    finally:
        await consumer.stop()


# --- raw Cassandra LWT -------------------------------------------------------------------


@contextlib.contextmanager
def scratch_lwt_table(settings: Settings, tag: str, *extra_tables: str):
    """A keyspace of its own (dropped afterwards) with table ``lwt (k, c, v blob)`` and
    ``extra_tables`` (CQL bodies); yields (session, keyspace, ``_lwt_insert``)."""
    from services.cassandra_cluster import open_cluster

    keyspace = f"{settings.keyspace}_bench_{tag}_{uuid.uuid4().hex[:6]}"
    cluster = open_cluster(settings)
    session = cluster.connect()
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        f"{settings.replication}", timeout=60)
        for table in ("lwt (k text, c text, v blob, PRIMARY KEY (k, c))", *extra_tables):
            session.execute(f"CREATE TABLE {keyspace}.{table}", timeout=60)
        yield session, keyspace, _lwt_insert(session, keyspace)
    finally:
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        except Exception as exc:  # noqa: BLE001 - never hide the error that ended the run
            say(f"could not drop {keyspace}: {exc}")
        cluster.shutdown()


def _lwt_insert(session, keyspace: str):
    """The prepared single-row ``INSERT ... IF NOT EXISTS`` into ``keyspace.lwt``, with
    the store's consistency and no driver retry."""
    from cassandra import ConsistencyLevel
    from cassandra.policies import FallthroughRetryPolicy

    insert = session.prepare(f"INSERT INTO {keyspace}.lwt (k, c, v) VALUES (?, ?, ?) "
                             "IF NOT EXISTS")
    insert.consistency_level = ConsistencyLevel.LOCAL_QUORUM
    insert.serial_consistency_level = ConsistencyLevel.SERIAL
    insert.retry_policy = FallthroughRetryPolicy()
    return insert


def raw_lwt(settings: Settings, ops: int, pids: dict[str, int]) -> Row:
    """``ops`` single-row INSERT IF NOT EXISTS, ``RAW_LWT_IN_FLIGHT`` at a time."""
    with scratch_lwt_table(settings, "raw") as (session, _, insert):
        payload = os.urandom(1024)
        for i in range(50):  # warm-up
            session.execute(insert, (f"warm{i}", "", payload), timeout=10)
        per_thread = max(1, ops // RAW_LWT_IN_FLIGHT)
        errors: list[BaseException] = []

        def run(w: int) -> None:
            try:
                for i in range(per_thread):
                    result = session.execute(insert, (f"k{w}_{i}", "", payload), timeout=10)
                    assert result.was_applied
            except BaseException as exc:  # reported after the run
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(RAW_LWT_IN_FLIGHT)]
        settle(pids)  # its keyspace's creation (schema flushes) is not the LWTs' work
        with CpuWindow({"client": os.getpid(), **pids}) as window:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        done = per_thread * RAW_LWT_IN_FLIGHT
        say(f"raw LWT: {done} in {window.seconds:.1f} s")
        return Row(f"raw Cassandra LWT INSERT IF NOT EXISTS, {RAW_LWT_IN_FLIGHT} in flight",
                   done, window.seconds, window.cpu_s)


# --- raw pipeline: the least any processor on this stack must do per turn ------------


@dataclass
class FloorResult:
    """What the raw pipeline did: checked by its test, so the figure is of real work."""

    consumed: int
    applied: int  # LWTs that answered [applied]=true
    published: int
    committed: dict[int, int]  # partition -> committed offset
    rows: int = 0  # rows in the LWT table afterwards
    requests: int = 0  # Cassandra requests sent while measuring
    most_in_flight: int = 0  # the most events one lane handled at once
    run_s: float = 0.0  # the whole run, its start-up and its stop included
    latency: list[float] = field(default_factory=list)  # produce -> outcome ms (paced runs)


FLOOR_SHAPES = {
    "lwt": "raw pipeline: consume + 1 LWT + publish + commit",
    "lwt2": "raw pipeline: consume + 2 LWTs (claim, then batch) + publish + commit",
    "read": "raw pipeline: + 1 read before the LWT",
    "ratchet": "raw pipeline: + read beside a claim LWT, then LWT, status write",
}
# The plain statements' tables of the floor shapes (beside ``lwt``).
FLOOR_TABLES = ("facts (k text, c text, v text, PRIMARY KEY (k, c))",
                "status (k text PRIMARY KEY, v text)")
# The floors ratchet's throughput is judged against (every round of them).
THROUGHPUT_FLOORS = ("lwt", "lwt2")
FLOOR_NAMES = {"lwt": "floor 1", "lwt2": "floor 1b", "read": "floor 2", "ratchet": "floor 3"}


def floor_topics(settings: Settings, name: str):
    """A fresh (source, sink) topic pair for one floor run, and the admin client that
    deletes them afterwards: (admin, source, sink)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    run = f"{settings.topic_prefix}{name}-{uuid.uuid4().hex[:6]}"
    source, sink = f"{run}-in", f"{run}-out"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    for future in admin.create_topics([
            NewTopic(t, num_partitions=settings.partitions, replication_factor=1)
            for t in (source, sink)]).values():
        future.result(30)
    return admin, source, sink


def raw_pipeline(settings: Settings, records: int, pids: dict[str, int], *,
                 shape: str = "lwt") -> tuple[Row, FloorResult]:
    """A floor under the end-to-end figure, composed of the raw baselines only.

    ``records`` events (one ~1 KiB turn each, distinct keys) go through the minimum a
    promotion processor on this stack does per turn, with none of ratchet's code:
    consume (aiokafka, a consumer group) -> ONE single-row LWT (``INSERT ... IF NOT
    EXISTS``, driver callbacks, no thread hop) -> publish one outcome (aiokafka,
    acks=all) -> commit, with one in-order lane per partition and the worker's lane
    window (``RATCHET_LANE_WINDOW`` events of a partition in flight, acked in offset
    order), like the worker. No decoding, validation, ledger, hint or status write: no
    processor of this design (an LWT per turn, durable before published) goes faster here.

    ``shape`` adds requests, as raw statements: ``lwt2``: a second conditional write
    per turn before the first, in another partition (the response id's claim, which
    binds it once per tenant across partitions). ``read``: the one read no design can
    skip (a request's durable facts: dedupe, cancellation, tool effects; memory is
    bounded, Cassandra is the truth) before the LWT. ``ratchet``: the request shape of
    ratchet's processor: that read in parallel with the claim LWT, before the
    promotion LWT; one write of status and owners after it.

    A backlog: the events are produced before the pipeline starts. Fed at a rate, with
    its latency: ``PacedFloor``.
    """
    admin, source, sink = floor_topics(settings, f"floor-{shape}")
    try:
        with scratch_lwt_table(settings, "floor", *FLOOR_TABLES) as (session, keyspace, insert):
            return _floor_measure(settings, session, keyspace, insert, source, sink,
                                  records, pids, shape)
    finally:
        _delete_topics(admin, [source, sink])


def _floor_measure(settings: Settings, session, keyspace: str, insert, source: str,
                   sink: str, records: int, pids: dict[str, int],
                   shape: str, rate: float | None = None,
                   run: str = "") -> tuple[Row, FloorResult]:
    """Produce ``records`` events, then time the pipeline over them (see raw_pipeline).
    Paced (``rate``), the pipeline runs in a process of its own (``_floor_child``), as
    ratchet's worker does: the probe's and the paced sender's threads here do not share
    its interpreter."""
    plain = _plain_statements(session, keyspace)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "enable.idempotence": True, "linger.ms": 5})
    value = os.urandom(1024)
    items = [(f"floor-{run}{i:08d}".encode(), value) for i in range(records)]
    probe = sender = None
    ready = None if rate is None else _SPAWN.Event()  # a backlog needs no start signal
    if rate is None:
        for key, _ in items:
            producer.produce(source, value=value, key=key)
            producer.poll(0)
        if producer.flush(60):
            raise RuntimeError("raw pipeline: events not delivered")
        # The previous floor's keyspace drop flushed every dirty memtable (system.paxos
        # too) and compactions follow; this floor's keyspace creation flushed the schema
        # tables. Not this floor's work: ~0.3-1.0 ms of Cassandra CPU per turn landed in
        # 1-second floor windows before (docs/benchmarks.md).
        settle(pids)
    else:
        settle(pids)  # the scratch keyspace's creation is not the floor's latency
        probe = LatencyProbe(settings, [sink])
        sender = probe.pace(lambda k, v: (producer.produce(source, value=v, key=k),
                                          producer.poll(0)), items, rate, ready)
        collector = threading.Thread(target=probe.collect, args=(records, 600), daemon=True)
        collector.start()  # arrivals are timed while the pipeline runs
    counter = RequestCounter(session)
    if rate is None:
        window = CpuWindow({"client": os.getpid(), **pids})
        result = asyncio.run(_floor_run(settings, source, sink, records, session,
                                        insert, plain, shape, ready, window))
    else:
        # From the topic's end: a run may reuse the topics of an earlier one.
        result, window = _floor_in_child(settings, source, sink, records, keyspace, shape,
                                         pids, ready)
    if probe is not None and sender is not None:
        sender.join()
        producer.flush(60)
        collector.join(30)
        result.latency = probe.latencies_ms()
        probe.close()
    result.requests = counter.total()
    if not run:  # a table of its own: its rows are this run's
        result.rows = session.execute(f"SELECT count(*) FROM {keyspace}.lwt",
                                      timeout=60).one()[0]
    say(f"raw pipeline ({shape}): {result.consumed} turns in {window.seconds:.1f} s")
    return (Row(FLOOR_SHAPES[shape], result.consumed, window.seconds, window.cpu_s,
                unit="turns", background_s=window.background_s), result)


_SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter, no forked driver


def _plain_statements(session, keyspace: str) -> Statements:
    from cassandra import ConsistencyLevel

    plain = Statements(
        read=session.prepare(f"SELECT c, v FROM {keyspace}.facts WHERE k = ?"),
        status=session.prepare(f"UPDATE {keyspace}.status SET v = ? WHERE k = ?"),
    )
    for statement in vars(plain).values():
        statement.consistency_level = ConsistencyLevel.QUORUM
    return plain


def _floor_in_child(settings: Settings, source: str, sink: str, records: int,
                    keyspace: str, shape: str, pids: dict[str, int],
                    ready=None) -> tuple[FloorResult, CpuWindow]:
    """``_floor_run`` in a spawned process; its result, and the CPU window with the
    child as ``client``."""
    results = _SPAWN.Queue()
    child = _SPAWN.Process(target=_floor_child, name="floor", daemon=True, args=(
        settings, source, sink, records, keyspace, shape, ready, results))
    child.start()
    try:
        # The child's start (imports, connections, the group join) is not the run: its
        # window starts when its consumer has its partitions (``ready``), or at once if
        # it failed first.
        deadline = time.monotonic() + 120
        while (ready is not None and not ready.wait(0.2) and child.is_alive()
               and results.empty() and time.monotonic() < deadline):
            pass
        with CpuWindow({"client": child.pid, **pids}) as window:
            outcome = results.get(timeout=660)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    if isinstance(outcome, BaseException):
        raise RuntimeError("the floor's process failed") from outcome
    return outcome, window


def _floor_child(settings: Settings, source: str, sink: str, records: int, keyspace: str,
                 shape: str, ready, results) -> None:
    """The floor pipeline, in the spawned process: its own driver session and loop."""
    from services.cassandra_cluster import open_cluster

    try:
        cluster = open_cluster(settings)
        try:
            session = cluster.connect()
            result = asyncio.run(_floor_run(
                settings, source, sink, records, session, _lwt_insert(session, keyspace),
                _plain_statements(session, keyspace), shape, ready))
        finally:
            cluster.shutdown()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        results.put(RuntimeError(f"{type(exc).__name__}: {exc}"))  # always picklable
    else:
        results.put(result)


@dataclass(frozen=True)
class Statements:
    """The plain statements of ``raw_pipeline``'s shapes."""

    read: object
    status: object


async def _floor_run(settings: Settings, source: str, sink: str, records: int, session,
                     insert, plain: Statements, shape: str,
                     ready: threading.Event | None = None,
                     window: CpuWindow | None = None) -> FloorResult:
    """``window``: entered once the consumer has its partitions and left when the last
    event is done, so the consumer's start and group join, and its final commit and
    stop, are outside the measured interval (the worker's start is outside its own)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTP

    began = time.monotonic()
    loop = asyncio.get_running_loop()

    def cql(statement, params) -> asyncio.Future:
        """The driver's callback future as an asyncio future (no thread hop)."""
        done = loop.create_future()
        future = session.execute_async(statement, params, timeout=10)
        future.add_callbacks(
            lambda rows: loop.call_soon_threadsafe(done.set_result, rows),
            lambda exc: loop.call_soon_threadsafe(done.set_exception, exc))
        return done

    # A paced run (``ready`` given) starts at the topic's end and lets the producer
    # start once every partition's position is known: its topics may be an earlier
    # run's. A backlog is produced before it starts: from the beginning.
    consumer = AIOKafkaConsumer(source, bootstrap_servers=settings.kafka_bootstrap,
                                group_id=_uid("bench-floor"), enable_auto_commit=False,
                                auto_offset_reset="earliest" if ready is None else "latest")
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    # What start-up built (modules, clients) out of the collector's reach, as the worker
    # does (streams/worker.py): a fresh process's first full collections otherwise walk
    # it mid-run (a 70-90 ms stall in most first paced rounds).
    gc.collect()
    gc.freeze()
    result = FloorResult(0, 0, 0, {})
    queues: dict[int, asyncio.Queue] = {}
    acked: dict[int, int] = {}

    def counted() -> None:
        """One more event done; the last one closes the measured interval at once (the
        main loop notices it only after its next fetch returns, up to 100 ms later)."""
        result.consumed += 1
        if result.consumed >= records and window is not None and window.t0 \
                and not window.seconds:
            window.__exit__(None, None, None)

    async def turn(msg) -> None:
        """One event's requests and its outcome's publish."""
        key = msg.key.decode()
        if shape == "read":
            await cql(plain.read, (key,))
        elif shape == "lwt2":
            await cql(insert, (f"claim-{key}", "", b""))
        elif shape == "ratchet":
            await asyncio.gather(cql(plain.read, (key,)),
                                 cql(insert, (f"claim-{key}", "", b"")))
        rows = await cql(insert, (key, "", msg.value))
        result.applied += bool(rows[0][0])  # the [applied] column
        if shape == "ratchet":
            await cql(plain.status, ("promoted", key))
        await (await producer.send(sink, b"outcome", key=msg.key))
        result.published += 1

    # The worker's lane window (``RATCHET_LANE_WINDOW``): up to ``lane_window`` events of a
    # partition in flight at once (the floor's keys are all distinct), acked in offset
    # order. Window 1: one event at a time per partition, awaited in the lane itself.
    lane_window = settings.lane_window
    failed: list[BaseException] = []

    async def lane(queue: asyncio.Queue) -> None:
        if lane_window == 1:
            result.most_in_flight = 1
            while True:
                msg = await queue.get()
                await turn(msg)
                acked[msg.partition] = msg.offset + 1  # in order: one lane per partition
                counted()
        in_flight: deque = deque()  # (message, task), in offset order, until acked
        slots = asyncio.Semaphore(lane_window)  # bounds the events being handled
        handling = 0

        def finished(task: asyncio.Task) -> None:
            nonlocal handling
            handling -= 1
            slots.release()
            if not task.cancelled() and task.exception() is not None:
                failed.append(task.exception())
            while in_flight and in_flight[0][1].done() and not in_flight[0][1].cancelled():
                if in_flight[0][1].exception() is not None:
                    return  # never acked: the floor fails (``failed``)
                msg, _ = in_flight.popleft()
                acked[msg.partition] = msg.offset + 1
                counted()

        try:
            while True:
                msg = await queue.get()
                await slots.acquire()
                task = asyncio.ensure_future(turn(msg))
                in_flight.append((msg, task))
                handling += 1
                result.most_in_flight = max(result.most_in_flight, handling)
                task.add_done_callback(finished)
        finally:
            for _, task in in_flight:
                task.cancel()

    lanes = []
    try:
        last_commit = time.monotonic()
        deadline = time.monotonic() + 600
        while result.consumed < records and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=100, max_records=500)
            if ready is not None and not ready.is_set() and consumer.assignment():
                for tp in consumer.assignment():
                    await consumer.position(tp)  # resolved: nothing produced is skipped
                ready.set()  # a paced producer starts now: latency excludes the join
            if window is not None and not window.t0 and consumer.assignment():
                window.__enter__()  # joined: the measured interval starts
            for tp, messages in batches.items():
                if tp.partition not in queues:
                    queues[tp.partition] = asyncio.Queue()
                    lanes.append(asyncio.create_task(lane(queues[tp.partition])))
                for msg in messages:
                    queues[tp.partition].put_nowait(msg)
            if time.monotonic() - last_commit >= 1.0 and acked:
                await consumer.commit({AioTP(source, p): o for p, o in acked.items()})
                last_commit = time.monotonic()
            for task in lanes:
                if task.done():
                    task.result()  # a lane failed: raise its error
            if failed:
                raise failed[0]  # an event of a windowed lane failed
        if window is not None and window.t0 and not window.seconds:
            window.__exit__(None, None, None)  # (a run that ended short: its deadline)
        await consumer.commit({AioTP(source, p): o for p, o in acked.items()})
        result.committed = dict(acked)
        return result
    finally:
        for task in lanes:
            task.cancel()
        await producer.stop()
        await consumer.stop()
        result.run_s = time.monotonic() - began


# --- end to end --------------------------------------------------------------------------


def encoded_turn(rig: Rig, conversation: str, head: int, now_ms: int) -> tuple[bytes, bytes, str]:
    """(key, value, response id) of turn ``head`` of ``conversation``, encoded."""
    response_id = _uid("resp")
    turn = make_turn(conversation_id=conversation, expected_head_seq=head, now_ms=now_ms,
                     response_id=response_id, idempotency_key=_uid("idem"))
    return (encode_key(conversation), rig.serde.encode(turn, rig.topics.gateway_events),
            response_id)


def encoded_turns(rig: Rig, conversations: int, per_conversation: int) -> list[list[tuple]]:
    """``rounds[r]`` = (key, value) of turn r of every conversation, encoded once."""
    now = int(time.time() * 1000)
    convs = [_uid("conv") for _ in range(conversations)]
    return [[encoded_turn(rig, conv, head, now)[:2] for conv in convs]
            for head in range(per_conversation)]


def consume_now(consumer: Consumer, timeout_s: float) -> list:
    """The messages there now, waiting up to ``timeout_s`` for the first one only.
    ``Consumer.consume(n, timeout)`` returns when n messages came or the timeout passed,
    so a clock read after it is late by up to the timeout (it was: 0-100 ms on every
    latency sample, 0.2 s on the end of the throughput window)."""
    first = consumer.poll(timeout_s)
    return [] if first is None else [first, *consumer.consume(1000, timeout=0)]


class OutcomeCounter:
    """Counts messages on the checkpoint and rejection topics, without decoding them.

    The end of the end-to-end window, as cheap for the shared machine as a floor's own
    count: its partitions are paused except inside ``wait_for``, and the broker answers
    a fetch every ``FETCH_WAIT_MS`` rather than at each outcome (a consumer fetching each
    outcome as it came, and the test rig's decoding collector beside it, took ~0.1 ms
    of the broker's CPU per turn and ~12 % of ratchet's rate: docs/benchmarks.md, "The
    bench's own observers"). The window's end is late by at most that wait."""

    FETCH_WAIT_MS = 10

    def __init__(self, settings: Settings, rig: Rig) -> None:
        self.consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                                  "group.id": _uid("bench-count"),
                                  "enable.auto.commit": False,
                                  # A fetch waits for this much data or FETCH_WAIT_MS.
                                  "fetch.min.bytes": 10_000_000,
                                  "fetch.wait.max.ms": self.FETCH_WAIT_MS})
        self.partitions = [TopicPartition(t, p, -2)
                           for t in (rig.topics.checkpoints, rig.topics.rejections)
                           for p in range(settings.partitions)]
        self.consumer.assign(self.partitions)
        self.consumer.pause(self.partitions)
        self.count = 0
        self.rejected = 0
        self.rejections_topic = rig.topics.rejections

    def wait_for(self, total: int, timeout_s: float, progress_s: float | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        next_note = time.monotonic() + (progress_s or timeout_s)
        self.consumer.resume(self.partitions)
        try:
            while self.count < total:
                now = time.monotonic()
                if now > deadline:
                    raise TimeoutError(f"{self.count}/{total} outcomes after {timeout_s}s")
                if progress_s and now > next_note:
                    say(f"{self.count}/{total} outcomes (load {load_average()})")
                    next_note = now + progress_s
                for msg in consume_now(self.consumer, 0.2):
                    if not msg.error():
                        self.count += 1
                        self.rejected += msg.topic() == self.rejections_topic
        finally:
            self.consumer.pause(self.partitions)


def produce(rig: Rig, rounds: list[list[tuple]]) -> int:
    n = 0
    for batch in rounds:
        for key, value in batch:
            rig.producer.send_raw(key, value)
            n += 1
    rig.producer.flush()
    return n


def start_worker(rig: Rig, tmp: Path, counter: OutcomeCounter,
                 loop_driver: str | None = None) -> WorkerProcess:
    """Start a worker (``loop_driver``: its ``RATCHET_LOOP_DRIVER``, else the settings')
    and wait until it has promoted a warm-up turn."""
    env = None if loop_driver is None else {"RATCHET_LOOP_DRIVER": loop_driver}
    worker = rig.worker(tmp, f"bench-worker-{loop_driver or rig.settings.loop_driver}", env)
    produce(rig, encoded_turns(rig, 1, 1))
    counter.wait_for(1, 120)
    return worker


def measure_throughput(rig: Rig, worker: WorkerProcess, counter: OutcomeCounter,
                       turns: int, per_conversation: int, pids: dict[str, int]) -> Row:
    rounds = encoded_turns(rig, max(1, turns // per_conversation), per_conversation)
    total = sum(len(b) for b in rounds)
    expected = counter.count + total
    with CpuWindow({"client": worker.pid, **pids}) as window:
        produce(rig, rounds)
        counter.wait_for(expected, 600, progress_s=5)
    name = (f"end to end: promoted turns ({per_conversation}/conversation, 1 worker)")
    return Row(name, total, window.seconds, window.cpu_s, window.rss_mb["client"], "turns",
               window.background_s)


def measure_rss(rig: Rig, worker: WorkerProcess, counter: OutcomeCounter) -> tuple[float, float]:
    """Worker RSS after 1k, then after 100k distinct conversations (1 turn each)."""
    def run(conversations: int) -> None:
        done = 0
        while done < conversations:  # in slices, so encoded events never pile up here
            size = min(5000, conversations - done)
            expected = counter.count + size
            produce(rig, encoded_turns(rig, size, 1))
            counter.wait_for(expected, 600)
            done += size
            say(f"RSS: {done}/{conversations} conversations, worker RSS "
                f"{proc_stats(worker.pid)[1]:.0f} MB")

    run(1000)
    _, after_1k = proc_stats(worker.pid)
    run(99_000)
    _, after_100k = proc_stats(worker.pid)
    return after_1k, after_100k


def _request_label(query: object) -> str:
    """``VERB table`` of a driver statement (a batch: its statements' labels joined)."""
    from cassandra.query import BatchStatement

    if isinstance(query, BatchStatement):  # its prepared parts carry ids, not text
        kind = "LOGGED (the promotion LWT)" if query.batch_type.name == "LOGGED" else (
            query.batch_type.name)
        return f"BATCH {kind}"
    text = getattr(getattr(query, "prepared_statement", None), "query_string", None)
    if text is None:
        text = getattr(query, "query_string", None) or str(query)
    match = re.search(r"^\s*(\w+).*?\b(?:FROM|INTO|UPDATE)\s+([\w.]+)", text, re.S | re.I)
    label = text[:40] if match is None else f"{match.group(1).upper()} {match.group(2)}"
    if re.search(r"\bIF\b", text):
        label += " IF"
    return label


class RequestCounter:
    """Counts the Cassandra requests a session sends, by statement (bench only).

    ``Session.execute`` and ``execute_async`` both build their request through
    ``_create_response_future``; wrapping it on the instance counts both."""

    def __init__(self, session) -> None:
        self.session = session
        self.counts: Counter[str] = Counter()
        self._original = session._create_response_future
        session._create_response_future = self._count

    def _count(self, query, *args, **kwargs):
        self.counts[_request_label(query)] += 1
        return self._original(query, *args, **kwargs)

    def total(self) -> int:
        return sum(self.counts.values())


def profile_core(settings: Settings, rig: Rig, turns: int = 300,
                 per_conversation: int = 3) -> str:
    """The processor core (this process, one thread) on ``turns`` turns, K per
    conversation in round order like the end-to-end run: Cassandra requests per turn
    (by statement), CPU of the calling thread per turn, and a pyinstrument profile."""
    from pyinstrument import Profiler

    from services.cassandra_cluster import open_cluster
    from services.ledger.cassandra import CassandraLedger
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore
    from streams.codec import RegistryCodec
    from streams.processor import PromotionProcessor
    from streams.records import RawRecord

    cluster = open_cluster(settings)
    session = cluster.connect(settings.keyspace)
    codec = RegistryCodec(rig.serde)
    processor = PromotionProcessor(CassandraCheckpointStore(session, StoreOptions()),
                                   CassandraLedger(session), codec, rig.topics)
    rounds = encoded_turns(rig, max(1, turns // per_conversation), per_conversation)
    records = [RawRecord(rig.topics.gateway_events, 0, i, key, value)
               for i, (key, value) in enumerate(kv for batch in rounds for kv in batch)]
    counter = RequestCounter(session)
    kinds: Counter[str] = Counter()
    profiler = Profiler()
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    profiler.start()
    for record in records:
        handled = processor.handle(record)
        kinds[handled.kind] += 1
        for out in handled.outbound:
            codec.encode(out.topic, out.model)
    profiler.stop()
    cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    cluster.shutdown()
    n = len(records)
    lines = [f"processor core, {n} turns ({per_conversation}/conversation, one thread): "
             f"{dict(kinds)}; {wall * 1000 / n:.1f} ms wall and {cpu * 1000 / n:.2f} ms CPU "
             "of the calling thread per turn (the driver's I/O thread not included)",
             f"Cassandra requests per turn: {counter.total() / n:.2f}"]
    lines += [f"  {count / n:5.2f}  {label}" for label, count in counter.counts.most_common()]
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    return "\n".join(lines) + "\n\npyinstrument (wall clock):\n" + "\n".join(
        text.splitlines()[:70])


# --- latency at a fixed rate ----------------------------------------------------------------


def p50_p99(latencies_ms: list[float]) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, samples) of the latency rows."""
    lat = sorted(latencies_ms)
    if not lat:
        return float("nan"), float("nan"), 0
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], len(lat)


# The broker's answers while a partition has no leader yet (a topic just made, a broker
# just restarted): asked again until it has one.
_NO_LEADER_YET = {"NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE",
                  "UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_PARTITION", "_UNKNOWN_TOPIC",
                  "_TIMED_OUT"}


def end_offsets(consumer: Consumer, partitions: list[TopicPartition],
                timeout_s: float = 60.0) -> list[TopicPartition]:
    """Each partition at its end offset (the high watermark the broker reports now);
    waits while a partition has no leader yet, raises after ``timeout_s``."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    placed = []
    for tp in partitions:
        while True:
            try:
                _, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
                break
            except KafkaException as exc:
                if (exc.args[0].name() not in _NO_LEADER_YET
                        or time.monotonic() >= deadline):
                    raise
                time.sleep(0.1)
        placed.append(TopicPartition(tp.topic, tp.partition, high))
    return placed


class RecordClock:
    """When each record was sent and when its outcome arrived, per record. A key's
    records live in one partition and each gets one outcome, published in the order
    they were processed, so the n-th outcome of a key answers its n-th record; that holds
    on one outcome topic, so outcomes of ``rejections_topic`` are counted apart
    (``rejected``): a run whose keys carry several records must have none."""

    def __init__(self, rejections_topic: str | None = None) -> None:
        self.rejections_topic = rejections_topic
        self.reset()

    def reset(self) -> None:
        """Forget every send and arrival (a warm-up's)."""
        self.sent: dict[bytes, list[float]] = {}
        self.arrived: dict[bytes, list[float]] = {}
        self.order: list[tuple[bytes, int]] = []  # (key, n-th record of it), sent order
        self.received = 0
        self.rejected = 0

    def mark_sent(self, key: bytes, at: float) -> None:
        times = self.sent.setdefault(key, [])
        self.order.append((key, len(times)))
        times.append(at)

    def mark_arrived(self, key: bytes, topic: str, at: float) -> None:
        self.arrived.setdefault(key, []).append(at)
        self.received += 1
        self.rejected += topic == self.rejections_topic

    def latencies_ms(self) -> list[float]:
        """Sent -> outcome arrived of every record answered, in ms, in sent order."""
        out = []
        for key, n in self.order:
            arrived = self.arrived.get(key, ())
            if n < len(arrived):
                out.append((arrived[n] - self.sent[key][n]) * 1000)
        return out

    def percentiles(self) -> tuple[float, float, int]:
        """(p50 ms, p99 ms, samples)."""
        return p50_p99(self.latencies_ms())


class LatencyProbe(RecordClock):
    """Produce -> outcome consumed, per record (``RecordClock``): a paced producer marks
    when each record was produced, a consumer (from the topics' end) when outcomes
    arrive."""

    def __init__(self, settings: Settings, topics: list[str],
                 rejections_topic: str | None = None) -> None:
        super().__init__(rejections_topic)
        self.consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                                  "group.id": _uid("bench-latency"),
                                  "enable.auto.commit": False})
        # Each partition from its end offset as the broker reports it NOW (a ListOffsets
        # answer awaited here): an outcome published after this line is never skipped.
        # Assigning at OFFSET_END left the lookup to the first fetch; when it came late
        # (a broker just restarted, a topic just made), an early outcome fell before
        # the resolved end and was never seen.
        self.consumer.assign(end_offsets(
            self.consumer, [TopicPartition(t, p) for t in topics
                            for p in range(settings.partitions)]))
        # The bench's older objects out of the collector's reach: a gen-2 collection of
        # this process (71 ms seen mid-run) would delay the probe's clock and sends,
        # whichever line it fell in.
        gc.collect()
        gc.freeze()

    def pace(self, send, items: list[tuple[bytes, bytes]], rate: float,
             ready: threading.Event | None = None) -> threading.Thread:
        """Start sending ``items`` at ``rate`` per second with ``send(key, value)``, once
        ``ready`` is set (the consumer under test has its partitions)."""
        def run() -> None:
            if ready is not None:
                ready.wait(60)
            t0 = time.monotonic()
            for i, (key, value) in enumerate(items):
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self.mark_sent(key, time.monotonic())
                send(key, value)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def collect(self, total: int, timeout_s: float) -> None:
        """Time arrivals until ``total`` outcomes came (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.received < total and time.monotonic() < deadline:
            for msg in consume_now(self.consumer, 0.1):
                if not msg.error():
                    self.mark_arrived(msg.key(), msg.topic(), time.monotonic())

    def close(self) -> None:
        self.consumer.close()


# A paced Conversation's next turn follows its previous one by about this long: a gateway
# continues a Conversation after its answer reached the user, not in the same millisecond.
TURN_SPACING_S = 0.5


def paced_turns(rig: Rig, turns: int, per_conversation: int, rate: float,
                ) -> list[tuple[bytes, bytes, str, str]]:
    """``turns`` turns (key, value, response id, conversation), ``per_conversation`` per
    new Conversation, in send order: groups of Conversations that each get their first
    turn, then their second, ..., so a Conversation's turns are ~``TURN_SPACING_S``
    apart at ``rate``."""
    now = int(time.time() * 1000)
    group = max(1, round(rate * TURN_SPACING_S))
    conversations = [_uid("conv") for _ in range(-(-turns // per_conversation))]
    out: list[tuple[bytes, bytes, str, str]] = []
    for start in range(0, len(conversations), group):
        members = conversations[start:start + group]
        for head in range(per_conversation):
            for conversation in members:
                key, value, response_id = encoded_turn(rig, conversation, head, now)
                out.append((key, value, response_id, conversation))
    return out[:turns]


def e2e_latency(settings: Settings, rig: Rig, rate: float, turns: int,
                http: HttpWaits | None = None, per_conversation: int = 1) -> list[float]:
    """Produce -> outcome consumed, ``turns`` turns at ``rate``, ``per_conversation``
    turns per new Conversation (``paced_turns``); with ``http``, each turn's HTTP wait is
    sent right after its produce (its figures: ``http.results``). Every turn must be
    promoted: a rejection of a Conversation's turn would break the turns after it."""
    probe = LatencyProbe(settings, [rig.topics.checkpoints, rig.topics.rejections],
                         rejections_topic=rig.topics.rejections)
    try:
        items = paced_turns(rig, turns, per_conversation, rate)
        # A Conversation's turns live in the partition of its id (CONTRACT section 2).
        response_of = {value: (response_id, conversation)
                       for _, value, response_id, conversation in items}

        def send(key: bytes, value: bytes) -> None:
            rig.producer.send_raw(key, value)
            rig.producer.producer.poll(0)
            if http is not None:
                http.wait_for(*response_of[value], probe.sent[key][-1])

        sender = probe.pace(send, [(key, value) for key, value, _, _ in items], rate)
        probe.collect(len(items), 120 + turns / rate)
        sender.join()
        rig.producer.flush()
        if probe.rejected:
            raise RuntimeError(f"latency run: {probe.rejected} of {len(items)} turns "
                               "rejected; its figures would not be of promotions")
        return probe.latencies_ms()
    finally:
        probe.close()


WARM_UP_TURNS = 50  # of the API, before its latency run
FIRST_TURNS = "ratchet, first turns only"  # every paced turn a new Conversation's first
WITH_API = "ratchet, API beside"  # the latency run with a `ratchet api` and its waits


def http_latency(settings: Settings, rig: Rig, tmp: Path, rate: float, turns: int,
                 pids: dict[str, int] | None = None, per_conversation: int = 1,
                 ) -> tuple[tuple[float, float, int], WaitFigures, dict[str, list[float]]]:
    """``e2e_latency`` with a ``ratchet api`` beside the worker and a GET with
    ``wait_ms`` per turn: (produce -> outcome consumed, produce -> HTTP certified,
    the client's ms per GET of an already-promoted response). ``pids``: more processes
    whose CPU over the run goes in ``WaitFigures.cpu_s``."""
    http = HttpWaits(settings, tmp)
    try:
        # Warm-up, not measured: the API's connections, prepared statements and code
        # paths get their first use here, as the worker's did before its runs.
        e2e_latency(settings, rig, rate, WARM_UP_TURNS, http, per_conversation)
        http.results(timeout_s=60)
        with CpuWindow({**(pids or {}), "api": http.api.pid, "bench": os.getpid()}) as window:
            consumed = e2e_latency(settings, rig, rate, turns, http, per_conversation)
            figures = http.results(timeout_s=60)
        figures = replace(figures, cpu_s=window.cpu_s, seconds=window.seconds,
                          background_s=window.background_s)
        return p50_p99(consumed), figures, http.overhead(http.answered[-turns:][:100])
    finally:
        http.close()


# --- floor 0: the Faust app alone ------------------------------------------------------------

FAUST_FLOOR = "floor 0: Faust app alone, consume + publish + ack (no storage)"


def faust_pipeline(settings: Settings, records: int, pids: dict[str, int], home: Path, *,
                   rate: float | None = None) -> tuple[Row, tuple[float, float, int] | None]:
    """Floor 0 (``ratchet.bench.faust_floor``, a worker process of its own): what the
    stream stack costs per record before ratchet does anything. ``rate`` None: a backlog
    of ``records`` produced before the clock starts (the throughput runs' shape);
    otherwise produced at ``rate`` with their latency (produce -> outcome consumed), the
    latency runs' shape. Returns the row (the floor process as ``client``) and the
    latency (None on a backlog)."""
    import subprocess

    admin, source, sink = floor_topics(settings, "floor-faust")
    run = source.removesuffix("-in")
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RATCHET_FLOOR_SOURCE": source, "RATCHET_FLOOR_SINK": sink,
           "RATCHET_FLOOR_PARTITIONS": str(settings.partitions),
           "RATCHET_FLOOR_DATADIR": str(home / run),
           "RATCHET_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    log = (home / f"{run}.log").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "ratchet.bench.faust_floor"],
                              env=env, cwd=home, stdout=log,
                              stderr=subprocess.STDOUT)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5})
    probe = LatencyProbe(settings, [sink])
    value = os.urandom(1700)  # a TurnCompleted's size
    try:
        warm_up = [(b"floor-0-warm-up", value)]
        probe.pace(lambda k, v: producer.produce(source, value=v, key=k), warm_up, 1).join()
        producer.flush(30)
        probe.collect(1, 90)  # the worker has its partitions and has published once
        if not probe.received:
            raise RuntimeError(f"floor 0: no outcome from the Faust worker (see {log.name})")
        probe.reset()
        items = [(f"floor-0-{i:08d}".encode(), value) for i in range(records)]
        if rate is None:
            for key, data in items:
                producer.produce(source, value=data, key=key)
                producer.poll(0)
            producer.flush(60)
            for key, _ in items:
                probe.mark_sent(key, 0.0)
        with CpuWindow({"client": worker.pid, **pids}) as window:
            if rate is None:
                probe.collect(records, 300)
            else:
                sender = probe.pace(lambda k, v: (producer.produce(source, value=v, key=k),
                                                  producer.poll(0)), items, rate)
                probe.collect(records, 120 + records / rate)
                sender.join()
        if probe.received < records:
            raise RuntimeError(f"floor 0: {probe.received} of {records} outcomes")
        latency = None if rate is None else probe.percentiles()
        name = FAUST_FLOOR if rate is None else f"{FAUST_FLOOR}, {rate:.0f}/s paced"
        return Row(name, records, window.seconds, window.cpu_s, unit="records",
                   background_s=window.background_s), latency
    finally:
        producer.flush(30)
        probe.close()
        worker.terminate()
        with contextlib.suppress(Exception):
            worker.wait(30)
        log.close()
        _delete_topics(admin, [source, sink])


# --- driver A/B: acsylla (the C++ driver, asyncio) on the raw LWT row ----------------------


def raw_lwt_acsylla(settings: Settings, ops: int, pids: dict[str, int]) -> Row:
    """The raw LWT row with acsylla (the worker's loop path driver) instead of
    cassandra-driver: same table shape, same consistency, ``RAW_LWT_IN_FLIGHT`` asyncio
    tasks (no threads)."""
    import acsylla

    with scratch_lwt_table(settings, "acsylla") as (_, keyspace, _insert):
        async def run() -> int:
            cluster = acsylla.create_cluster(list(settings.cassandra_hosts),
                                             port=settings.cassandra_port,
                                             request_timeout=10.0)
            session = await cluster.create_session()
            try:
                prepared = await session.create_prepared(
                    f"INSERT INTO {keyspace}.lwt (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS")
                payload = os.urandom(1024)

                async def one(key: str) -> None:
                    statement = prepared.bind()
                    statement.bind_list([key, "", payload])
                    statement.set_consistency(acsylla.Consistency.LOCAL_QUORUM)
                    statement.set_serial_consistency(acsylla.Consistency.SERIAL)
                    row = (await session.execute(statement)).first()
                    assert row is not None and row.column_value("[applied]") is True

                for i in range(50):
                    await one(f"warm{i}")
                per_task = max(1, ops // RAW_LWT_IN_FLIGHT)

                async def task(w: int) -> None:
                    for i in range(per_task):
                        await one(f"k{w}_{i}")

                settle(pids)  # as raw_lwt
                with CpuWindow({"client": os.getpid(), **pids}) as window:
                    await asyncio.gather(*(task(w) for w in range(RAW_LWT_IN_FLIGHT)))
                run.window = window  # type: ignore[attr-defined]
                return per_task * RAW_LWT_IN_FLIGHT
            finally:
                await session.close()

        done = asyncio.run(run())
        window = run.window  # type: ignore[attr-defined]
    say(f"raw LWT (acsylla): {done} in {window.seconds:.1f} s")
    return Row(f"raw LWT as above, acsylla (C++ driver), {RAW_LWT_IN_FLIGHT} tasks", done,
               window.seconds, window.cpu_s)


# --- the summary the issue asks for --------------------------------------------------------


def cores(cpu_s: dict[str, float], seconds: float) -> str:
    """``who share, ...``: cores each process used over ``seconds``."""
    return ", ".join(f"{who} {cpu / seconds:.2f}" for who, cpu in cpu_s.items()) if seconds else "-"


def background_cores(background_s: dict[str, float], seconds: float) -> str:
    """``; of which the servers' jit x, compaction y``: cores, see CpuWindow."""
    if not background_s or not seconds:
        return ""
    return "; of which the servers' " + ", ".join(
        f"{kind} {cpu / seconds:.2f}" for kind, cpu in background_s.items())


def summed_cpu_ms(row: Row) -> float:
    return sum(row.cpu_ms_per_op(who) or 0.0 for who in COLUMNS)


@dataclass(frozen=True)
class ThroughputRound:
    """One backlog run of ratchet and the floors measured just before it."""

    e2e: Row
    floors: dict[str, Row]  # by shape: "lwt" (floor 1), "lwt2" (floor 1b)


def throughput_lines(rounds: list[ThroughputRound]) -> list[str]:
    """Ratchet's rate and summed CPU per turn against each floor's, per round; with
    more than one round, then the medians of the rounds' ratios, the verdict.

    Why rounds: ratchet's backlog window (6-12 s) and a floor's (3-4 s) fall on
    different moments of a shared machine, and the same code ran at 258 and at 476
    turns/s ten minutes apart (session 39). Floors and ratchet alternate, and one slow
    moment moves one round's ratio, not the median.
    """
    lines: list[str] = []
    ratios: dict[str, list[tuple[float, float]]] = {}
    several = len(rounds) > 1
    for number, one in enumerate(rounds, 1):
        e2e = one.e2e
        for shape, floor in one.floors.items():
            rate = e2e.per_second / floor.per_second
            cpu = summed_cpu_ms(e2e) / summed_cpu_ms(floor)
            ratios.setdefault(shape, []).append((rate, cpu))
            label = f"round {number}, " if several else ""
            lines.append(
                f"  {label}vs {FLOOR_NAMES[shape]:<9} throughput {e2e.per_second:6.0f} / "
                f"{floor.per_second:6.0f} turns/s = {rate:.2f} (target >= 0.7 of floor 1); "
                f"CPU per turn {summed_cpu_ms(e2e):.2f} / {summed_cpu_ms(floor):.2f} ms = "
                f"{cpu:.2f} (target <= 1.5 of floor 1)")
            if e2e.background_s and floor.background_s:
                mine, theirs = summed_request_cpu_ms(e2e), summed_request_cpu_ms(floor)
                lines.append(
                    f"  {'':<{len(label) + 12}} without the servers' JIT, flushes and "
                    f"compactions: CPU per turn {mine:.2f} / {theirs:.2f} ms = "
                    f"{mine / theirs:.2f}")
    if several:
        for shape, pairs in ratios.items():
            rate = statistics.median(r for r, _ in pairs)
            cpu = statistics.median(c for _, c in pairs)
            if shape == "lwt":
                verdict = (f"throughput {rate:.2f} (target >= 0.7): "
                           f"{'met' if rate >= 0.7 else 'MISSED'}; CPU per turn {cpu:.2f} "
                           f"(target <= 1.5): {'met' if cpu <= 1.5 else 'MISSED'}")
            else:
                verdict = f"throughput {rate:.2f}; CPU per turn {cpu:.2f}"
            lines.append(f"  vs {FLOOR_NAMES[shape]}, median of the {len(pairs)} rounds' "
                         f"ratios: {verdict}")
    return lines


def summary(e2e: Row, floors: dict[str, Row], latency: dict[str, tuple[float, float, int]],
            rate: float,
            http: tuple[WaitFigures, dict[str, list[float]], QuarterLoad] | None = None,
            latency_cpu: dict[str, str] | None = None,
            rounds: list[tuple[list[float], list[float]]] | None = None,
            per_conversation: int = 1,
            throughput: list[ThroughputRound] | None = None) -> str:
    """The verdicts. ``e2e`` and ``floors`` are the throughput figures of one round;
    ``throughput``, when given, every round of them (``e2e`` and ``floors`` unused)."""
    lines = ["", "ratchet against its floors (same run):"]
    lines.extend(throughput_lines(throughput or [ThroughputRound(e2e, floors)]))
    if latency:
        lines.append(f"  latency at {rate:.0f} turns/s (half of ratchet's max), "
                     f"{per_conversation} turns per Conversation as in that run, produce -> "
                     "outcome consumed:")
        width = max(len(name) for name in latency)
        for name, (p50, p99, n) in latency.items():
            lines.append(f"    {name:<{width}} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  ({n} turns)")
        for floor in ("floor 1", "floor 1b"):
            if "ratchet" in latency and floor in latency:
                ratio = latency["ratchet"][1] / latency[floor][1]
                if floor == "floor 1" and rounds:
                    lines.append(f"    p99 ratio to floor 1 {ratio:.2f} (all rounds pooled; "
                                 "the verdict: the rounds' median below)")
                else:
                    lines.append(f"    p99 ratio to {floor} {ratio:.2f} "
                                 "(target <= 3 x floor 1)")
        lines.extend(round_lines(rounds or []))
        for name, text in (latency_cpu or {}).items():
            lines.append(f"    cores used, {name:<{width}}: {text}")
    if http is not None:
        figures, overhead, quarter = http
        lines.extend(http_summary(figures, overhead, floor=latency.get("floor 1"), rate=rate,
                                  quarter=quarter))
    return "\n".join(lines)


def after_warm_up(latencies_ms: list[float], turns: int) -> list[float]:
    """A paced run's figures without its first fifth (in send order), its warm-up: a
    fresh floor process's first 100-200 records wait on its first fetches and LWTs."""
    return latencies_ms[turns // 5:]


def alternated_latency(settings: Settings, rig: Rig, rate: float, turns: int, rounds: int,
                       pids: dict[str, int], floor: PacedFloor, per_conversation: int = 1,
                       ) -> tuple[CpuWindow, list[tuple[list[float], list[float]]]]:
    """``rounds`` pairs (ratchet, then floor 1), each ``turns`` at ``rate``: produce ->
    outcome consumed of both, alternated so that a slow minute of this shared machine
    (or the servers' own work after the backlog run) falls on both lines alike rather
    than on whichever ran during it; the first fifth of each run is not counted.
    ``floor``: floor 1 on its keyspace and topics (``PacedFloor``), made before, run once
    unmeasured first (ratchet's worker is warm from its backlog run). Returns
    the CPU of ``pids`` and this process over ratchet's runs only, and each round's
    latencies (ms)."""
    total = CpuWindow({**pids, "bench": os.getpid()})
    total.cpu_s = dict.fromkeys(total.pids, 0.0)
    paired: list[tuple[list[float], list[float]]] = []
    settle(pids)
    floor.warm_up(rate, turns)
    for _ in range(rounds):
        settle(pids)
        with CpuWindow(total.pids) as window:
            mine = e2e_latency(settings, rig, rate, turns, per_conversation=per_conversation)
        total.seconds += window.seconds
        for name, cpu in window.cpu_s.items():
            total.cpu_s[name] += cpu
        add_into(total.background_s, window.background_s)
        settle(pids)
        floor_ms = floor.run(rate, turns)
        paired.append((after_warm_up(mine, turns), after_warm_up(floor_ms, turns)))
    return total, paired


class PacedFloor:
    """A floor (``shape``, floor 1 by default) fed at a rate, run after run on ONE
    scratch keyspace and topic pair:
    creating and dropping them per run keeps Cassandra and Kafka busy (DDL, new
    partitions' files) during the next run, which ratchet's long-lived worker and
    topics never pay. Each run has keys of its own and reads from the topics' end."""

    def __init__(self, settings: Settings, pids: dict[str, int], shape: str = "lwt") -> None:
        self.settings, self.pids, self.shape, self.runs = settings, pids, shape, 0
        # CPU seconds per process ("floor": the floor's own process) and seconds over
        # the measured runs (not the warm-up): the floor's share of the machine.
        self.cpu_s: dict[str, float] = {}
        self.background_s: dict[str, float] = {}  # the servers' share (CpuWindow)
        self.seconds = 0.0

    def __enter__(self) -> PacedFloor:
        self._table = scratch_lwt_table(self.settings, "floor", *FLOOR_TABLES)
        self.session, self.keyspace, self.insert = self._table.__enter__()
        try:
            self.admin, self.source, self.sink = floor_topics(self.settings, "floor-paced")
        except BaseException:
            self._table.__exit__(None, None, None)
            raise
        return self

    def run(self, rate: float, records: int) -> list[float]:
        """One paced run: produce -> outcome consumed of each record, ms."""
        self.runs += 1
        row, result = _floor_measure(self.settings, self.session, self.keyspace, self.insert,
                                   self.source, self.sink, records, self.pids, self.shape,
                                   rate,
                                   run=f"r{self.runs}-")
        if result.applied != records:
            raise RuntimeError(f"paced floor: {result.applied} of {records} LWTs applied")
        self.seconds += row.seconds
        for who, cpu in row.cpu_s.items():
            name = "floor" if who == "client" else who
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + cpu
        add_into(self.background_s, row.background_s)
        return result.latency

    def warm_up(self, rate: float, records: int) -> None:
        """An unmeasured run of a fifth of ``records`` (at least 50): a new keyspace's and
        topics' first work is not the floor's latency (nor its CPU)."""
        self.run(rate, max(50, records // 5))
        self.cpu_s, self.background_s, self.seconds = {}, {}, 0.0

    def __exit__(self, *exc: object) -> None:
        try:
            _delete_topics(self.admin, [self.source, self.sink])
        finally:
            self._table.__exit__(None, None, None)


def settle(pids: dict[str, int], *, below_cores: float = 0.15, limit_s: float = 15.0) -> float:
    """Wait until Cassandra and Kafka are quiet (each under ``below_cores`` over half a
    second), at most ``limit_s``: a floor's run ends by dropping its keyspace, which
    keeps Cassandra busy for about a second after it, and starts by creating topics; a
    latency run started then would carry that work. Returns the seconds waited."""
    servers = {name: pid for name, pid in pids.items() if name in ("cassandra", "kafka")}
    start = time.monotonic()
    while servers and time.monotonic() - start < limit_s:
        with CpuWindow(servers) as window:
            time.sleep(0.5)
        if all(cpu / window.seconds < below_cores for cpu in window.cpu_s.values()):
            break
    return time.monotonic() - start


def round_lines(rounds: list[tuple[list[float], list[float]]]) -> list[str]:
    """One line per alternated round (both p99s, their ratio), then the median of the
    rounds' ratios: one round whose floor or ratchet run met a stall of the shared
    machine moves the pooled p99s; it does not move the median."""
    lines, ratios = [], []
    for i, (mine, floor) in enumerate(rounds, 1):
        _, mine99, _ = p50_p99(mine)
        _, floor99, _ = p50_p99(floor)
        ratios.append(mine99 / floor99)
        lines.append(f"      round {i}: ratchet p99 {mine99:7.1f} ms, floor 1 p99 "
                     f"{floor99:7.1f} ms, ratio {ratios[-1]:.2f}")
    if ratios:
        median = statistics.median(ratios)
        lines.append(f"    p99 ratio to floor 1, median of the {len(ratios)} rounds "
                     f"{median:.2f} (target <= 3): {'met' if median <= 3 else 'MISSED'}")
    return lines


@dataclass(frozen=True)
class QuarterLoad:
    """The HTTP latency run again at a quarter of ratchet's maximum, beside floor 1 at
    that rate."""

    rate: float
    figures: WaitFigures
    floor: tuple[float, float, int]


def cpu_demand(figures: WaitFigures, rate: float) -> str:
    """Every measured process's CPU per answered turn, summed, and the cores that sum
    asks for at ``rate``: at or near the machine's cores, the run measures the machine."""
    n = len(figures.latencies_ms)
    if not n:
        return "-"
    per_turn = {who: cpu * 1000 / n for who, cpu in figures.cpu_s.items()}
    total = sum(per_turn.values())
    parts = " + ".join(f"{who} {ms:.2f}" for who, ms in per_turn.items())
    return (f"{parts} = {total:.2f} ms of CPU per turn; at {rate:.0f} turns/s "
            f"{total * rate / 1000:.2f} of the machine's {os.cpu_count()} cores"
            + background_cores(figures.background_s, figures.seconds))


def http_summary(figures: WaitFigures, overhead_ms: dict[str, list[float]],
                 floor: tuple[float, float, int] | None, rate: float,
                 quarter: QuarterLoad | None = None) -> list[str]:
    """The produce -> HTTP certified lines of ``summary``."""
    p50, p99, n = p50_p99(figures.latencies_ms)
    lines = [f"  produce -> HTTP certified with wait_ms, the turns of '{WITH_API}' (a "
             "GET sent right after each produce):",
             f"    {'ratchet':<10} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  ({n} answers; "
             f"{figures.waited} waited for the promotion, {figures.queued} queued for one "
             f"of {MAX_IN_FLIGHT} client slots)"]
    if n and "api" in figures.cpu_s:
        lines.append(f"    the API's CPU: {figures.cpu_s['api'] * 1000 / n:.2f} ms per answer")
    lines.append(f"    demand: {cpu_demand(figures, rate)}")
    if floor is not None:
        lines.append(f"    floor 1 has no API: against its produce -> outcome consumed p99 "
                     f"{floor[1]:.1f} ms, p99 ratio {p99 / floor[1]:.2f} (target <= 3)")
    if quarter is not None:
        q50, q99, qn = p50_p99(quarter.figures.latencies_ms)
        lines.append(f"    at a quarter of the maximum ({quarter.rate:.0f} turns/s): p50 "
                     f"{q50:7.1f} ms  p99 {q99:7.1f} ms  ({qn} answers); floor 1 at that "
                     f"rate p99 {quarter.floor[1]:.1f} ms, p99 ratio "
                     f"{q99 / quarter.floor[1]:.2f}")
        lines.append(f"    demand: {cpu_demand(quarter.figures, quarter.rate)}")
    lines.append("    client overhead: GET with wait_ms of an already-promoted response "
                 "(an API cache hit), sequential, the two clients interleaved:")
    for client, times in overhead_ms.items():
        o50, o99, on = p50_p99(times)
        lines.append(f"      {client:<40} p50 {o50:5.1f} ms  p99 {o99:6.1f} ms  ({on})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratchet bench processor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=positive_int, default=3000)
    parser.add_argument("--per-conversation", type=positive_int, default=3)
    parser.add_argument("--raw", type=positive_int, default=3000,
                        help="LWTs of the raw Cassandra baseline (Kafka: 10x as many)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-only", action="store_true",
                        help="only the processor core profile (no worker, no baselines)")
    parser.add_argument("--rss", action="store_true")
    parser.add_argument("--driver-ab", action="store_true",
                        help="also end to end with the loop path on cassandra-driver")
    parser.add_argument("--latency-turns", type=non_negative_int, default=1000,
                        help="turns of each latency run at half the measured rate (0: none)")
    parser.add_argument("--throughput-rounds", type=positive_int, default=3,
                        help="backlog runs of floors 1 and 1b, then ratchet, alternated "
                             "(the verdicts: the medians of the rounds' ratios)")
    parser.add_argument("--latency-rounds", type=positive_int, default=3,
                        help="alternated latency runs of ratchet and floor 1 (pooled)")
    args = parser.parse_args(argv)

    import logging

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    load_before = load_average()
    base = Settings.from_env()
    pids = server_pids(base)
    with deferred_topic_deletion():
        return _run(args, load_before, base, pids)


def _run(args: argparse.Namespace, load_before: str, base: Settings,
         pids: dict[str, int]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bench-"))
    settings = isolated_settings(base, "bench", partitions=12, home=tmp / "home")
    say(f"load {load_before}; topics {settings.topic_prefix}*")
    rig = Rig(settings, collect=False)  # the bench counts outcomes (OutcomeCounter)
    if args.profile_only:
        try:
            print(f"load average {load_before} before, {load_average()} after")
            print(profile_core(settings, rig, per_conversation=args.per_conversation))
        finally:
            rig.close()
        return 0
    with CpuWindow(dict(pids)) as idle:  # what the servers burn without us
        time.sleep(3)
    rows: list[Row] = [Row("idle 3 s (servers' background, other users)", 0, idle.seconds,
                           idle.cpu_s)]
    sample = encoded_turns(rig, 1, 1)[0][0][1]
    rows.extend(raw_kafka(settings, sample, args.raw * 10, pids))
    rows.append(raw_lwt(settings, args.raw, pids))
    rows.append(raw_lwt_acsylla(settings, args.raw, pids))
    floors = {shape: raw_pipeline(settings, args.raw, pids, shape=shape)[0]
              for shape in FLOOR_SHAPES}
    rows.extend(floors.values())
    rows.append(faust_pipeline(settings, args.raw, pids, tmp / "floor-0")[0])
    counter = OutcomeCounter(settings, rig)
    if args.driver_ab:  # the same run on the other driver, before the measured worker
        other = "cassandra-driver" if settings.loop_driver == "acsylla" else "acsylla"
        say(f"end to end with the loop path on {other}: {args.turns} turns")
        worker = start_worker(rig, tmp, counter, other)
        try:
            ab = measure_throughput(rig, worker, counter, args.turns, args.per_conversation,
                                    pids)
        finally:
            worker.terminate()
        rows.append(replace(ab, name=f"{ab.name}, loop path on {other}"))
    say("starting the worker")
    worker = start_worker(rig, tmp, counter)
    try:
        say(f"end to end: {args.turns} turns")
        throughput: list[ThroughputRound] = []
        for number in range(1, args.throughput_rounds + 1):
            if number > 1:  # round 1's floors ran above, before the worker started
                say(f"round {number} of {args.throughput_rounds}: floors 1 and 1b, then "
                    f"ratchet, {args.turns} turns")
                floors = {shape: raw_pipeline(settings, args.raw, pids, shape=shape)[0]
                          for shape in THROUGHPUT_FLOORS}
                rows.extend(replace(row, name=f"{row.name} (round {number})")
                            for row in floors.values())
            settle(pids)  # as before each floor: the earlier runs' flushes are not this one's
            e2e = measure_throughput(rig, worker, counter, args.turns, args.per_conversation,
                                     pids)
            if args.driver_ab:
                e2e = replace(e2e, name=f"{e2e.name}, loop path on {settings.loop_driver}")
            rows.append(e2e if number == 1 else replace(e2e, name=f"{e2e.name} (round {number})"))
            throughput.append(ThroughputRound(
                e2e, {shape: floors[shape] for shape in THROUGHPUT_FLOORS}))
        # The latency runs' rate: half of the median round's.
        e2e = sorted((one.e2e for one in throughput), key=lambda row: row.per_second)[
            (len(throughput) - 1) // 2]
        latency: dict[str, tuple[float, float, int]] = {}
        latency_cpu: dict[str, str] = {}
        http = None
        rounds: list[tuple[list[float], list[float]]] = []
        rate = e2e.per_second / 2
        if args.latency_turns:
            say(f"latency at {rate:.0f} turns/s, {args.per_conversation} turns per "
                f"Conversation: ratchet and floor 1 alternated {args.latency_rounds} times, "
                "then first turns only, with the API, then floors 1b and 0")
            who = {"worker": worker.pid, **pids}
            # The paced floors' keyspaces and topics, made once, before any line is
            # measured: their creation is not a floor's latency.
            with PacedFloor(settings, pids) as floor_1, \
                    PacedFloor(settings, pids, "lwt2") as floor_1b:
                # The same turn mix as the throughput run whose half this rate is: a
                # Conversation's first turn costs two more requests (its owner's read
                # and write) than its later ones.
                alone, rounds = alternated_latency(settings, rig, rate, args.latency_turns,
                                                   args.latency_rounds, who, floor_1,
                                                   args.per_conversation)
                # Floor 1's load at this rate, before its quarter-load run below.
                floor_cores = (cores(floor_1.cpu_s, floor_1.seconds)
                               + background_cores(floor_1.background_s, floor_1.seconds))
                latency["ratchet"] = p50_p99([ms for mine, _ in rounds for ms in mine])
                latency["floor 1"] = p50_p99([ms for _, floor in rounds for ms in floor])
                if args.per_conversation > 1:
                    settle(pids)
                    firsts = e2e_latency(settings, rig, rate, args.latency_turns)
                    latency[FIRST_TURNS] = p50_p99(after_warm_up(firsts, args.latency_turns))
                latency[WITH_API], figures, overhead = http_latency(
                    settings, rig, tmp, rate, args.latency_turns, who, args.per_conversation)
                # The same at a quarter of the maximum, beside floor 1 at that rate:
                # whether a miss at half load is the design or the 2 cores the five
                # processes share.
                _, quarter_figures, _ = http_latency(settings, rig, tmp, rate / 2,
                                                     args.latency_turns, who,
                                                     args.per_conversation)
                settle(pids)
                quarter = QuarterLoad(rate / 2, quarter_figures,
                                      p50_p99(floor_1.run(rate / 2, args.latency_turns)))
                http = figures, overhead, quarter
                # The response id's claim makes two Paxos rounds in a row per turn:
                # floor 1b is the latency floor of that shape.
                settle(pids)
                floor_1b.warm_up(rate, args.latency_turns)
                settle(pids)
                latency["floor 1b"] = p50_p99(floor_1b.run(rate, args.latency_turns))
            paced_worker_ms = (alone.cpu_s.get("worker", 0.0) * 1000
                               / (args.latency_turns * args.latency_rounds))
            latency_cpu = {"ratchet": f"{cores(alone.cpu_s, alone.seconds)}; worker "
                                      f"{paced_worker_ms:.2f} ms per turn"
                                      + background_cores(alone.background_s, alone.seconds),
                           # The same rate's load on the shared cores (the floor's
                           # rounds; the bench's probe and sender not counted).
                           "floor 1": floor_cores,
                           WITH_API: cores(figures.cpu_s, figures.seconds)}
            # The stream stack alone at the same rate: what a record costs when records
            # arrive one at a time (no batching in the fetch or the produce).
            paced, latency["floor 0"] = faust_pipeline(
                settings, args.latency_turns, pids, tmp / "floor-0", rate=rate)
            latency_cpu["floor 0"] = (f"Faust worker {paced.cpu_ms_per_op('client'):.2f} ms "
                                      "per record")
        print(format_table(rows, load_before))
        print("\n".join(background_lines(rows)))
        print(f"lane window {settings.lane_window} (RATCHET_LANE_WINDOW): events of a "
              "partition in flight at once, in the worker and in the raw pipelines")
        print(f"fetch wait {settings.fetch_wait_ms} ms (RATCHET_FETCH_WAIT_MS): while records "
              "flow, the worker's fetches are held until 64 KiB of records or this wait; the "
              "raw pipelines' are answered at their first record")
        print(f"end to end rejected: {counter.rejected} (expected 0)")
        print(summary(e2e, throughput[0].floors, latency, rate, http, latency_cpu, rounds,
                      args.per_conversation, throughput))
        if args.rss:
            after_1k, after_100k = measure_rss(rig, worker, counter)
            print(f"worker RSS after 1k conversations {after_1k:.0f} MB, after 100k "
                  f"{after_100k:.0f} MB (ratio {after_100k / after_1k:.2f}, target <= 2)")
    finally:
        worker.terminate()
        rig.close()
    if args.profile:
        print()
        print(profile_core(settings, rig, per_conversation=args.per_conversation))
    return 0


if __name__ == "__main__":
    sys.exit(main())
