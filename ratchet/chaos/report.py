"""The run's report: JSON, a one-screen summary, and a PNG of throughput and latency."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from ratchet.chaos.checker import VIOLATION_CLASSES
from ratchet.chaos.observations import Violation


def group(violations: list[Violation], examples: int = 3) -> dict[str, dict[str, Any]]:
    by: dict[str, list[Violation]] = defaultdict(list)
    for v in violations:
        by[v.kind].append(v)
    return {k: {"count": len(vs), "examples": [v.as_dict() for v in vs[:examples]]}
            for k, vs in sorted(by.items())}


def summary(report: dict[str, Any]) -> str:
    r = report
    lines = [
        f"ratchet chaos  seed={r['seed']}  tag={r['tag']}  duration={r['duration_s']:.0f}s  "
        f"workers={r['workers']}  producers={r['producers']}",
        f"events: {r['events']['sent_turns']} turns sent ({r['events']['responses']} responses, "
        f"{r['events']['stories']} stories), {r['events']['dead_letter_records']} undecodable "
        f"records; observed {r['observed']['promoted']} promotions, "
        f"{r['observed']['rejected']} rejections, {r['observed']['orphaned']} orphaned effects, "
        f"{r['observed']['dead_letters']} dead letters",
        f"outcomes expected: {json.dumps(r['expected_outcomes'], sort_keys=True)}",
        f"wait_ms requests: {json.dumps(r['waits'])}",
        "faults:",
    ]
    for f in r["faults"]:
        mark = "ok" if f["ok"] else "FAILED"
        lines.append(f"  {f['start_s']:7.1f}s-{f['end_s']:7.1f}s  {f['name']:<18} {mark:<6} "
                     f"{f['detail'][:90]}")
    if r["unexpected_exits"]:
        lines.append(f"processes that died on their own: {r['unexpected_exits']}")
    v = r["violations"]
    lines.append(f"violations: {sum(c['count'] for c in v.values())}"
                 + ("" if v else "  (none: every check passed)"))
    # The harness's own verdicts first (what follows may be their consequence: turns
    # never sent, or outcomes never read, are never decided); then every class, those
    # the tuple does not list too.
    order = ["observer_died", "run_deadline", "observer_unread", *VIOLATION_CLASSES, *sorted(v)]
    for kind in dict.fromkeys(order):
        if kind in v:
            lines.append(f"  {kind:<28} {v[kind]['count']:>6}")
            for ex in v[kind]["examples"]:
                lines.append(f"      {ex['story']}: {ex['detail'][:150]}")
    lines.append(f"verdict: {'PASS' if r['passed'] else 'FAIL'}  (report: {r['report_path']})")
    return "\n".join(lines)


def write(report: dict[str, Any], out: Path) -> Path:
    path = out / "chaos-report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    return path


def plot(path: Path, sent: dict[tuple[str, str], float], decided: dict[tuple[str, str], float],
         t0_wall: float, faults: list[dict[str, Any]]) -> bool:
    """Decisions per second and decision latency (p50, max per 5 s) with fault spans."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    per_s: Counter[int] = Counter()
    lat: dict[int, list[float]] = defaultdict(list)
    for key, at in decided.items():
        second = int(at - t0_wall)
        per_s[second] += 1
        if key in sent:
            lat[second // 5 * 5].append(max(0.0, at - sent[key]))
    if not per_s:
        return False
    xs = list(range(0, max(per_s) + 1))
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    a1.plot(xs, [per_s.get(x, 0) for x in xs], lw=0.8, color="tab:blue")
    a1.set_ylabel("turns decided / s")
    buckets = sorted(lat)
    p50 = [sorted(lat[b])[len(lat[b]) // 2] for b in buckets]
    mx = [max(lat[b]) for b in buckets]
    a2.plot(buckets, p50, label="p50", color="tab:green")
    a2.plot(buckets, mx, label="max", color="tab:red", lw=0.8)
    a2.set_ylabel("decision latency (s)")
    a2.set_yscale("symlog", linthresh=1)
    a2.set_xlabel("seconds since the run started")
    a2.legend(loc="upper left")
    for f in faults:
        for ax in (a1, a2):
            ax.axvspan(f["start_s"], max(f["end_s"], f["start_s"] + 1), color="orange", alpha=0.25)
        a1.text(f["start_s"], a1.get_ylim()[1] * 0.95, f["name"], rotation=90, fontsize=7,
                va="top")
    fig.suptitle("ratchet chaos: throughput and decision latency (orange: faults)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True
