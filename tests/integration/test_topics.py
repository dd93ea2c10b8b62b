"""Topic housekeeping against the real broker: ``ensure_topics`` makes every contract topic
with the configured partitions, and ``delete_topics_with_prefix`` removes exactly the
topics of one isolated run (leftovers slow every later broker start)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from streams.topics import delete_topics_with_prefix, ensure_topics

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
