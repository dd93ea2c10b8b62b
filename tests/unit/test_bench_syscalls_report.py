"""``ratchet.bench.syscalls`` and the outcome counter it waits with, reviewed from outside
(session 51): a worker that died (as a Ctrl-C to the terminal's process group kills it)
fails the wait at once, not after its 30 min timeout; the idle window's figures are
per second, and its header says so (it said "per turn (2 turns)" of a window of 2 s)."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ratchet.bench import processor
from ratchet.bench.processor import OutcomeCounter
from ratchet.bench.syscalls import report
from ratchet.settings import Settings
from streams.testing import Rig


class SilentConsumer:
    """confluent-kafka's consumer with no outcome to give: each poll waits its timeout,
    then nothing (as once the worker died)."""

    def __init__(self, config: dict) -> None:
        pass

    def assign(self, partitions) -> None:
        pass

    resume = pause = assign

    def poll(self, timeout_s: float):
        time.sleep(timeout_s)
        return None


def counter_of(workers: list, monkeypatch) -> OutcomeCounter:
    """An ``OutcomeCounter`` (its own ``__init__``) on a rig holding ``workers``,
    checked by ``Rig``'s own ``_check_workers``."""
    monkeypatch.setattr(processor, "Consumer", SilentConsumer)
    rig = SimpleNamespace(workers=workers, topics=SimpleNamespace(
        checkpoints="rrevq-checkpoints", rejections="rrevq-rejections"))
    rig._check_workers = lambda: Rig._check_workers(rig)
    return OutcomeCounter(Settings(partitions=1), rig)


def dead_worker() -> SimpleNamespace:
    return SimpleNamespace(stopped_on_purpose=False, alive=lambda: False,
                           proc=SimpleNamespace(returncode=-2),
                           log_path=Path("bench-worker.log"), log_tail=lambda: "KeyboardInterrupt")


def test_a_wait_for_outcomes_fails_at_once_when_the_worker_died(monkeypatch):
    counter = counter_of([dead_worker()], monkeypatch)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="bench-worker.log exited with code -2"):
        counter.wait_for(10, timeout_s=30)
    # Bounded by the wait's own timeout, not a timing claim: it ran into the 30 s before.
    assert time.monotonic() - started < 30


def test_a_wait_with_a_live_worker_still_ends_at_its_timeout(monkeypatch):
    alive = SimpleNamespace(stopped_on_purpose=False, alive=lambda: True)
    counter = counter_of([alive], monkeypatch)
    with pytest.raises(TimeoutError, match="0/10 outcomes"):
        counter.wait_for(10, timeout_s=0.5)


def test_the_idle_windows_header_is_per_second_not_per_turn():
    calls = {"main (loop)": collections.Counter(epoll_pwait=160, getpid=40)}
    header, line = report("idle 2 s", calls, 2, unit="s").splitlines()
    assert header == "## idle 2 s: 200 syscalls, 100.0 per s (2 s)"
    assert "100.00/s" in line and "epoll_pwait 80.00" in line
    header, _ = report("backlog", calls, 50).splitlines()
    assert header == "## backlog: 200 syscalls, 4.0 per turn (50 turns)"
