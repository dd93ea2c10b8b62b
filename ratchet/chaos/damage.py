"""The damage phase: stored rows damaged in Cassandra after the workload settled, then
read back over HTTP (docs/chaos.md, "Damaged rows").

``plan`` picks a few stories whose outcome the oracle knows for sure (one world, no
expiry, every promotion in the story's own partitions) and, per story, one turn to
damage and how (``KINDS``); ``apply`` writes the damage with the real Cassandra driver
into the run's keyspace only; ``read`` asks every history, the Conversation and every
``/status`` of each damaged story (through the API's verified-history cache and with
``Cache-Control: no-cache``), the damaged response as another tenant, and the histories
of a sample of undamaged stories (``controls``) again with ``no-cache``. The checker
(``checker.check_damage``) judges the answers against what the docs promise:

- an items cell damaged (docs/store.md, "Verification on read", rules 4 and 5): every
  history whose lineage passes through the damaged turn is ``CORRUPT_HISTORY``
  (undecodable cell, items swapped, a content that is not its digest's) or
  ``MISSING_HISTORY`` (an item missing) when read from storage (``no-cache``); through
  the cache it is that failure or the history exactly as promoted (CONTRACT 5: "a
  history that was verified once is immutable: it may be served from memory";
  gateway-protocol.md section 8: a cached answer "only differs if stored rows were
  damaged since"); histories that do not pass through it are unchanged;
- the Conversation's head cells no checkpoint backs (``head_unbacked``): every history
  of the Conversation and the Conversation itself ``CORRUPT_HISTORY`` "on every
  endpoint, with or without Cache-Control", and every response's ``/status`` 500
  ``CORRUPT_HISTORY`` (gateway-protocol.md section 8, "Status body");
- ``/status`` of a turn whose items cell was damaged: ``promoted`` at its seq, or 500
  ``CORRUPT_HISTORY`` (the docs name the checkpoint row, not its items cell: see
  docs/chaos.md), never ``unknown`` or ``rejected``; its descendants' ``promoted``;
- as another tenant, ``NOT_FOUND`` (no damage disclosed either).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from ratchet.chaos.oracle import Expectation, Promo, World

if TYPE_CHECKING:
    from ratchet.chaos.observations import History, Observations

# Damage kind -> the failure every read through the damaged turn must answer.
KINDS = {
    "items_garbage": "CORRUPT_HISTORY",    # the items cell replaced by random bytes
    "item_dropped": "MISSING_HISTORY",     # the turn's last item left out of its cell
    "items_swapped": "CORRUPT_HISTORY",    # the turn's first two items swapped
    "content_altered": "CORRUPT_HISTORY",  # one item's content changed, digest kept
    "head_unbacked": "CORRUPT_HISTORY",    # the head's lineage digest rewritten
    "turn_deleted": "MISSING_HISTORY",     # a turn's row deleted (its descendants' answer)
}
CONVERSATION_KINDS = ("items_garbage", "item_dropped", "head_unbacked", "items_swapped",
                      "content_altered", "turn_deleted")
CHAIN_KINDS = ("item_dropped", "items_garbage", "content_altered", "items_swapped",
               "turn_deleted")
NO_CACHE = {"Cache-Control": "no-cache"}
# What the deleted turn's OWN reads answer (``turn_deleted``): MISSING_HISTORY, as its
# descendants' (docs/store.md rule 1: its request's idempotency record says it was
# promoted), and /status 500 MISSING_HISTORY. Until session 41 the docs did not settle
# it and ratchet answered NOT_FOUND / ``unknown`` (docs/chaos.md, "Damaged rows").
DELETED_OWN_REASONS = frozenset({"MISSING_HISTORY"})


@dataclass(frozen=True)
class Damage:
    """One damaged partition: which stored row of which story, how, and the responses
    whose every read from storage must fail (``through``: the damaged turn and every
    promoted response whose lineage passes through it; a head's damage: every turn of
    the Conversation)."""

    sid: str
    tenant: str
    partition: str
    conversation: bool
    kind: str
    response_id: str  # the damaged turn (head_unbacked: the head's)
    through: frozenset[str]

    @property
    def reason(self) -> str:
        return KINDS[self.kind]

    def reasons(self, rid: str) -> frozenset[str]:
        """The failures a read of ``rid`` (in ``through``) from storage may answer."""
        if self.kind == "turn_deleted" and rid == self.response_id:
            return DELETED_OWN_REASONS
        return frozenset({self.reason})

    @property
    def cache_may_hide(self) -> bool:
        """Whether a cached answer may still be the verified history (the head's damage
        is an integrity failure on every endpoint, cache or not)."""
        return self.kind != "head_unbacked"


@dataclass(frozen=True)
class DamageRead:
    """One answer of the damage phase: ``what`` (history, conversation, status,
    foreign), by whom, of which id, through the cache or not (``cached``), and what came
    (a ``History``; for status ``(state, reason, seq)``, a 500 as ``("error",
    <error>, None)``)."""

    what: str
    tenant: str
    ident: str
    cached: bool
    answer: History | tuple


def certain(e: Expectation) -> World | None:
    """The story's world if the oracle knows its outcome for sure and every promotion
    stays in the story's tenant and partitions: one world, nothing expiring or expired
    (expiry is checked before the integrity rules), no response raced onto another
    Conversation."""
    if e.story.kind not in ("conversation", "chain") or len(e.worlds) != 1:
        return None
    w = e.worlds[0]
    if not w.promoted or w.other_heads:
        return None
    for p in w.promoted.values():
        if p.expired or p.expiring or p.late:
            return None
        if e.story.kind == "conversation" and p.conversation_id != e.story.key:
            return None
        if e.story.kind == "chain" and p.conversation_id is not None:
            return None
    return w


def own_items(w: World, p: Promo) -> int:
    """How many items the turn of ``p`` added to its lineage."""
    if p.conversation_id is not None:
        parent = next((q for q in w.promoted.values() if q.conversation_id
                       == p.conversation_id and q.seq == p.seq - 1), None)
    else:
        parent = w.promoted.get(p.previous_response_id or "")
    return len(p.items) - (len(parent.items) if parent else 0)


def descendants(w: World, rid: str) -> set[str]:
    """``rid`` and every chain response of ``w`` whose lineage passes through it."""
    out, frontier = {rid}, [rid]
    while frontier:
        parent = frontier.pop()
        for child, p in w.promoted.items():
            if p.previous_response_id == parent and p.conversation_id is None \
                    and child not in out:
                out.add(child)
                frontier.append(child)
    return out


def _needs(kind: str) -> int:
    return {"items_swapped": 2, "item_dropped": 1, "content_altered": 1}.get(kind, 0)


def plan(expectations: list[Expectation], seed: int, conversations: int = 6,
         chains: int = 5) -> list[Damage]:
    """The damage of this run: ``conversations`` Conversations (one turn in the middle,
    so turns before it stay readable, or the head cells) and ``chains`` chains (a turn
    with a child, forks preferred: the other branch stays readable), each kind in turn."""
    rng = random.Random(f"damage:{seed}")
    conv, chain = [], []
    for e in expectations:
        w = certain(e)
        if w is None:
            continue
        (conv if e.story.kind == "conversation" else chain).append((e, w))
    rng.shuffle(conv)
    rng.shuffle(chain)
    # Up to ``SHARED_FIRST`` stories of each mode whose partition holds the other
    # history too (a Conversation id equal to a chain's first response id,
    # ``workload.shared_key_partner``) first: the other history is then read again
    # beside the damage, in the very partition.
    shared = _shared_partitions(expectations)
    conv = _shared_first(conv, shared)
    out: list[Damage] = []
    for e, w in conv:
        if len([d for d in out if d.conversation]) >= conversations:
            break
        if w.head < 3:
            continue
        kind = CONVERSATION_KINDS[len(out) % len(CONVERSATION_KINDS)]
        turns = sorted((p for p in w.promoted.values()), key=lambda p: p.seq)
        if kind == "head_unbacked":
            head = turns[-1]
            out.append(Damage(e.story.sid, e.story.tenant, e.story.key, True, kind,
                              head.response_id, frozenset(p.response_id for p in turns)))
            continue
        middle = [p for p in turns[1:-1] if own_items(w, p) >= _needs(kind)]
        if not middle:
            continue
        target = middle[len(middle) // 2]
        out.append(Damage(e.story.sid, e.story.tenant, e.story.key, True, kind,
                          target.response_id,
                          frozenset(p.response_id for p in turns if p.seq >= target.seq)))
    # Chains: forks first (a sibling branch must stay readable), then any parent.
    chain.sort(key=lambda ew: -_forks(ew[1]))
    chain = _shared_first(chain, shared)
    made = 0
    for e, w in chain:
        if made >= chains:
            break
        kind = CHAIN_KINDS[made % len(CHAIN_KINDS)]
        parents = [p for rid, p in sorted(w.promoted.items())
                   if any(q.previous_response_id == rid for q in w.promoted.values())
                   and own_items(w, p) >= _needs(kind)]
        if not parents:
            continue
        # The deepest parent with a sibling, else the deepest: an ancestor stays whole.
        target = max(parents, key=lambda p: (_has_sibling(w, p), p.seq))
        out.append(Damage(e.story.sid, e.story.tenant, _root(w, target), False, kind,
                          target.response_id,
                          frozenset(descendants(w, target.response_id))))
        made += 1
    return out


def _shared_partitions(expectations: list[Expectation]) -> set[tuple[str, str]]:
    """(tenant, partition key) of the partitions a Conversation story and a chain
    story share."""
    keys = {kind: {(e.story.tenant, e.story.key) for e in expectations
                   if e.story.kind == kind} for kind in ("conversation", "chain")}
    return keys["conversation"] & keys["chain"]


SHARED_FIRST = 2


def _shared_first(stories: list[tuple[Expectation, World]],
                  shared: set[tuple[str, str]]) -> list[tuple[Expectation, World]]:
    """The first ``SHARED_FIRST`` stories of a shared partition, then the others in
    their order."""
    first = [ew for ew in stories
             if (ew[0].story.tenant, ew[0].story.key) in shared][:SHARED_FIRST]
    return first + [ew for ew in stories if ew not in first]


def _forks(w: World) -> int:
    parents = [p.previous_response_id for p in w.promoted.values() if p.previous_response_id]
    return len(parents) - len(set(parents))


def _has_sibling(w: World, p: Promo) -> bool:
    return p.previous_response_id is not None and any(
        q.previous_response_id == p.previous_response_id and q is not p
        for q in w.promoted.values())


def _root(w: World, p: Promo) -> str:
    while p.previous_response_id and p.previous_response_id in w.promoted:
        p = w.promoted[p.previous_response_id]
    return p.response_id


def damaged_cell(kind: str, records: list[tuple], rng: random.Random) -> list[tuple] | bytes:
    """The damaged form of a turn's item records (``rows.ITEM_RECORD_FIELDS`` order):
    records to encode again, or raw bytes for the cell."""
    if kind == "items_garbage":
        return bytes([0x7F]) + rng.randbytes(48)  # no version byte the decoder knows
    if kind == "item_dropped":
        return records[:-1]
    if kind == "items_swapped":
        first, second = records[0], records[1]
        # Each record keeps its item_seq: only ids, contents and digests change place.
        return [(first[0], *second[1:]), (second[0], *first[1:]), *records[2:]]
    if kind == "content_altered":
        seq, item_id, item_type, role, call_id, content, digest, fmt = records[0]
        raw = content if isinstance(content, bytes | bytearray) else str(content).encode()
        altered = bytes(raw) + b" "  # still the same JSON object, another sha256
        return [(seq, item_id, item_type, role, call_id, altered, digest, fmt), *records[1:]]
    raise ValueError(kind)


def apply(settings, damages: Iterable[Damage], seed: int, say=print) -> None:
    """Write each damage into the run's keyspace (``settings.keyspace``) with
    cassandra-driver, as an operator's mistake or a bad disk would leave it."""
    import logging

    from cassandra.query import SimpleStatement

    from services import cassandra_cluster
    from services.store.rows import decode_turn_items, encode_turn_items

    rng = random.Random(f"damage-bytes:{seed}")
    logging.getLogger("cassandra").setLevel(logging.ERROR)
    table = f"{settings.keyspace}.turns"
    cluster = cassandra_cluster.open_cluster(settings)
    # The store's level (RATCHET_DATACENTERS): with several datacenters the turn to damage
    # was committed at QUORUM and the API reads at QUORUM; a LOCAL_QUORUM read need not
    # see the turn, nor that read the damage (rrevt's outside review, session 51).
    level = cassandra_cluster.store_levels(settings)["write_consistency"]
    try:
        session = cluster.connect()

        def run(cql: str, params: tuple):
            statement = SimpleStatement(cql, consistency_level=level)
            for attempt in range(5):  # a server a fault of the plan left busy
                try:
                    return session.execute(statement, params, timeout=30)
                except Exception:  # noqa: BLE001 - the last one is raised
                    if attempt == 4:
                        raise
                    time.sleep(1 + attempt)

        for d in damages:
            where = "tenant_id = %s AND partition_key = %s"
            if d.kind == "head_unbacked":
                run(f"UPDATE {table} SET head_lineage_digest = %s WHERE {where}",
                    ("0" * 64, d.tenant, d.partition))
            elif d.kind == "turn_deleted":
                run(f"DELETE FROM {table} WHERE {where} AND kind = 'checkpoint' AND ref = %s",
                    (d.tenant, d.partition, d.response_id))
            else:
                row = run(f"SELECT items FROM {table} WHERE {where} AND kind = 'checkpoint' "
                          f"AND ref = %s", (d.tenant, d.partition, d.response_id)).one()
                if row is None:
                    raise RuntimeError(f"damage: no turn row {d.response_id} in "
                                       f"{d.partition} of {d.tenant}")
                cell = damaged_cell(d.kind, decode_turn_items(row.items), rng)
                if not isinstance(cell, bytes):
                    cell = encode_turn_items(cell)
                run(f"UPDATE {table} SET items = %s WHERE {where} AND kind = 'checkpoint' "
                    f"AND ref = %s", (cell, d.tenant, d.partition, d.response_id))
            say(f"damage: {d.kind} on {d.response_id} ({'conversation' if d.conversation else 'chain'} "
                f"{d.partition} of {d.tenant}; {len(d.through)} responses through it)")
    finally:
        cluster.shutdown()


def controls(expectations: list[Expectation], damages: list[Damage]) -> list[Expectation]:
    """Undamaged stories whose histories are read again after the damage (``no-cache``):
    damage must not leak into another partition. Every story whose outcome the oracle
    knows for sure (``certain``)."""
    hit = {d.sid for d in damages}
    return [e for e in expectations if e.story.sid not in hit and certain(e)]


def _history(resp: httpx.Response, fp_hash: str) -> History:
    """A history answer as the observer records it (``observe.history_of``)."""
    from ratchet.chaos.observe import history_of
    from services.gateway.client import parse_outcome

    body = resp.json()
    return history_of(parse_outcome(body, resp.status_code), fp_hash, body)


def _status(resp: httpx.Response) -> tuple:
    body = resp.json()
    if resp.status_code == 200:
        return (body.get("state"), body.get("reason"), body.get("seq"))
    if resp.status_code >= 500 and isinstance(body, dict) and "error" in body \
            and body.get("retryable") is False:
        return ("error", body["error"], None)
    raise httpx.HTTPStatusError(f"status HTTP {resp.status_code}", request=resp.request,
                                response=resp)


def read(base_url: str, fp_hash: str, damages: list[Damage], expectations: list[Expectation],
         foreign_of, obs: Observations) -> None:
    """Every read of the damage phase (module docstring) into ``obs.damage_reads``; a
    read without an answer after its retries is a ``Lost`` (``what`` damage_<what>).
    ``foreign_of(tenant, ident)``: a tenant of the workload that never used ``ident``."""
    by_sid = {e.story.sid: e for e in expectations}
    jobs: list[tuple[str, str, str, bool]] = []
    for d in damages:
        w = by_sid[d.sid].worlds[0]
        for rid in sorted(w.promoted):
            jobs += [("history", d.tenant, rid, True), ("history", d.tenant, rid, False),
                     ("status", d.tenant, rid, False)]
        if d.conversation:
            jobs += [("conversation", d.tenant, d.partition, True),
                     ("conversation", d.tenant, d.partition, False)]
        foreign = foreign_of(d.tenant, d.response_id)
        if foreign:
            jobs.append(("foreign", foreign, d.response_id, False))
    for e in controls(expectations, damages):
        for rid in sorted(e.worlds[0].promoted):
            jobs.append(("history", e.story.tenant, rid, False))
        if e.story.kind == "conversation":
            jobs.append(("conversation", e.story.tenant, e.story.key, False))
    _read(base_url, fp_hash, jobs, obs)


def _read(base_url: str, fp_hash: str, jobs: list[tuple[str, str, str, bool]],
          obs: Observations) -> None:
    from ratchet.chaos.observations import Lost

    with httpx.Client(base_url=base_url, timeout=30) as http:
        for what, tenant, ident, cached in jobs:
            asked, error = int(time.time() * 1000), ""
            for attempt in range(5):
                try:
                    headers = {} if cached else NO_CACHE
                    if what == "status":
                        resp = http.get(f"/v1/responses/{ident}/status",
                                        params={"tenant_id": tenant}, headers=headers)
                        answer: History | tuple = _status(resp)
                    else:
                        path = (f"/v1/conversations/{ident}/history" if what == "conversation"
                                else f"/v1/responses/{ident}/history")
                        resp = http.get(path, params={"tenant_id": tenant,
                                                      "fingerprint_hash": fp_hash},
                                        headers=headers)
                        answer = _history(resp, fp_hash)
                    obs.damage_reads.append(DamageRead(what, tenant, ident, cached, answer))
                    break
                except Exception as exc:  # noqa: BLE001 - transport, 503, an answer not trusted
                    error = f"{type(exc).__name__}: {exc}"
                    time.sleep(0.5 + attempt)
            else:
                obs.lost.append(Lost(f"damage_{what}", tenant, ident, asked,
                                     int(time.time() * 1000), error))


# ------------------------------------------------------------- continuations


@dataclass(frozen=True)
class Continuation:
    """A turn sent after the damage on top of a damaged history: the Conversation's next
    turn at its head, or a chain child of the deepest response through the damaged
    turn. ``allowed``: its acceptable outcome records (gateway-protocol.md section 7: a
    turn whose stored history cannot be read is rejected ``CORRUPT``, "unless it is
    CONFLICT / OUT_OF_ORDER against the head, or fails an earlier check"; a worker
    "that promoted the history's last turn itself keeps what it verified and does not
    read it again", so it may promote it, unless the head's cells are damaged: the
    batch is conditioned on them). ``promo``: what the oracle promotes it as."""

    sid: str
    tenant: str
    response_id: str
    kind: str  # of the damage it continues
    reason: str  # what its history reads as from storage, once promoted
    promo: Promo
    allowed: frozenset

    @property
    def event_key(self) -> tuple[str, str]:
        return self.tenant, self.response_id


def continuations(expectations: list[Expectation], damages: list[Damage]):
    """One continuation per damage whose oracle world would promote it (a turn the
    oracle rejects for a reason of its own is not sent: the docs order those checks
    against the history's read only loosely). Returns ``[(Continuation, event)]``."""
    from ratchet.chaos.oracle import _decide
    from ratchet.chaos.story import StoryGateway

    by_sid = {e.story.sid: e for e in expectations}
    out = []
    for d in damages:
        e = by_sid[d.sid]
        w = e.worlds[0].fork()
        gw = StoryGateway(e.story, random.Random(f"continue:{d.sid}"))
        rid, key = f"resp-{d.sid}-after-damage", f"idem-{d.sid}-after-damage"
        if d.conversation:
            ident = gw.identity(rid, head=w.head)
        else:
            parents = [r for r in d.through
                       if not (d.kind == "turn_deleted" and r == d.response_id)]
            parent = max(sorted(parents), key=lambda r: w.promoted[r].seq)
            ident = gw.identity(rid, parent=parent)
        ev = gw.turn(ident, key, "and after the damage?")
        sigs = _decide(w, e.story, ev)
        promo = w.promoted.get(rid)
        if promo is None:
            continue
        corrupt = ("R", "CORRUPT", None)
        allowed = {corrupt} if d.kind == "head_unbacked" else {corrupt, *sigs}
        out.append((Continuation(d.sid, d.tenant, rid, d.kind, d.reason, promo,
                                 frozenset(allowed)), ev))
    return out


def send_continuations(settings, events, decided, say=print, timeout_s: float = 60.0) -> None:
    """Produce the continuations with the gateway library and wait until the output
    reader saw each one's outcome (``decided(tenant, rid)``) or ``timeout_s`` passed."""
    from ratchet.chaos.produce import DELIVERY_TIMEOUT_MS
    from schemas.avro import EventSerde, registry_client
    from services.gateway.producer import GatewayProducer

    producer = GatewayProducer(settings, EventSerde(registry_client(settings.schema_registry_url)),
                               config={"delivery.timeout.ms": DELIVERY_TIMEOUT_MS})
    for ev in events:
        producer.send(ev)
    producer.flush(DELIVERY_TIMEOUT_MS / 1000 + 10)
    deadline = time.monotonic() + timeout_s
    left = list(events)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [ev for ev in left if not decided(ev.tenant_id, ev.response_id)]
    say(f"damage: {len(events)} turns sent on damaged histories, "
        f"{len(events) - len(left)} decided")


def read_continuations(base_url: str, fp_hash: str, conts: list[Continuation],
                       obs: Observations) -> None:
    """Each continuation's history (cache and ``no-cache``) and ``/status``."""
    _read(base_url, fp_hash, [job for c in conts for job in (
        ("history", c.tenant, c.response_id, True), ("history", c.tenant, c.response_id, False),
        ("status", c.tenant, c.response_id, False))], obs)
