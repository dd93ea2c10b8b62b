"""The processor bench's paced latency runs: the turn mix of the throughput run, and a
clock that matches each outcome to its own record when a key carries several.

The latency rate is half of the throughput run's maximum, which was measured with
several turns per Conversation; a paced run of first turns only would cost more per
turn (a Conversation's owner is read and written on its first turn) than the run its
rate came from.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ratchet.bench.latency import TURN_SPACING_S, paced_turns
from ratchet.bench.probe import RecordClock


def test_the_nth_outcome_of_a_key_answers_its_nth_record():
    clock = RecordClock(rejections_topic="rejections")
    clock.mark_sent(b"a", 1.000)
    clock.mark_sent(b"b", 1.010)
    clock.mark_sent(b"a", 1.020)
    clock.mark_arrived(b"b", "checkpoints", 1.015)
    clock.mark_arrived(b"a", "checkpoints", 1.030)
    clock.mark_arrived(b"a", "checkpoints", 1.050)
    # In sent order: a's first (30 ms), b's (5 ms), a's second (30 ms).
    assert clock.latencies_ms() == pytest.approx([30.0, 5.0, 30.0])
    assert (clock.received, clock.rejected) == (3, 0)


def test_a_record_without_its_outcome_has_no_figure_and_rejections_are_counted():
    clock = RecordClock(rejections_topic="rejections")
    clock.mark_sent(b"a", 1.0)
    clock.mark_sent(b"a", 2.0)
    clock.mark_arrived(b"a", "rejections", 1.5)
    assert clock.latencies_ms() == pytest.approx([500.0])
    assert (clock.received, clock.rejected) == (1, 1)
    clock.reset()
    assert (clock.latencies_ms(), clock.received, clock.rejected) == ([], 0, 0)


class _Rig:
    """What ``encoded_turn`` uses of a rig; the 'encoded' value is the turn itself."""

    serde = SimpleNamespace(encode=lambda turn, topic: turn)
    topics = SimpleNamespace(gateway_events="gateway-events")


@pytest.mark.parametrize(("turns", "per_conversation", "rate"), [(30, 3, 20.0), (7, 3, 4.0),
                                                                  (5, 1, 100.0)])
def test_paced_turns_keep_each_conversation_in_order_and_spaced(turns, per_conversation,
                                                                 rate):
    items = paced_turns(_Rig(), turns, per_conversation, rate)
    assert len(items) == turns
    seen: dict[str, list[int]] = {}
    for position, (key, turn, response_id, conversation) in enumerate(items):
        assert key == conversation.encode()  # the Conversation's partition key
        assert turn.conversation_id == conversation and turn.response_id == response_id
        seen.setdefault(conversation, []).append(position)
        # Each turn extends the one before it: heads 0, 1, 2, ...
        assert turn.expected_head_seq == len(seen[conversation]) - 1
    assert len({turn.response_id for _, turn, _, _ in items}) == turns
    group = max(1, round(rate * TURN_SPACING_S))
    for positions in seen.values():
        assert len(positions) <= per_conversation
        # A Conversation's next turn comes a group of turns (about half a second) later.
        assert all(b - a == group for a, b in zip(positions, positions[1:], strict=False))
