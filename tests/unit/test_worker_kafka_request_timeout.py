"""RATCHET_KAFKA_REQUEST_TIMEOUT_S: the bound on every request of the worker's producer
(Faust's ``producer_request_timeout``, aiokafka's ``request_timeout_ms``). Faust's own
default, 1 200 s, held a worker's start 20 minutes against a Kafka that accepted and
never answered, and would hold a publish as long. Session 53; the worker's process test
is ``tests/integration/test_worker_kafka_lost_at_start.py``.

A publish that fails at the bound (aiokafka's ``KafkaTimeoutError`` from the batch's
future) is retried and its record acked only once its outcome is on the broker; with
the partition revoked meanwhile, never (its next owner reads it again)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from ratchet.samples import make_turn
from ratchet.settings import Settings, SettingsError
from ratchet.startup import explain
from schemas.models import CheckpointPromoted
from streams.app import Runtime, create_app
from streams.health import Health
from tests.unit.stream_world import build, dispatch_task
from tests.unit.test_processor_rules import TOPICS, PickleCodec, conv_id


def test_the_bound_defaults_to_30_s_and_round_trips():
    assert Settings.from_env({}).kafka_request_timeout_s == 30
    s = Settings.from_env({"RATCHET_KAFKA_REQUEST_TIMEOUT_S": "5"})
    assert s.kafka_request_timeout_s == 5
    assert Settings.from_env(s.to_env()) == s
    assert Settings.from_env({"RATCHET_KAFKA_REQUEST_TIMEOUT_S": "1200"}
                             ).kafka_request_timeout_s == 1200


@pytest.mark.parametrize("raw", ["4", "0", "1201", "-1", "30s", "2.5"])
def test_a_bound_that_cannot_work_is_refused_at_start(raw):
    with pytest.raises(SettingsError, match="RATCHET_KAFKA_REQUEST_TIMEOUT_S"):
        Settings.from_env({"RATCHET_KAFKA_REQUEST_TIMEOUT_S": raw})


def test_the_workers_producer_waits_the_bound_not_fausts_20_minutes(tmp_path):
    settings = dataclasses.replace(Settings(), home=tmp_path, kafka_request_timeout_s=7)
    runtime = Runtime(processor=None, codec=PickleCodec(), health=Health(),  # type: ignore[arg-type]
                      topics=TOPICS)
    app = create_app(settings, runtime, stall_after_s=0)
    assert app.conf.producer_request_timeout == 7
    # What Faust hands aiokafka's AIOKafkaProducer (its bootstrap and every produce).
    assert app.producer._settings_default()["request_timeout_ms"] == 7000


def test_the_start_line_names_the_bound():
    s = dataclasses.replace(Settings(), kafka_bootstrap="kafka-0:9092",
                            kafka_request_timeout_s=12)
    line = explain(KafkaConnectionError("Unable to bootstrap from [('kafka-0', 9092, 2)]"), s)
    assert line == ("Kafka at kafka-0:9092: lost while Faust's clients connected "
                    "(KafkaConnectionError: Unable to bootstrap): a broker restarting or "
                    "away, or silent (no answer within RATCHET_KAFKA_REQUEST_TIMEOUT_S=12 s)")


@pytest.mark.parametrize("revoked", [False, True])
def test_a_publish_that_times_out_is_never_acked(tmp_path, monkeypatch, revoked):
    """A guard of the commit order under the bound (passed before: the bound is new, the
    retry is not): the future of a publish fails as aiokafka's expired batch does."""
    turn = make_turn(conversation_id=conv_id(), expected_head_seq=0)
    silent = {"kafka": True}

    async def scenario():
        w = build(tmp_path, monkeypatch, grace_s=1.0)
        send = w.producer.send

        async def timing_out(topic, key, value, *rest):
            if not silent["kafka"]:
                return await send(topic, key, value, *rest)
            fut = asyncio.get_running_loop().create_future()
            fut.set_exception(KafkaTimeoutError("Batch for TopicPartition expired"))
            return fut

        w.producer.send = timing_out
        task = dispatch_task(w)
        await w.stream.queue.put(w.event(turn, 0))
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert w.acks == []
        assert w.runtime.health.status == "degraded"
        if revoked:
            await w.revoke(0)
        else:
            silent["kafka"] = False
            await w.until_acked(1, polls=300)
        task.cancel()
        await w.app.lanes.stop()
        return w

    w = asyncio.run(asyncio.wait_for(scenario(), 30))
    if revoked:  # redelivered to the next owner from the committed offset
        assert w.acks == [] and w.outcomes(turn.response_id) == []
    else:
        assert w.acks == [(0, 0)]
        assert [type(o) for o in w.outcomes(turn.response_id)] == [CheckpointPromoted]


def test_the_bound_holds_a_publish_because_the_producer_is_not_idempotent(tmp_path):
    """A pin (an outside review of session 53: why the fake producer above suffices).
    aiokafka fails a batch that waited ``request_timeout_ms`` (its ``batch_ttl``) only
    without a transaction manager: an idempotent or transactional producer retries an
    expired batch for ever (``Sender._can_retry``), and the bound would hold no publish."""
    settings = dataclasses.replace(Settings(), home=tmp_path, kafka_request_timeout_s=7)
    runtime = Runtime(processor=None, codec=PickleCodec(), health=Health(),  # type: ignore[arg-type]
                      topics=TOPICS)
    app = create_app(settings, runtime, stall_after_s=0)
    assert app.conf.processing_guarantee.value == "at_least_once"
    # What Faust's ``_new_producer`` hands aiokafka (``_settings_extra`` adds idempotence
    # in a transaction).
    made = {**app.producer._settings_default(), **app.producer._settings_extra()}
    assert not made.get("enable_idempotence", False) and made["request_timeout_ms"] == 7000
