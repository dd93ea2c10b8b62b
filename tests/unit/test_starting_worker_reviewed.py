"""``streams.worker.StartingWorker``, reviewed from outside (helper rreva, session 53).

Its docstring promises three things of the exception its start raises; the process test
(``tests/integration/test_worker_kafka_lost_at_start.py``) checks the first only:

1. an error ``ratchet.startup.explain`` explains (a Kafka away as Faust's clients
   connect) becomes ``start_failure``, the start returning so Faust stops what it
   started, and ``run_worker`` raises ``StartupFailed`` with that line;
2. any other error (a bug) is raised again: its traceback stays;
3. an explained error raised while the worker is being stopped (SIGTERM or Ctrl-C
   during the start) is raised again too: the stop is the start's end, not a Kafka lost.

These pin the promises (they held before this review: no defect found here).
"""

from __future__ import annotations

import asyncio
import dataclasses
from unittest import mock

import faust
import pytest
from aiokafka.errors import KafkaConnectionError, UnknownTopicOrPartitionError

from ratchet.settings import Settings
from streams.worker import StartingWorker

SETTINGS = dataclasses.replace(Settings(), kafka_bootstrap="kafka-0:9092")


def _start(exc: BaseException, *, stopping: bool) -> StartingWorker:
    worker = object.__new__(StartingWorker)  # its start alone: no app, no loop
    worker.settings = SETTINGS
    with mock.patch.object(faust.Worker, "start", mock.AsyncMock(side_effect=exc)), \
            mock.patch.object(StartingWorker, "should_stop",
                              new_callable=mock.PropertyMock, return_value=stopping):
        asyncio.run(worker.start())
    return worker


def test_a_kafka_lost_while_starting_is_the_start_failure_line():
    worker = _start(KafkaConnectionError("Unable to bootstrap from [('kafka-0', 9092)]"),
                    stopping=False)
    assert worker.start_failure == (
        "Kafka at kafka-0:9092: lost while Faust's clients connected "
        "(KafkaConnectionError: Unable to bootstrap): a broker restarting or away, or "
        "silent (no answer within RATCHET_KAFKA_REQUEST_TIMEOUT_S=30 s)")


@pytest.mark.parametrize("exc", [ValueError("a bug"), UnknownTopicOrPartitionError(),
                                 OSError("disk full")],
                         ids=["bug", "other aiokafka error", "OSError"])
def test_an_error_that_is_not_a_server_away_keeps_its_traceback(exc):
    with pytest.raises(type(exc)):
        _start(exc, stopping=False)


def test_a_kafka_error_while_the_worker_is_being_stopped_is_raised_again():
    with pytest.raises(KafkaConnectionError):
        _start(KafkaConnectionError("Connection at kafka-0:9092 closed"), stopping=True)


def test_a_cancelled_start_is_not_a_start_failure():
    """SIGTERM cancels the start's future (``mode``'s ``_stop_on_signal``): a
    ``CancelledError`` is no ``Exception`` and goes through."""
    with pytest.raises(asyncio.CancelledError):
        _start(asyncio.CancelledError(), stopping=True)
