"""The servers ``ratchet infra`` runs, in start order."""

from __future__ import annotations

from infra.servers.base import Server, Unhealthy
from infra.servers.cassandra import Cassandra
from infra.servers.kafka import Kafka
from infra.servers.registry import Registry
from ratchet.settings import Settings

SERVER_CLASSES: dict[str, type[Server]] = {
    "kafka": Kafka,
    "cassandra": Cassandra,
    "registry": Registry,
}
NAMES = tuple(SERVER_CLASSES)


def server(settings: Settings, name: str) -> Server:
    try:
        return SERVER_CLASSES[name](settings)
    except KeyError:
        raise ValueError(f"unknown server {name!r}; known: {', '.join(NAMES)}") from None


__all__ = ["NAMES", "SERVER_CLASSES", "Server", "Unhealthy", "server"]
