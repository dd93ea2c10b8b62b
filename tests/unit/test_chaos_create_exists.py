"""Chaos's own keyspace and topics when the create reads "exists already" (no server:
stand-ins for the driver and the admin client).

The name exists either because something made it before the run (a tag's collision, a
hand) or because the run's own create applied and was sent again (the driver or
librdkafka retrying a request whose answer was lost). The run cannot tell which, so it
neither uses nor deletes it; it said only "made before this run", leaving one of its own
unnamed (session 48's review, left). Now the line names the name, that it may be the
run's own, and the command that removes it once sure.
"""

from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka import KafkaError, KafkaException

from ratchet.chaos import run_topics, runner
from ratchet.settings import Settings


@pytest.fixture
def chaos(tmp_path):
    return dataclasses.replace(Settings.from_env({}), home=tmp_path, keyspace="chaos_7xabc123",
                               topic_prefix="chaos-7xabc123.")


def test_a_keyspace_that_exists_already_is_named_with_its_drop(chaos, monkeypatch):
    from cassandra import AlreadyExists

    class Session:
        def execute(self, *_args, **_kwargs):
            raise AlreadyExists(keyspace=chaos.keyspace)

    class Cluster:
        def connect(self):
            return Session()

        def shutdown(self):
            pass

    monkeypatch.setattr("services.cassandra_cluster.open_cluster", lambda _s: Cluster())
    with pytest.raises(runner.ChaosSetupFailed) as refused:
        runner._make_keyspace(chaos, print)
    said = str(refused.value)
    assert f"keyspace {chaos.keyspace} exists already" in said, said
    assert "this run's own create, sent again after it applied" in said, said
    assert f"DROP KEYSPACE IF EXISTS {chaos.keyspace};" in said, said


def test_topics_that_exist_already_are_named_with_their_delete(chaos, monkeypatch):
    from concurrent.futures import Future

    class Metadata:
        brokers = {1: None}

    class Admin:
        def list_topics(self, **_kwargs):
            return Metadata()

        def create_topics(self, topics, **_kwargs):
            out = {}
            for topic in topics:
                out[topic.topic] = Future()
                out[topic.topic].set_exception(
                    KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
            return out

    monkeypatch.setattr(run_topics, "_admin", lambda _s: Admin())
    made: list[str] = []
    with pytest.raises(run_topics.TopicsNotMade) as refused:
        run_topics.make(chaos, "chaos-7xabc123", made)
    said = str(refused.value)
    assert made == []
    assert "this run's own create, sent again after it applied" in said, said
    for topic in run_topics.wanted(chaos, "chaos-7xabc123", 1):
        assert run_topics.delete_command(chaos, topic.topic) in said, said
