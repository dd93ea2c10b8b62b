"""A send waiting for room in librdkafka's full queue, against a ``close`` of another
thread (sessions 48 and 48's rgw4).

docs/service.md, section 3: a send of another thread waiting for room is ended by a
``close`` (``ProducerClosed`` naming the events of its turn queued before it) once its
poll returns: it serves the reports itself, at most 0.1 s a poll, and looks for a close
between polls. Session 48 woke it at once with a condition and a report-pumping
thread; that was taken out (a signal handler's close deadlocked with it, the last test
here), and these tests hold the 0.1 s promise instead: each poll of the waiting send
asks for at most 0.1 s, and a close begun during it ends the send once it returns,
with no poll more; no close is missed (one begun while the poll is in progress,
one together with a report: the close wins).

``FakeKafka`` stands in for librdkafka: its queue holds one event, and its ``poll``
with a timeout (the waiting send's) blocks until the test lets it return, so each test
knows what the send saw when: never a timing claim.
"""

from __future__ import annotations

import signal
import threading

import pytest

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, ProducerClosed
from tests.unit.producer_process import run_script
from tests.unit.test_gateway_library_review import effect_of, gateway


class Room:
    """A producer on a ``FakeKafka`` whose queue holds one event, and whose waiting
    ``poll`` blocks until ``release`` (each entry counted and its timeout kept,
    ``polling`` set on entry; ``on_poll`` run there first, if given)."""

    def __init__(self) -> None:
        self.producer, self.kafka = gateway()
        self.polling = threading.Event()
        self.release = threading.Event()
        self.poll_timeouts: list[float] = []
        self.on_poll = None
        plain_produce, plain_poll = self.kafka.produce, self.kafka.poll

        def produce_until_full(topic, value, key, on_delivery):
            if self.kafka.queued:
                raise BufferError("Local: Queue full")
            plain_produce(topic, value, key, on_delivery)

        def poll(timeout=0):
            if timeout:
                self.poll_timeouts.append(timeout)
                if self.on_poll is not None:
                    self.on_poll()
                self.polling.set()
                assert self.release.wait(30), "the test never let librdkafka's poll return"
            return plain_poll(0)

        self.kafka.produce, self.kafka.poll = produce_until_full, poll
        self.turn = make_turn()
        self.effect = effect_of(self.turn, "call_1")
        self.sent: list[BaseException | None] = []
        self.closed: list[BaseException | None] = []

    @property
    def waiting_polls(self) -> int:
        return len(self.poll_timeouts)

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


def test_a_close_ends_a_send_waiting_for_room_once_its_poll_of_at_most_0_1_s_returns():
    """The send waits for room, polling; another thread's close begins during that poll
    (and waits for the send). Once the poll returns (here: when the test lets it), the
    send ends ``ProducerClosed`` without polling again, and the close goes on. Each
    poll asked for at most 0.1 s: the bound on how long the close waits for it. (This
    replaces session 48's "ended while the poll still blocks", the promise of the
    report pump taken out.)"""
    room = Room()
    sender = room.send_turn()
    assert room.polling.wait(10)
    closer = room.close()
    assert _set_within(room.producer._closing)
    assert sender.is_alive() and closer.is_alive()  # the close waits for the send
    room.release.set()
    sender.join(10)
    closer.join(10)
    assert not sender.is_alive() and not closer.is_alive()
    assert room.poll_timeouts == [0.1]  # one poll, bounded: no other before the close
    room.assert_the_turn_was_refused_and_the_effect_purged()


def test_a_close_begun_as_the_send_starts_its_poll_is_not_missed():
    """The close begins (marks the producer closing) after the send found the queue
    full and checked for a close, as its poll starts: the send must not produce or
    poll again once that poll returns."""
    room = Room()
    closers: list[threading.Thread] = []

    def close_first() -> None:
        closers.append(room.close())
        assert _set_within(room.producer._closing)

    room.on_poll = close_first
    room.release.set()  # polls return at once: only the close can end the send
    sender = room.send_turn()
    sender.join(10)
    assert not sender.is_alive(), "a close as the poll started was missed"
    closers[0].join(10)
    assert room.waiting_polls == 1
    room.assert_the_turn_was_refused_and_the_effect_purged()


def test_a_report_and_a_close_together_end_the_send_as_closed():
    """Room made (the queued effect's report served by the send's own poll) and a close
    begun during that poll: the close wins, the turn is refused, not queued for the
    close to purge."""
    room = Room()
    producer, kafka = room.producer, room.kafka
    sender = room.send_turn()
    assert room.polling.wait(10)
    closer = room.close()
    assert _set_within(producer._closing)
    kafka.deliver(0)  # delivered: its report comes with the poll, room for the turn
    room.release.set()
    sender.join(10)
    assert not sender.is_alive()
    closer.join(10)
    assert isinstance(room.sent[0], ProducerClosed), room.sent
    assert room.closed == [None]  # the effect was delivered, nothing purged
    assert len(kafka.produced) == 1


def test_a_report_served_while_a_send_waits_makes_room_for_it():
    """The send's poll serves the queued effect's report: the send queues the turn and
    returns (no close)."""
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
    """SIGINT in the sending (main) thread while it waits for room: the send raises
    ``KeyboardInterrupt``; a later ``close`` purges the effect queued before and raises
    it (nothing hangs)."""
    room = Room()
    main = threading.main_thread().ident
    assert threading.current_thread().ident == main  # signal handlers run there

    plain_poll = room.kafka.poll  # the room's (never held here: released)
    room.release.set()
    waits = []

    def poll(timeout=0):
        if timeout:
            waits.append(timeout)
            # Bounded: were Ctrl-C not to interrupt it, the send would wait for room
            # for ever (a run stalled once): fail instead of hanging.
            assert len(waits) < 50, "SIGINT did not interrupt the waiting send"
        if timeout and not room.polling.is_set():  # the send waits for room: Ctrl-C
            signal.pthread_kill(main, signal.SIGINT)
        return plain_poll(timeout)

    room.kafka.poll = poll
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises
    try:
        with pytest.raises(KeyboardInterrupt):
            room.producer.send_turn(room.turn, effects=[room.effect])
    finally:
        signal.signal(signal.SIGINT, before)
    with pytest.raises(DeliveryError) as raised:
        room.producer.close(timeout_s=0)
    assert [eid for eid, _ in raised.value.failures] == [room.effect.event_id]
    assert room.kafka.closed and len(room.kafka.produced) == 1

_HANDLERS_CLOSE_WHILE_ANOTHER_THREAD_WAITS_FOR_ROOM = '''
import signal

told = {}
polled_elsewhere = threading.Event()  # a thread other than the main one polled


class Client:
    """The real client, its queue one event long; says when another thread polls."""

    def __init__(self, real):
        self._real = real

    def poll(self, timeout=0):
        if threading.current_thread() is not threading.main_thread():
            polled_elsewhere.set()
        return self._real.poll(timeout)

    def __len__(self):
        return len(self._real)

    def __getattr__(self, name):
        return getattr(self._real, name)


def handler(signum, frame):
    told["close"] = outcome(lambda: producer.close(timeout_s=0), "nothing")


producer = unreachable({"queue.buffering.max.messages": 1})
producer._producer = Client(producer._producer)
first, second = make_turn(), make_turn()
sent = producer.send(first)  # the queue is full from now on


def send_second():
    try:
        producer.send(second)
        told["send"] = "queued"
    except GatewayError as exc:
        told["send"] = type(exc).__name__


sender = threading.Thread(target=send_second, daemon=True)
sender.start()
signal.signal(signal.SIGUSR1, handler)
plain_done = sent.done


def done():
    """The main thread's wait checks its delivery: once the sender waits for room (a
    thread of its own polled), the signal lands here (where the wait holds its locks)."""
    if polled_elsewhere.is_set() and "signalled" not in told:
        told["signalled"] = True
        signal.raise_signal(signal.SIGUSR1)  # the handler runs before this returns
    return plain_done()


sent.done = done
told["wait"] = outcome(lambda: sent.wait(timeout_s=600), "written")  # never its timeout
sender.join(30)
for name in ("close", "wait", "send"):
    print(name, told.get(name))
print("first", first.event_id)
'''


def test_a_handlers_close_while_another_threads_send_waits_for_room_does_not_hang():
    """Thread S's send waits for room in librdkafka's full queue (the real client, one
    event long, broker unreachable); the main thread waits for its own ``Delivery``, and
    SIGUSR1's handler closes the producer there. The close ends S's send
    (``ProducerClosed``), purges the main thread's turn and raises it, and the wait
    raises it too. With session 48's report pump the main thread held ``_room`` there,
    S needed ``_room`` to let ``_sending`` go and the close waited for ``_sending``: a
    deadlock (the outside review's item left; killed at the bound)."""
    *told, first = run_script(_HANDLERS_CLOSE_WHILE_ANOTHER_THREAD_WAITS_FOR_ROOM,
                              timeout_s=30)
    event_id = first.removeprefix("first ")
    assert told == [f"close {[event_id]}", f"wait {[event_id]}", "send ProducerClosed"]
