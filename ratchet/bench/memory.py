"""A worker's memory on a backlog of large turns, beside the backlog's own bytes.

    ratchet bench memory [--turns 60] [--mib 8] [--partitions 12]

A backlog of ``--turns`` valid turns of ``--mib`` MiB each (one assistant message of
random letters, each turn a Conversation of its own, spread over ``--partitions``
partitions) is produced BEFORE a real ``ratchet worker`` starts, so the worker fetches
as fast as Kafka gives and promotes as fast as Cassandra takes: the case where every
buffer between the two fills. Figures per row, from ``/proc/<pid>/status``: the worker's
RSS once it has promoted a small warm-up turn (idle), its peak RSS while it drains the
backlog (VmHWM), its RSS once every turn is promoted, and the seconds it took.

Rows: the defaults, and ``RATCHET_LANE_MAX_BYTES`` at 1 GiB (the lanes bounded by
their 2 000 events only, as before the byte bound). The raw figure beside them is the
backlog's bytes: what a worker holding the whole backlog would hold.
docs/decisions.md, "Worker memory", has the design and the figures.
"""

from __future__ import annotations

import argparse
import base64
import os
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Consumer, Producer

from ratchet.bench.args import positive_int
from ratchet.bench.measure import RunFailed
from ratchet.samples import make_turn
from ratchet.settings import Settings
from schemas.avro import encode_key
from schemas.items import message
from schemas.limits import CLIENT_MAX_BYTES
from streams.testing import Rig, isolated_settings

MIB = 1024 * 1024


def say(msg: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of ``pid`` in MB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def _turn(rig: Rig, text: str) -> tuple[bytes, bytes]:
    turn = make_turn(
        items=[message(text, role="assistant", item_id=f"msg_{uuid.uuid4().hex[:12]}")],
        conversation_id=f"conv_{uuid.uuid4().hex[:12]}",
        response_id=f"resp_{uuid.uuid4().hex[:12]}",
        idempotency_key=f"idem_{uuid.uuid4().hex[:12]}", now_ms=int(time.time() * 1000))
    return encode_key(turn.conversation_id), rig.serde.encode(turn, rig.topics.gateway_events)


def run_row(settings: Settings, label: str, turns: int, mib: int, partitions: int,
            env: dict[str, str]) -> dict[str, float | str]:
    with tempfile.TemporaryDirectory(prefix="ratchet-bench-memory-") as tmp:
        home = Path(tmp)
        rig = Rig(isolated_settings(settings, "mem", partitions=partitions, home=home / "h"),
                  collect=False)
        promoted = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                             "group.id": f"bench-memory-{uuid.uuid4().hex}",
                             "auto.offset.reset": "earliest"})
        promoted.subscribe([rig.topics.checkpoints])
        try:
            producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                                 "message.max.bytes": CLIENT_MAX_BYTES, "acks": "all"})
            # Idle: a worker that has promoted one small turn (the same code warmed up).
            key, value = _turn(rig, "warm-up")
            producer.produce(rig.topics.gateway_events, value=value, key=key)
            producer.flush(60)
            worker = rig.worker(home, "idle-worker", env=env)
            _wait_for(promoted, 1, worker)
            idle = _status(worker.pid)["VmRSS"]
            worker.terminate()
            backlog = 0
            for n in range(turns):
                key, value = _turn(rig, _text(mib * MIB))
                backlog += len(key) + len(value)
                producer.produce(rig.topics.gateway_events, value=value, key=key)
                producer.poll(0)
                if n % 20 == 19:
                    say(f"{label}: {n + 1}/{turns} turns produced")
            producer.flush(120)
            # The backlog is on the topic before this worker starts (same group: it
            # goes on after the warm-up turn).
            started = time.monotonic()
            worker = rig.worker(home, env=env)
            _wait_for(promoted, turns, worker)
            seconds = time.monotonic() - started
            figures = _status(worker.pid)
            worker.terminate()
        finally:
            promoted.close()
            rig.close()
    return {"row": label, "backlog_mb": backlog / 1e6, "idle_mb": idle,
            "peak_mb": figures["VmHWM"], "after_mb": figures["VmRSS"], "seconds": seconds}


def _text(size: int) -> str:
    """``size`` random letters and digits, quickly (no JSON escaping needed)."""
    return base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size].replace("/", "x")


def _wait_for(consumer: Consumer, count: int, worker, timeout_s: float = 900) -> None:
    """Until ``count`` more CheckpointPromoted records are on the topic."""
    seen, deadline = 0, time.monotonic() + timeout_s
    while seen < count:
        if time.monotonic() > deadline or not worker.alive():
            raise RunFailed(f"{seen}/{count} promoted\n{worker.log_tail()}")
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen += 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The suite's options; a usage error exits 2 (``ratchet bench`` asks before its
    header)."""
    parser = argparse.ArgumentParser(prog="ratchet bench memory",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=positive_int, default=60)
    parser.add_argument("--mib", type=positive_int, default=8,
                        help="MiB of text per turn (at most 9: a turn's limit is 10 MiB)")
    parser.add_argument("--partitions", type=positive_int, default=12)
    args = parser.parse_args(argv)
    if args.mib > 9:
        parser.error("--mib: at most 9 (a gateway event is at most 10 MiB)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = replace(Settings.from_env(), worker_metrics_port=0)
    rows = [
        run_row(settings, "defaults", args.turns, args.mib, args.partitions, {}),
        run_row(settings, "lanes bounded by count only", args.turns, args.mib,
                args.partitions, {"RATCHET_LANE_MAX_BYTES": str(1024 * MIB)}),
    ]
    print(f"\n{args.turns} turns of {args.mib} MiB on {args.partitions} partitions, "
          f"produced before the worker starts; worker RSS in MB:")
    print(f"{'row':32} {'backlog':>9} {'idle':>7} {'peak':>7} {'after':>7} {'drain s':>8}")
    for r in rows:
        print(f"{r['row']:32} {r['backlog_mb']:9.0f} {r['idle_mb']:7.0f} {r['peak_mb']:7.0f} "
              f"{r['after_mb']:7.0f} {r['seconds']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
