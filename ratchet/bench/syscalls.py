"""A real worker's system calls per promoted turn, by thread and name: counts, not times.

``python -m ratchet.bench.syscalls [--conversations N] [--per-conversation K]
[--paced-rate R] [--idle-s S]``

Starts one ``ratchet worker`` (``streams.testing.Rig``, its own topic prefix and
consumer group; isolate the keyspace with ``RATCHET_KEYSPACE``), warms it up, then
attaches ``strace -f -ff`` (one trace file per thread) over three windows:

* **idle**: ``--idle-s`` seconds with no turn (what a worker's timers cost per second);
* **backlog**: N x K pre-encoded turns produced at once (round by round);
* **paced**: as many turns again, one every 1/R s.

Each window ends when every outcome is on the outcome topics. It prints the syscalls per
promoted turn by thread (``/proc/<pid>/task/<tid>/comm``, threads of the same name
summed) and by name. strace stops the process at each call: the rate under it means
nothing, only the counts do, and those do not move with the shared machine's load
(they do with timing-driven wake-ups: the paced window's per-turn figure includes the
idle timers' calls over its duration, printed beside it).
"""

from __future__ import annotations

import argparse
import collections
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ratchet.bench.args import positive_int
from ratchet.bench.measure import say
from ratchet.bench.processor import OutcomeCounter, produce, start_worker
from ratchet.bench.turns import encoded_turns
from ratchet.settings import Settings
from streams.testing import Rig, isolated_settings

# "123 read(5, ..." or "123 <... read resumed>": the call's name, once per call.
_CALL = re.compile(r"^(?:\d+\s+)?([a-z_0-9]+)\(")


def count_calls(trace: Path) -> collections.Counter[str]:
    """Syscall names in one strace output file (``+++``/``---`` lines are not calls)."""
    counts: collections.Counter[str] = collections.Counter()
    with trace.open(errors="replace") as lines:
        for line in lines:
            match = _CALL.match(line)
            if match:
                counts[match.group(1)] += 1
    return counts


def thread_names(pid: int) -> dict[int, str]:
    names = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:
            continue
    return names


def thread_label(tid: int, pid: int, names: dict[int, str]) -> str:
    """The main thread (tid == pid: the event loop's) apart from the other threads that
    inherited its name (the C++ driver's I/O thread is also ``python``)."""
    if tid == pid:
        return "main (loop)"
    name = names.get(tid, "?")
    return f"{name} (other)" if name in ("python", "python3") else name


class Tracing:
    """``strace -f -ff -o DIR/t -p PID`` for one window: every thread's calls in a file
    of its own (``t.<tid>``)."""

    def __init__(self, pid: int, out: Path) -> None:
        out.mkdir(parents=True)
        self.pid, self.out = pid, out
        self.names = thread_names(pid)
        self.proc = subprocess.Popen(["strace", "-f", "-ff", "-qq", "-o", str(out / "t"),
                                      "-p", str(pid)], stderr=subprocess.PIPE)
        # Attached once every thread has its file (strace creates it at attach).
        deadline = time.monotonic() + 30
        while len(list(out.glob("t.*"))) < len(self.names):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"strace did not attach: {self.proc.stderr.read()!r}")
            time.sleep(0.05)

    def stop(self) -> dict[str, collections.Counter[str]]:
        """Detach; the calls by thread name."""
        self.names |= thread_names(self.pid)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=60)
        by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        for trace in self.out.glob("t.*"):
            tid = int(trace.suffix[1:])
            by_thread[thread_label(tid, self.pid, self.names)] += count_calls(trace)
        return by_thread


def report(title: str, by_thread: dict[str, collections.Counter[str]], per: int,
           top: int = 12, unit: str = "turn") -> str:
    """The calls per ``unit`` (``per`` of them in the window): per turn, or per second
    for the idle window (its header said "per turn (2 turns)" of 2 s before)."""
    total = sum(sum(c.values()) for c in by_thread.values())
    units = f"{per} {unit}" + ("s" if unit == "turn" else "")
    lines = [f"## {title}: {total} syscalls, {total / per:.1f} per {unit} ({units})"]
    for name, calls in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(calls.values())
        if not n:
            continue
        lines.append(f"  {name:<18} {n / per:8.2f}/{unit}  " + ", ".join(
            f"{call} {c / per:.2f}" for call, c in calls.most_common(top)))
    return "\n".join(lines)


def paced(rig: Rig, rounds: list[list[tuple]], rate: float) -> int:
    """One turn every 1/rate s, each flushed to the broker at once (a gateway's pace)."""
    n, start = 0, time.monotonic()
    for batch in rounds:
        for key, value in batch:
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            rig.producer.send_raw(key, value)
            rig.producer.producer.poll(0)
            n += 1
    rig.producer.flush()
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=positive_int, default=1000)
    parser.add_argument("--per-conversation", type=positive_int, default=3)
    parser.add_argument("--paced-rate", type=positive_int, default=100)
    parser.add_argument("--idle-s", type=positive_int, default=10)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-syscalls-"))
    settings = isolated_settings(Settings.from_env(), "sys", partitions=12, home=tmp / "home")
    rig = Rig(settings, collect=False)
    try:
        counter = OutcomeCounter(settings, rig)
        worker = start_worker(rig, tmp, counter)
        expected = 1
        # Warm-up: every lane, the driver's prepared statements, the codec's caches.
        expected += produce(rig, encoded_turns(rig, 100, 3))
        counter.wait_for(expected, 300)
        n = args.conversations * args.per_conversation
        out = []

        tracing = Tracing(worker.pid, tmp / "idle")
        time.sleep(args.idle_s)
        idle = tracing.stop()
        out.append(report(f"idle {args.idle_s} s", idle, args.idle_s, unit="s"))

        rounds = encoded_turns(rig, args.conversations, args.per_conversation)
        tracing = Tracing(worker.pid, tmp / "backlog")
        expected += produce(rig, rounds)
        counter.wait_for(expected, 1800, progress_s=30)
        out.append(report("backlog", tracing.stop(), n))

        rounds = encoded_turns(rig, args.conversations, args.per_conversation)
        tracing = Tracing(worker.pid, tmp / "paced")
        started = time.monotonic()
        expected += paced(rig, rounds, args.paced_rate)
        counter.wait_for(expected, 1800, progress_s=30)
        seconds = time.monotonic() - started
        out.append(report(f"paced {args.paced_rate}/s ({seconds:.0f} s)", tracing.stop(), n))
        say(f"traces in {tmp}")
        print("\n\n".join(out))
    finally:
        rig.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
