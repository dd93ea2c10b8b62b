"""The decision notifier's poll thread never waits on the brokers, and a stop is not a
failure (services/api/notifier.py), session 46.

- The connect's first metadata request ran on the poll thread (up to 10 s while the
  brokers did not answer): a stop then waited out its join (5 s) and returned with the
  thread still running. Every call that may wait on a broker now runs beside the poll.
- A failure that came after a stop (the connect's metadata request failing once the
  brokers timed out, a poll failing while the consumer went down) was logged
  `decision notifier failed; restarting` at error level and counted a restart.
- The `ratchet_api_notifier_up` gauge stayed 1 after a stop.

Kafka is ``tests/unit/notifier_world.py``'s fake."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.api import metrics
from services.api import notifier as notifier_module
from services.api.waiters import PromotionWaiters
from tests.unit.notifier_world import (
    BOUND_S,
    FakeConsumer,
    fake_kafka,
    following,
    notifier_of,
)

POLL_THREAD = "decision-notifier"
CAUSES = ("topics_changed", "topics_missing", "failed")


class RecordedCalls(FakeConsumer):
    """Records the thread of every call that may wait on a broker (a metadata request,
    an uncached ask of a partition's end) and the metadata request's timeout;
    ``checked`` is set at the second metadata request (the first topics check)."""

    calls: list[tuple[str, str, float]]
    checked: threading.Event

    def list_topics(self, timeout: float = -1):
        cls = type(self)
        cls.calls.append(("list_topics", threading.current_thread().name, timeout))
        if sum(call[0] == "list_topics" for call in cls.calls) >= 2:
            cls.checked.set()
        return super().list_topics(timeout)

    def get_watermark_offsets(self, tp, timeout: float = -1, cached: bool = False):
        if not cached:
            type(self).calls.append(("end", threading.current_thread().name, timeout))
        return super().get_watermark_offsets(tp, timeout, cached)


def test_no_call_that_may_wait_on_the_brokers_runs_on_the_poll_thread(monkeypatch):
    """The connect's metadata request, its asks of the partitions' ends and the topics
    checks all run beside the poll, each metadata request bounded as the check's. Before,
    the connect's metadata request ran on the poll thread, up to 10 s."""
    fake_kafka(monkeypatch, RecordedCalls)
    RecordedCalls.calls, RecordedCalls.checked = [], threading.Event()

    async def scenario() -> bool:
        loop = asyncio.get_running_loop()
        async with following(notifier_of(PromotionWaiters(), topics_check_s=0.01)) as positioned:
            assert positioned
            return await loop.run_in_executor(None, RecordedCalls.checked.wait, BOUND_S)

    assert asyncio.run(scenario()), "no topics check ran after the connect"
    kinds = {call[0] for call in RecordedCalls.calls}
    assert kinds == {"list_topics", "end"}, kinds
    on_poll_thread = [call for call in RecordedCalls.calls if call[1] == POLL_THREAD]
    assert on_poll_thread == [], "a call that may wait on the brokers ran on the poll thread"
    looks = [call for call in RecordedCalls.calls if call[0] == "list_topics"]
    assert all(0 < timeout <= notifier_module.TOPICS_CHECK_TIMEOUT_S
               for _, _, timeout in looks), looks


class HangingConnect(FakeConsumer):
    """The brokers do not answer the first consumer's metadata request: it waits for
    ``gate`` (the test's stand-in for librdkafka's timeout), then fails, or says the
    topics do not exist (``outcome``)."""

    gate: threading.Event
    asked: threading.Event
    outcome = "fails"

    def list_topics(self, timeout: float = -1):
        if self.number == 1:
            type(self).asked.set()
            type(self).gate.wait()
            if type(self).outcome == "fails":
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, "timed out"))
            return type("Meta", (), {"topics": {}})()
        return super().list_topics(timeout)


class FailingPoll(FakeConsumer):
    """Once ``hang`` is set, a poll waits for ``gate`` then fails (the consumer's
    connection lost while the API stops)."""

    hang: threading.Event
    gate: threading.Event
    polling: threading.Event

    def poll(self, timeout: float):
        if type(self).hang.is_set():
            type(self).polling.set()
            type(self).gate.wait()
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker connection lost"))
        return super().poll(timeout)


def _restarts() -> float:
    return sum(metrics.NOTIFIER_RESTARTS.labels(cause)._value.get() for cause in CAUSES)


def test_a_stop_while_the_first_metadata_request_waits_on_the_brokers_ends_the_thread(
        monkeypatch):
    """Before, the stop's join (its 5 s; here ``BOUND_S``) ended with the poll thread
    still inside the request (up to 10 s; here until the gate opens)."""
    fake_kafka(monkeypatch, HangingConnect)
    HangingConnect.gate, HangingConnect.asked = threading.Event(), threading.Event()
    HangingConnect.outcome = "fails"
    notifier = notifier_of(PromotionWaiters())
    notifier.start()
    try:
        assert HangingConnect.asked.wait(BOUND_S)
        assert notifier.stop(BOUND_S), "the poll thread waited on the brokers after the stop"
    finally:
        HangingConnect.gate.set()
        notifier.stop()


@pytest.mark.parametrize("where", ["connect_fails", "connect_topics_missing", "poll"])
def test_a_failure_after_a_stop_is_not_a_restart(monkeypatch, caplog, where):
    """A stop, then the call the poll thread was in fails (the connect's metadata
    request, or finds the topics missing; or a poll): nothing at warning level or above,
    no restart counted, no other consumer. Before, `decision notifier failed;
    restarting` (or `waiting for its topics`) was logged and a restart counted."""
    caplog.set_level(logging.INFO, logger="ratchet.api.notifier")
    before = _restarts()
    if where == "poll":
        broker = fake_kafka(monkeypatch, FailingPoll)
        FailingPoll.hang, FailingPoll.gate = threading.Event(), threading.Event()
        FailingPoll.polling = threading.Event()
        gate, asked = FailingPoll.gate, FailingPoll.polling
    else:
        broker = fake_kafka(monkeypatch, HangingConnect)
        HangingConnect.gate, HangingConnect.asked = threading.Event(), threading.Event()
        HangingConnect.outcome = "fails" if where == "connect_fails" else "topics_missing"
        gate, asked = HangingConnect.gate, HangingConnect.asked
    notifier = notifier_of(PromotionWaiters())
    notifier.start()
    try:
        if where == "poll":
            assert notifier.wait_assigned(BOUND_S)
            FailingPoll.hang.set()
        assert asked.wait(BOUND_S)
        notifier.stop(0)  # the stop comes while the call waits
        gate.set()  # then the call fails
        assert notifier.stop(BOUND_S), "the poll thread did not end"
    finally:
        gate.set()
        notifier.stop()
    loud = [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == "ratchet.api.notifier" and r.levelno >= logging.WARNING]
    assert loud == [], "a stop was logged as a failure"
    assert _restarts() == before, "a stop was counted a restart"
    assert broker.consumers == 1, "a consumer was made after the stop"


def test_the_up_gauge_is_zero_once_stopped(monkeypatch):
    """Before, ``ratchet_api_notifier_up`` stayed 1 after a stop (``up`` said false)."""
    fake_kafka(monkeypatch)

    async def scenario() -> bool:
        notifier = notifier_of(PromotionWaiters())
        async with following(notifier) as positioned:
            assert positioned
            assert metrics.NOTIFIER_UP._value.get() == 1
        return notifier.up

    assert asyncio.run(scenario()) is False
    assert metrics.NOTIFIER_UP._value.get() == 0, "the gauge says up after the stop"
