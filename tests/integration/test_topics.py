"""Topic housekeeping against the real broker: ``ensure_topics`` makes every contract topic
with the configured partitions and size limit (and raises the limit of topics an older
deployment made), and ``delete_topics_with_prefix`` removes exactly the topics of one
isolated run (leftovers slow every later broker start)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import replace

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from schemas.limits import DEAD_LETTER_MAX_MESSAGE_BYTES, MIB, TOPIC_MAX_MESSAGE_BYTES
from streams.topics import delete_topics_with_prefix, ensure_topics, topic_names

pytestmark = pytest.mark.integration


def _topics(kafka_admin) -> dict:
    return kafka_admin.list_topics(timeout=30).topics


def _wait_gone(kafka_admin, names: set[str], timeout_s: float = 30) -> set[str]:
    deadline = time.monotonic() + timeout_s
    left = names & set(_topics(kafka_admin))
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = names & set(_topics(kafka_admin))
    return left


def test_isolated_topics_are_created_then_deleted_by_prefix(settings, kafka_admin,
                                                            unique_name):
    mine = replace(settings, topic_prefix=f"{unique_name('mine')}.", partitions=3)
    other = replace(settings, topic_prefix=f"{unique_name('other')}.", partitions=2)
    created = set(vars(ensure_topics(mine)).values())
    kept = set(vars(ensure_topics(other)).values())
    try:
        listed = _topics(kafka_admin)
        assert created <= set(listed)
        assert {len(listed[name].partitions) for name in created} == {3}

        deleted = delete_topics_with_prefix(settings.kafka_bootstrap, [mine.topic_prefix])

        assert set(deleted) == created
        assert _wait_gone(kafka_admin, created) == set()
        assert kept <= set(_topics(kafka_admin))  # another run's topics are untouched
    finally:
        delete_topics_with_prefix(settings.kafka_bootstrap, [mine.topic_prefix,
                                                             other.topic_prefix])


def test_an_empty_prefix_deletes_nothing(settings, kafka_admin, unique_name):
    run = replace(settings, topic_prefix=f"{unique_name('keep')}.")
    names = set(vars(ensure_topics(run)).values())
    try:
        assert delete_topics_with_prefix(settings.kafka_bootstrap, [""]) == []
        assert names <= set(_topics(kafka_admin))
    finally:
        delete_topics_with_prefix(settings.kafka_bootstrap, [run.topic_prefix])


def _max_message_bytes(kafka_admin, names: Iterable[str]) -> dict[str, int]:
    """``max.message.bytes`` of each topic as the broker reports it (a topic created a
    moment ago may be unknown to it for a little while)."""
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in names]
    deadline = time.monotonic() + 30
    while True:
        try:
            return {res.name: int(future.result(timeout=30)["max.message.bytes"].value)
                    for res, future in kafka_admin.describe_configs(resources).items()}
        except KafkaException as exc:
            if exc.args[0].name() != "UNKNOWN_TOPIC_OR_PART" or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_existing_topics_are_raised_to_the_size_limit_never_lowered(settings, kafka_admin,
                                                                    unique_name, caplog):
    """A running deployment upgrading: its topics exist with the broker's 1 MiB default,
    so the documented maximum would not hold; ``ensure_topics`` raises them, keeps an
    operator's larger value, and says what it changed."""
    run = replace(settings, topic_prefix=f"{unique_name('upgrade')}.", partitions=1)
    names = topic_names(run)
    operators = 32 * MIB
    old = [NewTopic(names.gateway_events, 1, 1, config={"max.message.bytes": str(MIB)}),
           NewTopic(names.dead_letters, 1, 1),  # the broker's default (1 MiB + 12 bytes)
           NewTopic(names.checkpoints, 1, 1, config={"max.message.bytes": str(operators)})]
    try:
        for future in kafka_admin.create_topics(old).values():
            future.result(timeout=30)
        before = _max_message_bytes(kafka_admin, [names.gateway_events, names.dead_letters])
        assert before[names.gateway_events] == MIB
        assert before[names.dead_letters] < DEAD_LETTER_MAX_MESSAGE_BYTES

        with caplog.at_level(logging.INFO, logger="streams.topics"):
            ensure_topics(run)

        assert _max_message_bytes(kafka_admin, vars(names).values()) == {
            names.gateway_events: TOPIC_MAX_MESSAGE_BYTES,
            names.checkpoints: operators,  # larger than required: never lowered
            names.rejections: TOPIC_MAX_MESSAGE_BYTES,  # created now
            names.orphaned_effects: TOPIC_MAX_MESSAGE_BYTES,
            names.dead_letters: DEAD_LETTER_MAX_MESSAGE_BYTES,
        }
        raised = [r.getMessage() for r in caplog.records if "raised" in r.getMessage()]
        assert sorted(raised) == sorted([
            f"raised max.message.bytes of topic {names.gateway_events} from {MIB} "
            f"to {TOPIC_MAX_MESSAGE_BYTES}",
            f"raised max.message.bytes of topic {names.dead_letters} from "
            f"{before[names.dead_letters]} to {DEAD_LETTER_MAX_MESSAGE_BYTES}",
        ])

        caplog.clear()
        with caplog.at_level(logging.INFO, logger="streams.topics"):
            ensure_topics(run)  # the next start finds nothing to change
        assert not [r for r in caplog.records if "raised" in r.getMessage()]
    finally:
        delete_topics_with_prefix(settings.kafka_bootstrap, [run.topic_prefix])
