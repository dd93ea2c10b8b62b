"""The bench's table: one ``Row`` per measured line (a rate, and who burnt how much
CPU for it), formatted side by side, with the servers' background share per row."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ratchet.bench.measure import load_average


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


def summed_cpu_ms(row: Row) -> float:
    return sum(row.cpu_ms_per_op(who) or 0.0 for who in COLUMNS)
