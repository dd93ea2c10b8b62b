"""What the checker may see: the output topics and the HTTP API, nothing else.

- ``OutputReader``: a thread reading ``checkpoints``, ``rejections``,
  ``orphaned-effects`` and ``dead-letters`` from the beginning, all the run long (it
  rides out Kafka restarts: librdkafka reconnects);
- ``Waiters``: threads asking ``/history?wait_ms=`` for turns about to be produced, so
  requests are waiting when the API is restarted; each answer is kept for the checker;
- ``fetch_histories``: after the run, the history of every response sent (promoted or
  not), of every Conversation, and of some responses asked as another tenant, over HTTP.

A request that gets no answer is never dropped: it is kept as a ``Lost`` (what, for whom,
when, why), and the checker excuses only those a fault window explains.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, KafkaError

from ratchet.chaos.observations import (
    FINAL_ORPHAN_REASONS,
    OTHER_FINGERPRINT,
    UNSEEN,
    History,
    Lost,
    Observations,
    Promoted,
    Rejected,
    Violation,
    Wait,
)
from ratchet.chaos.oracle import certificate_of
from ratchet.settings import Settings
from schemas.avro import EventSerde, registry_client
from schemas.errors import DecodeError, RegistryUnavailable
from schemas.models import CheckpointPromoted, DeadLetter, EffectOrphaned, PromotionRejected
from services.gateway.client import Certified, Failure, Outcome
from services.gateway.client import RehydrationClient as _LibraryClient
from services.gateway.errors import GatewayError

OUTPUT_TOPICS = ("checkpoints", "rejections", "orphaned-effects", "dead-letters")


class OutputReader(threading.Thread):
    """The run's one view of the output topics. It never ends quietly: an exception
    that stops it is kept in ``failure`` (the run then fails ``observer_died``: every
    outcome after it would read "never decided", a misjudgment, as run 27 of session
    51's soak may have been). A record it cannot decode (a tombstone, a schema id the
    registry does not know) does not stop it: it is kept in ``unread`` and read past
    (the run fails ``observer_unread``: that record may be an outcome the checks need)."""

    def __init__(self, settings: Settings, group: str, *, consumer=None, serde=None) -> None:
        super().__init__(name="chaos-output-reader", daemon=True)
        self.settings = settings
        self.obs = Observations()
        self.lock = threading.Lock()
        self.records = 0
        self.decided: dict[tuple[str, str], set] = {}  # (tenant, rid) -> outcome sigs
        self.counts: dict[tuple[str, str], int] = {}  # (tenant, rid) -> outcome records
        self.failure: str | None = None  # why the reader stopped before it was told to
        self.unread: list[str] = []  # records read past: "topic[partition]@offset: why"
        self.stop = threading.Event()
        self._serde = serde or EventSerde(registry_client(settings.schema_registry_url))
        self._consumer = consumer or Consumer({
            "bootstrap.servers": settings.kafka_bootstrap, "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 2000, "log_level": 0,
        })
        self._consumer.subscribe([settings.topic(t) for t in OUTPUT_TOPICS])

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                msg = self._consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        time.sleep(0.2)  # broker restarting: librdkafka reconnects by itself
                    continue
                self._take(msg)
        except Exception as exc:  # noqa: BLE001 - kept and told: the run fails on it
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                self._consumer.close()
            except Exception as exc:  # noqa: BLE001
                self.failure = self.failure or f"closing its consumer: {type(exc).__name__}: {exc}"

    def _take(self, msg) -> None:
        while True:
            try:
                rec = self._serde.decode(msg.value(), msg.topic(), msg.partition(), msg.offset())
                break
            except RegistryUnavailable:
                time.sleep(1)  # registry restarting: the record is fine, ask again
            except DecodeError as exc:  # this record only: the ones after it are read
                with self.lock:
                    self.unread.append(str(exc))
                return
        at = msg.timestamp()[1]
        with self.lock:
            self.records += 1
            if isinstance(rec, CheckpointPromoted):
                p = Promoted(rec.tenant_id, rec.response_id, rec.conversation_id,
                             rec.previous_response_id, rec.seq, str(rec.certification),
                             rec.idempotency_key, rec.request_digest, rec.item_count, at)
                self.obs.promoted.append(p)
                self.decided.setdefault((p.tenant, p.response_id), set()).add(p.sig)
                self._count(p.tenant, p.response_id)
            elif isinstance(rec, PromotionRejected):
                r = Rejected(rec.tenant_id, rec.response_id,
                             str(rec.reason) if rec.reason else None, rec.existing_response_id, at)
                self.obs.rejected.append(r)
                self.decided.setdefault((r.tenant, r.response_id), set()).add(r.sig)
                self._count(r.tenant, r.response_id)
            elif isinstance(rec, EffectOrphaned):
                self.obs.orphaned.add((rec.tenant_id, rec.effect_id))
                self.obs.orphan_records.setdefault((rec.tenant_id, rec.effect_id), []).append(
                    (str(rec.reason), rec.effect_completed, rec.output_digest))
                if rec.effect_completed:
                    self.obs.completed_orphans.add((rec.tenant_id, rec.effect_id))
                if str(rec.reason) == "EFFECT_CONFLICT":
                    self.obs.conflict_orphans.add((rec.tenant_id, rec.effect_id,
                                                   rec.output_digest))
                elif str(rec.reason) in FINAL_ORPHAN_REASONS:
                    self.obs.final_orphans.add((rec.tenant_id, rec.effect_id))
            elif isinstance(rec, DeadLetter):
                self.obs.dead_letters.add((rec.key, rec.value))

    def _count(self, tenant: str, rid: str) -> None:
        self.counts[(tenant, rid)] = self.counts.get((tenant, rid), 0) + 1


OBSERVER_CLASSES = ("observer_died", "observer_unread")  # the harness's, not CONTRACT's


def observer_violations(reader: OutputReader) -> list[Violation]:
    """The harness's own verdicts on its reader: it died (``observer_died``, the
    exception), or read records past (``observer_unread``, one per record). Neither is
    a CONTRACT rule broken: the run cannot judge what it did not see."""
    out = []
    if reader.failure is not None:
        out.append(Violation("observer_died", "-", (
            f"the output reader stopped after {reader.records} records: {reader.failure}; "
            "outcomes after that were not seen (a harness failure, not a verdict on the "
            "product)")))
    with reader.lock:
        unread = list(reader.unread)
    out += [Violation("observer_unread", "-", f"an output record read past: {u}") for u in unread]
    return out


class RehydrationClient(_LibraryClient):
    """The gateway library's client, keeping the body of the last history answer
    (``last_body``): the checker also compares fields the library does not return
    (``conversation_head_seq``). One per thread, like the library's."""

    last_body: dict | None = None

    def _get(self, path: str, params: dict, timeout: float | None):
        self.last_body = None
        resp = super()._get(path, params, timeout)
        try:
            body = resp.json()
        except ValueError:
            body = None
        self.last_body = body if isinstance(body, dict) else None
        return resp


def _body_of(client) -> dict | None:
    """The last answer's body, if the client keeps it (a test's stand-in may not)."""
    return getattr(client, "last_body", None)


def history_of(outcome: Outcome, fp_hash: str, body: dict | None = None) -> History:
    """Digests recomputed from the returned content: a wrong digest field cannot hide
    (it is a fault of its own), nor a checkpoint that is not this answer's, nor an item
    whose ``role`` or ``call_id`` is not its content's (gateway-protocol.md section 5).
    With the answer's ``body``, also its ``conversation_head_seq``; of a certified
    answer, what its checkpoint carries (``oracle.certificate_of``)."""
    if isinstance(outcome, Failure):
        return History("failure", outcome.reason, ())
    faults = []
    items = []
    for n, i in enumerate(outcome.items):
        digest = hashlib.sha256(i.content.encode()).hexdigest()
        items.append((i.item_id, i.type, digest))
        if i.content_digest != digest:
            faults.append(f"item {n} ({i.item_id}) content_digest is not its content's")
        faults += _columns_problems(n, i)
    chs = UNSEEN if body is None else body.get("conversation_head_seq")
    cert = UNSEEN
    if isinstance(outcome, Certified):
        cp = outcome.checkpoint
        cert = certificate_of(cp.token_artifact, cp.boundary_proof, cp.router_receipt)
        if cp.seq != outcome.head_seq:
            faults.append(f"checkpoint seq {cp.seq} != head_seq {outcome.head_seq}")
        if cp.fingerprint_hash != fp_hash:
            faults.append(f"checkpoint of fingerprint {cp.fingerprint_hash}, asked {fp_hash}")
        if not cp.token_artifact:
            faults.append("certified without a token artifact")
    return History("certified" if isinstance(outcome, Certified) else "fallback",
                   getattr(outcome, "reason", None), tuple(items), outcome.response_id,
                   outcome.head_seq, tuple(faults), chs, cert)


def _columns_problems(n: int, item) -> list[str]:
    """``role`` and ``call_id`` are the content's own (a string, else null)."""
    try:
        doc = json.loads(item.content)
    except ValueError:
        return [f"item {n} ({item.item_id}) content is not JSON"]
    if not isinstance(doc, dict):
        return [f"item {n} ({item.item_id}) content is not a JSON object"]
    wrong = []
    for name in ("role", "call_id"):
        want = doc.get(name) if isinstance(doc.get(name), str) else None
        if getattr(item, name) != want:
            wrong.append(f"item {n} ({item.item_id}) {name} {getattr(item, name)!r}, its "
                         f"content's {want!r}")
    return wrong


FOREIGN_TENANT = "chaos-foreign-tenant"


def fetch_histories(base_url: str, fp_hash: str, responses: Iterable[tuple[str, str]],
                    conversations: Iterable[tuple[str, str]], obs: Observations,
                    threads: int = 8, foreign_every: int = 20, other_fp_every: int = 10) -> None:
    """Every history of ``responses`` and ``conversations``, and every response's
    ``/status`` (``obs.statuses``); every ``foreign_every``-th
    response is also asked as a tenant that never sent it (``obs.foreign``), every
    ``other_fp_every``-th with another fingerprint (``obs.other_fingerprint``)."""
    local = threading.local()

    def client() -> RehydrationClient:
        if not hasattr(local, "c"):
            local.c = RehydrationClient(base_url, timeout_s=30)
        return local.c

    names = {"r": "history", "f": "foreign", "o": "other_fingerprint", "c": "conversation",
             "s": "status"}

    def one(kind: str, tenant: str, ident: str) -> None:
        asked_ms, error = _now_ms(), ""
        for attempt in range(5):
            try:
                c = client()
                if kind == "r":
                    outcome = c.response_history(tenant, ident, fp_hash)
                    obs.histories[(tenant, ident)] = history_of(outcome, fp_hash, _body_of(c))
                elif kind == "f":
                    outcome = c.response_history(FOREIGN_TENANT, ident, fp_hash)
                    obs.foreign[(FOREIGN_TENANT, ident)] = history_of(outcome, fp_hash,
                                                                      _body_of(c))
                elif kind == "s":
                    got = c.status(tenant, ident)
                    obs.statuses[(tenant, ident)] = (got.state, got.reason, got.seq)
                elif kind == "o":
                    outcome = c.response_history(tenant, ident, OTHER_FINGERPRINT)
                    obs.other_fingerprint[(tenant, ident)] = history_of(
                        outcome, OTHER_FINGERPRINT, _body_of(c))
                else:
                    outcome = c.conversation_history(tenant, ident, fp_hash)
                    obs.conversations[(tenant, ident)] = history_of(outcome, fp_hash,
                                                                    _body_of(c))
                return
            except GatewayError as exc:
                error = f"{type(exc).__name__}: {exc}"
                time.sleep(1 + attempt)
        who = FOREIGN_TENANT if kind == "f" else tenant
        with lock:
            obs.lost.append(Lost(names[kind], who, ident, asked_ms, _now_ms(), error))

    lock = threading.Lock()
    responses = list(responses)
    jobs = [("r", t, r) for t, r in responses] + [("c", t, c) for t, c in conversations]
    jobs += [("s", t, r) for t, r in responses]
    jobs += [("f", t, r) for t, r in responses[::foreign_every] if t != FOREIGN_TENANT]
    jobs += [("o", t, r) for t, r in responses[1::other_fp_every]]
    for kind, tenant, ident in jobs:
        who = FOREIGN_TENANT if kind == "f" else tenant
        obs.asked.setdefault(names[kind], set()).add((who, ident))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda j: one(*j), jobs))


def _now_ms() -> int:
    return int(time.time() * 1000)


class Waiters:
    """Threads asking for histories with ``wait_ms`` while the run goes on."""

    def __init__(self, base_url: str, fp_hash: str, pick: Callable[[random.Random], tuple],
                 obs: Observations, threads: int = 3, wait_ms: int = 4000) -> None:
        self.base_url, self.fp_hash, self.pick, self.obs = base_url, fp_hash, pick, obs
        self.wait_ms = wait_ms
        self.stop = threading.Event()
        self.counts = {"asked": 0, "answered": 0, "not_yet": 0, "unavailable": 0}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(n,), daemon=True,
                                          name=f"chaos-waiter-{n}") for n in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=self.wait_ms / 1000 + 35)

    def _count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _run(self, n: int) -> None:
        rng = random.Random(n)
        with RehydrationClient(self.base_url, timeout_s=30) as client:
            while not self.stop.is_set():
                picked = self.pick(rng)
                if picked is None:
                    time.sleep(0.5)
                    continue
                tenant, rid = picked
                self._count("asked")
                asked_ms = int(time.time() * 1000)
                try:
                    outcome = client.response_history(tenant, rid, self.fp_hash, self.wait_ms)
                except GatewayError as exc:
                    self._count("unavailable")
                    with self._lock:  # kept: the checker excuses it only inside a fault
                        self.obs.lost.append(Lost("wait", tenant, rid, asked_ms, _now_ms(),
                                                  f"{type(exc).__name__}: {exc}"))
                    time.sleep(0.5)
                    continue
                h = history_of(outcome, self.fp_hash, _body_of(client))
                self._count("not_yet" if h.outcome == "failure" else "answered")
                with self._lock:  # failures too: one asked after the promotion is stale
                    self.obs.waits.append(Wait(tenant, rid, h, asked_ms))
