"""An API started before the worker created the decision topics (a first start) says so
in one WARNING line per retry, not an ERROR with a traceback, and is not up until they
exist (an outside review, session 32: a gateway team took the traceback for a fault).
Real Kafka."""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka.admin import NewTopic

from services.api.notifier import DecisionNotifier
from services.api.waiters import PromotionWaiters


def test_missing_topics_are_a_warning_until_they_exist(settings, kafka_admin, caplog):
    topic = f"notifier-missing-{uuid.uuid4().hex[:8]}"
    notifier = DecisionNotifier(settings.kafka_bootstrap, {topic: "promoted"},
                                PromotionWaiters(), decode_response_id=lambda *_: "r")
    caplog.set_level(logging.INFO, logger="services.api.notifier")
    notifier.start()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
                "waiting for its topics" in r.getMessage() for r in caplog.records):
            time.sleep(0.1)
        waiting = [r for r in caplog.records if "waiting for its topics" in r.getMessage()]
        assert waiting and all(r.levelno == logging.WARNING and r.exc_info is None
                               for r in waiting)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not notifier.up
        kafka_admin.create_topics([NewTopic(topic, num_partitions=1,
                                            replication_factor=1)])[topic].result(30)
        assert notifier.wait_assigned(30), "the notifier never followed the new topic"
        assert notifier.up
    finally:
        notifier.stop()
        kafka_admin.delete_topics([topic])
