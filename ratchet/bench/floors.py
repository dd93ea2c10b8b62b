"""The raw baselines of ``ratchet bench processor`` (its floors): raw Kafka, the raw
Cassandra LWT (both drivers), the raw pipelines (consume -> LWT(s) -> publish ->
commit, none of ratchet's code; on a backlog and paced, ``PacedFloor``) and floor 0,
the Faust app alone. Each is the least a processor of this design does per turn."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import os
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from ratchet.bench.measure import (
    CpuWindow,
    RequestCounter,
    RunFailed,
    add_into,
    say,
    settle,
    unique_name,
)
from ratchet.bench.probe import LatencyProbe
from ratchet.bench.table import Row
from ratchet.settings import Settings
from schemas.avro import encode_key

RAW_LWT_IN_FLIGHT = 12  # the worker's 12 lanes, one blocking promotion each


# --- raw Kafka ---------------------------------------------------------------------------


def raw_kafka(settings: Settings, value: bytes, records: int,
              pids: dict[str, int]) -> tuple[Row, Row]:
    """Produce ``records`` copies of one encoded turn (distinct keys) to a fresh
    12-partition topic with confluent-kafka, then read them with one aiokafka consumer."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"{settings.topic_prefix}raw-baseline"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=settings.partitions,
                                  replication_factor=1)])[topic].result(30)
    try:
        producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                             "enable.idempotence": True, "linger.ms": 5})
        keys = [encode_key(f"conv_{i:08d}") for i in range(records)]
        who = {"client": os.getpid(), **pids}
        with CpuWindow(who) as produced:
            for key in keys:
                while True:
                    try:
                        producer.produce(topic, value=value, key=key)
                        break
                    except BufferError:
                        producer.poll(0.05)
                producer.poll(0)
            if producer.flush(60):
                raise RunFailed("raw baseline: records not delivered")
        say(f"raw Kafka: produced {records} in {produced.seconds:.1f} s")
        with CpuWindow(who) as consumed:
            got = asyncio.run(_aiokafka_read(settings, topic, records))
        say(f"raw Kafka: consumed {got} in {consumed.seconds:.1f} s")
        return (
            Row("raw Kafka produce (confluent-kafka, acks=all)", records, produced.seconds,
                produced.cpu_s),
            Row("raw Kafka consume (1 aiokafka consumer)", got, consumed.seconds,
                consumed.cpu_s),
        )
    finally:
        _delete_topics(admin, [topic])


_deferred_topics: list[tuple[object, list[str]]] | None = None


def _delete_topics(admin, topics: list[str]) -> None:
    """Delete now, or at the end of the bench's run (``deferred_topic_deletion``): a
    broker removes a deleted topic's files later (a minute by default,
    ``file.delete.delay.ms``), at up to a core of Kafka's CPU, in another line's run."""
    if _deferred_topics is None:
        admin.delete_topics(topics)
    else:
        _deferred_topics.append((admin, topics))


@contextlib.contextmanager
def deferred_topic_deletion():
    """Scratch topics deleted when the block ends, not while other lines measure."""
    global _deferred_topics
    _deferred_topics = []
    try:
        yield
    finally:
        pending, _deferred_topics = _deferred_topics, None
        for admin, topics in pending:
            admin.delete_topics(topics)


async def _aiokafka_read(settings: Settings, topic: str, records: int) -> int:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as AioTP

    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([AioTP(topic, p) for p in range(settings.partitions)])
        got = 0
        deadline = time.monotonic() + 60
        while got < records and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            got += sum(len(b) for b in batches.values())
        return got
    finally:
        await consumer.stop()


# --- raw Cassandra LWT -------------------------------------------------------------------


@contextlib.contextmanager
def scratch_lwt_table(settings: Settings, tag: str, *extra_tables: str):
    """A keyspace of its own (dropped afterwards) with table ``lwt (k, c, v blob)`` and
    ``extra_tables`` (CQL bodies); yields (session, keyspace, ``_lwt_insert``)."""
    from services.cassandra_cluster import open_cluster

    keyspace = f"{settings.keyspace}_bench_{tag}_{uuid.uuid4().hex[:6]}"
    cluster = open_cluster(settings)
    session = cluster.connect()
    try:
        session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                        f"{settings.replication}", timeout=60)
        for table in ("lwt (k text, c text, v blob, PRIMARY KEY (k, c))", *extra_tables):
            session.execute(f"CREATE TABLE {keyspace}.{table}", timeout=60)
        yield session, keyspace, _lwt_insert(session, keyspace)
    finally:
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        except Exception as exc:  # noqa: BLE001 - never hide the error that ended the run
            say(f"could not drop {keyspace}: {exc}")
        cluster.shutdown()


def _lwt_insert(session, keyspace: str):
    """The prepared single-row ``INSERT ... IF NOT EXISTS`` into ``keyspace.lwt``, with
    the store's consistency and no driver retry."""
    from cassandra import ConsistencyLevel
    from cassandra.policies import FallthroughRetryPolicy

    insert = session.prepare(f"INSERT INTO {keyspace}.lwt (k, c, v) VALUES (?, ?, ?) "
                             "IF NOT EXISTS")
    insert.consistency_level = ConsistencyLevel.LOCAL_QUORUM
    insert.serial_consistency_level = ConsistencyLevel.SERIAL
    insert.retry_policy = FallthroughRetryPolicy()
    return insert


def raw_lwt(settings: Settings, ops: int, pids: dict[str, int]) -> Row:
    """``ops`` single-row INSERT IF NOT EXISTS, ``RAW_LWT_IN_FLIGHT`` at a time."""
    with scratch_lwt_table(settings, "raw") as (session, _, insert):
        payload = os.urandom(1024)
        for i in range(50):  # warm-up
            session.execute(insert, (f"warm{i}", "", payload), timeout=10)
        per_thread = max(1, ops // RAW_LWT_IN_FLIGHT)
        errors: list[BaseException] = []

        def run(w: int) -> None:
            try:
                for i in range(per_thread):
                    result = session.execute(insert, (f"k{w}_{i}", "", payload), timeout=10)
                    assert result.was_applied
            except BaseException as exc:  # reported after the run
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(RAW_LWT_IN_FLIGHT)]
        settle(pids)  # its keyspace's creation (schema flushes) is not the LWTs' work
        with CpuWindow({"client": os.getpid(), **pids}) as window:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        done = per_thread * RAW_LWT_IN_FLIGHT
        say(f"raw LWT: {done} in {window.seconds:.1f} s")
        return Row(f"raw Cassandra LWT INSERT IF NOT EXISTS, {RAW_LWT_IN_FLIGHT} in flight",
                   done, window.seconds, window.cpu_s)


# --- raw pipeline: the least any processor on this stack must do per turn ------------


@dataclass
class FloorResult:
    """What the raw pipeline did: checked by its test, so the figure is of real work."""

    consumed: int
    applied: int  # LWTs that answered [applied]=true
    published: int
    committed: dict[int, int]  # partition -> committed offset
    rows: int = 0  # rows in the LWT table afterwards
    requests: int = 0  # Cassandra requests sent while measuring
    most_in_flight: int = 0  # the most events one lane handled at once
    run_s: float = 0.0  # the whole run, its start-up and its stop included
    latency: list[float] = field(default_factory=list)  # produce -> outcome ms (paced runs)


FLOOR_SHAPES = {
    "lwt": "raw pipeline: consume + 1 LWT + publish + commit",
    "lwt2": "raw pipeline: consume + 2 LWTs (claim, then batch) + publish + commit",
    "read": "raw pipeline: + 1 read before the LWT",
    "ratchet": "raw pipeline: + read beside a claim LWT, then LWT, status write",
}
# The plain statements' tables of the floor shapes (beside ``lwt``).
FLOOR_TABLES = ("facts (k text, c text, v text, PRIMARY KEY (k, c))",
                "status (k text PRIMARY KEY, v text)")
# The floors ratchet's throughput is judged against (every round of them).
THROUGHPUT_FLOORS = ("lwt", "lwt2")
FLOOR_NAMES = {"lwt": "floor 1", "lwt2": "floor 1b", "read": "floor 2", "ratchet": "floor 3"}


def floor_topics(settings: Settings, name: str):
    """A fresh (source, sink) topic pair for one floor run, and the admin client that
    deletes them afterwards: (admin, source, sink)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    run = f"{settings.topic_prefix}{name}-{uuid.uuid4().hex[:6]}"
    source, sink = f"{run}-in", f"{run}-out"
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    for future in admin.create_topics([
            NewTopic(t, num_partitions=settings.partitions, replication_factor=1)
            for t in (source, sink)]).values():
        future.result(30)
    return admin, source, sink


def raw_pipeline(settings: Settings, records: int, pids: dict[str, int], *,
                 shape: str = "lwt") -> tuple[Row, FloorResult]:
    """A floor under the end-to-end figure, composed of the raw baselines only.

    ``records`` events (one ~1 KiB turn each, distinct keys) go through the minimum a
    promotion processor on this stack does per turn, with none of ratchet's code:
    consume (aiokafka, a consumer group) -> ONE single-row LWT (``INSERT ... IF NOT
    EXISTS``, driver callbacks, no thread hop) -> publish one outcome (aiokafka,
    acks=all) -> commit, with one in-order lane per partition and the worker's lane
    window (``RATCHET_LANE_WINDOW`` events of a partition in flight, acked in offset
    order), like the worker. No decoding, validation, ledger, hint or status write: no
    processor of this design (an LWT per turn, durable before published) goes faster here.

    ``shape`` adds requests, as raw statements: ``lwt2``: a second conditional write
    per turn before the first, in another partition (the response id's claim, which
    binds it once per tenant across partitions). ``read``: the one read no design can
    skip (a request's durable facts: dedupe, cancellation, tool effects; memory is
    bounded, Cassandra is the truth) before the LWT. ``ratchet``: the request shape of
    ratchet's processor: that read in parallel with the claim LWT, before the
    promotion LWT; one write of status and owners after it.

    A backlog: the events are produced before the pipeline starts. Fed at a rate, with
    its latency: ``PacedFloor``.
    """
    admin, source, sink = floor_topics(settings, f"floor-{shape}")
    try:
        with scratch_lwt_table(settings, "floor", *FLOOR_TABLES) as (session, keyspace, insert):
            return _floor_measure(settings, session, keyspace, insert, source, sink,
                                  records, pids, shape)
    finally:
        _delete_topics(admin, [source, sink])


def _floor_measure(settings: Settings, session, keyspace: str, insert, source: str,
                   sink: str, records: int, pids: dict[str, int],
                   shape: str, rate: float | None = None,
                   run: str = "") -> tuple[Row, FloorResult]:
    """Produce ``records`` events, then time the pipeline over them (see raw_pipeline).
    Paced (``rate``), the pipeline runs in a process of its own (``_floor_child``), as
    ratchet's worker does: the probe's and the paced sender's threads here do not share
    its interpreter."""
    plain = _plain_statements(session, keyspace)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap,
                         "enable.idempotence": True, "linger.ms": 5})
    value = os.urandom(1024)
    items = [(f"floor-{run}{i:08d}".encode(), value) for i in range(records)]
    probe = sender = None
    ready = None if rate is None else _SPAWN.Event()  # a backlog needs no start signal
    if rate is None:
        for key, _ in items:
            producer.produce(source, value=value, key=key)
            producer.poll(0)
        if producer.flush(60):
            raise RunFailed("raw pipeline: events not delivered")
        # The previous floor's keyspace drop flushed every dirty memtable (system.paxos
        # too) and compactions follow; this floor's keyspace creation flushed the schema
        # tables. Not this floor's work: ~0.3-1.0 ms of Cassandra CPU per turn landed in
        # 1-second floor windows before (docs/benchmarks.md).
        settle(pids)
    else:
        settle(pids)  # the scratch keyspace's creation is not the floor's latency
        probe = LatencyProbe(settings, [sink])
        sender = probe.pace(lambda k, v: (producer.produce(source, value=v, key=k),
                                          producer.poll(0)), items, rate, ready)
        collector = threading.Thread(target=probe.collect, args=(records, 600), daemon=True)
        collector.start()  # arrivals are timed while the pipeline runs
    counter = RequestCounter(session)
    if rate is None:
        window = CpuWindow({"client": os.getpid(), **pids})
        result = asyncio.run(_floor_run(settings, source, sink, records, session,
                                        insert, plain, shape, ready, window))
    else:
        # From the topic's end: a run may reuse the topics of an earlier one.
        result, window = _floor_in_child(settings, source, sink, records, keyspace, shape,
                                         pids, ready)
    if probe is not None and sender is not None:
        sender.join()
        producer.flush(60)
        collector.join(30)
        result.latency = probe.latencies_ms()
        probe.close()
    result.requests = counter.total()
    if not run:  # a table of its own: its rows are this run's
        result.rows = session.execute(f"SELECT count(*) FROM {keyspace}.lwt",
                                      timeout=60).one()[0]
    say(f"raw pipeline ({shape}): {result.consumed} turns in {window.seconds:.1f} s")
    return (Row(FLOOR_SHAPES[shape], result.consumed, window.seconds, window.cpu_s,
                unit="turns", background_s=window.background_s), result)


_SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter, no forked driver


def _plain_statements(session, keyspace: str) -> Statements:
    from cassandra import ConsistencyLevel

    plain = Statements(
        read=session.prepare(f"SELECT c, v FROM {keyspace}.facts WHERE k = ?"),
        status=session.prepare(f"UPDATE {keyspace}.status SET v = ? WHERE k = ?"),
    )
    for statement in vars(plain).values():
        statement.consistency_level = ConsistencyLevel.QUORUM
    return plain


def _floor_in_child(settings: Settings, source: str, sink: str, records: int,
                    keyspace: str, shape: str, pids: dict[str, int],
                    ready=None) -> tuple[FloorResult, CpuWindow]:
    """``_floor_run`` in a spawned process; its result, and the CPU window with the
    child as ``client``."""
    results = _SPAWN.Queue()
    child = _SPAWN.Process(target=_floor_child, name="floor", daemon=True, args=(
        settings, source, sink, records, keyspace, shape, ready, results))
    child.start()
    try:
        # The child's start (imports, connections, the group join) is not the run: its
        # window starts when its consumer has its partitions (``ready``), or at once if
        # it failed first.
        deadline = time.monotonic() + 120
        while (ready is not None and not ready.wait(0.2) and child.is_alive()
               and results.empty() and time.monotonic() < deadline):
            pass
        with CpuWindow({"client": child.pid, **pids}) as window:
            outcome = results.get(timeout=660)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    if isinstance(outcome, BaseException):
        raise RunFailed("the floor's process failed") from outcome
    return outcome, window


def _floor_child(settings: Settings, source: str, sink: str, records: int, keyspace: str,
                 shape: str, ready, results) -> None:
    """The floor pipeline, in the spawned process: its own driver session and loop."""
    from services.cassandra_cluster import open_cluster

    try:
        cluster = open_cluster(settings)
        try:
            session = cluster.connect()
            result = asyncio.run(_floor_run(
                settings, source, sink, records, session, _lwt_insert(session, keyspace),
                _plain_statements(session, keyspace), shape, ready))
        finally:
            cluster.shutdown()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        results.put(RuntimeError(f"{type(exc).__name__}: {exc}"))  # always picklable
    else:
        results.put(result)


@dataclass(frozen=True)
class Statements:
    """The plain statements of ``raw_pipeline``'s shapes."""

    read: object
    status: object


async def _floor_run(settings: Settings, source: str, sink: str, records: int, session,
                     insert, plain: Statements, shape: str,
                     ready: threading.Event | None = None,
                     window: CpuWindow | None = None) -> FloorResult:
    """``window``: entered once the consumer has its partitions and left when the last
    event is done, so the consumer's start and group join, and its final commit and
    stop, are outside the measured interval (the worker's start is outside its own)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as AioTP

    began = time.monotonic()
    loop = asyncio.get_running_loop()

    def cql(statement, params) -> asyncio.Future:
        """The driver's callback future as an asyncio future (no thread hop)."""
        done = loop.create_future()
        future = session.execute_async(statement, params, timeout=10)
        future.add_callbacks(
            lambda rows: loop.call_soon_threadsafe(done.set_result, rows),
            lambda exc: loop.call_soon_threadsafe(done.set_exception, exc))
        return done

    # A paced run (``ready`` given) starts at the topic's end and lets the producer
    # start once every partition's position is known: its topics may be an earlier
    # run's. A backlog is produced before it starts: from the beginning.
    consumer = AIOKafkaConsumer(source, bootstrap_servers=settings.kafka_bootstrap,
                                group_id=unique_name("bench-floor"), enable_auto_commit=False,
                                auto_offset_reset="earliest" if ready is None else "latest")
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    # What start-up built (modules, clients) out of the collector's reach, as the worker
    # does (streams/worker.py): a fresh process's first full collections otherwise walk
    # it mid-run (a 70-90 ms stall in most first paced rounds).
    gc.collect()
    gc.freeze()
    result = FloorResult(0, 0, 0, {})
    queues: dict[int, asyncio.Queue] = {}
    acked: dict[int, int] = {}

    def counted() -> None:
        """One more event done; the last one closes the measured interval at once (the
        main loop notices it only after its next fetch returns, up to 100 ms later)."""
        result.consumed += 1
        if result.consumed >= records and window is not None and window.t0 \
                and not window.seconds:
            window.__exit__(None, None, None)

    async def turn(msg) -> None:
        """One event's requests and its outcome's publish."""
        key = msg.key.decode()
        if shape == "read":
            await cql(plain.read, (key,))
        elif shape == "lwt2":
            await cql(insert, (f"claim-{key}", "", b""))
        elif shape == "ratchet":
            await asyncio.gather(cql(plain.read, (key,)),
                                 cql(insert, (f"claim-{key}", "", b"")))
        rows = await cql(insert, (key, "", msg.value))
        result.applied += bool(rows[0][0])  # the [applied] column
        if shape == "ratchet":
            await cql(plain.status, ("promoted", key))
        await (await producer.send(sink, b"outcome", key=msg.key))
        result.published += 1

    # The worker's lane window (``RATCHET_LANE_WINDOW``): up to ``lane_window`` events of a
    # partition in flight at once (the floor's keys are all distinct), acked in offset
    # order. Window 1: one event at a time per partition, awaited in the lane itself.
    lane_window = settings.lane_window
    failed: list[BaseException] = []

    async def lane(queue: asyncio.Queue) -> None:
        if lane_window == 1:
            result.most_in_flight = 1
            while True:
                msg = await queue.get()
                await turn(msg)
                acked[msg.partition] = msg.offset + 1  # in order: one lane per partition
                counted()
        in_flight: deque = deque()  # (message, task), in offset order, until acked
        slots = asyncio.Semaphore(lane_window)  # bounds the events being handled
        handling = 0

        def finished(task: asyncio.Task) -> None:
            nonlocal handling
            handling -= 1
            slots.release()
            if not task.cancelled() and task.exception() is not None:
                failed.append(task.exception())
            while in_flight and in_flight[0][1].done() and not in_flight[0][1].cancelled():
                if in_flight[0][1].exception() is not None:
                    return  # never acked: the floor fails (``failed``)
                msg, _ = in_flight.popleft()
                acked[msg.partition] = msg.offset + 1
                counted()

        try:
            while True:
                msg = await queue.get()
                await slots.acquire()
                task = asyncio.ensure_future(turn(msg))
                in_flight.append((msg, task))
                handling += 1
                result.most_in_flight = max(result.most_in_flight, handling)
                task.add_done_callback(finished)
        finally:
            for _, task in in_flight:
                task.cancel()

    lanes = []
    try:
        last_commit = time.monotonic()
        deadline = time.monotonic() + 600
        while result.consumed < records and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=100, max_records=500)
            if ready is not None and not ready.is_set() and consumer.assignment():
                for tp in consumer.assignment():
                    await consumer.position(tp)  # resolved: nothing produced is skipped
                ready.set()  # a paced producer starts now: latency excludes the join
            if window is not None and not window.t0 and consumer.assignment():
                window.__enter__()  # joined: the measured interval starts
            for tp, messages in batches.items():
                if tp.partition not in queues:
                    queues[tp.partition] = asyncio.Queue()
                    lanes.append(asyncio.create_task(lane(queues[tp.partition])))
                for msg in messages:
                    queues[tp.partition].put_nowait(msg)
            if time.monotonic() - last_commit >= 1.0 and acked:
                await consumer.commit({AioTP(source, p): o for p, o in acked.items()})
                last_commit = time.monotonic()
            for task in lanes:
                if task.done():
                    task.result()  # a lane failed: raise its error
            if failed:
                raise failed[0]  # an event of a windowed lane failed
        if window is not None and window.t0 and not window.seconds:
            window.__exit__(None, None, None)  # (a run that ended short: its deadline)
        await consumer.commit({AioTP(source, p): o for p, o in acked.items()})
        result.committed = dict(acked)
        return result
    finally:
        for task in lanes:
            task.cancel()
        await producer.stop()
        await consumer.stop()
        result.run_s = time.monotonic() - began


# --- floor 0: the Faust app alone ------------------------------------------------------------

FAUST_FLOOR = "floor 0: Faust app alone, consume + publish + ack (no storage)"


def faust_pipeline(settings: Settings, records: int, pids: dict[str, int], home: Path, *,
                   rate: float | None = None) -> tuple[Row, tuple[float, float, int] | None]:
    """Floor 0 (``ratchet.bench.faust_floor``, a worker process of its own): what the
    stream stack costs per record before ratchet does anything. ``rate`` None: a backlog
    of ``records`` produced before the clock starts (the throughput runs' shape);
    otherwise produced at ``rate`` with their latency (produce -> outcome consumed), the
    latency runs' shape. Returns the row (the floor process as ``client``) and the
    latency (None on a backlog)."""
    import subprocess

    admin, source, sink = floor_topics(settings, "floor-faust")
    run = source.removesuffix("-in")
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "RATCHET_FLOOR_SOURCE": source, "RATCHET_FLOOR_SINK": sink,
           "RATCHET_FLOOR_PARTITIONS": str(settings.partitions),
           "RATCHET_FLOOR_DATADIR": str(home / run),
           "RATCHET_KAFKA_BOOTSTRAP": settings.kafka_bootstrap}
    log = (home / f"{run}.log").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "ratchet.bench.faust_floor"],
                              env=env, cwd=home, stdout=log,
                              stderr=subprocess.STDOUT)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5})
    probe = LatencyProbe(settings, [sink])
    value = os.urandom(1700)  # a TurnCompleted's size
    try:
        warm_up = [(b"floor-0-warm-up", value)]
        probe.pace(lambda k, v: producer.produce(source, value=v, key=k), warm_up, 1).join()
        producer.flush(30)
        probe.collect(1, 90)  # the worker has its partitions and has published once
        if not probe.received:
            raise RunFailed(f"floor 0: no outcome from the Faust worker (see {log.name})")
        probe.reset()
        items = [(f"floor-0-{i:08d}".encode(), value) for i in range(records)]
        if rate is None:
            for key, data in items:
                producer.produce(source, value=data, key=key)
                producer.poll(0)
            producer.flush(60)
            for key, _ in items:
                probe.mark_sent(key, 0.0)
        with CpuWindow({"client": worker.pid, **pids}) as window:
            if rate is None:
                probe.collect(records, 300)
            else:
                sender = probe.pace(lambda k, v: (producer.produce(source, value=v, key=k),
                                                  producer.poll(0)), items, rate)
                probe.collect(records, 120 + records / rate)
                sender.join()
        if probe.received < records:
            raise RunFailed(f"floor 0: {probe.received} of {records} outcomes")
        latency = None if rate is None else probe.percentiles()
        name = FAUST_FLOOR if rate is None else f"{FAUST_FLOOR}, {rate:.0f}/s paced"
        return Row(name, records, window.seconds, window.cpu_s, unit="records",
                   background_s=window.background_s), latency
    finally:
        producer.flush(30)
        probe.close()
        worker.terminate()
        with contextlib.suppress(Exception):
            worker.wait(30)
        log.close()
        _delete_topics(admin, [source, sink])


# --- driver A/B: acsylla (the C++ driver, asyncio) on the raw LWT row ----------------------


def raw_lwt_acsylla(settings: Settings, ops: int, pids: dict[str, int]) -> Row:
    """The raw LWT row with acsylla (the worker's loop path driver) instead of
    cassandra-driver: same table shape, same consistency, ``RAW_LWT_IN_FLIGHT`` asyncio
    tasks (no threads)."""
    import acsylla

    with scratch_lwt_table(settings, "acsylla") as (_, keyspace, _insert):
        async def run() -> int:
            cluster = acsylla.create_cluster(list(settings.cassandra_hosts),
                                             port=settings.cassandra_port,
                                             request_timeout=10.0)
            session = await cluster.create_session()
            try:
                prepared = await session.create_prepared(
                    f"INSERT INTO {keyspace}.lwt (k, c, v) VALUES (?, ?, ?) IF NOT EXISTS")
                payload = os.urandom(1024)

                async def one(key: str) -> None:
                    statement = prepared.bind()
                    statement.bind_list([key, "", payload])
                    statement.set_consistency(acsylla.Consistency.LOCAL_QUORUM)
                    statement.set_serial_consistency(acsylla.Consistency.SERIAL)
                    row = (await session.execute(statement)).first()
                    assert row is not None and row.column_value("[applied]") is True

                for i in range(50):
                    await one(f"warm{i}")
                per_task = max(1, ops // RAW_LWT_IN_FLIGHT)

                async def task(w: int) -> None:
                    for i in range(per_task):
                        await one(f"k{w}_{i}")

                settle(pids)  # as raw_lwt
                with CpuWindow({"client": os.getpid(), **pids}) as window:
                    await asyncio.gather(*(task(w) for w in range(RAW_LWT_IN_FLIGHT)))
                run.window = window  # type: ignore[attr-defined]
                return per_task * RAW_LWT_IN_FLIGHT
            finally:
                await session.close()

        done = asyncio.run(run())
        window = run.window  # type: ignore[attr-defined]
    say(f"raw LWT (acsylla): {done} in {window.seconds:.1f} s")
    return Row(f"raw LWT as above, acsylla (C++ driver), {RAW_LWT_IN_FLIGHT} tasks", done,
               window.seconds, window.cpu_s)


class PacedFloor:
    """A floor (``shape``, floor 1 by default) fed at a rate, run after run on ONE
    scratch keyspace and topic pair:
    creating and dropping them per run keeps Cassandra and Kafka busy (DDL, new
    partitions' files) during the next run, which ratchet's long-lived worker and
    topics never pay. Each run has keys of its own and reads from the topics' end."""

    def __init__(self, settings: Settings, pids: dict[str, int], shape: str = "lwt") -> None:
        self.settings, self.pids, self.shape, self.runs = settings, pids, shape, 0
        # CPU seconds per process ("floor": the floor's own process) and seconds over
        # the measured runs (not the warm-up): the floor's share of the machine.
        self.cpu_s: dict[str, float] = {}
        self.background_s: dict[str, float] = {}  # the servers' share (CpuWindow)
        self.seconds = 0.0

    def __enter__(self) -> PacedFloor:
        self._table = scratch_lwt_table(self.settings, "floor", *FLOOR_TABLES)
        self.session, self.keyspace, self.insert = self._table.__enter__()
        try:
            self.admin, self.source, self.sink = floor_topics(self.settings, "floor-paced")
        except BaseException:
            self._table.__exit__(None, None, None)
            raise
        return self

    def run(self, rate: float, records: int) -> list[float]:
        """One paced run: produce -> outcome consumed of each record, ms."""
        self.runs += 1
        row, result = _floor_measure(self.settings, self.session, self.keyspace, self.insert,
                                   self.source, self.sink, records, self.pids, self.shape,
                                   rate,
                                   run=f"r{self.runs}-")
        if result.applied != records:
            raise RunFailed(f"paced floor: {result.applied} of {records} LWTs applied")
        self.seconds += row.seconds
        for who, cpu in row.cpu_s.items():
            name = "floor" if who == "client" else who
            self.cpu_s[name] = self.cpu_s.get(name, 0.0) + cpu
        add_into(self.background_s, row.background_s)
        return result.latency

    def warm_up(self, rate: float, records: int) -> None:
        """An unmeasured run of a fifth of ``records`` (at least 50): a new keyspace's and
        topics' first work is not the floor's latency (nor its CPU)."""
        self.run(rate, max(50, records // 5))
        self.cpu_s, self.background_s, self.seconds = {}, {}, 0.0

    def __exit__(self, *exc: object) -> None:
        try:
            _delete_topics(self.admin, [self.source, self.sink])
        finally:
            self._table.__exit__(None, None, None)
