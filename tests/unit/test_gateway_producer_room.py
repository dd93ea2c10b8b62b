"""A send waiting for room in librdkafka's full queue, against a ``close`` of another
thread (session 48).

docs/service.md, section 3: a send of another thread waiting for room is ended by a
``close`` (``ProducerClosed`` naming the events of its turn queued before it). Before
session 48 the waiting send polled librdkafka 0.1 s at a time and saw the close only
when its poll returned; it now waits on a condition that a delivery report (room) and a
close both notify, while a thread of the producer serves the reports. No wake-up may be
lost: a close before the wait, during it, or together with a report.

``FakeKafka`` stands in for librdkafka: its queue holds one event, and its ``poll`` with
a timeout (the one that waits for reports) blocks until the test lets it return, so
each test knows which wake-up ended the wait: never a timing claim.
"""

from __future__ import annotations

import signal
import threading

import pytest
from confluent_kafka import Message

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, ProducerClosed
from tests.unit.test_gateway_library_review import effect_of, gateway


class Room:
    """A producer on a ``FakeKafka`` whose queue holds one event, and whose waiting
    ``poll`` blocks until ``release`` (each entry counted, ``polling`` set on entry)."""

    def __init__(self) -> None:
        self.producer, self.kafka = gateway()
        self.polling = threading.Event()
        self.release = threading.Event()
        self.waiting_polls = 0
        plain_produce, plain_poll = self.kafka.produce, self.kafka.poll

        def produce_until_full(topic, value, key, on_delivery):
            if self.kafka.queued:
                raise BufferError("Local: Queue full")
            plain_produce(topic, value, key, on_delivery)

        def poll(timeout=0):
            if timeout:
                self.waiting_polls += 1
                self.polling.set()
                assert self.release.wait(30), "the test never let librdkafka's poll return"
            return plain_poll(0)

        self.kafka.produce, self.kafka.poll = produce_until_full, poll
        self.turn = make_turn()
        self.effect = effect_of(self.turn, "call_1")
        self.sent: list[BaseException | None] = []
        self.closed: list[BaseException | None] = []

    def send_turn(self) -> threading.Thread:
        """Thread: the effect is queued, the turn waits for room."""
        def send() -> None:
            try:
                self.producer.send_turn(self.turn, effects=[self.effect])
                self.sent.append(None)
            except ProducerClosed as exc:
                self.sent.append(exc)
        return _started(send)

    def close(self) -> threading.Thread:
        def close() -> None:
            try:
                self.producer.close(timeout_s=0)
                self.closed.append(None)
            except DeliveryError as exc:
                self.closed.append(exc)
        return _started(close)

    def assert_the_turn_was_refused_and_the_effect_purged(self) -> None:
        assert isinstance(self.sent[0], ProducerClosed), self.sent
        assert self.effect.event_id in str(self.sent[0])  # queued before: sent again
        assert [eid for eid, _ in self.closed[0].failures] == [self.effect.event_id]
        assert len(self.kafka.produced) == 1 and self.kafka.closed  # the turn never


def _started(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_close_ends_a_send_waiting_for_reports_while_librdkafkas_poll_still_blocks():
    """The send waits for room; the close of another thread must end it without any
    poll returning (the one poll in progress is held until the send has ended). It
    polled itself before session 48, so it saw the close only once its poll returned:
    here never, until the test let it."""
    room = Room()
    sender = room.send_turn()
    assert room.polling.wait(10)
    closer = room.close()
    sender.join(10)
    try:
        assert not sender.is_alive(), "the send saw the close only when its poll returned"
        assert room.waiting_polls == 1 and not room.release.is_set()
    finally:
        room.release.set()  # the report pump's poll returns: the close releases the client
    closer.join(10)
    assert not closer.is_alive()
    room.assert_the_turn_was_refused_and_the_effect_purged()


def test_a_close_between_the_queue_full_check_and_the_wait_is_not_missed():
    """The close begins (marks the producer closing and notifies) after the send found
    the queue full and checked for a close, before it waits: it must not wait (no report
    would ever wake it here: the poll is held for good)."""
    room = Room()
    producer = room.producer
    plain_wait = producer._wait_for_room
    closers: list[threading.Thread] = []

    def close_first(*args, **kwargs):
        with producer._room:  # the close's notify waits for this lock: as late as it gets
            closers.append(room.close())
            assert _set_within(producer._closing)
            return plain_wait(*args, **kwargs)

    producer._wait_for_room = close_first
    sender = room.send_turn()
    sender.join(10)
    try:
        assert not sender.is_alive(), "a close before the wait was missed"
    finally:
        room.release.set()
    closers[0].join(10)
    assert room.waiting_polls == 0  # never waited for a report
    room.assert_the_turn_was_refused_and_the_effect_purged()


def test_a_report_and_a_close_together_end_the_send_as_closed():
    """Room made (the queued effect's report served by another thread) and a close begun
    before the waiting send wakes: the close wins, the turn is refused, not queued."""
    room = Room()
    producer, kafka = room.producer, room.kafka
    sender = room.send_turn()
    assert room.polling.wait(10)
    with producer._room:  # the send cannot wake until both happened
        closer = room.close()
        assert _set_within(producer._closing)
        _, _, report = kafka.queued.pop(0)  # delivered: room for the turn
        report(None, Message(topic="t", partition=0, offset=7))
    sender.join(10)
    try:
        assert not sender.is_alive()
    finally:
        room.release.set()
    closer.join(10)
    assert isinstance(room.sent[0], ProducerClosed), room.sent
    assert room.closed == [None]  # the effect was delivered, nothing purged
    assert len(kafka.produced) == 1


def test_a_report_served_while_a_send_waits_makes_room_for_it():
    """The report pump's poll serves the queued effect's report: the send wakes and
    queues the turn, and returns (no close)."""
    room = Room()
    kafka = room.kafka
    sender = room.send_turn()
    assert room.polling.wait(10)
    kafka.deliver(0)  # the broker answered: its report comes with the poll
    room.release.set()
    sender.join(10)
    assert not sender.is_alive() and room.sent == [None]
    assert len(kafka.produced) == 2
    kafka.deliver(0)
    room.producer.close(timeout_s=0)  # both delivered: nothing raised
    assert kafka.closed


def _set_within(event: threading.Event) -> bool:
    return event.wait(10)


def test_ctrl_c_while_a_send_waits_for_room_leaves_a_producer_that_closes():
    """SIGINT in the sending (main) thread while it waits on the condition: the send
    raises ``KeyboardInterrupt``; the report pump ends once no send waits, and a later
    ``close`` purges the effect queued before and raises it (nothing hangs)."""
    room = Room()
    main = threading.main_thread().ident
    assert threading.current_thread().ident == main  # signal handlers run there

    plain_poll = room.kafka.poll  # the room's (never held here: released)
    room.release.set()

    def poll(timeout=0):
        if timeout and not room.polling.is_set():  # the send waits for room: Ctrl-C
            signal.pthread_kill(main, signal.SIGINT)
        return plain_poll(timeout)

    room.kafka.poll = poll
    with pytest.raises(KeyboardInterrupt):
        room.producer.send_turn(room.turn, effects=[room.effect])
    with pytest.raises(DeliveryError) as raised:
        room.producer.close(timeout_s=0)
    assert [eid for eid, _ in raised.value.failures] == [room.effect.event_id]
    assert room.kafka.closed and len(room.kafka.produced) == 1
    assert room.producer._pump is None and room.producer._waiting_for_reports == 0
