"""``ratchet smoke``: one round trip through every server, as the application will use them.

1. Serialize an Avro record through the schema registry (Confluent wire format).
2. Produce it to Kafka (``<prefix>smoke``) and consume that exact record back.
3. Write it to Cassandra with a lightweight transaction and read it back at SERIAL.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from ratchet.settings import Settings

SMOKE_SCHEMA = {
    "type": "record", "name": "Smoke", "namespace": "ratchet.infra",
    "fields": [{"name": "smoke_id", "type": "string"}, {"name": "sent_at_ms", "type": "long"}],
}
SMOKE_KEYSPACE_SUFFIX = "_smoke"


class SmokeFailed(RuntimeError):
    """A step of the round trip did not give back what was sent."""


def _kafka_round_trip(settings: Settings, record: dict) -> dict:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from schemas.avro import registry_client
    from streams.topics import QUIET_LOG_LEVEL

    # librdkafka logged each failed connection itself (~190 lines with Kafka away);
    # its errors reach this code as exceptions, and the failure's line says them.
    quiet = {"bootstrap.servers": settings.kafka_bootstrap, "log_level": QUIET_LOG_LEVEL}
    topic = settings.topic("smoke")
    admin = AdminClient(quiet)
    if topic not in admin.list_topics(timeout=10).topics:
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    registry = registry_client(settings.schema_registry_url)
    ctx = SerializationContext(topic, MessageField.VALUE)
    payload = AvroSerializer(registry, json.dumps(SMOKE_SCHEMA))(record, ctx)
    schema_id = int.from_bytes(payload[1:5], "big")
    print(f"  registry: schema id {schema_id} for subject {topic}-value, "
          f"{len(payload)} bytes in Confluent wire format")

    delivered: list = []
    producer = Producer({**quiet, "acks": "all"})
    producer.produce(topic, key=record["smoke_id"].encode(), value=payload,
                     on_delivery=lambda err, msg: delivered.append((err, msg)))
    producer.flush(30)
    if not delivered or delivered[0][0] is not None:
        raise SmokeFailed(f"kafka produce failed: {delivered}")
    partition, offset = delivered[0][1].partition(), delivered[0][1].offset()
    print(f"  kafka: produced to {topic}[{partition}] offset {offset}")

    consumer = Consumer({**quiet,
                         "group.id": f"ratchet-smoke-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            value = AvroDeserializer(registry)(msg.value(), ctx)
            print(f"  kafka: consumed offset {msg.offset()} and decoded it via the registry")
            return value
    finally:
        consumer.close()
    raise SmokeFailed(f"kafka: record at {topic}[{partition}]@{offset} not consumed in 30s")


def _cassandra_round_trip(settings: Settings, record: dict) -> dict:
    from cassandra import ConsistencyLevel
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import RoundRobinPolicy
    from cassandra.query import SimpleStatement

    logging.getLogger("cassandra").setLevel(logging.ERROR)
    ks = settings.keyspace + SMOKE_KEYSPACE_SUFFIX
    profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60)
    cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port,
                      protocol_version=5, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    try:
        s = cluster.connect()
        s.execute(f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {settings.replication}")
        s.execute(f"CREATE TABLE IF NOT EXISTS {ks}.smoke (smoke_id text PRIMARY KEY, "
                  "sent_at_ms bigint)")
        rs = s.execute(f"INSERT INTO {ks}.smoke (smoke_id, sent_at_ms) VALUES (%s, %s) "
                       "IF NOT EXISTS", (record["smoke_id"], record["sent_at_ms"]))
        if not rs.was_applied:
            raise SmokeFailed("cassandra: INSERT ... IF NOT EXISTS was not applied")
        row = s.execute(SimpleStatement(
            f"SELECT smoke_id, sent_at_ms FROM {ks}.smoke WHERE smoke_id = %s",
            consistency_level=ConsistencyLevel.SERIAL), (record["smoke_id"],)).one()
        print(f"  cassandra: LWT insert applied and read back at SERIAL from {ks}.smoke")
        return {"smoke_id": row.smoke_id, "sent_at_ms": row.sent_at_ms}
    finally:
        cluster.shutdown()


def cli_smoke(settings: Settings) -> int:
    t0 = time.monotonic()
    record = {"smoke_id": uuid.uuid4().hex, "sent_at_ms": int(time.time() * 1000)}
    print(f"smoke record {record}")
    try:
        via_kafka = _kafka_round_trip(settings, record)
        if via_kafka != record:
            raise SmokeFailed(f"kafka gave back {via_kafka}, sent {record}")
        via_cassandra = _cassandra_round_trip(settings, via_kafka)
        if via_cassandra != record:
            raise SmokeFailed(f"cassandra gave back {via_cassandra}, sent {record}")
    except Exception as exc:
        print(f"ratchet smoke FAILED: {type(exc).__name__}: {exc}\n"
              "  (are the servers up? `ratchet infra status`)", flush=True)
        return 1
    print(f"smoke OK: registry -> kafka -> cassandra round trip in {time.monotonic() - t0:.1f}s")
    return 0
