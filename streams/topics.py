"""The topics of CONTRACT section 2: their names for a prefix, and their creation
(idempotent, with the configured partitions and the protocol's size limit, which is
also raised on topics that exist already)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from ratchet.settings import Settings
from schemas.limits import DEAD_LETTER_MAX_MESSAGE_BYTES, TOPIC_MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)
# librdkafka's syslog levels: 2 is critical (FAIL lines, level 3, are not printed).
QUIET_LOG_LEVEL = 2


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


class TopicConfigError(Exception):
    """A ratchet topic's size limit could not be read or raised (the documented maximum
    would not hold on it)."""


def max_message_bytes(topics: Topics, name: str) -> int:
    """The ``max.message.bytes`` a ratchet topic needs: above the protocol's maximum
    event (``schemas/limits.py`` says why), dead letters one MiB more."""
    return DEAD_LETTER_MAX_MESSAGE_BYTES if name == topics.dead_letters \
        else TOPIC_MAX_MESSAGE_BYTES


def topic_config(topics: Topics, name: str) -> dict[str, str]:
    """Configs a topic is created with."""
    return {"max.message.bytes": str(max_message_bytes(topics, name))}


def limits_to_raise(current: Mapping[str, int], required: Mapping[str, int]
                    ) -> dict[str, tuple[int, int]]:
    """``{topic: (current, required)}`` for the topics whose limit is below what they
    need. Raise only: a larger value an operator set is theirs to keep."""
    return {name: (current[name], need) for name, need in required.items()
            if current[name] < need}


def ensure_topics(settings: Settings, timeout_s: float = 30.0) -> Topics:
    """Create every ratchet topic that does not exist yet, raise the size limit of those
    that do (``raise_size_limits``); return their names.

    All topics get ``settings.partitions`` partitions so that a conversation's events
    and outcomes share a partition number, and the size configs of ``topic_config``.
    Replication is 3, or the number of brokers when the cluster is smaller (a local
    single broker). Existing topics keep their partitions and other configs.
    """
    topics = topic_names(settings)
    # librdkafka logs each failed connection attempt itself: with Kafka away, ~580
    # lines on stderr before the worker's one line (an outside review, session 26).
    # Its errors reach the caller as exceptions; only critical ones are logged here.
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap,
                         "log_level": QUIET_LOG_LEVEL})
    metadata = list_topics(admin, timeout_s)
    replication = min(3, max(1, len(metadata.brokers)))
    existing = [name for name in vars(topics).values() if name in metadata.topics]
    wanted = [
        NewTopic(name, num_partitions=settings.partitions, replication_factor=replication,
                 config=topic_config(topics, name))
        for name in vars(topics).values()
        if name not in metadata.topics
    ]
    if wanted:
        for name, future in admin.create_topics(wanted, operation_timeout=timeout_s).items():
            try:
                future.result(timeout=timeout_s)
                log.info("created topic %s (%d partitions)", name, settings.partitions)
            except KafkaException as exc:
                if _error_name(exc) == "TOPIC_ALREADY_EXISTS":
                    existing.append(name)  # made meanwhile, maybe by an older version
                    continue
                raise
    raise_size_limits(admin, topics, existing, timeout_s)
    return topics


# How long one metadata request of ``list_topics`` may block.
_ASK_S = 0.5


def list_topics(admin: AdminClient, timeout_s: float):
    """``admin.list_topics`` within ``timeout_s``, asked ``_ASK_S`` at a time: librdkafka's
    call blocks in C, where a signal's Python handler runs only once it returns, so a
    SIGTERM or Ctrl-C while the worker waited for a Kafka that accepts and never answers
    stopped it the rest of the 30 s later (session 48's second outside review). The
    last error is raised once ``timeout_s`` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=max(0.001, min(_ASK_S,
                                                            deadline - time.monotonic())))
        except KafkaException:
            if time.monotonic() >= deadline:
                raise


def raise_size_limits(admin: AdminClient, topics: Topics, names: Sequence[str],
                      timeout_s: float = 30.0) -> dict[str, tuple[int, int]]:
    """Bring existing ratchet topics up to the ``max.message.bytes`` they need; return
    ``{topic: (old, new)}`` of those changed.

    A topic keeps the configs it was made with: one made before the size limit (or by
    hand) has the broker's default, about 1 MiB, so a deployment upgrading in place
    would refuse events the protocol promises to carry. Only this one config is set
    (an incremental alter, the others stay), and only upward.
    """
    if not names:
        return {}
    required = {name: max_message_bytes(topics, name) for name in names}
    changes = limits_to_raise(_current_limits(admin, names, timeout_s), required)
    if not changes:
        return {}
    resources = [
        ConfigResource(ResourceType.TOPIC, name, incremental_configs=[ConfigEntry(
            "max.message.bytes", str(new), incremental_operation=AlterConfigOpType.SET)])
        for name, (_, new) in changes.items()
    ]
    futures = admin.incremental_alter_configs(resources, request_timeout=timeout_s)
    for resource, future in futures.items():
        old, new = changes[resource.name]
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise TopicConfigError(
                f"could not raise max.message.bytes of topic {resource.name} from {old} to "
                f"{new} (the principal needs ALTER_CONFIGS on it): {exc}") from exc
        log.warning("raised max.message.bytes of topic %s from %d to %d",
                    resource.name, old, new)
    _until_reported(admin, changes, timeout_s)
    return changes


def _until_reported(admin: AdminClient, changes: dict[str, tuple[int, int]],
                    timeout_s: float) -> None:
    """Return once the broker reports each raised limit. The alter's answer comes when
    the controller has it; the broker that takes the records applies it a moment later
    (measured: the old value read right after, session 49's CI class of races), and a
    worker producing a large record in that moment would be refused. Past ``timeout_s``
    it fails as the alter would."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = _current_limits(admin, list(changes), timeout_s)
        behind = {name: now[name] for name, (_, new) in changes.items() if now[name] < new}
        if not behind:
            return
        if time.monotonic() > deadline:
            raise TopicConfigError(
                "the broker still reports " + ", ".join(
                    f"max.message.bytes {value} of topic {name} (raised to "
                    f"{changes[name][1]})" for name, value in sorted(behind.items()))
                + f" {timeout_s:g} s after it was raised")
        time.sleep(0.1)


def _current_limits(admin: AdminClient, names: Sequence[str],
                    timeout_s: float) -> dict[str, int]:
    """``max.message.bytes`` of each topic. A topic made a moment ago (by another
    worker starting, say) may be unknown for a little while to the broker that
    answers: it is asked again until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    current: dict[str, int] = {}
    while True:
        unknown = []
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in names if n not in current]
        for resource, future in admin.describe_configs(resources,
                                                       request_timeout=timeout_s).items():
            try:
                current[resource.name] = int(future.result(timeout=timeout_s)
                                             ["max.message.bytes"].value)
            except KafkaException as exc:
                if _error_name(exc) != "UNKNOWN_TOPIC_OR_PART" or time.monotonic() > deadline:
                    raise TopicConfigError(f"could not read max.message.bytes of topic "
                                           f"{resource.name}: {exc}") from exc
                unknown.append(resource.name)
            except (KeyError, TypeError, ValueError) as exc:
                raise TopicConfigError(f"topic {resource.name}: no integer "
                                       f"max.message.bytes ({exc!r})") from exc
        if not unknown:
            return current
        time.sleep(0.1)


def _error_name(exc: KafkaException) -> str:
    return getattr(exc.args[0], "name", lambda: "")() if exc.args else ""


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
