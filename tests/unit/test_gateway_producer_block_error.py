"""Leaving a ``with GatewayProducer(...)`` block with the block's own exception: the
close's ``DeliveryError`` is not raised (the block's error is the one to see), and is
told as a note on the block's error (session 52; before, it was swallowed and its
failures told to no one: a failed turn left the block as if written)."""

from __future__ import annotations

import pytest

from ratchet.samples import make_turn
from tests.unit.test_gateway_library_open_items import RETRIABLE
from tests.unit.test_gateway_producer_signal_points import _named, _producer


@pytest.mark.parametrize("kind", [RuntimeError, KeyboardInterrupt, SystemExit])
def test_a_block_that_raises_carries_the_close_s_failures_as_a_note(kind):
    """Any block error, a ``BaseException`` too (``add_note`` is ``BaseException``'s)."""
    producer, kafka = _producer()
    event_id = producer.send(make_turn()).event_ids[0]
    kafka.deliver(0, RETRIABLE)
    with pytest.raises(kind) as raised, producer:
        raise kind("the block's own error")
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


def test_a_block_s_note_names_every_failed_event_past_the_error_s_first_five():
    """The ``DeliveryError``'s text lists five failures and counts the rest ("+N more"):
    a note made of that text alone named five of seven failed events, and the other two
    were told to no one (the close had moved the thread's cursor past them: its next
    flush names nothing). Every failed event is named in the note (rrevy's outside
    review, session 52)."""
    producer, kafka = _producer()
    event_ids = [producer.send(make_turn()).event_ids[0] for _ in range(7)]
    for _ in event_ids:
        kafka.deliver(0, RETRIABLE)
    with pytest.raises(RuntimeError) as raised, producer:
        raise RuntimeError("the block's own error")
    notes = getattr(raised.value, "__notes__", [])
    assert len(notes) == 1 and "DeliveryError" in notes[0]
    assert [event_id for event_id in event_ids if event_id not in notes[0]] == []
    assert _named(lambda: producer.flush(0)) == []
