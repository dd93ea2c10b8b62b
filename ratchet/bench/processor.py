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

This module runs the phases in order and measures ratchet's own worker; the parts live
beside it: the floors in ``floors``, the paced latency runs in ``latency`` (records
timed by ``probe``), the CPU and request accounting in ``measure``, the table in
``table``, the turns on the wire in ``turns``, the verdicts in ``verdicts``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from ratchet.bench.args import non_negative_int, positive_int
from ratchet.bench.floors import (
    FLOOR_SHAPES,
    THROUGHPUT_FLOORS,
    PacedFloor,
    deferred_topic_deletion,
    faust_pipeline,
    raw_kafka,
    raw_lwt,
    raw_lwt_acsylla,
    raw_pipeline,
)
from ratchet.bench.latency import (
    FIRST_TURNS,
    WITH_API,
    after_warm_up,
    alternated_latency,
    e2e_latency,
    http_latency,
)
from ratchet.bench.measure import (
    CpuWindow,
    RequestCounter,
    background_cores,
    cores,
    load_average,
    proc_stats,
    say,
    server_pids,
    settle,
    unique_name,
)
from ratchet.bench.probe import p50_p99
from ratchet.bench.table import Row, background_lines, format_table
from ratchet.bench.turns import consume_now, encoded_turns
from ratchet.bench.verdicts import QuarterLoad, ThroughputRound, summary
from ratchet.settings import Settings
from streams.testing import Rig, WorkerProcess, isolated_settings


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
                                  "group.id": unique_name("bench-count"),
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
        # A worker of the rig that died fails the wait at once (with its log's tail):
        # else the wait ran into its timeout (30 min in ``bench syscalls``), e.g. after a
        # Ctrl-C that reached the worker but whose ``KeyboardInterrupt`` the bench lost.
        self.watch = rig._check_workers

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
                messages = consume_now(self.consumer, 0.2)
                if not messages:
                    self.watch()  # only when nothing came: no cost while outcomes flow
                for msg in messages:
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The suite's options; a usage error exits 2 (``ratchet bench`` asks before its
    header)."""
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

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
