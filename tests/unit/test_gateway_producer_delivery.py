"""Each send's own delivery, whatever thread or coroutine waits for it (an outside
review of the gateway library, session 48).

docs/gateway-protocol.md, section 1: a gateway MUST NOT report a turn persisted before
the broker acknowledged it with an offset. ``flush`` tells each *thread* each delivery
failure once: with several requests served by one thread (coroutines on an asyncio
event loop, a synchronous server handling requests in turn), one request's flush was
told another's failure, and the other's flush then returned as if its turn had been
written. ``send`` / ``send_turn`` now return the ``Delivery`` of their events, whose
``wait`` (``wait_async`` on an event loop) raises their failures, and only theirs.

No broker is needed: librdkafka is replaced by ``FakeKafka``.
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError, FlushTimeout
from tests.unit.test_gateway_library_review import effect_of, gateway

TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT)


def test_two_coroutines_on_one_loop_are_each_told_their_own_delivery():
    """Coroutine A's turn fails, B's is written; B waits first. A's wait raises A's
    failure (a flush of A's there returned: B's flush had been told it)."""
    producer, kafka = gateway()
    a_turn, b_turn = make_turn(), make_turn()
    told: dict[str, object] = {}

    async def request(name, turn, delivered):
        sending = producer.send_turn(turn)
        await delivered.wait()  # the broker answered both
        try:
            await sending.wait_async(5)
            told[name] = "written"
        except DeliveryError as exc:
            told[name] = [eid for eid, _ in exc.failures]

    async def main():
        a_answered, b_answered = asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(request("A", a_turn, a_answered))
        b = asyncio.create_task(request("B", b_turn, b_answered))
        await asyncio.sleep(0)  # both sent
        kafka.deliver(0, TIMED_OUT)  # A's
        kafka.deliver(0)  # B's
        b_answered.set()
        await b
        a_answered.set()
        await a

    asyncio.run(main())
    assert told == {"B": "written", "A": [a_turn.event_id]}
    with pytest.raises(DeliveryError):  # the thread's flushes are told it as before
        producer.close(timeout_s=0)


def test_a_flush_of_the_same_thread_first_does_not_hide_a_sends_failure():
    """The same in one thread without asyncio: the thread's flush is told the failure
    (as before), and the failed send's ``Delivery`` still raises it."""
    producer, kafka = gateway()
    first = producer.send(make_turn())
    second = producer.send(make_turn())
    kafka.deliver(0, TIMED_OUT)
    kafka.deliver(0)
    with pytest.raises(DeliveryError):
        producer.flush(1)
    with pytest.raises(DeliveryError) as raised:
        first.wait(1)
    assert [eid for eid, _ in raised.value.failures] == list(first.event_ids)
    assert raised.value.retryable and raised.value.pending == 0
    second.wait(1)  # written: returns
    producer.close(timeout_s=0)


def test_a_turns_delivery_covers_its_effects_and_waits_for_every_report():
    """Effects and turn are one ``Delivery``; not all reported within the timeout:
    ``FlushTimeout`` with those in flight; an effect failed: ``DeliveryError`` naming
    it, with the turn still in flight counted as ``pending``."""
    producer, kafka = gateway()
    turn = make_turn()
    effect = effect_of(turn)
    sent = producer.send_turn(turn, effects=[effect])
    assert sent.event_ids == (effect.event_id, turn.event_id)
    with pytest.raises(FlushTimeout) as in_flight:
        sent.wait(0.2)  # FakeKafka answers only when told
    assert in_flight.value.pending == 2
    kafka.deliver(0, TIMED_OUT)  # the effect's report, served by the wait's reports
    with pytest.raises(DeliveryError) as raised:
        sent.wait(0.2)
    assert [eid for eid, _ in raised.value.failures] == [effect.event_id]
    assert raised.value.pending == 1
    kafka.deliver(0)
    with pytest.raises(DeliveryError) as raised:  # its failure stays its own
        sent.wait(1)
    assert raised.value.pending == 0 and sent.done()
    with pytest.raises(DeliveryError):  # the thread never flushed: told by its close
        producer.close(timeout_s=0)


def test_a_delivery_purged_by_close_is_reported_by_its_wait():
    producer, kafka = gateway()
    sent = producer.send(make_turn())
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=0)
    with pytest.raises(DeliveryError) as raised:
        sent.wait(1)
    assert [eid for eid, _ in raised.value.failures] == list(sent.event_ids)
    assert raised.value.retryable
