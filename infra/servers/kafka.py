"""Apache Kafka 4.1.1 as one KRaft node that is both broker and controller."""

from __future__ import annotations

import base64
import subprocess
import uuid

from infra.fetch import fetch_jars
from infra.jdk import java17
from infra.servers.base import Port, Server, Unhealthy, host_port

VERSION = "4.1.1"
ARTIFACTS = [
    f"org.apache.kafka:kafka_2.13:{VERSION}",
    # Kafka itself pulls slf4j-api 1.7; ask for 2.x explicitly so slf4j-simple 2.x binds.
    "org.slf4j:slf4j-api:2.0.17",
    "org.slf4j:slf4j-simple:2.0.17",
]
HEAP = ["-Xms512m", "-Xmx512m"]
HEALTH_TOPIC = "_ratchet.healthcheck"


class Kafka(Server):
    name = "kafka"
    version = VERSION
    start_timeout_s = 90.0
    port_setting = "RATCHET_KAFKA_BOOTSTRAP"

    def client_port(self) -> int:
        return host_port(self.settings.kafka_bootstrap.split(",")[0], 9092)[1]

    def controller_port(self) -> int:
        return self.client_port() + 1

    def ports(self) -> list[Port]:
        return [*super().ports(),
                Port(self.controller_port(), "kafka's controller port (its client port + 1)",
                     self.port_setting)]

    def endpoint(self) -> str:
        return f"kafka      {self.settings.kafka_bootstrap}  (controller 127.0.0.1:{self.controller_port()})"

    def fetch(self) -> None:
        fetch_jars(self.dist_dir, ARTIFACTS)

    def _properties(self) -> str:
        port, ctl = self.client_port(), self.controller_port()
        return "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.bootstrap.servers=127.0.0.1:{ctl}",
                f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctl}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={self.data_dir / 'logs'}",
                "num.partitions=1",
                "num.network.threads=2",
                "num.io.threads=4",
                "background.threads=4",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=10",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "transaction.state.log.num.partitions=4",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=true",
                "delete.topic.enable=true",
                "log.retention.hours=168",
                "log.segment.bytes=67108864",
                "",
            ]
        )

    def prepare(self) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        props = self.conf_dir / "server.properties"
        props.write_text(self._properties())
        if (self.data_dir / "logs" / "meta.properties").exists():
            return  # already formatted: keep the cluster id and the data
        cluster_id = new_cluster_id()
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            [java17(), "-Xmx256m", "-cp", f"{self.dist_dir / 'lib'}/*", "kafka.tools.StorageTool",
             "format", "--standalone", "-t", cluster_id, "-c", str(props)],
            capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"kafka storage format failed (exit {out.returncode}):\n{out.stdout}{out.stderr}"
            )

    def command(self) -> list[str]:
        return [
            java17(), *HEAP, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients=warn",
            "-cp", f"{self.dist_dir / 'lib'}/*", "kafka.Kafka", str(self.conf_dir / "server.properties"),
        ]

    def check(self, timeout_s: float = 10.0) -> None:
        """Create (once) and list a topic through the AdminClient."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.settings.kafka_bootstrap,
                             "socket.connection.setup.timeout.ms": 3000,
                             "log_level": 0})
        try:
            topics = admin.list_topics(timeout=timeout_s).topics
            if HEALTH_TOPIC not in topics:
                fut = admin.create_topics([NewTopic(HEALTH_TOPIC, 1, 1)],
                                          request_timeout=timeout_s)[HEALTH_TOPIC]
                try:
                    fut.result(timeout=timeout_s)
                except KafkaException as exc:
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        raise
                topics = admin.list_topics(timeout=timeout_s).topics
            if HEALTH_TOPIC not in topics:
                raise Unhealthy(f"topic {HEALTH_TOPIC} created but not listed")
        except Unhealthy:
            raise
        except Exception as exc:  # confluent-kafka raises several types here
            raise Unhealthy(f"kafka admin round trip failed: {exc}") from exc


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID as 22 url-safe base64 characters.

    Never one that starts with "-": the storage tool's argument parser takes it for an
    option ("argument --cluster-id/-t: expected one argument"), which failed 1 fresh
    start in 64 (a CI run on 2026-11-29). Kafka's own ``Uuid.randomUuid`` redraws such
    ids for the same reason.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
