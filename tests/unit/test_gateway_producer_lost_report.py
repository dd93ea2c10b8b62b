"""A delivery report an exception ended (Ctrl-C, a signal handler's exception) is told
by the next ``flush`` and by its ``Delivery``, not only by ``close`` (session 49).

confluent-kafka raises an exception out of the callback serving a report from the
``poll`` / ``flush`` it ran in and drops that report. Before, a ``flush`` between that
call and the ``close`` returned as if every event were written (nothing was in flight
any more), and the event's ``Delivery.wait`` said ``FlushTimeout``, "still in flight",
for ever: a caller that flushes to know its turn is written was told so wrongly. The
real client, its broker unreachable: the event times out after ``delivery.timeout.ms``
and its report is served by the main thread's ``flush``.
"""

from __future__ import annotations

import functools

import pytest

from ratchet.samples import make_turn
from ratchet.settings import Settings
from services.gateway.errors import DeliveryError, FlushTimeout
from services.gateway.producer import GatewayProducer


class _Serde:
    def encode(self, event, topic):
        return b"\0" * 100


def _unreachable() -> GatewayProducer:
    return GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=_Serde(),
                           config={"log_level": 0, "delivery.timeout.ms": 200})


class _Client:
    """The real client; ``produce`` hands librdkafka the report wrapped by ``wrap``
    (the report librdkafka holds is then the wrapper, and only it)."""

    def __init__(self, real, wrap):
        self._real, self._wrap = real, wrap

    def produce(self, *args, on_delivery, **kwargs):
        return self._real.produce(*args, on_delivery=self._wrap(on_delivery), **kwargs)

    def __len__(self):
        return len(self._real)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _ctrl_c_before_its_first_line(report, err, msg):
    """Ctrl-C as the report is entered: Python runs a signal's handler at a function's
    first instruction, before any ``try`` in it (CPython 3.11's ``RESUME``)."""
    del report  # as the real case: no frame of the traceback holds the report
    raise KeyboardInterrupt


def _interrupted(producer: GatewayProducer, where: str) -> None:
    """Ctrl-C ends the event's report, ``where``: inside it, once it began (before it
    recorded anything), or before its first line."""
    if where == "inside":
        explained, interrupted = producer._explained, []

        def ctrl_c_once(err):  # called by the report before it records anything
            if not interrupted:
                interrupted.append(err)
                raise KeyboardInterrupt
            return explained(err)
        producer._explained = ctrl_c_once
    else:
        producer._producer = _Client(
            producer._producer,
            lambda report: functools.partial(_ctrl_c_before_its_first_line, report))


@pytest.mark.parametrize("where", ["inside", "before its first line"])
def test_a_flush_after_a_report_ctrl_c_ended_raises_it(where):
    """The flush after the interrupted one raises the event, retryable (it may or may
    not be written); so does its ``Delivery``, at once; the close tells it no more (it
    was told). Before: the flush returned, the wait was ``FlushTimeout``."""
    producer = _unreachable()
    _interrupted(producer, where)
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)  # serves the timed-out event's report: Ctrl-C ends it
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(0)
    assert [eid for eid, _ in flushed.value.failures] == list(sent.event_ids)
    assert flushed.value.retryable and flushed.value.pending == 0
    assert "never ran to its end" in flushed.value.failures[0][1]
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)
    producer.close(timeout_s=0)  # told once per thread: nothing left for the close


def test_a_delivery_waited_first_raises_the_report_ctrl_c_ended():
    """No flush between: the event's own ``wait`` raises it (it was ``FlushTimeout``,
    "still in flight", however long it waited)."""
    producer = _unreachable()
    _interrupted(producer, "inside")
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        sent.wait(10)
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=0)  # this thread never flushed: the close tells it


def test_ctrl_c_in_a_flush_that_ended_no_report_loses_nothing():
    """Control: Ctrl-C out of librdkafka's flush before it served the report (as
    confluent-kafka's check for signals between its waits raises it) drops nothing:
    the next flush serves the report and raises its own error, a timeout, not a lost
    report."""
    producer = _unreachable()
    real_flush = producer._producer.flush
    calls = []

    def ctrl_c_first(timeout=-1):
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_flush(timeout)

    producer._producer = _Client(producer._producer, lambda report: report)
    producer._producer.flush = ctrl_c_first
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(10)
    [(event_id, text)] = flushed.value.failures
    assert event_id == sent.event_ids[0] and "within delivery.timeout.ms" in text
    with pytest.raises(DeliveryError):
        sent.wait(0)
    producer.close(timeout_s=0)


def test_a_report_still_to_come_is_no_lost_one():
    """Control: a flush after an exception, with the report not served yet, waits for
    it as before (``FlushTimeout`` with no time, nothing failed)."""
    producer = _unreachable()
    producer._reports_may_be_cut = True  # as after an exception out of a poll
    sent = producer.send(make_turn())
    with pytest.raises(FlushTimeout):
        producer.flush(0)
    with pytest.raises(FlushTimeout):
        sent.wait(0)
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=0)

