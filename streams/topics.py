"""Create the topics of CONTRACT section 2 (idempotent), with the configured partitions."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ratchet.settings import Settings
from streams.processor import Topics

log = logging.getLogger(__name__)


def topic_names(settings: Settings) -> Topics:
    return Topics.with_prefix(settings.topic_prefix)


def ensure_topics(settings: Settings, timeout_s: float = 30.0) -> Topics:
    """Create every ratchet topic that does not exist yet; return their names.

    All topics get ``settings.partitions`` partitions so that a conversation's events
    and outcomes share a partition number. Replication is 3, or the number of brokers
    when the cluster is smaller (a local single broker).
    """
    topics = topic_names(settings)
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    metadata = admin.list_topics(timeout=timeout_s)
    replication = min(3, max(1, len(metadata.brokers)))
    wanted = [
        NewTopic(name, num_partitions=settings.partitions, replication_factor=replication)
        for name in vars(topics).values()
        if name not in metadata.topics
    ]
    if not wanted:
        return topics
    for name, future in admin.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
            log.info("created topic %s (%d partitions)", name, settings.partitions)
        except KafkaException as exc:
            if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                continue
            raise
    return topics
