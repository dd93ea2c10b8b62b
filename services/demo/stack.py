"""A running ratchet (worker + API child processes) plus the clients to drive it.

Used by ``ratchet demo`` and by tests/e2e. ``RunningStack.start`` expects Kafka,
Cassandra and the registry to be up (``ratchet infra up``); it then:
1. applies the migrations to ``settings.keyspace`` (idempotent);
2. registers the Avro schemas (idempotent) and creates the topics;
3. starts a worker and an API process and waits until both are ready.
``stop`` stops exactly those two processes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from ratchet.settings import Settings
from schemas.avro import EventSerde, register_schemas, registry_client
from services.demo.processes import (
    ChildProcess,
    free_port,
    start_api,
    start_worker,
    wait_api_ready,
    wait_worker_ready,
)
from services.gateway.client import RehydrationClient
from services.gateway.producer import GatewayProducer


def prepare(settings: Settings) -> None:
    """Migrations, schemas and topics: what the worker and the API expect to exist."""
    from infra.migrate import apply_migrations
    from services.cassandra_cluster import open_cluster
    from streams.topics import ensure_topics

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    cluster = open_cluster(settings)
    try:
        apply_migrations(cluster, settings)
    finally:
        cluster.shutdown()
    register_schemas(registry_client(settings.schema_registry_url))
    ensure_topics(settings)


@dataclass
class RunningStack:
    settings: Settings
    base_url: str
    worker: ChildProcess
    api: ChildProcess
    producer: GatewayProducer
    client: RehydrationClient

    @classmethod
    def start(
        cls,
        settings: Settings,
        log_dir: Path,
        *,
        api_port: int | None = None,
        group_id: str | None = None,
    ) -> RunningStack:
        settings = replace(settings, api_host="127.0.0.1", api_port=api_port or free_port())
        prepare(settings)
        worker = start_worker(settings, log_dir, group_id=group_id)
        api = start_api(settings, log_dir)
        base_url = f"http://127.0.0.1:{settings.api_port}"
        try:
            wait_worker_ready(worker, settings)
            wait_api_ready(api, base_url)
        except BaseException:
            api.stop()
            worker.stop()
            raise
        serde = EventSerde(registry_client(settings.schema_registry_url))
        return cls(
            settings=settings,
            base_url=base_url,
            worker=worker,
            api=api,
            producer=GatewayProducer(settings, serde),
            client=RehydrationClient(base_url, timeout_s=10),
        )

    def stop(self) -> None:
        self.client.close()
        self.api.stop()
        self.worker.stop()
