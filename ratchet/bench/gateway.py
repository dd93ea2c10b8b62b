"""The gateway library's send cost beside its raw floor, in one run.

``ratchet bench gateway [--turns N] [--rounds R]``

Three lines, run in turn ``--rounds`` times (a slow minute of the shared machine falls
on all three), each over the same N turns built beforehand (``gateway_turns``: the
processor suite's mix, K turns per Conversation, each with one tool effect, a token
artifact and a boundary proof), against the real broker and registry:

* **encode**: each turn's effect and the turn encoded as the library does it
  (``EventSerde.encode``: the ``to_avro`` dump, fastavro's write, the registry's
  framing), nothing produced. The part of (c) that (b) does not do.
* **raw produce (floor)**: confluent-kafka's ``produce`` of those records' bytes,
  encoded before the clock, with the gateway's producer settings
  (``PRODUCER_DEFAULTS``: idempotent, acks=all), a report callback and a ``poll(0)``
  per record, then a ``flush``: what any producer of these bytes pays.
* **send_turn**: ``GatewayProducer.send_turn(turn, effects=[effect])`` through the
  public API (its checks, encode, produce, delivery bookkeeping), then ``flush``.

Per line: turns/s (wall) and CPU microseconds per turn of the sending thread
(``time.thread_time``) and of the whole process (librdkafka's threads too), and the
broker's when its pid is known. Then send_turn over the floor per round and the median
of the rounds' ratios. Each line's producer is made, and sends one untimed warm-up
turn (the registry lookups, the broker connection), before its clock starts.

Topics: a prefix of its own (``isolated_settings``), made at the start and deleted at
the end, also of a run stopped by Ctrl-C or a failure. The registry's subjects are the
record-name ones every prefix shares (``schemas.avro.subject_for``), registered
idempotently (same text, same id): the run adds nothing there and deletes nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from ratchet.bench.args import positive_int
from ratchet.bench.measure import CpuWindow, RunFailed, load_average, say, server_pids
from ratchet.bench.table import Row
from ratchet.bench.turns import gateway_turns
from ratchet.settings import Settings
from schemas.models import ToolEffect, TurnCompleted

ENCODE, FLOOR, SEND = "encode", "raw produce (floor)", "send_turn"
LINES = (ENCODE, FLOOR, SEND)
PER_CONVERSATION = 3  # the processor suite's default mix
RAW_TOPIC = "raw-floor"  # after the run's prefix: the floor's own topic

Turn = tuple[TurnCompleted, list[ToolEffect]]


@dataclass(frozen=True)
class Line:
    """One measured line of one round. ``row.cpu_s``: ``thread`` (the sending thread),
    ``process`` (this process, librdkafka's threads too) and ``kafka`` when known."""

    round: int
    row: Row
    records: int  # messages it put on a topic (0 for the encode): counted back by tests

    def cpu_us(self, who: str) -> float | None:
        ms = self.row.cpu_ms_per_op(who)
        return None if ms is None else ms * 1000


def ratio(mine: Line, floor: Line) -> dict[str, float | None]:
    """send_turn over the floor: turns/s, and CPU per turn for each CPU column."""
    out: dict[str, float | None] = {
        "turns/s": mine.row.per_second / floor.row.per_second
        if floor.row.per_second else None}
    for who in ("thread", "process"):
        a, b = mine.cpu_us(who), floor.cpu_us(who)
        out[who] = a / b if a is not None and b else None
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(lines: list[Line], load_before: str) -> str:
    """The table (one row per line and round) and send_turn against the floor: each
    round's ratios, then the median of the rounds' ratios."""
    out = [f"load average {load_before} before, {load_average()} after; "
           f"{os.cpu_count()} cores (shared: compare rows of one run only)",
           "CPU: us per turn (one turn = the turn and its one tool effect)",
           f"{'round':>5} {'line':<20} {'turns':>6} {'s':>6} {'turns/s':>8} "
           f"{'thread us':>10} {'process us':>11} {'kafka us':>9}"]
    for line in lines:
        r = line.row
        out.append(f"{line.round:>5} {r.name:<20} {r.count:>6} {r.seconds:>6.2f} "
                   f"{r.per_second:>8.0f} {_fmt(line.cpu_us('thread'), '.0f'):>10} "
                   f"{_fmt(line.cpu_us('process'), '.0f'):>11} "
                   f"{_fmt(line.cpu_us('kafka'), '.0f'):>9}")
    by_round: dict[int, dict[str, Line]] = {}
    for line in lines:
        by_round.setdefault(line.round, {})[line.row.name] = line
    out += ["", "send_turn vs floor (send_turn / raw produce; 'own': send_turn's thread CPU "
                "less the encode's and the floor's, i.e. its checks and delivery "
                "bookkeeping):"]
    ratios = []
    for number, named in sorted(by_round.items()):
        if SEND in named and FLOOR in named:
            ratios.append(ratio(named[SEND], named[FLOOR]))
            out.append(f"  round {number}: {_ratio_text(ratios[-1])}"
                       + _own_text(named[SEND], named[FLOOR], named.get(ENCODE)))
    if ratios:
        medians = {key: _median([one[key] for one in ratios]) for key in ratios[0]}
        out.append(f"  median of {len(ratios)} round(s): {_ratio_text(medians)}")
    return "\n".join(out)


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def own_us(send: Line, floor: Line, encode: Line | None) -> float | None:
    """send_turn's thread CPU per turn that neither the encode nor the produce explains:
    the library's checks and delivery bookkeeping."""
    parts = [send.cpu_us("thread"), floor.cpu_us("thread"),
             None if encode is None else encode.cpu_us("thread")]
    if any(part is None for part in parts):
        return None
    mine, produce, encoding = parts
    return mine - produce - encoding


def _own_text(send: Line, floor: Line, encode: Line | None) -> str:
    own = own_us(send, floor, encode)
    return "" if own is None else f"; own {own:.0f} us"


def _ratio_text(one: dict[str, float | None]) -> str:
    return (f"turns/s {_fmt(one['turns/s'], '.3f')} x, thread CPU per turn "
            f"{_fmt(one['thread'], '.1f')} x, process CPU per turn "
            f"{_fmt(one['process'], '.1f')} x")


# --- the lines ---------------------------------------------------------------------------


def _timed(name: str, turns: int, number: int, records: int, pids: dict[str, int],
           body: Callable[[], None]) -> Line:
    """Run ``body`` timed: wall, this thread's and this process's CPU (``process_time``:
    every thread, at a finer grain than ``/proc``'s 10 ms ticks, which are ~3 us a
    turn at 3 000 turns), and the broker's when its pid is known (``CpuWindow``)."""
    broker = {k: v for k, v in pids.items() if k == "kafka"}
    with CpuWindow(broker) as window:
        wall0, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
        body()
        cpu = {"thread": time.thread_time() - thread0,
               "process": time.process_time() - process0}
        wall = time.perf_counter() - wall0
    return Line(number, Row(name, turns, wall, {**cpu, **window.cpu_s}), records)


def encode_line(serde, topic: str, turns: list[Turn], number: int,
                pids: dict[str, int]) -> Line:
    def body() -> None:
        for turn, effects in turns:
            for effect in effects:
                serde.encode(effect, topic)
            serde.encode(turn, topic)
    for turn, effects in turns[:1]:  # warm: the registry's lookups, once per record type
        serde.encode(turn, topic)
        for effect in effects:
            serde.encode(effect, topic)
    return _timed(ENCODE, len(turns), number, 0, pids, body)


def floor_line(settings: Settings, topic: str, records: list[tuple[bytes, bytes]],
               warm_up: list[tuple[bytes, bytes]], turns: int, number: int,
               pids: dict[str, int]) -> Line:
    from confluent_kafka import Producer

    from services.gateway.producer import PRODUCER_DEFAULTS

    failed: list[object] = []

    def report(err, _msg) -> None:
        if err is not None:
            failed.append(err)

    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, **PRODUCER_DEFAULTS})

    def send(batch: list[tuple[bytes, bytes]]) -> None:
        for key, value in batch:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=report)
                    break
                except BufferError:  # the local queue is full: let deliveries drain
                    producer.poll(0.05)
            producer.poll(0)
        if producer.flush(60) or failed:
            raise RunFailed(f"raw produce: {len(failed)} record(s) failed "
                            f"({failed[:1]}), {len(producer)} not delivered in 60 s")

    send(warm_up)
    line = _timed(FLOOR, turns, number, len(records) + len(warm_up), pids,
                  lambda: send(records))
    return line


def send_line(settings: Settings, turns: list[Turn], warm_up: Turn, number: int,
              pids: dict[str, int]) -> Line:
    from services.gateway.errors import GatewayError
    from services.gateway.producer import GatewayProducer

    producer = GatewayProducer(settings)  # as a gateway makes it: its own registry client

    def send(batch: list[Turn]) -> None:
        try:
            for turn, effects in batch:
                producer.send_turn(turn, effects=effects)
            producer.flush()
        except GatewayError as exc:
            raise RunFailed(f"send_turn: {type(exc).__name__}: {exc}") from exc

    try:
        send([warm_up])
        records = sum(1 + len(effects) for _, effects in turns)
        line = _timed(SEND, len(turns), number, records + 1 + len(warm_up[1]), pids,
                      lambda: send(turns))
    except BaseException:
        # The run failed (or was stopped): purge what is in flight at once, and let the
        # failure raised stand. ``close`` raises what it purged: in a ``finally`` that
        # replaced the line's ``RunFailed`` with a traceback (session 51's review).
        with contextlib.suppress(GatewayError):
            producer.close(timeout_s=0)
        raise
    try:
        producer.close()  # nothing in flight after the flush: it releases the client
    except GatewayError as exc:
        raise RunFailed(f"send_turn: closing its producer: {type(exc).__name__}: "
                        f"{exc}") from exc
    return line


def run(settings: Settings, turns: int, rounds: int, pids: dict[str, int],
        on_round: Callable[[int], None] | None = None) -> list[Line]:
    """The lines, ``rounds`` times, on topics that exist (``bench_topics``)."""
    from schemas.avro import EventSerde, encode_key, registry_client

    gateway_topic = settings.topic("gateway-events")
    raw_topic = f"{settings.topic_prefix}{RAW_TOPIC}"
    client = registry_client(settings.schema_registry_url)
    serde = EventSerde(client)
    try:
        built = gateway_turns(-(-turns // PER_CONVERSATION), PER_CONVERSATION)[:turns]
        warm_up = gateway_turns(1, 1)[0]

        def encoded(batch: list[Turn]) -> list[tuple[bytes, bytes]]:
            return [(encode_key(event.partition_key), serde.encode(event, gateway_topic))
                    for turn, effects in batch for event in (*effects, turn)]

        records, warm_records = encoded(built), encoded([warm_up])
        lines: list[Line] = []
        for number in range(1, rounds + 1):
            lines.append(encode_line(serde, gateway_topic, built, number, pids))
            lines.append(floor_line(settings, raw_topic, records, warm_records, turns,
                                    number, pids))
            lines.append(send_line(settings, built, warm_up, number, pids))
            say(f"round {number} of {rounds}: " + "; ".join(
                f"{line.row.name} {line.row.per_second:.0f} turns/s, "
                f"{line.cpu_us('thread'):.0f} us" for line in lines[-3:]))
            if on_round is not None:
                on_round(number)
        return lines
    finally:
        client.close()


class bench_topics:
    """The run's topics (the ratchet topics under its prefix, and the floor's), deleted
    when the block ends however it ends."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __enter__(self) -> bench_topics:
        from confluent_kafka.admin import AdminClient, NewTopic

        from streams.topics import ensure_topics

        try:
            ensure_topics(self.settings)
            admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap})
            name = f"{self.settings.topic_prefix}{RAW_TOPIC}"
            admin.create_topics([NewTopic(name, num_partitions=self.settings.partitions,
                                          replication_factor=1)])[name].result(30)
            # Created is not yet in every metadata answer (seen: a list right after the
            # creation without it): the floor's first produce would wait for it.
            wanted = {name, self.settings.topic("gateway-events")}
            deadline = time.monotonic() + 30
            while not wanted <= set(admin.list_topics(timeout=30).topics):
                if time.monotonic() > deadline:
                    raise RunFailed(f"topics {sorted(wanted)} not listed 30 s after "
                                    "their creation")
                time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        from streams.topics import delete_topics_with_prefix

        delete_topics_with_prefix(self.settings.kafka_bootstrap, [self.settings.topic_prefix])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The suite's options; a usage error exits 2 (``ratchet bench`` asks before its
    header)."""
    parser = argparse.ArgumentParser(prog="ratchet bench gateway",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=positive_int, default=3000,
                        help="turns per line and round (each with one tool effect)")
    parser.add_argument("--rounds", type=positive_int, default=3,
                        help="rounds of the three lines (the verdict: the medians of "
                             "the rounds' ratios)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from schemas.avro import register_schemas, registry_client
    from streams.testing import isolated_settings

    args = parse_args(argv)
    load_before = load_average()
    base = Settings.from_env()
    settings = isolated_settings(base, "bench-gw")
    pids = server_pids(base)
    say(f"load {load_before}; topics {settings.topic_prefix}*; {args.turns} turns x "
        f"{args.rounds} round(s)")
    client = registry_client(settings.schema_registry_url)
    try:
        register_schemas(client)  # idempotent: a registry that was reset has them again
    finally:
        client.close()
    with bench_topics(settings):
        lines = run(settings, args.turns, args.rounds, pids)
    print(format_report(lines, load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
