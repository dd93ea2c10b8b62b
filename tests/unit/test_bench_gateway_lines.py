"""``ratchet bench gateway``'s lines without a server (doubles for the producers, the
serde and the clocks): what each timed window holds, and a failed send_turn line ends
as the run's one-line verdict (``RunFailed``), its producer closed.

An outside review (session 51): a ``close`` that raised after a failed flush (events
still in flight are purged and raised as ``DeliveryError``) replaced the line's
``RunFailed``, and ``ratchet bench`` printed a traceback instead of its one line.
"""

from __future__ import annotations

import types

import pytest

from ratchet.bench import gateway
from ratchet.bench.measure import RunFailed
from ratchet.bench.turns import gateway_turns
from ratchet.settings import Settings
from services.gateway import producer as gateway_producer
from services.gateway.errors import DeliveryError, FlushTimeout

SETTINGS = Settings.from_env()


class Clock:
    """``time`` for the bench module: each reading of a clock is logged (``log``)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def module(self) -> types.SimpleNamespace:
        def reading(name: str):
            def read() -> float:
                self.log.append(name)
                return float(len(self.log))
            return read
        return types.SimpleNamespace(
            perf_counter=reading("wall"), thread_time=reading("thread"),
            process_time=reading("process"), monotonic=reading("monotonic"),
            sleep=lambda _s: None)


def window(log: list[str]) -> list[str]:
    """What happened between the first clock reading and the last."""
    clocks = {"wall", "thread", "process"}
    at = [i for i, what in enumerate(log) if what in clocks]
    return [what for what in log[at[0]:at[-1]] if what not in clocks]


@pytest.fixture
def log(monkeypatch) -> list[str]:
    events: list[str] = []
    monkeypatch.setattr(gateway, "time", Clock(events).module())
    return events


def test_the_floor_window_holds_every_produce_and_the_flush_not_the_warm_up(log,
                                                                            monkeypatch):
    import confluent_kafka

    class Producer:
        def __init__(self, config) -> None:
            assert config["enable.idempotence"] is True and config["acks"] == "all"
            self.queued = []

        def produce(self, topic, value, key, on_delivery) -> None:
            log.append(f"produce {value.decode()}")
            self.queued.append(on_delivery)

        def poll(self, _timeout) -> int:
            log.append("poll")
            return 0

        def flush(self, _timeout) -> int:
            log.append("flush")
            for report in self.queued:
                report(None, None)
            self.queued = []
            return 0

        def __len__(self) -> int:
            return len(self.queued)

    monkeypatch.setattr(confluent_kafka, "Producer", Producer)
    records = [(b"k", b"a"), (b"k", b"b")]
    line = gateway.floor_line(SETTINGS, "t", records, [(b"k", b"w")], 1, 1, {})
    assert window(log) == ["produce a", "poll", "produce b", "poll", "flush"]
    assert log.index("produce w") < log.index("produce a")  # warmed, before the clock
    assert line.records == 3


def test_the_encode_window_encodes_each_event_once(log):
    turns = gateway_turns(2, 1)

    class Serde:
        def encode(self, event, topic, data=None) -> bytes:
            log.append(f"encode {event.event_id}")
            return b""

    gateway.encode_line(Serde(), "t", turns, 1, {})
    assert window(log) == [f"encode {event.event_id}"
                           for turn, effects in turns for event in (*effects, turn)]


class FakeGatewayProducer:
    """``GatewayProducer``: logs its calls; ``flush_raises`` / ``close_raises``."""

    flush_raises: Exception | None = None
    close_raises: Exception | None = None
    closed: list[float] = []

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send_turn(self, turn, effects=()) -> None:
        self.log.append(f"send {turn.event_id}")

    def flush(self, timeout_s: float = 30.0) -> None:
        self.log.append("flush")
        if self.flush_raises is not None and self.log.count("flush") > 1:
            raise self.flush_raises  # the warm-up's flush passes

    def close(self, timeout_s: float = 30.0) -> None:
        self.log.append("close")
        FakeGatewayProducer.closed.append(timeout_s)
        if self.close_raises is not None:
            raise self.close_raises


@pytest.fixture
def fake_producer(log, monkeypatch):
    FakeGatewayProducer.flush_raises = FakeGatewayProducer.close_raises = None
    FakeGatewayProducer.closed = []
    monkeypatch.setattr(gateway_producer, "GatewayProducer",
                        lambda _settings: FakeGatewayProducer(log))
    return FakeGatewayProducer


def test_the_send_turn_window_holds_every_send_and_the_flush(log, fake_producer):
    turns, warm_up = gateway_turns(2, 1), gateway_turns(1, 1)[0]
    line = gateway.send_line(SETTINGS, turns, warm_up, 1, {})
    assert window(log) == [f"send {turn.event_id}" for turn, _ in turns] + ["flush"]
    assert log[:2] == [f"send {warm_up[0].event_id}", "flush"]  # warmed, before the clock
    assert log[-1] == "close" and line.records == 2 * 3


def test_a_failed_flush_is_the_runs_verdict_though_the_close_raises_too(log, fake_producer):
    """The flush timed out: the close purges what is in flight and raises it. The run
    fails with the flush's failure (one line), the producer closed without waiting."""
    fake_producer.flush_raises = FlushTimeout(3)
    fake_producer.close_raises = DeliveryError([("e1", "purged")], retryable=True)
    with pytest.raises(RunFailed, match="FlushTimeout: 3 event"):
        gateway.send_line(SETTINGS, gateway_turns(2, 1), gateway_turns(1, 1)[0], 1, {})
    assert fake_producer.closed == [0]


def test_a_close_that_raises_after_a_clean_run_fails_the_run_in_one_line(log, fake_producer):
    fake_producer.close_raises = DeliveryError([("e1", "lost")], retryable=False)
    with pytest.raises(RunFailed, match="closing its producer: DeliveryError"):
        gateway.send_line(SETTINGS, gateway_turns(2, 1), gateway_turns(1, 1)[0], 1, {})
