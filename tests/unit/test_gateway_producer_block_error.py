"""Leaving a ``with GatewayProducer(...)`` block with the block's own exception: the
close's ``DeliveryError`` is not raised (the block's error is the one to see), and is
told as a note on the block's error (session 52; before, it was swallowed and its
failures told to no one: a failed turn left the block as if written)."""

from __future__ import annotations

import pytest

from ratchet.samples import make_turn
from tests.unit.test_gateway_library_open_items import RETRIABLE
from tests.unit.test_gateway_producer_signal_points import _named, _producer


def test_a_block_that_raises_carries_the_close_s_failures_as_a_note():
    producer, kafka = _producer()
    event_id = producer.send(make_turn()).event_ids[0]
    kafka.deliver(0, RETRIABLE)
    with pytest.raises(RuntimeError) as raised, producer:
        raise RuntimeError("the block's own error")
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == 1 and "DeliveryError" in notes[0] and event_id in notes[0]
    # Told once: the thread's flush after it names nothing again.
    assert _named(lambda: producer.flush(0)) == []


def test_a_block_that_raises_with_everything_delivered_gets_no_note():
    producer, kafka = _producer()
    producer.send(make_turn())
    kafka.deliver(0, None)
    with pytest.raises(RuntimeError) as raised, producer:
        raise RuntimeError("the block's own error")
    assert getattr(raised.value, "__notes__", []) == []
