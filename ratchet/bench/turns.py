"""The bench's turns on the wire: ``TurnCompleted`` records encoded once, before any
clock runs (or, for the gateway's send, built once with their tool effect), and a raw
read of what is on a topic now."""

from __future__ import annotations

import time

from confluent_kafka import Consumer

from ratchet.bench.measure import unique_name
from ratchet.samples import make_tool_loop_turn, make_turn
from schemas.avro import encode_key
from schemas.models import ToolEffect, TurnCompleted
from streams.testing import Rig


def encoded_turn(rig: Rig, conversation: str, head: int, now_ms: int) -> tuple[bytes, bytes, str]:
    """(key, value, response id) of turn ``head`` of ``conversation``, encoded."""
    response_id = unique_name("resp")
    turn = make_turn(conversation_id=conversation, expected_head_seq=head, now_ms=now_ms,
                     response_id=response_id, idempotency_key=unique_name("idem"))
    return (encode_key(conversation), rig.serde.encode(turn, rig.topics.gateway_events),
            response_id)


def encoded_turns(rig: Rig, conversations: int, per_conversation: int) -> list[list[tuple]]:
    """``rounds[r]`` = (key, value) of turn r of every conversation, encoded once."""
    now = int(time.time() * 1000)
    convs = [unique_name("conv") for _ in range(conversations)]
    return [[encoded_turn(rig, conv, head, now)[:2] for conv in convs]
            for head in range(per_conversation)]


def gateway_turns(conversations: int, per_conversation: int
                  ) -> list[tuple[TurnCompleted, list[ToolEffect]]]:
    """The same mix as ``encoded_turns`` (``per_conversation`` turns of each
    Conversation, in round order), each turn as a gateway sends it: one tool round (a
    function call and its output, the effect published before the turn), a token
    artifact and a boundary proof. Built, not encoded: the gateway bench times both."""
    now = int(time.time() * 1000)
    convs = [unique_name("conv") for _ in range(conversations)]
    return [make_tool_loop_turn(rounds=1, total_items=6, conversation_id=conv,
                                expected_head_seq=head, now_ms=now)
            for head in range(per_conversation) for conv in convs]


def consume_now(consumer: Consumer, timeout_s: float) -> list:
    """The messages there now, waiting up to ``timeout_s`` for the first one only.
    ``Consumer.consume(n, timeout)`` returns when n messages came or the timeout passed,
    so a clock read after it is late by up to the timeout (it was: 0-100 ms on every
    latency sample, 0.2 s on the end of the throughput window)."""
    first = consumer.poll(timeout_s)
    return [] if first is None else [first, *consumer.consume(1000, timeout=0)]
