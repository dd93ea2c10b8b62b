"""The gateway library's items left open by session 43's review (session 44).

docs/service.md, section 3: delivery failures are raised on the next ``flush`` of each
thread, once per thread; a sending thread is told the failures reported from its send
on, a thread's first flush every failure no thread that sent before it has flushed past;
every refusal of the library is a typed ``GatewayError`` saying whether a retry helps;
``close()`` (also leaving the ``with`` block) releases what the object holds.

1. The producer kept each thread's place in its failures by ``threading.get_ident()``;
   Python reuses idents, so a thread that ended left its place to the next thread given
   its ident: that thread was told failures it never produced (reported before it
   sent), or not told a failure another thread's send was waiting for.
2. ``send_turn`` refused an effect keyed apart from its turn with a plain
   ``ValueError``.
3. ``EffectClaims`` had no context manager.

No broker is needed: librdkafka is replaced by ``FakeKafka`` (the session 43 review's).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_tool_effect, make_turn
from schemas.keys import MissingChainRoot
from services.gateway.errors import (
    DeliveryError,
    EffectKeyedApart,
    GatewayError,
    UnservableId,
)
from services.gateway.events import TurnIdentity
from tests.unit.test_gateway_library_review import gateway

RETRIABLE = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, "not enough replicas", retriable=True)


def run_in_thread(fn: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    return thread


def run_with_ident(ident: int, fn: Callable[[], None]) -> None:
    """Run ``fn`` in a new thread that has the ident ``ident`` (of a thread that ended):
    start and join threads until the platform hands that ident out again (glibc reuses
    a joined thread's stack, and its ident, within a few threads)."""
    ran: list[bool] = []

    def maybe() -> None:
        if threading.get_ident() == ident:
            ran.append(True)
            fn()

    for _ in range(1000):
        run_in_thread(maybe)
        if ran:
            return
    pytest.fail(f"no new thread was given the ident {ident} in 1000 threads")


# 1. ------------------------------------------------------------------------------------
def test_a_new_thread_with_a_reused_ident_is_not_told_failures_reported_before_it_sent():
    """A thread sends and ends; its event fails; a new thread given the same ident sends
    and flushes: it is told only what failed from its send on (nothing here). Keyed by
    ident, it was told the ended thread's failure as its own."""
    producer, kafka = gateway()
    told: list[DeliveryError | None] = []
    first = run_in_thread(lambda: producer.send(make_turn()))
    kafka.deliver(0, RETRIABLE)  # the ended thread's event failed
    kafka.poll()

    def second() -> None:
        producer.send(make_turn())
        kafka.deliver(0)  # its own event is written
        try:
            producer.flush(1)
            told.append(None)
        except DeliveryError as exc:
            told.append(exc)

    run_with_ident(first.ident, second)
    assert told == [None], f"told of a failure reported before it sent: {told}"


def test_a_new_thread_with_a_reused_ident_is_told_what_a_sender_has_not_flushed_past():
    """This thread sends; its event fails. A thread flushes (told of it) and ends; a new
    thread given the same ident flushes for the first time: it is told the failure, which
    the sender has not flushed past (an executor thread flushing for the sender). Keyed by
    ident, it took the ended thread's place, past the failure, and was told nothing."""
    producer, kafka = gateway()
    mine = make_turn()
    producer.send(mine)
    kafka.deliver(0, RETRIABLE)
    told: list[DeliveryError | None] = []

    def flusher() -> None:
        try:
            producer.flush(1)
            told.append(None)
        except DeliveryError as exc:
            told.append(exc)

    first = run_in_thread(flusher)
    run_with_ident(first.ident, flusher)
    assert len(told) == 2 and all(isinstance(exc, DeliveryError) for exc in told), told
    assert [eid for eid, _ in told[1].failures] == [mine.event_id]
    with pytest.raises(DeliveryError):  # and the sender is still told, once
        producer.flush(1)
    producer.flush(1)
    assert producer._failure_log == []  # no thread left needs it: not kept



# 2. ------------------------------------------------------------------------------------
def test_an_effect_keyed_apart_from_its_turn_is_a_typed_refusal_with_nothing_produced():
    producer, kafka = gateway()
    turn = make_turn()
    effect = make_tool_effect("call_1", idempotency_key=turn.idempotency_key,
                              conversation_id="conv_other")
    with pytest.raises(EffectKeyedApart, match="TurnIdentity") as refused:
        producer.send_turn(turn, effects=[effect])
    assert isinstance(refused.value, GatewayError) and not refused.value.retryable
    assert (refused.value.effect_id, refused.value.effect_key, refused.value.turn_key) == (
        effect.effect_id, "conv_other", turn.conversation_id)
    assert kafka.produced == []


def test_a_continued_chain_without_its_root_is_a_typed_refusal_with_nothing_produced():
    producer, kafka = gateway()
    turn = make_turn(conversation_id=None, expected_head_seq=None, chain_root_id=None,
                     previous_response_id="resp_0")
    for send in (producer.send, producer.send_turn):
        with pytest.raises(GatewayError, match="pass chain_root_id") as refused:
            send(turn)
        assert isinstance(refused.value, MissingChainRoot) and not refused.value.retryable
    with pytest.raises(GatewayError, match="pass chain_root_id"):
        TurnIdentity.chain("t1", "resp_1", previous_response_id="resp_0")
    assert kafka.produced == []


def test_an_event_with_an_empty_key_is_a_typed_refusal():
    producer, kafka = gateway()
    with pytest.raises(UnservableId):
        producer.send(make_turn(conversation_id=""))
    assert kafka.produced == []
