"""An outside review of session 45's fixes (session 45, rfix3).

docs/service.md, section 3: a signal handler may use the gateway producer while its
thread is inside the producer (session 45 made its locks reentrant so that a handler's
``close`` there does not wait for ever). A handler that *sends* (a cancellation on
SIGTERM, then ``close``) while its thread is inside librdkafka's ``poll`` or ``flush``
runs inside a delivery report: the send served reports itself (``poll``), and
confluent-kafka's ``poll`` from inside its own callback leaves the outer call without
its call state: the next report of that call aborts the process (``CallState_get:
Assertion `cs != NULL' failed``). A send there must queue its event and leave the
reports to the call it runs in; with librdkafka's queue full it cannot wait for room
there (only serving reports makes room): ``EventNotQueued``, retryable.

With the real client, each case in a process of its own (an abort ends the process),
an unreachable broker: every event times out and is reported by ``flush``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from faust.types import TP
from faust.types.tuples import Message

from ratchet.samples import make_turn
from services.gateway.errors import ProducerClosed
from streams.consumer_loop import LoopConsumerApp, WorkerApp
from tests.unit.test_commit_before_revoke import _recording_consumer
from tests.unit.test_gateway_library_review import effect_of, gateway

ROOT = Path(__file__).resolve().parents[2]

_SEND_IN_A_REPORT = """
import sys
from ratchet.samples import make_turn
from ratchet.settings import Settings
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer


class Serde:
    def encode(self, event, topic):
        return b"\\\\0" * 100


config = {"message.timeout.ms": 300, "log_level": 0}
if sys.argv[1] == "full":
    config["queue.buffering.max.messages"] = 3
producer = GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=Serde(),
                           config=config)
explained, handled = producer._explained, []
late = make_turn()


def report_with_a_signal(err):  # a signal handler sends while a delivery report runs
    if not handled:
        try:
            if sys.argv[1] == "flush":
                producer.flush(1)
                handled.append("flushed")
            else:
                producer.send(late)
                handled.append("queued")
        except Exception as exc:
            handled.append(f"{type(exc).__name__} retryable={exc.retryable}")
    return explained(err)


producer._explained = report_with_a_signal
turns = [make_turn() for _ in range(3)]
for turn in turns:
    producer.send(turn)
told = set()
for _ in range(3):  # the late event, if queued, may be reported by the next flush
    try:
        producer.flush(20)
        break
    except DeliveryError as exc:
        told |= {eid for eid, _ in exc.failures}
print("handler:", handled)
ids = {t.event_id for t in turns}
print("flush:", "all" if told == ids | ({late.event_id} if handled == ["queued"] else set())
      else sorted(told))
sys.stdout.flush()
"""


def _run(case: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _SEND_IN_A_REPORT, case],
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT),
                          env={**os.environ})
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    return done.stdout.splitlines()


def test_a_signal_handlers_send_inside_a_delivery_report_queues_without_aborting():
    """The handler's send is queued (no ``poll`` from inside the report) and its event
    reported like any other; the process goes on (it aborted)."""
    lines = _run("room")
    assert "handler: ['queued']" in lines, lines
    assert "flush: all" in lines, lines


def test_a_signal_handlers_send_inside_a_delivery_report_with_the_queue_full_is_refused():
    """librdkafka's queue full inside a delivery report: the send cannot wait for room
    (serving reports there aborts the process): refused, retryable, nothing produced;
    the flush it ran in still reports every event queued before."""
    lines = _run("full")
    assert "handler: ['EventNotQueued retryable=True']" in lines, lines
    assert "flush: all" in lines, lines


def test_a_signal_handlers_flush_inside_a_delivery_report_does_not_abort():
    """A handler's ``flush`` there cannot wait (librdkafka's flush from inside its own
    callback aborts the process): it raises at once what it knows, ``FlushTimeout``
    with the events still in flight (retryable); the flush it ran in goes on and
    reports every event."""
    lines = _run("flush")
    assert "handler: ['FlushTimeout retryable=True']" in lines, lines
    assert "flush: all" in lines, lines


# A close mid-turn names the events of the turn queued before it (the merge of session
# 45: "a close mid-turn names the events queued before it"), so that the caller sends
# the whole turn again, never the turn alone, whose effects the close purged.
def test_a_signal_handlers_close_while_a_turn_waits_for_room_names_what_was_queued():
    """librdkafka's queue full at the turn's second effect: the send serves reports to
    make room, and a signal handler's close runs in that ``poll``. The send's
    ``ProducerClosed`` names the effect queued before it and asks for the whole turn
    again (it said "create a new one", naming nothing: the caller could send the turn
    alone)."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    plain_produce, plain_poll = kafka.produce, kafka.poll

    def produce_until_full(topic, value, key, on_delivery):
        if kafka.produced:
            raise BufferError("Local: Queue full")
        plain_produce(topic, value, key, on_delivery)

    def poll_with_a_signal(timeout=0):
        if timeout:  # the send waits for room: SIGTERM arrives, its handler closes
            producer.close(timeout_s=0)  # inside librdkafka's poll: it finishes as that returns
        return plain_poll(timeout)

    kafka.produce, kafka.poll = produce_until_full, poll_with_a_signal
    try:
        producer.send_turn(turn, effects=effects)
        refused = None
    except ProducerClosed as exc:
        refused = exc
    assert refused is not None
    assert kafka.closed and len(kafka.produced) == 1
    assert effects[0].event_id in str(refused), str(refused)  # queued, then purged
    assert "whole turn" in str(refused), str(refused)


# A revocation whose settling fails crashes the worker (session 45) "what was acked is
# still committed and Faust still told". With the thread consumer
# (``RATCHET_WORKER_CONSUMER=thread``) a commit is a call to the consumer's thread, and
# the app's crash crashes that thread's service: on a real broker its method queue
# served one more call after ``app.crash``, then none (the review's probe), so the
# second of ``commit_acked``'s two commits, needed when Faust's periodic commit is in
# flight, was never served. The commits and Faust's revocation come first, the crash last.
@pytest.mark.parametrize("cls", [LoopConsumerApp, WorkerApp])
def test_a_revocation_whose_settling_fails_commits_and_tells_faust_before_the_crash(
        tmp_path, monkeypatch, cls):
    async def check():
        consumer, committed = _recording_consumer(cls, "unit-settle-fails-order", tmp_path,
                                                  monkeypatch)
        order: list[str] = []
        plain_commit = consumer._commit

        async def commit(offsets):
            order.append("commit, crashed" if consumer.app.crashed else "commit")
            return await plain_commit(offsets)

        async def app_revoke_handler(revoked):
            order.append("told, crashed" if consumer.app.crashed else "told")

        async def settle_revoked(revoked):
            raise RuntimeError("a bug while settling")

        monkeypatch.setattr(consumer, "_commit", commit)
        monkeypatch.setattr(consumer, "_on_partitions_revoked", app_revoke_handler)
        monkeypatch.setattr(consumer.app, "settle_revoked", settle_revoked, raising=False)
        consumer.ack(Message("events", 0, 0, 0.0, 0, None, b"k", b"v", None))
        await consumer.on_partitions_revoked({TP("events", 0)})
        return consumer.app, committed, order

    app, committed, order = asyncio.run(asyncio.wait_for(check(), 10))
    assert app.crashed and str(app.crash_reason) == "a bug while settling"
    assert committed.get(TP("events", 0)) == 1
    assert order == ["commit", "told"], order  # both before the crash
