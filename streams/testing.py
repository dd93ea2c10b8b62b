"""Drive a real promotion worker from outside: produce events, collect outcomes.

Used by the integration and fault tests and by the benches (``ratchet/bench/``).
Everything talks to the real servers of ``settings``; a unique topic prefix and
consumer group per run keep runs apart.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from ratchet.settings import Settings
from schemas.avro import EventSerde, encode_key, register_schemas
from schemas.models import Frozen
from services.gateway.kafka_calls import interruptible
from streams.topics import Topics, delete_topics_with_prefix, ensure_topics

ROOT = Path(__file__).resolve().parents[1]


def isolated_settings(settings: Settings, tag: str = "t", partitions: int | None = None,
                      home: Path | None = None) -> Settings:
    """``settings`` with a topic prefix (and optionally home/partitions) of its own."""
    prefix = f"ratchet-{tag}-{uuid.uuid4().hex[:8]}."
    return replace(settings, topic_prefix=prefix,
                   partitions=partitions or settings.partitions,
                   home=home or settings.home)


def worker_env(settings: Settings, group: str) -> dict[str, str]:
    return {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT),
            "RATCHET_CONSUMER_GROUP": group,
            "RATCHET_LOG_LEVEL": os.environ.get("RATCHET_LOG_LEVEL", "WARNING")}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WorkerProcess:
    """``ratchet worker`` as a subprocess (a Faust worker owns its loop and signals)."""

    def __init__(self, settings: Settings, group: str, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        # Set when the test itself stops the worker: any other exit is a failure to report.
        self.stopped_on_purpose = False
        # Each test worker gets its own metrics port: several may run on one machine.
        self.metrics_port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ratchet.cli", "worker"],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
            env=worker_env(replace(settings, worker_metrics_port=self.metrics_port), group)
            | (env or {}),
        )

    def metrics(self) -> str:
        """The worker's Prometheus exposition text."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as answer:
            return answer.read().decode()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000, skip: str = "HTTP Request: ") -> str:
        """The end of the worker's log, without lines containing ``skip`` (at INFO the
        registry client logs every request, which would crowd out everything else)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        if skip:
            text = "".join(line for line in text.splitlines(keepends=True) if skip not in line)
        return f"--- {self.log_path.name} (pid {self.pid}, exit {self.proc.returncode}) ---\n" \
            + text[-chars:]

    def stacks(self) -> str:
        """Every thread's Python stack of the live worker (py-spy, when installed): what a
        stalled worker is waiting on, for failure reports."""
        spy = Path(sys.executable).with_name("py-spy")
        if not self.alive() or not spy.exists():
            return ""
        try:
            done = subprocess.run([str(spy), "dump", "--pid", str(self.pid)],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"(py-spy failed: {exc})"
        return f"--- stacks of {self.log_path.stem} (pid {self.pid}) ---\n" \
            + (done.stdout or done.stderr)

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM: finish in-flight events, commit, exit."""
        self.stopped_on_purpose = True
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: no cleanup at all (crash simulation)."""
        self.stopped_on_purpose = True
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class EventProducer:
    """Produce gateway events (Avro via the registry) keyed by their partition key."""

    def __init__(self, settings: Settings, serde: EventSerde, topics: Topics) -> None:
        self.serde = serde
        self.topic = topics.gateway_events
        self.producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                                  "enable.idempotence": True, "linger.ms": 5})
        self._bootstrap = settings.kafka_bootstrap
        # response_id -> (partition, offset) of its event, once the broker acked it
        # (failure reports say where a missing outcome's event sits).
        self.placed: dict[str, tuple[int, int]] = {}
        self.failed: list[tuple[str | None, str]] = []  # (response_id, delivery error)
        self.resent: list[str] = []  # response ids sent again by ``deliver``
        # Response ids (None: raw records) reported delivered without an offset.
        self.unconfirmed: list[str | None] = []
        self._wait_until_writable()

    def _wait_until_writable(self, timeout_s: float = 30) -> None:
        """The topic was usually created a moment ago: wait until the producer sees a
        leader for every partition AND the broker answers for each one's log (a new
        partition is led in the metadata before the broker has loaded its log, a
        second or more for 60 partitions on a busy box), so that the first events are
        not sent while the partitions are still settling."""
        deadline = time.monotonic() + timeout_s
        while True:
            meta = self.producer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if meta is not None and meta.error is None and meta.partitions and all(
                    p.leader >= 0 for p in meta.partitions.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"topic {self.topic} has no leader for every partition")
            time.sleep(0.1)
        probe = Consumer({"bootstrap.servers": self._bootstrap,
                          "group.id": f"ratchet-probe-{uuid.uuid4().hex[:8]}"})
        try:
            for partition in sorted(meta.partitions):
                while True:
                    try:  # ListOffsets: answered by the leader once the log is loaded
                        probe.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                    timeout=5)
                        break
                    except Exception as exc:  # noqa: BLE001 - retried until the deadline
                        if time.monotonic() > deadline:
                            raise RuntimeError(
                                f"{self.topic}[{partition}] not answering: {exc}") from exc
                        time.sleep(0.1)
        finally:
            probe.close()

    def send(self, *events: Frozen) -> None:
        for event in events:
            key = event.conversation_id or event.chain_root_id or event.response_id
            self.send_raw(encode_key(key), self.serde.encode(event, self.topic),
                          on_delivery=self._delivered_callback(event.response_id))

    def _delivered_callback(self, response_id: str | None) -> Callable:
        def delivered(err, msg) -> None:
            if err is not None:
                # A lost event looks like a stalled worker from outside (its
                # conversation's later turns are OUT_OF_ORDER forever): say so.
                self.failed.append((response_id, str(err)))
            elif msg.offset() is None:
                # "Delivered" without an offset: librdkafka reports a batch the broker
                # called a duplicate as a success, and seen here (CI, 2026-11-29) such
                # events were NOT in the log. Not placed: ``deliver`` sends it again
                # (a real duplicate is harmless: the processor dedupes redeliveries).
                self.unconfirmed.append(response_id)
            elif response_id is not None:
                self.placed[response_id] = (msg.partition(), msg.offset())
        return delivered

    def send_raw(self, key: bytes | None, value: bytes | None,
                 on_delivery: Callable | None = None) -> None:
        on_delivery = on_delivery or self._delivered_callback(None)
        while True:
            try:
                self.producer.produce(self.topic, value=value, key=key,
                                      on_delivery=on_delivery)
                break
            except BufferError:
                interruptible(self.producer.poll, 0.1)
        interruptible(self.producer.poll, 0)

    def deliver(self, *events: Frozen, attempts: int = 3) -> None:
        """Send ``events`` and wait until the broker has acknowledged each one; an event
        without a delivery report after the flush is sent again (before anything that
        must follow it). Twice in the fault test, under load, an event vanished without
        any report (neither success nor error; 199 of 200 on the topic), and its
        conversation's later turns were then OUT_OF_ORDER: a stall from outside."""
        pending = [e for e in events if e.response_id is not None]
        self.send(*events)
        for _ in range(attempts):
            self.flush()
            pending = [e for e in pending if e.response_id not in self.placed]
            if not pending:
                return
            self.resent.extend(e.response_id for e in pending)
            self.send(*pending)
        self.flush()
        lost = [e.response_id for e in pending if e.response_id not in self.placed]
        if lost:
            raise RuntimeError(f"{len(lost)} events never acknowledged: {lost[:5]}")

    def flush(self) -> None:
        """Wait for every event; fail if any was not written (nothing silently lost)."""
        # Ctrl-C inside a report (a bench's): ``KeyboardInterrupt``, not ``SystemError``
        # (``services.gateway.kafka_calls``; session 50).
        remaining = interruptible(self.producer.flush, 60)
        if remaining:
            raise RuntimeError(f"{remaining} events not delivered")
        if self.failed:
            raise RuntimeError(f"{len(self.failed)} events failed delivery: {self.failed[:5]}")


@dataclass
class Seen:
    topic: str
    partition: int
    offset: int
    model: Frozen


class OutcomeCollector:
    """Read every outcome topic from the beginning in a background thread."""

    def __init__(self, settings: Settings, serde: EventSerde, topics: Topics) -> None:
        self.serde = serde
        self.topics = topics
        # Called while waiting; raises to end a wait that can no longer succeed.
        self.watch: Callable[[], None] = lambda: None
        self.by_response: dict[str, list[Seen]] = defaultdict(list)
        self.dead_letters: list[Seen] = []
        self.all: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer({
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"collector-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        })
        names = [topics.checkpoints, topics.rejections, topics.orphaned_effects,
                 topics.dead_letters]
        self._consumer.assign([TopicPartition(t, p, -2) for t in names
                               for p in range(settings.partitions)])
        self._thread = threading.Thread(target=self._run, daemon=True, name="collector")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, timeout=0.2):
                if msg.error():
                    continue
                model = self.serde.decode(msg.value(), msg.topic(), msg.partition(),
                                          msg.offset())
                seen = Seen(msg.topic(), msg.partition(), msg.offset(), model)
                with self._lock:
                    self.all.append(seen)
                    if msg.topic() == self.topics.dead_letters:
                        self.dead_letters.append(seen)
                    else:
                        self.by_response[model.response_id].append(seen)

    def count(self, topic: str | None = None) -> int:
        with self._lock:
            return sum(1 for s in self.all if topic is None or s.topic == topic)

    def outcomes(self, response_id: str) -> list[Frozen]:
        """Promoted / rejected outcomes of one response (not orphaned effects)."""
        with self._lock:
            return [s.model for s in self.by_response.get(response_id, [])
                    if s.topic in (self.topics.checkpoints, self.topics.rejections)]

    def orphans(self, response_id: str) -> list[Frozen]:
        with self._lock:
            return [s.model for s in self.by_response.get(response_id, [])
                    if s.topic == self.topics.orphaned_effects]

    def wait(self, condition: Callable[[], bool], timeout_s: float = 60,
             why: str = "outcomes") -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            self.watch()
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s}s waiting for {why}")
            time.sleep(0.05)

    def outcome(self, response_id: str, timeout_s: float = 60) -> Frozen:
        """The first outcome of ``response_id`` (waits for it)."""
        self.wait(lambda: self.outcomes(response_id), timeout_s, f"outcome of {response_id}")
        return self.outcomes(response_id)[0]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()


class Rig:
    """Topics + producer + collector for one isolated run (workers are started apart)."""

    def __init__(self, settings: Settings, *, collect: bool = True) -> None:
        """``collect=False``: no ``OutcomeCollector`` (``collector`` is None). The
        benchmark counts outcomes its own cheap way: a collector decodes every outcome in
        a thread of the measuring process and fetches each as it comes, work the
        measured pipeline would be charged for (docs/benchmarks.md, "The bench's own
        observers")."""
        from schemas.avro import registry_client

        self.settings = settings
        client = registry_client(settings.schema_registry_url)
        register_schemas(client)
        self.serde = EventSerde(client)
        self.topics = ensure_topics(settings)
        self.producer = EventProducer(settings, self.serde, self.topics)
        self.collector: OutcomeCollector | None = None
        if collect:
            self.collector = OutcomeCollector(settings, self.serde, self.topics)
            self.collector.watch = self._check_workers
        self.group = f"ratchet-test-{uuid.uuid4().hex[:8]}"
        self.workers: list[WorkerProcess] = []

    def worker(self, log_dir: Path, tag: str = "worker",
               env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(self.settings, self.group, log_dir / f"{tag}.log", env)
        self.workers.append(worker)
        return worker

    def _check_workers(self) -> None:
        """A worker that died without the test stopping it fails the wait at once,
        with its log, instead of letting the wait run into its timeout."""
        for worker in self.workers:
            if not worker.stopped_on_purpose and not worker.alive():
                raise RuntimeError(
                    f"worker {worker.log_path.name} exited with code "
                    f"{worker.proc.returncode} while the test waited:\n{worker.log_tail()}")

    def send(self, *events: Frozen) -> None:
        """Send and wait until the broker has each one (see ``EventProducer.deliver``)."""
        self.producer.deliver(*events)

    def close(self) -> None:
        # A worker a test left running would outlive the test run (it reconnects to
        # whatever serves the ports next): stop every one this rig started.
        for worker in self.workers:
            if worker.alive():
                worker.terminate(timeout_s=20)
        if self.collector is not None:
            self.collector.close()
        # Its own topics, and the Faust internal ones of its consumer group.
        delete_topics_with_prefix(self.settings.kafka_bootstrap,
                                  [self.settings.topic_prefix, f"{self.group}-"])
