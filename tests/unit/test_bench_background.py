"""The processor bench's split of the servers' CPU: what their JIT compilers and their
flushes and compactions took inside a window, and the CPU ratio without them."""

from __future__ import annotations

import os
import threading

import ratchet.bench.measure as measure
from ratchet.bench.measure import CpuWindow, background_cpu, thread_cpu
from ratchet.bench.table import Row, background_lines
from ratchet.bench.verdicts import QuarterLoad, http_summary, summary

BEFORE = {1: ("C2 CompilerThre", 1.0), 2: ("CompactionExecu", 0.5),
          3: ("Native-Transpor", 2.0), 5: ("MemtableFlushWr", 0.2)}
AFTER = {1: ("C2 CompilerThre", 1.25), 2: ("CompactionExecu", 0.75),
         3: ("Native-Transpor", 5.0), 4: ("C1 CompilerThre", 0.1)}  # 5 ended, 4 began


def test_background_threads_are_summed_by_kind_and_request_threads_left_out():
    spent = background_cpu(BEFORE, AFTER)
    assert spent["jit"] == 0.25 + 0.1  # a thread started inside the window counts whole
    assert spent["compaction"] == 0.25  # the flush writer that ended is missed
    assert set(spent) == {"jit", "compaction"}


def test_a_window_splits_only_the_servers_threads(monkeypatch):
    snapshots = iter([BEFORE, AFTER])
    asked: list[int] = []

    def scripted(pid: int):
        asked.append(pid)
        return next(snapshots)

    monkeypatch.setattr(measure, "thread_cpu", scripted)
    with CpuWindow({"cassandra": os.getpid(), "client": os.getpid()}) as window:
        pass
    assert asked == [os.getpid(), os.getpid()]  # the client's threads are never read
    assert window.background_s == {"jit": 0.35, "compaction": 0.25}
    assert window.cpu_s["cassandra"] >= 0


def test_thread_cpu_reads_each_live_thread_of_a_process():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        first = thread_cpu(os.getpid())[spinner.native_id][1]
        deadline = os.times().elapsed + 5
        while thread_cpu(os.getpid())[spinner.native_id][1] <= first:
            assert os.times().elapsed < deadline, "the spinning thread's CPU never grew"
    finally:
        stop.set()
        spinner.join()
    assert threading.get_native_id() in thread_cpu(os.getpid())


def _row(turns: int, client: float, cassandra: float, jit: float) -> Row:
    return Row("r", turns, 1.0, {"client": client, "cassandra": cassandra, "kafka": 0.0},
               background_s={"jit": jit, "compaction": 0.05})


def test_the_summary_gives_the_cpu_ratio_without_the_background_beside_the_total():
    e2e = _row(1000, client=1.0, cassandra=2.0, jit=0.5)     # 3.0 ms, 2.45 without
    floor = _row(1000, client=0.5, cassandra=0.75, jit=0.0)  # 1.25 ms, 1.20 without
    text = summary(e2e, {"lwt": floor}, {}, 100.0)
    assert "CPU per turn 3.00 / 1.25 ms = 2.40" in text
    assert ("without the servers' JIT, flushes and compactions: CPU per turn 2.45 / 1.20 ms"
            " = 2.04") in text


def _jit_row(name: str, count: int, jit_s: float) -> Row:
    return Row(name, count, 1.0, {"cassandra": 1.0}, background_s={"jit": jit_s,
                                                                   "compaction": 0.0})


def test_a_run_on_servers_still_compiling_is_flagged():
    lines = background_lines([_jit_row("floor", 1000, 0.05), _jit_row("ratchet", 2000, 0.9),
                                    _jit_row("floor 1b", 1000, 0.4)])
    assert lines[-1].startswith("WARNING: the servers' JIT compilers were busy in 2 window")
    assert "0.45 ms per op, in 'ratchet'" in lines[-1]


def test_a_warm_run_carries_no_warning():
    lines = background_lines([_jit_row("floor", 1000, 0.13), _jit_row("ratchet", 3000, 0.12)])
    assert lines and not any(line.startswith("WARNING") for line in lines)


def test_the_http_lines_show_the_servers_background_inside_their_windows():
    """A flush or a compaction inside the API-beside line is what its tail is made of on
    a shared host: each HTTP line's demand says how much of it the window held."""
    from ratchet.bench.http_wait import WaitFigures

    def figures(compaction_s: float) -> WaitFigures:
        return WaitFigures([10.0] * 100, waited=100, queued=0,
                           cpu_s={"cassandra": 0.2, "api": 0.1}, seconds=2.0,
                           background_s={"jit": 0.0, "compaction": compaction_s})

    lines = http_summary(figures(0.5), {}, (5.0, 15.0, 100), 50.0,
                               QuarterLoad(25.0, figures(0.1), (5.0, 12.0, 100)))
    demand = [line for line in lines if line.strip().startswith("demand:")]
    assert len(demand) == 2
    assert demand[0].endswith("; of which the servers' jit 0.00, compaction 0.25")
    assert demand[1].endswith("; of which the servers' jit 0.00, compaction 0.05")
