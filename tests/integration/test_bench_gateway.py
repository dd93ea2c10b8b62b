"""``ratchet bench gateway`` on the real broker and registry: its lines, and the turns it
says it sent really on its topics (consumed back and counted), and its topics gone
after the run."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from ratchet import cli
from ratchet.bench.gateway import FLOOR, LINES, RAW_TOPIC, SEND, bench_topics, format_report, run
from ratchet.bench.turns import consume_now
from schemas.avro import EventSerde, registry_client
from schemas.models import ToolEffect, TurnCompleted
from streams.testing import isolated_settings

pytestmark = pytest.mark.integration


def on_topic(settings, topic: str, expected: int, timeout_s: float = 30) -> list:
    """Every message of ``topic``: until ``expected`` came, then one more short read so
    that a surplus is seen too."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"count-{time.monotonic_ns()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, -2) for p in range(settings.partitions)])
    got: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            got += [m for m in consume_now(consumer, 0.5) if not m.error()]
        got += [m for m in consume_now(consumer, 1.0) if not m.error()]
    finally:
        consumer.close()
    return got


def listed_soon(ours, check, timeout_s: float = 15) -> set[str]:
    """``ours()`` once ``check`` holds of it, or its last answer: a topic deleted (or
    created) is not in every metadata answer at once."""
    deadline = time.monotonic() + timeout_s
    while not check(names := ours()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return names


def test_the_lines_and_every_turn_sent_on_its_topic(settings):
    turns, rounds = 7, 2
    s = isolated_settings(settings, "bench-gw-it", partitions=3)
    with bench_topics(s):
        lines = run(s, turns, rounds, {})
        sent = on_topic(s, s.topic("gateway-events"),
                        sum(line.records for line in lines if line.row.name == SEND))
        raw = on_topic(s, f"{s.topic_prefix}{RAW_TOPIC}",
                       sum(line.records for line in lines if line.row.name == FLOOR))

    # Three lines a round, in order, each over the N turns, with both CPU columns.
    assert [(line.round, line.row.name) for line in lines] == [
        (r, name) for r in range(1, rounds + 1) for name in LINES]
    for line in lines:
        assert line.row.count == turns and line.row.per_second > 0
        assert line.row.cpu_s["thread"] > 0 and line.row.cpu_s["process"] > 0
    # send_turn: per round the N turns and a warm-up turn, each with its one effect,
    # really on the gateway topic and decodable as such.
    serde = EventSerde(registry_client(s.schema_registry_url))
    kinds = [type(serde.decode(m.value(), m.topic(), m.partition(), m.offset())) for m in sent]
    assert kinds.count(TurnCompleted) == kinds.count(ToolEffect) == rounds * (turns + 1)
    assert len(kinds) == 2 * rounds * (turns + 1)
    # The floor: the same records' bytes, as many, on its own topic.
    assert len(raw) == 2 * rounds * (turns + 1)
    assert sorted(m.value() for m in raw) == sorted(m.value() for m in sent)

    report = format_report(lines, "0.00, 0.00, 0.00").splitlines()
    assert sum(1 for row in report if row.split()[:1] in (["1"], ["2"])) == 3 * rounds
    assert report[-1].startswith("  median of 2 round(s): turns/s ")


def test_the_cli_run_prints_its_table_and_leaves_no_topic(settings):
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})

    def ours() -> set[str]:
        return {t for t in admin.list_topics(timeout=30).topics
                if t.startswith("ratchet-bench-gw-")}

    before = ours()
    result = CliRunner().invoke(cli.main, ["bench", "gateway", "--turns", "5", "--rounds", "1"],
                                env=settings.to_env())
    assert result.exit_code == 0, result.output
    out = result.output
    assert "== bench gateway: " in out
    for name in LINES:
        assert f"    1 {name} " in out
    assert "  round 1: turns/s " in out and "median of 1 round(s)" in out
    assert listed_soon(ours, lambda names: names <= before) <= before  # deleted


def test_a_run_stopped_inside_its_topics_deletes_them(settings):
    """Ctrl-C mid-run: the block's end deletes the run's topics all the same."""
    s = isolated_settings(settings, "bench-gw-stop", partitions=1)
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})

    def ours() -> set[str]:
        return {t for t in admin.list_topics(timeout=30).topics
                if t.startswith(s.topic_prefix)}

    with pytest.raises(KeyboardInterrupt), bench_topics(s):
        assert f"{s.topic_prefix}{RAW_TOPIC}" in ours() and s.topic("gateway-events") in ours()
        raise KeyboardInterrupt
    assert listed_soon(ours, lambda names: not names) == set()
