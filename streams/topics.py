"""The topics of CONTRACT section 2: their names for a prefix, and their creation
(idempotent, with the configured partitions)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ratchet.settings import Settings
from schemas.limits import DEAD_LETTER_MAX_MESSAGE_BYTES, TOPIC_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Topics:
    """Full topic names (CONTRACT section 2) for one prefix."""

    gateway_events: str
    checkpoints: str
    rejections: str
    orphaned_effects: str
    dead_letters: str

    @classmethod
    def with_prefix(cls, prefix: str) -> Topics:
        return cls(
            gateway_events=f"{prefix}gateway-events",
            checkpoints=f"{prefix}checkpoints",
            rejections=f"{prefix}rejections",
            orphaned_effects=f"{prefix}orphaned-effects",
            dead_letters=f"{prefix}dead-letters",
        )


def topic_names(settings: Settings) -> Topics:
    return Topics.with_prefix(settings.topic_prefix)


def topic_config(topics: Topics, name: str) -> dict[str, str]:
    """Configs a topic is created with: ``max.message.bytes`` above the protocol's
    maximum event (``schemas/limits.py`` says why), dead letters one MiB more."""
    limit = (DEAD_LETTER_MAX_MESSAGE_BYTES if name == topics.dead_letters
             else TOPIC_MAX_MESSAGE_BYTES)
    return {"max.message.bytes": str(limit)}


def ensure_topics(settings: Settings, timeout_s: float = 30.0) -> Topics:
    """Create every ratchet topic that does not exist yet; return their names.

    All topics get ``settings.partitions`` partitions so that a conversation's events
    and outcomes share a partition number, and the size configs of ``topic_config``
    (topics that exist already keep theirs: raise it with kafka-configs). Replication is 3, or the number of brokers
    when the cluster is smaller (a local single broker).
    """
    topics = topic_names(settings)
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    metadata = admin.list_topics(timeout=timeout_s)
    replication = min(3, max(1, len(metadata.brokers)))
    wanted = [
        NewTopic(name, num_partitions=settings.partitions, replication_factor=replication,
                 config=topic_config(topics, name))
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


def delete_topics_with_prefix(bootstrap: str, prefixes: list[str],
                              timeout_s: float = 30.0) -> list[str]:
    """Delete every topic whose name starts with one of ``prefixes``; return their names.

    For isolated runs (tests, the bench): each makes its own topics, and leftovers are
    not just disk. A broker loads every partition at start, so a few thousand stale
    test partitions made a local Kafka take over 90 s to come up. Failures are logged,
    not raised: a cleanup must never hide the result of the run it cleans up after.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        names = [name for name in admin.list_topics(timeout=timeout_s).topics
                 if any(name.startswith(p) for p in prefixes if p)]
        if not names:
            return []
        for name, future in admin.delete_topics(names, operation_timeout=timeout_s).items():
            try:
                future.result(timeout=timeout_s)
            except Exception as exc:  # noqa: BLE001 - see the docstring
                log.warning("could not delete topic %s: %s", name, exc)
        return names
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("could not delete the topics of %s: %s", prefixes, exc)
        return []
