"""The verdicts of ``ratchet bench processor``: ratchet against its floors per
throughput round and on the rounds' medians, the latency summary, and the HTTP
wait's CPU demand."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

from ratchet.bench.floors import FLOOR_NAMES
from ratchet.bench.http_wait import MAX_IN_FLIGHT, WaitFigures
from ratchet.bench.latency import WITH_API
from ratchet.bench.measure import background_cores
from ratchet.bench.probe import p50_p99
from ratchet.bench.table import Row, summed_cpu_ms, summed_request_cpu_ms


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
