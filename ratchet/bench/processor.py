"""Promotion processor throughput, end to end, on the local servers.

``python -m ratchet.bench.processor [--turns N] [--per-conversation K] [--profile]
[--rss]``

* **throughput**: one ``ratchet worker`` (subprocess, 12 partitions, own topic prefix
  and consumer group). After a warm-up turn, N pre-encoded turns over N/K
  conversations are produced (round by round, so each conversation's turns stay in
  order) and the clock stops when N outcomes are on the outcome topics. Target:
  >= 500 promoted turns/s. Reported with the worker's CPU seconds and RSS.
* **where the time goes** (``--profile``): the processor core (decode, validate,
  ledger + store on Cassandra, encode) for 300 turns in this process under
  pyinstrument; the worker's event loop is thin by design, the time is in here.
* **memory** (``--rss``): worker RSS after 1k, then after 100k distinct conversations
  (target: at most 2x). Takes a few minutes.

The outcome counter reads raw messages without decoding them, so the bench process
steals as little CPU as possible from the worker on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from ratchet.settings import Settings
from schemas.avro import encode_key
from schemas.samples import make_turn
from streams.testing import Rig, WorkerProcess, isolated_settings


@dataclass(frozen=True)
class Throughput:
    turns: int
    seconds: float
    worker_cpu_s: float
    worker_rss_mb: float

    @property
    def per_second(self) -> float:
        return self.turns / self.seconds

    def line(self) -> str:
        return (f"{self.turns} turns in {self.seconds:.1f} s = {self.per_second:.0f} promoted "
                f"turns/s (target >= 500); worker CPU {self.worker_cpu_s:.1f} s "
                f"({self.worker_cpu_s / self.seconds:.0%} of one core), RSS "
                f"{self.worker_rss_mb:.0f} MB")


def _uid(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def encoded_turns(rig: Rig, conversations: int, per_conversation: int) -> list[list[tuple]]:
    """``rounds[r]`` = (key, value) of turn r of every conversation, encoded once."""
    now = int(time.time() * 1000)
    topic = rig.topics.gateway_events
    convs = [_uid("conv") for _ in range(conversations)]
    rounds = []
    for head in range(per_conversation):
        batch = []
        for conv in convs:
            turn = make_turn(conversation_id=conv, expected_head_seq=head, now_ms=now,
                             response_id=_uid("resp"), idempotency_key=_uid("idem"))
            batch.append((encode_key(conv), rig.serde.encode(turn, topic)))
        rounds.append(batch)
    return rounds


class OutcomeCounter:
    """Counts messages on the checkpoint and rejection topics, without decoding them."""

    def __init__(self, settings: Settings, rig: Rig) -> None:
        self.consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                                  "group.id": _uid("bench-count"),
                                  "enable.auto.commit": False})
        self.consumer.assign([TopicPartition(t, p, -2)
                              for t in (rig.topics.checkpoints, rig.topics.rejections)
                              for p in range(settings.partitions)])
        self.count = 0
        self.rejected = 0
        self.rejections_topic = rig.topics.rejections

    def wait_for(self, total: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count < total:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count}/{total} outcomes after {timeout_s}s")
            for msg in self.consumer.consume(1000, timeout=0.2):
                if not msg.error():
                    self.count += 1
                    self.rejected += msg.topic() == self.rejections_topic


def proc_stats(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return cpu, rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def produce(rig: Rig, rounds: list[list[tuple]]) -> int:
    n = 0
    for batch in rounds:
        for key, value in batch:
            rig.producer.send_raw(key, value)
            n += 1
    rig.producer.flush()
    return n


def start_worker(rig: Rig, tmp: Path, counter: OutcomeCounter) -> WorkerProcess:
    """Start a worker and wait until it has promoted a warm-up turn."""
    worker = rig.worker(tmp, "bench-worker")
    produce(rig, encoded_turns(rig, 1, 1))
    counter.wait_for(1, 120)
    return worker


def measure_throughput(rig: Rig, worker: WorkerProcess, counter: OutcomeCounter,
                       turns: int, per_conversation: int) -> Throughput:
    rounds = encoded_turns(rig, max(1, turns // per_conversation), per_conversation)
    total = sum(len(b) for b in rounds)
    cpu0, _ = proc_stats(worker.pid)
    start = time.monotonic()
    expected = counter.count + total
    produce(rig, rounds)
    counter.wait_for(expected, 600)
    seconds = time.monotonic() - start
    cpu1, rss = proc_stats(worker.pid)
    return Throughput(total, seconds, cpu1 - cpu0, rss)


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

    run(1000)
    _, after_1k = proc_stats(worker.pid)
    run(99_000)
    _, after_100k = proc_stats(worker.pid)
    return after_1k, after_100k


def profile_core(settings: Settings, rig: Rig, turns: int = 300) -> str:
    """pyinstrument text profile of the processor core (this process, one thread)."""
    from cassandra.cluster import Cluster
    from pyinstrument import Profiler

    from services.ledger.cassandra import CassandraLedger
    from services.store.base import StoreOptions
    from services.store.cassandra import CassandraCheckpointStore
    from streams.codec import RegistryCodec
    from streams.processor import PromotionProcessor
    from streams.records import RawRecord

    cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port)
    session = cluster.connect(settings.keyspace)
    codec = RegistryCodec(rig.serde)
    processor = PromotionProcessor(CassandraCheckpointStore(session, StoreOptions()),
                                   CassandraLedger(session), codec, rig.topics)
    records = [RawRecord(rig.topics.gateway_events, 0, i, key, value)
               for i, (key, value) in enumerate(encoded_turns(rig, turns, 1)[0])]
    profiler = Profiler()
    profiler.start()
    for record in records:
        handled = processor.handle(record)
        for out in handled.outbound:
            codec.encode(out.topic, out.model)
    profiler.stop()
    cluster.shutdown()
    return profiler.output_text(unicode=False, color=False, show_all=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=6000)
    parser.add_argument("--per-conversation", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--rss", action="store_true")
    args = parser.parse_args(argv)

    import logging

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    base = Settings.from_env()
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bench-"))
    settings = isolated_settings(base, "bench", partitions=12, home=tmp / "home")
    rig = Rig(settings)
    counter = OutcomeCounter(settings, rig)
    worker = start_worker(rig, tmp, counter)
    try:
        result = measure_throughput(rig, worker, counter, args.turns, args.per_conversation)
        print(result.line())
        print(f"rejected: {counter.rejected} (expected 0)")
        if args.rss:
            after_1k, after_100k = measure_rss(rig, worker, counter)
            print(f"worker RSS after 1k conversations {after_1k:.0f} MB, after 100k "
                  f"{after_100k:.0f} MB (ratio {after_100k / after_1k:.2f}, target <= 2)")
    finally:
        worker.terminate()
        rig.close()
    if args.profile:
        text = profile_core(settings, rig)
        print("\nprocessor core profile (pyinstrument, 300 turns, one thread):")
        print("\n".join(text.splitlines()[:60]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
