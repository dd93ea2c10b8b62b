"""The chaos run's Kafka topics: made by the run itself, so that it deletes exactly those.

The run deleted every topic whose name began with ``chaos-<tag>`` at its end, trusting
its tag: a topic of such a name made before the run (a tag's collision, by hand) went
with the run's (session 48's operator leftovers, left; session 48). The workers create
the topics they find missing and accept those that exist, so their creations prove
nothing; the run now creates every topic its workers would (CONTRACT section 2's five,
and Faust's leader topic of the run's consumer group) with ``create_topics`` before they
start. A create Kafka answers is the run's; a name that exists already is refused; and
only the topics whose create succeeded are deleted at the end.
"""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from ratchet.settings import Settings
from streams.topics import QUIET_LOG_LEVEL, topic_config, topic_names

TIMEOUT_S = 30.0


class TopicsNotMade(RuntimeError):
    """The run cannot have topics of its own: ``str()`` is the operator's line (the
    runner's ``ChaosSetupFailed``). Those it did make are in the caller's list."""


def leader_topic(group: str) -> str:
    """Faust's topic for electing its assignor's leader (``faust.assignor``), which the
    first worker of ``group`` would create: one partition, Faust's replication (1)."""
    return f"{group}-__assignor-__leader"


def wanted(settings: Settings, group: str, brokers: int) -> list[NewTopic]:
    """The topics a run's workers would create, as they would create them
    (``streams.topics.ensure_topics``; Faust's leader topic as Faust declares it)."""
    topics = topic_names(settings)
    replication = min(3, max(1, brokers))
    return [*(NewTopic(name, num_partitions=settings.partitions,
                       replication_factor=replication, config=topic_config(topics, name))
              for name in vars(topics).values()),
            NewTopic(leader_topic(group), num_partitions=1, replication_factor=1)]


def make(settings: Settings, group: str, made: list[str]) -> None:
    """Create the run's topics, appending to ``made`` each one Kafka says it created.
    ``TopicsNotMade`` when a name exists already (not the run's: neither used nor
    deleted) or a create was not answered (it may have made it: named with the command
    that deletes it, and not deleted, since it may not be the run's)."""
    admin = _admin(settings)
    brokers = len(admin.list_topics(timeout=TIMEOUT_S).brokers)
    exists, unknown = [], []
    for name, future in admin.create_topics(wanted(settings, group, brokers),
                                            operation_timeout=TIMEOUT_S).items():
        try:
            future.result(timeout=TIMEOUT_S)
            made.append(name)
        except KafkaException as exc:
            if _error_name(exc) == "TOPIC_ALREADY_EXISTS":
                exists.append(name)
            else:
                unknown.append(f"{name} ({exc})")
        except Exception as exc:  # noqa: BLE001 - no answer: it may exist now
            unknown.append(f"{name} ({type(exc).__name__}: {exc})")
    if exists:
        # Made before the run, or by its own create sent again after it applied (its
        # answer lost): which cannot be told, so named with their delete (session 49).
        raise TopicsNotMade(
            f"topic(s) {', '.join(sorted(exists))} exist already: made before this run "
            "(its tag met an earlier run's, or a hand made them) or by this run's own "
            "create, sent again after it applied; not used or deleted, nothing of theirs "
            "was changed. Run again (a new tag); once sure no other run uses them, remove "
            f"them with {'; '.join(delete_command(settings, n) for n in sorted(exists))}")
    if unknown:
        raise TopicsNotMade(
            f"creating topic(s) {'; '.join(unknown)} got no answer: they may exist now, "
            f"this run's or not; remove them once sure with {delete_command(settings, '<name>')}")


def delete(settings: Settings, made: list[str], prefix: str) -> tuple[list[str], list[str]]:
    """Delete exactly the topics in ``made``. Returns (the lines of those it could not
    delete, each with its command; the topics named ``prefix...`` still there that this
    run did not make, left alone). A topic already gone counts as deleted."""
    admin = _admin(settings)
    failed: list[str] = []
    if made:
        for name, future in admin.delete_topics(list(made),
                                                operation_timeout=TIMEOUT_S).items():
            try:
                future.result(timeout=2 * TIMEOUT_S)
            except KafkaException as exc:
                if _error_name(exc) != "UNKNOWN_TOPIC_OR_PART":
                    failed.append(f"{name} ({exc}): {delete_command(settings, name)}")
            except Exception as exc:  # noqa: BLE001 - named, never hides the verdict
                failed.append(f"{name} ({type(exc).__name__}: {exc}): "
                              f"{delete_command(settings, name)}")
    others = sorted(t for t in admin.list_topics(timeout=TIMEOUT_S).topics
                    if t.startswith(prefix) and t not in made)
    return failed, others


def delete_command(settings: Settings, name: str) -> str:
    return (f"`kafka-topics.sh --bootstrap-server {settings.kafka_bootstrap} --delete "
            f"--topic {name}`")


def _admin(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka_bootstrap,
                        "log_level": QUIET_LOG_LEVEL})


def _error_name(exc: KafkaException) -> str:
    return getattr(exc.args[0], "name", lambda: "")() if exc.args else ""

