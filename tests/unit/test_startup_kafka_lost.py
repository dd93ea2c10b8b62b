"""``ratchet.startup.explain`` on aiokafka's errors (Faust's clients): the ones that say
Kafka could not be reached or did not answer are the start's one line, naming the
bootstrap; any other aiokafka error is not explained (None: its traceback stays, a bug
is not hidden as a server away). Session 53; the worker's process test is
``tests/integration/test_worker_kafka_lost_at_start.py``."""

from __future__ import annotations

import dataclasses

import pytest
from aiokafka.errors import (
    IllegalStateError,
    KafkaConnectionError,
    KafkaTimeoutError,
    NodeNotReadyError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

from ratchet.settings import Settings
from ratchet.startup import explain

SETTINGS = dataclasses.replace(Settings(), kafka_bootstrap="kafka-0:9092")
LOST = "Kafka at kafka-0:9092: lost while Faust's clients connected ({}): a broker " \
       "restarting or away, or silent (no answer within RATCHET_KAFKA_REQUEST_TIMEOUT_S=30 s)"


@pytest.mark.parametrize("exc,reason", [
    (KafkaConnectionError("Unable to bootstrap from "
                          "[('kafka-0', 9092, <AddressFamily.AF_INET: 2>)]"),
     "KafkaConnectionError: Unable to bootstrap"),
    (KafkaConnectionError("Connection at kafka-0:9092 closed"),
     "KafkaConnectionError: Connection at kafka-0:9092 closed"),
    (NodeNotReadyError("Attempt to send a request to node which is not ready (node id 1)."),
     "NodeNotReadyError: Attempt to send a request to node which is not ready (node id 1)."),
    (RequestTimedOutError(), "RequestTimedOutError"),
    (KafkaTimeoutError(), "KafkaTimeoutError"),
])
def test_kafka_away_for_aiokafka_is_the_start_line(exc, reason):
    assert explain(exc, SETTINGS) == LOST.format(reason)


@pytest.mark.parametrize("exc", [UnknownTopicOrPartitionError(), IllegalStateError("bug")])
def test_other_aiokafka_errors_keep_their_traceback(exc):
    assert explain(exc, SETTINGS) is None
