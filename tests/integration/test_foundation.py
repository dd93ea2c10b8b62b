"""The foundation, proved against the real servers.

(a) Avro in Confluent wire format through the registry, produced with confluent-kafka,
    consumed by a Faust agent in a real consumer group that commits its offset; a new
    worker with the same group resumes after the committed offset.
(b) A single-partition Cassandra conditional batch applies once, then returns
    ``[applied]=false`` with the current values.
(c) The registry enforces BACKWARD compatibility per subject like Confluent's.

The Faust worker runs as a subprocess of this very file (``python test_foundation.py
faust-worker ...``): a Faust worker owns its event loop and signal handlers, which
does not mix with pytest's process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import in_ci

pytestmark = pytest.mark.integration

EVENT_SCHEMA = {
    "type": "record",
    "name": "FoundationProbe",
    "namespace": "ratchet.tests",
    "fields": [
        {"name": "seq", "type": "int"},
        {"name": "text", "type": "string"},
        {"name": "produced_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


# ------------------------------------------------------------------ faust worker (subprocess)


def faust_worker(broker: str, registry_url: str, topic: str, group: str, out: str) -> None:
    """Consume ``topic`` in consumer group ``group``; append each decoded record to ``out``."""
    import faust
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    app = faust.App(
        group,
        broker=f"kafka://{broker}",
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        topic_partitions=1,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=1,
        broker_commit_interval=0.5,
        store="memory://",
        datadir=str(Path(out).parent / f"{group}-data"),  # not the current directory
    )
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    ctx = SerializationContext(topic, MessageField.VALUE)

    @app.agent(app.topic(topic, key_type=bytes, value_type=bytes), concurrency=1)
    async def consume(stream):
        async for event in stream.events():
            value = deserialize(event.value, ctx)
            value["produced_at"] = value["produced_at"].isoformat()
            with open(out, "a") as f:
                f.write(json.dumps({"offset": event.message.offset, "value": value}) + "\n")

    faust.Worker(app, loglevel="WARNING").execute_from_commandline()


class FaustWorker:
    """A Faust worker subprocess; ``stop()`` sends SIGTERM (Faust commits, then leaves)."""

    def __init__(self, settings, topic: str, group: str, tmp: Path, tag: str) -> None:
        self.out = tmp / f"{tag}.jsonl"
        self.log = tmp / f"{tag}.log"
        self.out.touch()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "faust-worker", settings.kafka_bootstrap,
                 settings.schema_registry_url, topic, group, str(self.out)],
                stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2],
                env=dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2])),
            )

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]

    def wait_for(self, count: int, timeout_s: float = 90) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(self.records()) < count:
            if self.proc.poll() is not None:
                pytest.fail(f"faust worker exited {self.proc.returncode}:\n{self.log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"faust worker saw {self.records()} after {timeout_s}s, wanted "
                            f"{count} records; log:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.2)
        return self.records()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _committed(settings, topic: str, group: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def _wait_committed(settings, topic: str, group: str, offset: int, timeout_s: float = 30) -> int:
    deadline = time.monotonic() + timeout_s
    while (got := _committed(settings, topic, group)) != offset:
        if time.monotonic() > deadline:
            pytest.fail(f"group {group} committed offset {got}, expected {offset}")
        time.sleep(0.5)
    return got


# ------------------------------------------------------------------------------- tests


def test_avro_through_registry_into_faust_group_commits_and_resumes(
    settings, schema_registry_client, unique_topic, unique_name, tmp_path
):
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    serialize = AvroSerializer(schema_registry_client, json.dumps(EVENT_SCHEMA))
    ctx = SerializationContext(unique_topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all",
                         "enable.idempotence": True})

    def produce(seqs):
        for seq in seqs:
            payload = serialize({"seq": seq, "text": f"record {seq}",
                                 "produced_at": int(time.time() * 1000)}, ctx)
            # Confluent wire format: magic byte 0, then the 4-byte big-endian schema id.
            assert payload[0] == 0
            producer.produce(unique_topic, key=b"conversation-1", value=payload)
        assert producer.flush(30) == 0

    group = unique_name("ratchet-test-group")
    produce([1, 2, 3])

    first = FaustWorker(settings, unique_topic, group, tmp_path, "first")
    try:
        seen = first.wait_for(3)
        assert [r["value"]["seq"] for r in seen] == [1, 2, 3]
        assert [r["offset"] for r in seen] == [0, 1, 2]
        _wait_committed(settings, unique_topic, group, 3)
    finally:
        first.stop()

    produce([4, 5])
    second = FaustWorker(settings, unique_topic, group, tmp_path, "second")
    try:
        seen = second.wait_for(2)
        time.sleep(3)  # anything re-delivered from before the commit would show up now
        seen = second.records()
        assert [r["value"]["seq"] for r in seen] == [4, 5], "resumed after the committed offset"
        assert seen[0]["value"]["text"] == "record 4"
        _wait_committed(settings, unique_topic, group, 5)
    finally:
        second.stop()


def test_single_partition_conditional_batch_applies_once(cassandra_session, fresh_keyspace):
    from cassandra import ConsistencyLevel
    from cassandra.query import BatchStatement

    s = cassandra_session
    s.execute(
        f"""CREATE TABLE {fresh_keyspace}.heads (
              conv text, seq int, item text, head int STATIC, attempt text STATIC,
              PRIMARY KEY (conv, seq))""",
        timeout=60,
    )
    insert_head = s.prepare(
        f"INSERT INTO {fresh_keyspace}.heads (conv, head, attempt) VALUES (?, ?, ?) IF NOT EXISTS")
    assert s.execute(insert_head, ("c1", 0, "t0")).was_applied

    advance = s.prepare(
        f"UPDATE {fresh_keyspace}.heads SET head = ?, attempt = ? WHERE conv = ? IF head = ?")
    add_item = s.prepare(
        f"INSERT INTO {fresh_keyspace}.heads (conv, seq, item) VALUES (?, ?, ?) IF NOT EXISTS")

    def promote(token: str):
        batch = BatchStatement(serial_consistency_level=ConsistencyLevel.SERIAL)
        batch.add(advance, (1, token, "c1", 0))
        batch.add(add_item, ("c1", 1, f"item from {token}"))
        return s.execute(batch)

    first = promote("attempt-a")
    assert first.was_applied

    second = promote("attempt-b")
    assert not second.was_applied
    current = {(r.conv, r.seq): r for r in second.current_rows}
    # The server returns the current values of the checked rows: the head is at 1 with
    # the first attempt's token and the clustering row already exists.
    heads = [r for r in current.values() if r.head is not None]
    assert heads and all(r.head == 1 and r.attempt == "attempt-a" for r in heads)

    rows = list(s.execute(f"SELECT seq, item, head, attempt FROM {fresh_keyspace}.heads "
                          "WHERE conv = 'c1'"))
    assert [(r.seq, r.item) for r in rows] == [(1, "item from attempt-a")]
    assert rows[0].head == 1 and rows[0].attempt == "attempt-a"


def test_registry_enforces_backward_compatibility(schema_registry_client, unique_name):
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    sr = schema_registry_client
    subject = unique_name("ratchet-test") + "-value"
    v1 = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "b", "type": "int", "default": 0}]}
    breaking = {**v1, "fields": [*v1["fields"], {"name": "c", "type": "int"}]}  # no default

    id1 = sr.register_schema(subject, Schema(json.dumps(v1), "AVRO"))
    assert sr.set_compatibility(subject, "BACKWARD")["compatibilityLevel"] == "BACKWARD"
    assert sr.get_compatibility(subject) == "BACKWARD"
    assert json.loads(sr.get_schema(id1).schema_str) == v1
    # the same schema, formatted differently, keeps its id
    assert sr.register_schema(subject, Schema(json.dumps(v1, indent=2), "AVRO")) == id1

    assert not sr.test_compatibility(subject, Schema(json.dumps(breaking), "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        sr.register_schema(subject, Schema(json.dumps(breaking), "AVRO"))
    assert refused.value.http_status_code == 409

    id2 = sr.register_schema(subject, Schema(json.dumps(v2), "AVRO"))
    assert id2 != id1
    assert sr.get_versions(subject) == [1, 2]
    assert sr.delete_subject(subject) == [1, 2]


@pytest.mark.slow
def test_one_server_restarts_alone_and_registry_keeps_schema_ids(
    settings, schema_registry_client, unique_name
):
    """The fault-injection API: stop one server, see it down, start it, nothing lost."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from infra import launcher

    if launcher.server_status(settings, "registry").pid is None:
        # CI starts every server with the local launcher: there this must not skip.
        why = "the registry was not started by the local launcher (RATCHET_* or compose)"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    subject = unique_name("ratchet-test") + "-value"
    schema = {"type": "record", "name": "Kept", "fields": [{"name": "a", "type": "long"}]}
    schema_id = schema_registry_client.register_schema(subject, Schema(json.dumps(schema), "AVRO"))

    assert launcher.stop_server(settings, "registry", out=print) in ("stopped", "killed")
    assert not launcher.server_status(settings, "registry").healthy
    assert launcher.server_status(settings, "kafka").healthy  # the others keep running
    launcher.start_server(settings, "registry", out=print)

    entry = launcher.StateFile(settings.home).get("registry")
    port = launcher.server(settings, "registry").client_port()
    assert entry is not None and launcher.pid_listens_on(entry.pid, port)
    fresh = SchemaRegistryClient({"url": settings.schema_registry_url})  # no client cache
    assert json.loads(fresh.get_schema(schema_id).schema_str) == schema
    fresh.delete_subject(subject)


def _free_port() -> int:
    """A local port that nothing listens on now (the fake servers' client port)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_server_that_dies_at_start_is_reported_with_exit_code_and_log(tmp_path):
    """No real server needed: a fake one whose process exits at once."""
    from infra import launcher
    from infra.servers import Server
    from ratchet.settings import Settings

    port = _free_port()  # nobody listens on it

    class Broken(Server):
        name, version, start_timeout_s = "broken", "0", 20

        def fetch(self): ...
        def is_fetched(self): return True
        def prepare(self): self.data_dir.mkdir(parents=True, exist_ok=True)
        def command(self): return ["sh", "-c", "echo 'cannot bind: boom' >&2; exit 3"]
        def client_port(self): return port
        def check(self, timeout_s=10.0): raise launcher.Unhealthy("never")
        def endpoint(self): return "nowhere"

    settings = Settings(home=tmp_path)
    with pytest.raises(launcher.ServerStartError) as err:
        launcher._ensure_started(Broken(settings), launcher.StateFile(tmp_path), print)
    msg = str(err.value)
    assert err.value.exit_code == 3 and "broken failed to start" in msg
    assert str(tmp_path / "logs" / "broken.log") in msg and "cannot bind: boom" in msg


def test_the_launched_cassandra_runs_with_its_timer_slack(settings):
    """Every thread of the local Cassandra (its worker pool's spin-waits above all) runs
    with the configured slack: set before the JVM started, inherited by its threads."""
    from infra import launcher

    entry = launcher.StateFile(settings.home).get("cassandra")
    if entry is None or not launcher.is_alive(entry):
        why = "Cassandra was not started by the local launcher (RATCHET_* or compose)"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    expected = str(launcher.server(settings, "cassandra").timer_slack_ns() or 50_000)
    threads = list(Path(f"/proc/{entry.pid}/task").iterdir())
    slacks = {(Path("/proc") / t.name / "timerslack_ns").read_text().strip() for t in threads}
    assert len(threads) > 20 and slacks == {expected}


def test_the_launcher_starts_a_server_with_its_timer_slack(tmp_path):
    """No real server needed: a fake one that writes down its own slack, then listens."""
    from infra import launcher
    from infra.servers import Server
    from ratchet.settings import Settings

    port = _free_port()
    seen = tmp_path / "slack"
    listen = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); "
              "s.listen(); time.sleep(60)")

    class Slack(Server):
        name, version, start_timeout_s = "slack", "0", 20

        def fetch(self): ...
        def is_fetched(self): return True
        def prepare(self): self.data_dir.mkdir(parents=True, exist_ok=True)
        def command(self):
            return ["sh", "-c", f"cat /proc/$$/timerslack_ns > {seen}; "
                                f"exec {sys.executable} -c \"{listen}\""]
        def client_port(self): return port
        def timer_slack_ns(self): return 456_000
        def check(self, timeout_s=10.0):
            if not self.port_open():
                raise launcher.Unhealthy("not listening yet")
        def endpoint(self): return f"slack 127.0.0.1:{port}"

    state = launcher.StateFile(tmp_path)
    srv = Slack(Settings(home=tmp_path))
    launcher._ensure_started(srv, state, print)
    try:
        assert seen.read_text().strip() == "456000"
    finally:
        launcher.terminate(state.get("slack"))


if __name__ == "__main__" and sys.argv[1:2] == ["faust-worker"]:
    faust_worker(*sys.argv[2:7])
