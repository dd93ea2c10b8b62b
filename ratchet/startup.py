"""One line for an operator when a process cannot start because a server is missing.

``ratchet worker`` and ``ratchet api`` connect to Cassandra, Kafka and the registry
before they serve. A failure there is the operator's to fix (a server down, a keyspace
not migrated, a wrong address), and docs/operations.md promises it as a non-zero exit
with the reason on stderr, not as a driver's traceback of dozens of lines.
"""

from __future__ import annotations

import re

from ratchet.settings import Settings


class StartupFailed(Exception):
    """A process could not start: ``str()`` is the one line to show."""


def explain(exc: BaseException, settings: Settings) -> str | None:
    """The operator's line for ``exc`` raised while connecting at start; None when it is
    not a failure to reach a server (a bug: let its traceback through)."""
    from aiokafka.errors import (
        KafkaConnectionError,
        KafkaTimeoutError,
        NodeNotReadyError,
        RequestTimedOutError,
    )
    from cassandra import UnresolvableContactPoints
    from cassandra.cluster import NoHostAvailable
    from confluent_kafka import KafkaException
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from infra.migrate import SchemaBehind
    from schemas.errors import RegistryUnavailable
    from services.cassandra_cluster import UnknownLocalDatacenter

    cassandra = f"{','.join(settings.cassandra_hosts)}:{settings.cassandra_port}"
    if isinstance(exc, UnknownLocalDatacenter):
        return str(exc)
    if isinstance(exc, SchemaBehind):
        return f"Cassandra at {cassandra}: {exc}"
    if isinstance(exc, NoHostAvailable):
        if "keyspace" in str(exc).lower():
            return (f"Cassandra at {cassandra} has no keyspace {settings.keyspace!r} "
                    f"(or it is unreachable): run `ratchet migrate` first")
        errors = exc.errors if isinstance(exc.errors, dict) else {}
        reasons = "; ".join(f"{host}: {err}" for host, err in list(errors.items())[:2])
        return f"cannot reach Cassandra at {cassandra}: {reasons or exc}"
    if isinstance(exc, UnresolvableContactPoints):
        return (f"cannot resolve the Cassandra host(s) {','.join(settings.cassandra_hosts)}: "
                f"check RATCHET_CASSANDRA_HOSTS (or the DNS of the Cassandra service)")
    if isinstance(exc, SchemaRegistryError):
        return (f"the schema registry at {settings.schema_registry_url} answered HTTP "
                f"{exc.http_status_code}: {exc.error_message} (RATCHET_SCHEMA_REGISTRY_URL is "
                f"the registry's Confluent-compatible API, e.g. Apicurio's "
                f"http://host:8080/apis/ccompat/v7)")
    if isinstance(exc, RegistryUnavailable):
        return (f"the schema registry at {settings.schema_registry_url} does not answer: "
                f"{exc}")
    if isinstance(exc, KafkaException):
        return f"Kafka at {settings.kafka_bootstrap}: {exc.args[0] if exc.args else exc}"
    # aiokafka's errors that say its client could not reach Kafka or had no answer, as
    # Faust's producer and consumer start: a broker restarting under a worker's start
    # (session 53; it escaped as Faust's traceback). Its other errors keep theirs. aiokafka
    # raises the same error for a Kafka that closed the connection and for one that did
    # not answer within the request bound, so the line names both.
    if isinstance(exc, (KafkaConnectionError, NodeNotReadyError, RequestTimedOutError,
                        KafkaTimeoutError)):
        return (f"Kafka at {settings.kafka_bootstrap}: lost while Faust's clients connected "
                f"({_aiokafka_reason(exc)}): a broker restarting or away, or silent (no "
                f"answer within RATCHET_KAFKA_REQUEST_TIMEOUT_S="
                f"{settings.kafka_request_timeout_s} s)")
    if type(exc).__module__.startswith("acsylla"):
        return f"cannot reach Cassandra at {cassandra} (C++ driver): {exc}"
    return None


def _aiokafka_reason(exc: BaseException) -> str:
    """``KafkaConnectionError: Unable to bootstrap``: aiokafka's message without the
    address list it appends (``[('127.0.0.1', 9092, <AddressFamily.AF_INET: 2>)]``; the
    line names the bootstrap already), or a protocol error's ``[Error 7]`` prefix."""
    text = re.sub(r"^\[Error \d+\] | from \[.*\]$", "", str(exc).strip())
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name
