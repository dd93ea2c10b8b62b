"""A producer process: its share of the stories, through the gateway library or as raw bytes.

Process ``i`` of ``n`` sends the stories with ``index % n == i``. Order within a story is
kept by sending in **rounds**: a round holds at most one step of each active story,
and every producer is flushed before the next round. A round that fails (Kafka down
for longer than the delivery timeout, registry down while encoding) is sent again
whole: the events that did arrive are then redelivered, which the contract says is
harmless (an outcome never flips), and their first copies stay in step order.

A step's ``race`` events go through a second producer (another librdkafka client, as
another gateway would), so which of the two lands first in Kafka is open.

Each first send of a turn is logged (``<out>/sent-<i>.jsonl``: response id, tenant, wall
clock) for the latency plot; a shared counter reports progress to the runner. A claim
answered against the claims API's rules is logged there too (``claim_wrong``), for the
checker (its class first: ``[effect_executed_twice] ...``, ``ratchet/chaos/claims.py``).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from ratchet.chaos.claims import ClaimAnswerWrong, ClaimedRun, ClaimProbe, ClaimRunner
from ratchet.chaos.story import RawRecord, Story
from ratchet.chaos.timed import Stamper
from ratchet.chaos.workload import generate
from ratchet.settings import Settings
from schemas.avro import EventSerde, encode_key, registry_client
from schemas.models import TurnCompleted
from services.gateway.errors import GatewayError, RehydrationUnavailable
from services.gateway.kafka_calls import interruptible
from services.gateway.producer import PRODUCER_DEFAULTS, GatewayProducer

# Outlast a Kafka restart (tens of seconds on a busy machine) before reporting failure.
DELIVERY_TIMEOUT_MS = 180_000
ACTIVE_STORIES = 48


class _RawProducer:
    """Raw bytes (pre-encoded events, undecodable records) with the gateway's settings."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topic("gateway-events")
        self._config = {"bootstrap.servers": settings.kafka_bootstrap, **PRODUCER_DEFAULTS,
                        "delivery.timeout.ms": DELIVERY_TIMEOUT_MS}
        self._p = Producer(self._config)
        self._errors: list[str] = []
        self._retired: list[Producer] = []

    def send(self, key: bytes, value: bytes | None) -> None:
        def report(err, msg) -> None:
            if err is not None or msg.offset() is None:
                self._errors.append(str(err or "delivered without an offset"))

        while True:
            try:
                self._p.produce(self.topic, value=value, key=key, on_delivery=report)
                break
            except BufferError:
                interruptible(self._p.poll, 0.1)
        # Ctrl-C inside a report: ``KeyboardInterrupt``, not a ``SystemError`` that
        # ``_send_round`` took for a failed round (``services.gateway.kafka_calls``; session 50).
        interruptible(self._p.poll, 0)

    def flush(self) -> None:
        """Raise ``GatewayError`` when an event was not delivered, after replacing the
        librdkafka client (``_renew``): the round is then sent again through a new one."""
        left = interruptible(self._p.flush, DELIVERY_TIMEOUT_MS / 1000 + 10)
        errors, self._errors = self._errors, []
        if errors or left:
            self._renew()
            raise GatewayError(f"raw delivery failed: {errors[:3]} ({left} in flight)")

    def _renew(self) -> None:
        """A new client in place of one whose round failed. After a Kafka restart
        (seed 3, session 45) one client of a producer process delivered nothing again:
        every round timed out after ``DELIVERY_TIMEOUT_MS``, sent again through the same
        client, timed out again, until the run's deadline failed it (``run_deadline``).
        The old client is purged and kept, not destroyed: destroying a client that
        cannot reach its broker may block."""
        old, self._p = self._p, Producer(self._config)
        old.purge()
        interruptible(old.poll, 0)  # runs the purged reports (``send``)
        self._retired.append(old)
        self._errors = []


class _Sender:
    def __init__(self, settings: Settings) -> None:
        serde = EventSerde(registry_client(settings.schema_registry_url))
        self._settings = settings
        self.gateway = self._gateway_producer(serde)
        self.race = self._gateway_producer(serde)
        self.raw = _RawProducer(settings)
        self.serde = serde
        self.claims = ClaimRunner(f"http://{settings.api_host}:{settings.api_port}")
        self.claims_wrong: list[tuple[str, str, str]] = []
        self.stamp = Stamper()  # expiries stamped at the send (ratchet/chaos/timed.py)

    def send(self, story: Story, index: int, race: bool = False) -> None:
        ev = self.stamp(story, index, story.events[index])
        if isinstance(ev, (ClaimedRun, ClaimProbe)):
            self._claim(ev)
        elif isinstance(ev, RawRecord):
            self.raw.send(ev.key, ev.value)
        elif race:
            self.race.send(ev)
        elif story.path == "raw":
            self.raw.send(encode_key(ev.partition_key), self.serde.encode(ev, self.raw.topic))
        else:
            self.gateway.send(ev)

    def _claim(self, run: ClaimedRun | ClaimProbe) -> None:
        """Through the API, now (its turn is produced after it). Unavailable: the round
        is sent again (same token). A library refusal of the first roles is reported,
        not retried: the turn that lists the claim is then judged without it, and the
        checker reports the outcome the oracle did not expect. Every failed check of the
        runner (an answer against the rules, an effect run twice, a replayed output that
        is not the recorded one; also an unexpected ``AssertionError``: never taken for a
        refusal) is kept for the log (``claims_wrong``): the checker reports each."""
        try:
            self.claims.run(run)
        except RehydrationUnavailable:
            raise
        except ClaimAnswerWrong as exc:
            print(f"producer: claim {run.effect_id} answered against the rules: {exc}",
                  flush=True)
        except GatewayError as exc:
            print(f"producer: claim {run.effect_id} refused: {exc!r:.300}", flush=True)
        finally:
            for found in self.claims.findings:
                self.claims_wrong.append((found.tenant_id, found.effect_id, found.logged()))
            self.claims.findings.clear()
            for note in self.claims.unchecked:
                print(f"producer: claim check left unchecked: {note}", flush=True)
            self.claims.unchecked.clear()

    def _gateway_producer(self, serde: EventSerde) -> GatewayProducer:
        return GatewayProducer(self._settings, serde,
                               config={"delivery.timeout.ms": DELIVERY_TIMEOUT_MS})

    def flush(self) -> None:
        """Flush every producer; one whose events were not all delivered is replaced by a
        new one before the error is raised (the round is sent again: ``_send_round``),
        as the raw producer replaces its client (``_RawProducer._renew``, why). The old
        one is closed at once (what it still held is purged, never written later behind
        the round sent again)."""
        for name in ("gateway", "race"):
            producer = getattr(self, name)
            try:
                producer.flush(DELIVERY_TIMEOUT_MS / 1000 + 10)
            except GatewayError:
                setattr(self, name, self._gateway_producer(self.serde))
                with contextlib.suppress(GatewayError):  # the purged events: known
                    producer.close(0)
                raise
        self.raw.flush()


def run(cfg: dict[str, Any], index: int, sent_counter: Any, stop: Any) -> None:
    """Process entry point (spawned by the runner)."""
    settings = Settings.from_env(cfg["env"])
    workload = generate(cfg["seed"], cfg["turns"], cfg["tag"])
    mine = [s for s in workload.stories if s.index % cfg["producers"] == index]
    rate = cfg["rate"] / cfg["producers"]  # turns per second for this process
    sender = _Sender(settings)
    sender.stamp = Stamper(Path(cfg["out"], f"stamps-{index}.jsonl"))
    with Path(cfg["out"], f"sent-{index}.jsonl").open("a", buffering=1) as log:
        _produce(mine, rate, sender, log, sent_counter, stop)


def _produce(mine: list[Story], rate: float, sender: _Sender, log, sent_counter, stop) -> None:
    queue, active = list(reversed(mine)), []
    position: dict[int, int] = {}
    logged: set[tuple[int, int]] = set()
    turns, start = 0, time.monotonic()
    while (queue or active) and not stop.value:
        while queue and len(active) < ACTIVE_STORIES:
            active.append(queue.pop())
        round_ = [(s, s.steps[position.get(s.index, 0)]) for s in active]
        _send_round(sender, round_)
        now = time.time()
        for story, step in round_:
            for i in (*step.sends, *step.race):
                ev = story.events[i]
                if isinstance(ev, TurnCompleted):
                    turns += 1
                    if (story.index, i) not in logged:
                        logged.add((story.index, i))
                        log.write(json.dumps({"t": now, "tenant": ev.tenant_id,
                                              "rid": ev.response_id}) + "\n")
            position[story.index] = position.get(story.index, 0) + 1
        for tenant, effect_id, detail in sender.claims_wrong:
            log.write(json.dumps({"t": now, "tenant": tenant, "effect_id": effect_id,
                                  "claim_wrong": detail}) + "\n")
        sender.claims_wrong.clear()
        active = [s for s in active if position[s.index] < len(s.steps)]
        with sent_counter.get_lock():
            sent_counter.value += sum(
                1 for story, step in round_ for i in (*step.sends, *step.race)
                if isinstance(story.events[i], TurnCompleted))
        ahead = turns / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)


def _send_round(sender: _Sender, round_: list) -> None:
    """Send one round and flush; on any failure send the whole round again."""
    delay = 0.5
    while True:
        try:
            for story, step in round_:
                for i in step.sends:
                    sender.send(story, i)
                for i in step.race:
                    sender.send(story, i, race=True)
            sender.flush()
            return
        except Exception as exc:  # delivery, flush timeout, registry unavailable
            print(f"producer: round failed, sending it again: {exc!r:.300}", flush=True)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
