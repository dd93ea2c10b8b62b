"""What a bench window measures, beside the rates: the CPU of processes and of the
servers' threads (``CpuWindow``, with the JIT and compaction share), the machine's load,
Cassandra requests per statement (``RequestCounter``), and the wait for quiet servers
before a window (``settle``). Progress goes to stderr (``say``)."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ratchet.settings import Settings


class RunFailed(RuntimeError):
    """A bench run that could not measure what it set out to (an event not delivered, a
    turn rejected, a wait answered without a certified history): the run's verdict,
    said in one line by ``ratchet bench`` (exit 1), not a bug's traceback."""


def say(msg: str) -> None:
    """Progress on stderr, so the table on stdout stays clean."""
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())




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


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


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
    label = text[:40] if match is None else (  # the table, not its keyspace
        f"{match.group(1).upper()} {match.group(2).rsplit('.', 1)[-1]}")
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




def cores(cpu_s: dict[str, float], seconds: float) -> str:
    """``who share, ...``: cores each process used over ``seconds``."""
    return ", ".join(f"{who} {cpu / seconds:.2f}" for who, cpu in cpu_s.items()) if seconds else "-"


def background_cores(background_s: dict[str, float], seconds: float) -> str:
    """``; of which the servers' jit x, compaction y``: cores, see CpuWindow."""
    if not background_s or not seconds:
        return ""
    return "; of which the servers' " + ", ".join(
        f"{kind} {cpu / seconds:.2f}" for kind, cpu in background_s.items())


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
