"""The bench's produce -> HTTP ``certified`` figure is of real waits, on the real servers.

``ratchet bench processor`` prints, beside produce -> outcome consumed, the time from
producing a turn to a ``wait_ms`` GET of its response answering ``certified``. This
test makes sure that figure measures what it names: a real worker and a real API, one
certified answer per produced turn, requests that were sent before the promotion (the
API parked them until the promotion record woke them), and the client-overhead
samples taken on responses already promoted. And the latency probes' arrival clock is
read when a record comes, not when a batch call gives up waiting for more.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from ratchet.bench.floors import PacedFloor
from ratchet.bench.http_wait import ASYNC_CLIENT, BLOCKING_CLIENT
from ratchet.bench.latency import alternated_latency, http_latency
from ratchet.bench.processor import OutcomeCounter, start_worker
from ratchet.bench.turns import consume_now
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration


def test_each_produced_turn_gets_one_certified_answer_after_waiting(settings, tmp_path):
    turns = 20
    bench = isolated_settings(settings, "httpwait", partitions=2, home=tmp_path / "home")
    rig = Rig(bench)
    worker = None
    try:
        worker = start_worker(rig, tmp_path, OutcomeCounter(bench, rig))
        # Three turns per Conversation, as the bench's throughput run: each GET names
        # its own response, the outcomes of one key are matched in order.
        consumed, figures, overhead = http_latency(bench, rig, tmp_path, rate=10.0,
                                                   turns=turns, per_conversation=3)
    finally:
        if worker is not None:
            worker.terminate()
        rig.close()

    assert consumed[2] == turns  # every outcome consumed
    assert len(figures.latencies_ms) == turns  # one certified answer per turn
    assert all(ms > 0 for ms in figures.latencies_ms)
    # Sent right after the produce, the requests reach the API before the worker has
    # promoted their turn: the API parks them until the record wakes them.
    assert 0 < figures.waited <= turns
    assert figures.queued == 0  # 10 turns/s never fills the client's slots
    assert {name: len(times) for name, times in overhead.items()} == {
        ASYNC_CLIENT: turns, BLOCKING_CLIENT: turns}


def test_alternated_latency_rounds_measure_ratchet_then_floor_each_round(settings, tmp_path):
    """The p99 ratio's two lines come from alternated rounds: each round has every
    turn of ratchet's run and every record of floor 1's but the first fifth of each (the
    warm-up), and the CPU window covers the worker over ratchet's runs only."""
    turns, rounds = 15, 2  # 15 // 5: three warm-up turns a run
    bench = isolated_settings(settings, "alternate", partitions=2, home=tmp_path / "home")
    rig = Rig(bench)
    worker = None
    try:
        worker = start_worker(rig, tmp_path, OutcomeCounter(bench, rig))
        with PacedFloor(bench, {}) as floor:
            window, paired = alternated_latency(bench, rig, 10.0, turns, rounds,
                                                {"worker": worker.pid}, floor,
                                                per_conversation=3)
    finally:
        if worker is not None:
            worker.terminate()
        rig.close()

    assert [(len(mine), len(floor)) for mine, floor in paired] == [(turns - 3, turns - 3)] * rounds
    assert all(ms > 0 for mine, floor in paired for ms in mine + floor)
    # Two paced runs of 15 turns at 10/s: at least 1.4 s each, the floors' not counted.
    assert 2 * 1.4 <= window.seconds < 2 * 30
    assert window.cpu_s["worker"] > 0 and "bench" in window.cpu_s


def test_consume_now_returns_a_record_when_it_comes_not_at_the_timeout(settings,
                                                                       unique_topic):
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap,
                         "group.id": f"{unique_topic}-g", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(unique_topic, 0, 0)])
        assert consume_now(consumer, 0.5) == []  # nothing there: empty after the timeout
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
        producer.produce(unique_topic, b"one")
        producer.produce(unique_topic, b"two")
        assert producer.flush(10) == 0
        start = time.monotonic()
        got = []
        while len(got) < 2 and time.monotonic() - start < 20:
            got += consume_now(consumer, 30.0)
        # Consumer.consume(1000, 30) would have waited out the 30 s for 998 more.
        assert time.monotonic() - start < 15
        assert [m.value() for m in got] == [b"one", b"two"]
    finally:
        consumer.close()
