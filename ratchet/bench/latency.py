"""Ratchet's end-to-end latency at a fixed rate: turns paced as a gateway sends
them, produce -> outcome consumed (``e2e_latency``), with a ``ratchet api`` beside
the worker (``http_latency``), and alternated with floor 1 (``alternated_latency``)."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from ratchet.bench.floors import PacedFloor
from ratchet.bench.http_wait import HttpWaits, WaitFigures
from ratchet.bench.measure import CpuWindow, RunFailed, add_into, settle, unique_name
from ratchet.bench.probe import LatencyProbe, p50_p99
from ratchet.bench.turns import encoded_turn
from ratchet.settings import Settings
from services.gateway.kafka_calls import interruptible
from streams.testing import Rig

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
    conversations = [unique_name("conv") for _ in range(-(-turns // per_conversation))]
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
            interruptible(rig.producer.producer.poll, 0)  # runs reports: see kafka_calls
            if http is not None:
                http.wait_for(*response_of[value], probe.sent[key][-1])

        sender = probe.pace(send, [(key, value) for key, value, _, _ in items], rate)
        probe.collect(len(items), 120 + turns / rate)
        sender.join()
        rig.producer.flush()
        if probe.rejected:
            raise RunFailed(f"latency run: {probe.rejected} of {len(items)} turns "
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
