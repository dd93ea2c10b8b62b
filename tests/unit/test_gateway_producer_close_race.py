"""The gateway producer's ``close`` in one thread while another thread is inside
librdkafka's ``poll`` or ``flush`` on the same producer (left open since before session
45; found out in session 46).

docs/service.md, section 3: ``close`` waits for the queued events at most ``timeout_s``,
purges the rest and raises what was not delivered; every event's failure is raised once
to each thread by its next ``flush`` (or ``close``); a ``close`` never aborts or hangs.

1. A send waiting for room in librdkafka's full queue (it holds the send lock and
   ``poll``s until a delivery report makes room) kept another thread's ``close`` waiting
   for that lock until one of the queued events was delivered or timed out: up to
   ``delivery.timeout.ms`` (30 s) for each event of the turn, whatever the close's
   ``timeout_s``; with a queue that never drains, for ever. That send is now ended by
   the close (``ProducerClosed`` naming the events of its turn queued before it, which
   the close purges and reports): the close goes on at once.
2. A ``flush`` in another thread: confluent-kafka's ``close`` waits for the calls inside
   the client and ends a ``flush`` at its next 200 ms chunk; the purged events'
   reports are served before it returns, and each thread is told them once. This
   held before session 46 too (kept as the promise docs/service.md now makes).

With the real client each case runs in a process of its own (an abort ends the
process), an unreachable broker: nothing is ever delivered.
"""

from __future__ import annotations

import threading

from ratchet.samples import make_turn
from services.gateway.errors import ProducerClosed
from tests.unit.producer_process import run_script
from tests.unit.test_gateway_library_review import effect_of, gateway

# The main thread sends the first event, thread A the second and flushes; the main
# thread closes once A is inside librdkafka's ``poll`` (waiting for room: "room") or
# ``flush`` ("flush"). Each line says what a
# thread was told; "took" is the close's time against the events' 30 s timeout.
_CLOSE_RACING_A_POLL = """
case = sys.argv[1]
config = {"message.timeout.ms": 30_000}
if case == "room":
    config["queue.buffering.max.messages"] = 1
producer = unreachable(config)
inside = threading.Event()
serve, flush = producer._serve_reports, producer.flush


def serve_and_say(timeout_s=0):  # a send waiting for room polls with a timeout
    if timeout_s:
        inside.set()
    return serve(timeout_s)


producer._serve_reports = serve_and_say
first, second = make_turn(), make_turn()
names = {first.event_id: "first", second.event_id: "second"}
told = []


def told_of(exc):
    return sorted((names.get(eid, eid), "purged" if "closed before" in why else why)
                  for eid, why in getattr(exc, "failures", ()))


def thread_a():
    try:
        if case == "room":
            producer.send(second)  # librdkafka's queue holds one: it waits for room
            told.append("A send: returned")
        else:
            producer.send(second)
            inside.set()  # (flush) A's flush is about to wait 30 s in librdkafka
            producer.flush(60)
            told.append("A flush: returned")
    except GatewayError as exc:
        told.append(f"A {type(exc).__name__}: {told_of(exc)}")
    for _ in range(2):  # what A's next flushes are told: each failure once (the first
        try:  # waits for the close's purge)
            producer.flush(60)
            told.append("A then: nothing")
        except GatewayError as exc:
            told.append(f"A then {type(exc).__name__}: {told_of(exc)}")


producer.send(first)  # the closing thread sends too: each thread is told every failure
a = threading.Thread(target=thread_a)
a.start()
inside.wait(30)
if case == "flush":
    time.sleep(0.3)  # let A's flush reach librdkafka (either way every event is told)
start = time.monotonic()
try:
    producer.close(timeout_s=1)
    told.append("close: returned")
except GatewayError as exc:
    told.append(f"close {type(exc).__name__}: {told_of(exc)}")
took = time.monotonic() - start
a.join(90)
for line in told:
    print(line)
print("A ended:", not a.is_alive())
print("took under 10 s:", took < 10, round(took, 1))
sys.stdout.flush()
"""


def _run(case: str) -> list[str]:
    return run_script(_CLOSE_RACING_A_POLL, case, timeout_s=150)


def test_a_close_while_another_threads_send_waits_for_room_ends_that_send():
    """librdkafka's queue (one event here) full: thread A's second send polls for room
    holding the send lock. The close in another thread waited for it until the first
    event timed out (30 s, with ``timeout_s=1``), then purged the second: A's send
    returned as if its turn were on its way. Now the close ends A's wait at once: A's
    send is ``ProducerClosed`` (the second event never produced, never reported), the
    first event is purged and told once to each thread."""
    lines = _run("room")
    assert "A ProducerClosed: []" in lines, lines  # no failure of its own to list
    assert "close DeliveryError: [('first', 'purged')]" in lines, lines  # not timed out
    assert "A then DeliveryError: [('first', 'purged')]" in lines, lines
    assert "A then: nothing" in lines, lines  # told once
    assert "A ended: True" in lines, lines
    assert any(line.startswith("took under 10 s: True") for line in lines), lines


def test_a_close_while_another_thread_flushes_tells_each_thread_once():
    """Thread A inside librdkafka's ``flush`` (waiting 60 s for two events) when the
    main thread closes with ``timeout_s=1``: the close purges both, A's flush returns
    and raises both (retryable), once; the close raises them to its own thread; no
    abort, no hang, no report after the close returned."""
    lines = _run("flush")
    both = "[('first', 'purged'), ('second', 'purged')]"
    assert f"A DeliveryError: {both}" in lines, lines
    assert f"close DeliveryError: {both}" in lines, lines
    assert lines.count("A then: nothing") == 2, lines
    assert "A ended: True" in lines, lines
    assert any(line.startswith("took under 10 s: True") for line in lines), lines


# Thread B sends once the main thread's close has begun (marked the producer closing)
# and before that close takes the send lock: the close is held there until B's send
# returned or raised. The close then waits 1 s for the events and purges the rest.
_SEND_AS_A_CLOSE_BEGINS = """
producer = unreachable({"message.timeout.ms": 30_000})
first, second = make_turn(), make_turn()
names = {first.event_id: "first", second.event_id: "second"}
began, sent, told = threading.Event(), threading.Event(), []


class Closing(type(producer._closing)):
    def set(self):  # the close marks the producer closing, then B sends
        super().set()
        began.set()
        sent.wait(30)


producer._closing = Closing()


def told_of(exc):
    return sorted((names.get(eid, eid), "purged" if "closed before" in why else why)
                  for eid, why in getattr(exc, "failures", ()))


def thread_b():
    began.wait(30)
    try:
        producer.send(second)
        told.append("B send: returned")
    except GatewayError as exc:
        told.append(f"B {type(exc).__name__}: {told_of(exc)}")
        told.append(f"B names second: {second.event_id in str(exc)}")
    sent.set()
    for _ in range(2):  # what B's flushes are told
        try:
            producer.flush(60)
            told.append("B then: nothing")
        except GatewayError as exc:
            told.append(f"B then {type(exc).__name__}: {told_of(exc)}")


producer.send(first)
b = threading.Thread(target=thread_b)
b.start()
try:
    producer.close(timeout_s=1)
    told.append("close: returned")
except GatewayError as exc:
    told.append(f"close {type(exc).__name__}: {told_of(exc)}")
b.join(90)
for line in told:
    print(line)
print("B ended:", not b.is_alive())
sys.stdout.flush()
"""


def test_a_send_that_starts_once_a_close_began_is_refused_and_queues_nothing():
    """Thread B's send starts after the main thread's close began and before it took
    the send lock. It queued its event and returned, as if the event were on its way,
    and the close then purged it (told only to flushes, as a delivery failure). A send
    that starts once a close began is ``ProducerClosed`` now, naming the event it did
    not produce; nothing of it is queued, purged or reported (session 47)."""
    lines = run_script(_SEND_AS_A_CLOSE_BEGINS, timeout_s=150)
    assert "B ProducerClosed: []" in lines, lines
    assert "B names second: True" in lines, lines
    assert "close DeliveryError: [('first', 'purged')]" in lines, lines
    # B's flushes: the first's purge or nothing (B never sent: told what no sender has
    # flushed past, as any first flush), never the second, which was not produced.
    assert not [line for line in lines if "'second'" in line], lines
    assert "B ended: True" in lines, lines


def test_a_close_while_another_threads_turn_waits_for_room_that_never_comes_returns():
    """A queue that never drains (``FakeKafka`` makes no room): the close in another
    thread waited for the send lock for ever. Now it ends the wait: the send is
    ``ProducerClosed`` naming the effect queued before it and asking for the whole turn
    again; the close purges that effect and raises it."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    plain_produce = kafka.produce
    waiting = threading.Event()
    never = threading.Event()

    def produce_until_full(topic, value, key, on_delivery):
        if kafka.queued:
            raise BufferError("Local: Queue full")
        plain_produce(topic, value, key, on_delivery)

    plain_poll = kafka.poll

    def poll(timeout=0):
        if timeout:  # the send waits for room
            waiting.set()
            never.wait(timeout)
        return plain_poll(0)

    kafka.produce, kafka.poll = produce_until_full, poll
    sent: list[BaseException | None] = []

    def send() -> None:
        try:
            producer.send_turn(turn, effects=effects)
            sent.append(None)
        except ProducerClosed as exc:
            sent.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    assert waiting.wait(10)
    closed: list[BaseException | None] = []

    def close() -> None:
        try:
            producer.close(timeout_s=0)
            closed.append(None)
        except Exception as exc:  # noqa: BLE001 - asserted below
            closed.append(exc)

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(10)
    assert not closer.is_alive(), "the close waited for ever for the send lock"
    sender.join(10)
    assert isinstance(sent[0], ProducerClosed)
    assert effects[0].event_id in str(sent[0]) and "whole turn" in str(sent[0])
    assert [eid for eid, _ in closed[0].failures] == [effects[0].event_id]  # purged
    assert closed[0].retryable
    assert kafka.closed and len(kafka.produced) == 1


def test_a_turn_sent_once_a_close_began_is_refused_naming_each_of_its_events():
    """The same with a turn (``FakeKafka``; the send runs as the close marks the
    producer closing, before it takes the send lock): it queued the effects and the
    turn, which the close purged. Now nothing of the turn is produced, and the refusal
    names every event of it, to be sent again whole with a new producer."""
    producer, kafka = gateway()
    turn = make_turn()
    effects = [effect_of(turn, "call_1"), effect_of(turn, "call_2")]
    refused: list[ProducerClosed] = []

    class Closing(type(producer._closing)):
        def set(self) -> None:  # another thread's send_turn runs now
            super().set()
            try:
                producer.send_turn(turn, effects=effects)
            except ProducerClosed as exc:
                refused.append(exc)

    producer._closing = Closing()
    producer.close(timeout_s=0)  # nothing queued: nothing purged, nothing raised
    assert kafka.produced == [] and kafka.closed
    assert len(refused) == 1
    assert all(e.event_id in str(refused[0]) for e in (*effects, turn)), str(refused[0])
    assert "whole turn" in str(refused[0])
