"""The size limit each ratchet topic needs, and which existing topics must be raised to
it (pure; the broker round trip is tests/integration/test_topics.py)."""

from __future__ import annotations

from schemas.limits import DEAD_LETTER_MAX_MESSAGE_BYTES, MIB, TOPIC_MAX_MESSAGE_BYTES
from streams.topics import Topics, limits_to_raise, max_message_bytes, topic_config

TOPICS = Topics.with_prefix("ratchet.")


def test_dead_letters_take_twice_the_other_topics_and_one_mib():
    assert max_message_bytes(TOPICS, TOPICS.dead_letters) == DEAD_LETTER_MAX_MESSAGE_BYTES
    others = set(vars(TOPICS).values()) - {TOPICS.dead_letters}
    assert {max_message_bytes(TOPICS, name) for name in others} == {TOPIC_MAX_MESSAGE_BYTES}
    assert DEAD_LETTER_MAX_MESSAGE_BYTES == 2 * TOPIC_MAX_MESSAGE_BYTES + MIB
    assert topic_config(TOPICS, TOPICS.gateway_events) == {
        "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}


def test_only_limits_below_the_requirement_are_raised_never_lowered():
    required = {"low": 16 * MIB, "equal": 16 * MIB, "operators": 16 * MIB}
    current = {"low": MIB, "equal": 16 * MIB, "operators": 64 * MIB}
    assert limits_to_raise(current, required) == {"low": (MIB, 16 * MIB)}
