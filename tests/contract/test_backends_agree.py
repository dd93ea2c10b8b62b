"""The two backends side by side: seeded random sequences of the operations the
processor and the claims API make, applied to the memory store and ledger AND to the
Cassandra ones, every answer compared after each step (a differential test).

The contract suites hold each backend to hand-written cases; this one holds them to
EACH OTHER on sequences nobody wrote by hand: Conversation turns on right, stale and
future heads, hints right and wrong, retries with the same or another response id, a
key reused with another digest, response ids reused across partitions and tenants,
chain roots, forks, continuations of missing or foreign parents, turns over the size
bound, the worker's loop path (``start_claiming`` + ``promote_from_hints_async``),
``judge``, every read (histories by response and by Conversation, blocking and
awaited, heads, ``locate``, ``read_turn``, ``read_checkpoint`` / ``read_promoted`` /
``get_checkpoint``, ``turn_lost``, ``promoted_request`` / ``promoted_key``), request
facts marks (``mark_request_facts``, ``mark_claim``, ``hold_request``), and the
ledger: effects recorded, redelivered, conflicting or foreign, cancellations by scope,
effect claims (claim, the same token re-sent, another claimant, takeover after expiry
on the injected clock, conflicting arguments, completion by the holder or not, again
with the same or another outcome), decisions, rejections and status, owners.

Each backend runs two stores on the same data (two workers, each with its own hints,
stale after the other's promotions); a step goes through one of them, the same one on
both backends. The Cassandra store reads a partition as wide from a few hundred bytes of
items outside the lineage read (256 KiB in production), so that its two-query read is
compared too; that changes how it reads, never what it answers.

Deterministic: fixed seeds drive every choice, ids are numbered (a per-run suffix keeps
them apart from other runs on the shared keyspace; it changes no decision). After each
sequence every response, Conversation, key and claim it touched is read back from both,
and a new claim of every request the ledger knows is answered by both.

Normalized, and only this (everything else must be equal, field by field):
* facts marks: each backend draws its own uuid per mark (``mark_request_facts``,
  ``mark_claim``); a mark is replaced by its order of first appearance in that backend
  (``_Marks``), and a mark the test passes back (``facts_mark=``) is translated to the
  backend's own;
* an exception is compared by its type, not its message (a message names driver or
  row details: logs only);
* ``HistoryFailure.detail`` is compared too: it turned out equal everywhere.
Timestamps need no normalization: both stores and the ledger's ``now_ms`` read one
injected ``FakeClock`` (which also moves by fractions of a millisecond: every record
keeps milliseconds, ``utc_ms``, on both backends).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from ratchet.domain import claims
from ratchet.domain.claims import ClaimRequest, EffectPolicy
from ratchet.domain.history import Head, PromotionMode, StoredTokenArtifact
from ratchet.domain.plan import FactsChanged, PromotionRequest, ResponseClaim
from ratchet.domain.promotion import RecordedEffect
from schemas import items as item_builders
from schemas.canonical import canonical_json_text as canonical_json
from schemas.models import Certification, Item, sha256_hex
from services.ledger.base import Cancellation, Decision, Ledger
from services.ledger.memory import MemoryLedger
from services.store.base import ANY_LINEAGE, CheckpointStore, StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import T0, FakeClock

# The sequences CI runs. ``RATCHET_DIFF_SEEDS=first:last`` runs others (a longer hunt
# by hand); any run is deterministic for its seeds.
SEEDS = range(*map(int, os.environ.get("RATCHET_DIFF_SEEDS", "42:82").split(":")))
MIN_STEPS, MAX_STEPS = 20, 40
# Small enough that a turn above it is cheap to build; "big" turns sit just under it.
MAX_TURN_BYTES = 150_000
BIG_ITEM = 100_000
LEASE = 10_000


class Diverged(AssertionError):
    pass


class _Marks:
    """A backend's facts marks by order of first appearance (module docstring)."""

    def __init__(self) -> None:
        self.labels: dict[str, str] = {}
        self.marks: dict[str, str] = {}

    def label(self, mark: str | None) -> str | None:
        if mark is None:
            return None
        if mark not in self.labels:
            name = f"mark#{len(self.labels)}"
            self.labels[mark], self.marks[name] = name, mark
        return self.labels[mark]

    def mark(self, label: str | None) -> str | None:
        return None if label is None else self.marks.get(label, label)


@dataclasses.dataclass
class Side:
    """One backend: two stores on the same data (two workers, each with hints of its
    own: one's are stale after the other's promotions), its ledger, its marks."""

    stores: tuple[CheckpointStore, CheckpointStore]
    ledger: Ledger
    marks: _Marks = dataclasses.field(default_factory=_Marks)
    current: int = 0

    @property
    def store(self) -> CheckpointStore:
        return self.stores[self.current]


def _first_difference(a: Any, b: Any, path: str = "answer") -> str:
    """Where two unequal answers first differ (a field path), for the failure."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if x != y:
                return _first_difference(x, y, f"{path}.{f.name}")
    if isinstance(a, (tuple, list)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} != {b!r}"


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - compared by type (module docstring)
        return ("raised", type(exc).__name__)


@dataclasses.dataclass
class Req:
    """A request the sequence made, for later retries and reads."""

    request: PromotionRequest


class Sequence:
    """One seeded sequence over both sides."""

    def __init__(self, seed: int, memory: Side, cassandra: Side, clock: FakeClock,
                 run: str) -> None:
        self.rng = random.Random(seed)
        self.seed, self.sides, self.clock, self.run = seed, (memory, cassandra), clock, run
        self.n = 0
        self.log: list[str] = []
        self.tenants = [f"ta{seed}{run}", f"tb{seed}{run}"]
        self.convs: list[tuple[str, str]] = []
        self.roots: list[tuple[str, str]] = []  # (tenant, root response id)
        self.requests: list[PromotionRequest] = []
        self.response_ids: list[tuple[str, str]] = []  # (tenant, id) ever used
        self.keys: list[tuple[str, str, str]] = []  # (tenant, partition, key)
        self.ledger_keys: list[tuple[str, str, str]] = []  # those the ledger was told of
        self.claims: list[ClaimRequest] = []
        self.effects: list[RecordedEffect] = []
        self.events: list[tuple[str, str, str]] = []  # (tenant, key, event id)
        # (tenant, key) of requests held for a response id that was never promoted
        # (``hold_request``, as the processor does before orphaning a late effect)
        self.held: list[tuple[str, str]] = []
        self.steps = 0

    # -- helpers ----------------------------------------------------------------------

    def new(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}_{self.seed}{self.run}"

    @property
    def memory(self) -> MemoryCheckpointStore:
        store = self.sides[0].stores[0]
        assert isinstance(store, MemoryCheckpointStore)
        return store

    def peek_head(self, tenant: str, partition: str) -> Head | None:
        """The memory store's head, read without its hints (which a public read would
        teach it, and not the Cassandra store)."""
        partition_ = self.memory._partitions.get((tenant, partition))
        return None if partition_ is None else partition_.head

    def peek_checkpoints(self, tenant: str, partition: str) -> dict:
        partition_ = self.memory._partitions.get((tenant, partition))
        return {} if partition_ is None else dict(partition_.checkpoints)

    def both(self, what: str, call: Callable[[Side], Any],
             normalize: Callable[[Side, Any], Any] | None = None) -> Any:
        """``call`` on each side; their normalized answers must be equal."""
        self.log.append(what)
        answers = []
        for side in self.sides:
            answer = _outcome(lambda s=side: call(s))
            if normalize is not None and not (isinstance(answer, tuple)
                                              and answer[:1] == ("raised",)):
                answer = normalize(side, answer)
            answers.append(answer)
        if answers[0] != answers[1]:
            trail = "\n  ".join(self.log[-12:])
            raise Diverged(
                f"seed {self.seed}, step {self.steps}: {what}\n"
                f"  first difference (memory, then the other): "
                f"{_first_difference(*answers)[:2000]}\n"
                f"last operations:\n  {trail}")
        return answers[0]

    def item(self, size: int = 0) -> Item:
        n = self.new("item")
        body: dict[str, Any] = {"type": "message", "role": "user", "text": n}
        if size:
            body["pad"] = "x" * size
        content = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return Item(item_id=n, type="message", role="user", content=content,
                    content_digest=sha256_hex(content))

    def items(self, big: float = 0.08) -> tuple[Item, ...]:
        roll = self.rng.random()
        if roll < 0.06:
            return (self.item(), self.item(MAX_TURN_BYTES))  # over the size bound
        if roll < 0.06 + big:
            return (self.item(BIG_ITEM),)  # under it
        if roll < 0.09 + big:
            return ()  # a turn that adds no item
        if roll < 0.27 + big:
            # other item types: a tool call and its output (a call id, no role), an
            # assistant message with text beyond ASCII
            call = self.new("call")
            return (
                item_builders.message("héllo ✓ 🙂", role="assistant", item_id=self.new("msg")),
                item_builders.function_call(call, "lookup", {"q": "ü"},
                                            item_id=self.new("fc")),
                item_builders.function_call_output(call, "ok", item_id=self.new("fco")),
            )
        if roll < 0.31 + big:
            # what the processor refuses before the store (a format it cannot read, a
            # type outside the catalogue): stored alike, and failed alike by every read
            odd = self.rng.choice((
                item_builders.make_item("message", {"role": "user"}, role="user",
                                        item_id=self.new("fmt"), format_version=2),
                item_builders.make_item("x_custom", {}, item_id=self.new("odd")),
            ))
            return (self.item(), odd)
        return tuple(self.item() for _ in range(self.rng.randint(1, 3)))

    def artifact(self) -> StoredTokenArtifact:
        return StoredTokenArtifact(
            artifact_id=self.new("art"), token_hash="th", token_count=42,
            safe_append_boundary=40, fingerprint_hash="fp1",
            expires_at=self.clock.now + timedelta(seconds=self.rng.choice((60, 3600))))

    def request(self, tenant: str, partition: str, mode: PromotionMode, *,
                previous: str | None = None, expected: int | None = None) -> PromotionRequest:
        """A fresh request, or (drawn) a retry of an earlier one in the same place:
        the same key and digest with the same or another response id, or the same key
        with another digest; or a response id reused from anywhere."""
        key = self.new("key")
        digest = sha256_hex(key.encode())
        response_id = partition if (mode is PromotionMode.CHAIN and previous is None) \
            else self.new("resp")
        roll = self.rng.random()
        earlier = [r for r in self.requests if r.tenant_id == tenant and r.mode is mode
                   and (r.partition_key == partition or (
                       mode is PromotionMode.CHAIN and previous is None
                       and r.previous_response_id is None))]
        if earlier and roll < 0.35:
            base = self.rng.choice(earlier)
            key, digest = base.idempotency_key, base.request_digest
            kind = self.rng.random()
            if kind < 0.4:
                response_id = base.response_id
                partition, previous = base.partition_key, base.previous_response_id
                expected = base.expected_head_seq if self.rng.random() < 0.5 else expected
            elif kind < 0.7:
                digest = sha256_hex(f"other{self.new('d')}".encode())
        elif self.response_ids and roll < 0.45 and not (
                mode is PromotionMode.CHAIN and previous is None):
            _, response_id = self.rng.choice(self.response_ids)
        elif mode is PromotionMode.CHAIN and previous is None and roll < 0.6:
            held = [key for held_tenant, key in self.held if held_tenant == tenant]
            if held:
                key = self.rng.choice(held)
        certified = self.rng.random() < 0.8
        expires = None
        if self.rng.random() < 0.2:
            expires = self.clock.now + timedelta(seconds=self.rng.choice((30, 300, 3000)))
        attempt = self.rng.choice((None, 1, 2))
        return PromotionRequest(
            tenant_id=tenant, partition_key=partition, mode=mode, response_id=response_id,
            idempotency_key=key, request_digest=digest,
            items=self.items(),
            certification=Certification.CERTIFIED if certified
            else Certification.LOGICAL_ONLY,
            fingerprint_hash=self.rng.choice(("fp1", "fp1", None)),
            previous_response_id=previous,
            expected_head_seq=expected,
            token_artifact=self.artifact() if certified else None,
            router_receipt=self.rng.choice((None, canonical_json(
                {"receipt_id": "rc1", "covered_tokens": 40}))),
            boundary_proof=self.rng.choice((None, canonical_json({"boundary_kind": "append"}))),
            expires_at=expires,
            attempt=attempt,
            effect_ids=() if attempt is None else tuple(
                f"e{i}" for i in range(self.rng.randint(0, 2))),
        )

    def tenant(self) -> str:
        return self.tenants[0] if self.rng.random() < 0.8 else self.tenants[1]

    # -- promotions ---------------------------------------------------------------------

    def conversation_turn(self) -> None:
        if not self.convs or self.rng.random() < 0.2:
            conv = self.new("conv")
            if self.roots and self.rng.random() < 0.15:
                _, conv = self.rng.choice(self.roots)  # a chain's partition's id
            self.convs.append((self.tenant(), conv))
        tenant, conv = self.rng.choice(self.convs)
        if self.rng.random() < 0.1:
            tenant = self.tenant()  # perhaps another tenant's Conversation id
        head = self.peek_head(tenant, conv)
        seq = 0 if head is None else head.seq
        expected = self.rng.choice((seq, seq, seq, max(seq - 1, 0), max(seq - 2, 0),
                                    seq + 1, seq + 2))
        request = self.request(tenant, conv, PromotionMode.CONVERSATION, expected=expected)
        hint = None
        roll = self.rng.random()
        if roll < 0.3 and head is not None:
            hint = head
        elif roll < 0.45:
            hint = Head(request.expected_head_seq or 0, self.new("resp"),
                        self.rng.randint(0, 5), None if head is None else head.lineage_digest)
        extends: object = ANY_LINEAGE
        if self.rng.random() < 0.25:
            extends = self.rng.choice((None if head is None else head.response_id,
                                       self.new("resp")))
        self.promote(request, head_hint=hint, extends=extends)

    def chain_turn(self) -> None:
        if not self.roots or self.rng.random() < 0.15:
            tenant = self.tenant()
            root = self.new("resp")
            if self.convs and self.rng.random() < 0.1:
                _, root = self.rng.choice(self.convs)  # a Conversation's id
            request = self.request(tenant, root, PromotionMode.CHAIN)
            self.roots.append((tenant, request.partition_key))
            if self.rng.random() < 0.15:
                # Its request held first for another first response, never promoted
                # (the processor's ``hold_request`` for a cancelled request's effect).
                holder, key = self.new("resp"), request.idempotency_key
                self.held.append((tenant, key))
                self.both(f"hold_request {tenant} {key} {holder}",
                          lambda s: s.store.hold_request(tenant, key, holder))
            self.promote(request)
            return
        # mostly a chain that has turns to continue
        grown = [(t, r) for t, r in self.roots if self.peek_checkpoints(t, r)]
        tenant, root = self.rng.choice(grown if grown and self.rng.random() < 0.8
                                       else self.roots)
        promoted = [c for c in self.peek_checkpoints(tenant, root).values()]
        roll = self.rng.random()
        parent_hint = None
        if promoted and roll < 0.7:
            parent = self.rng.choice(promoted)  # the latest or an earlier one: a fork
            previous = parent.response_id
            hint_roll = self.rng.random()
            if hint_roll < 0.3:
                parent_hint = parent
            elif hint_roll < 0.7:
                # a hint wrong in one fact the child is built from (a stale or damaged
                # copy): the write's conditions refuse it, on both
                parent_hint = self.rng.choice((
                    dataclasses.replace(parent, seq=parent.seq + 1),
                    dataclasses.replace(parent, last_item_seq=parent.last_item_seq + 1),
                    dataclasses.replace(parent, lineage_digest="0" * 64),
                    dataclasses.replace(parent, mode=PromotionMode.CONVERSATION)))
        elif roll < 0.8 and self.convs:
            conv_tenant, conv = self.rng.choice(self.convs)
            checkpoints = list(self.peek_checkpoints(conv_tenant, conv))
            previous = self.rng.choice(checkpoints) if checkpoints else self.new("resp")
        elif roll < 0.9 and len(self.roots) > 1:
            _, other = self.rng.choice(self.roots)  # another chain's response
            others = list(self.peek_checkpoints(tenant, other)) or [other]
            previous = self.rng.choice(others)
        else:
            previous = self.new("resp")  # never promoted
        request = self.request(tenant, root, PromotionMode.CHAIN, previous=previous)
        extends: object = ANY_LINEAGE
        if self.rng.random() < 0.25:
            extends = self.rng.choice((request.previous_response_id, self.new("resp")))
        self.promote(request, parent_hint=parent_hint, extends=extends)

    def promote(self, request: PromotionRequest, **kw: Any) -> None:
        self.requests.append(request)
        self.response_ids.append((request.tenant_id, request.response_id))
        self.keys.append((request.tenant_id, request.partition_key, request.idempotency_key))
        mark_label = None
        if self.rng.random() < 0.3:
            # The mark the caller decided with: the current one (read first, as the
            # processor does), or a stale one.
            mark_label = self.both(
                f"request_facts_mark {request.idempotency_key}",
                lambda s: s.store.request_facts_mark(request.tenant_id, request.partition_key,
                                                     request.idempotency_key),
                lambda s, mark: s.marks.label(mark))
            if self.rng.random() < 0.3:
                mark_label = "mark#0"
        path = self.rng.random()
        what = (f"promote {request.mode.value} {request.response_id} in "
                f"{request.partition_key} key {request.idempotency_key} expected "
                f"{request.expected_head_seq} prev {request.previous_response_id} "
                f"mark {mark_label} {({k: getattr(v, 'seq', v) for k, v in kw.items()})}")

        def normalize(side: Side, outcome: Any) -> Any:
            if isinstance(outcome, FactsChanged):
                return FactsChanged(side.marks.label(outcome.mark))
            return outcome

        if path < 0.6:
            self.both(what, lambda s: s.store.promote(
                request, facts_mark=s.marks.mark(mark_label), **kw), normalize)
            return
        # The worker's path: the claim sent first, then (the loop path) the batch from
        # hints, then ``promote`` with the claim's holder.
        holders = self.both(f"start_claiming {request.response_id}",
                            lambda s: s.store.start_claiming(ResponseClaim.of(request))())
        if path < 0.8:
            hints = {k: v for k, v in kw.items() if k != "extends" or v is not ANY_LINEAGE}
            fast = self.both(f"promote_from_hints_async {what}", lambda s: asyncio.run(
                s.store.promote_from_hints_async(
                    request, facts_mark=s.marks.mark(mark_label), **hints)))
            if fast is not None:
                return
        self.both(f"{what} claimed", lambda s: s.store.promote(
            request, claimed=holders, facts_mark=s.marks.mark(mark_label), **kw), normalize)

    def judge(self) -> None:
        if not self.requests:
            return
        base = self.rng.choice(self.requests)
        request = dataclasses.replace(base, expected_head_seq=(
            None if base.mode is PromotionMode.CHAIN else self.rng.randint(0, 4)))
        guess = self.rng.choice((None, None, self.rng.choice(self.response_ids)[1]))
        self.both(f"judge {request.response_id} guess {guess}",
                  lambda s: s.store.judge(request, guess))

    # -- reads ----------------------------------------------------------------------------

    def any_response(self) -> tuple[str, str]:
        promoted = [(r.tenant_id, r.response_id) for r in self.requests
                    if self.memory._locate(r.tenant_id, r.response_id) is not None]
        if promoted and self.rng.random() < 0.6:
            tenant, response_id = self.rng.choice(promoted)
            return (self.tenant() if self.rng.random() < 0.1 else tenant), response_id
        if self.response_ids and self.rng.random() < 0.9:
            tenant, response_id = self.rng.choice(self.response_ids)
            return (self.tenant() if self.rng.random() < 0.1 else tenant), response_id
        return self.tenant(), self.new("resp")

    def any_partition(self) -> tuple[str, str]:
        places = self.convs + self.roots
        if places and self.rng.random() < 0.9:
            tenant, partition = self.rng.choice(places)
            return (self.tenant() if self.rng.random() < 0.1 else tenant), partition
        return self.tenant(), self.new("conv")

    def read(self) -> None:
        tenant, response_id = self.any_response()
        ptenant, partition = self.any_partition()
        now = self.clock.now
        kind = self.rng.randrange(13)
        if kind == 0:
            hint = self.rng.choice((None, partition, self.memory._locate(tenant, response_id)))
            self.both(f"read_history {tenant} {response_id} pk={hint}",
                      lambda s: s.store.read_history(tenant, response_id=response_id,
                                                     partition_key=hint, now=now))
        elif kind == 1:
            self.both(f"read_history conversation {ptenant} {partition}",
                      lambda s: s.store.read_history(ptenant, conversation_id=partition))
        elif kind == 2:
            self.both(f"read_history_async {tenant} {response_id}", lambda s: asyncio.run(
                s.store.read_history_async(tenant, response_id=response_id)))
        elif kind == 3:
            self.both(f"read_history_async conversation {ptenant} {partition}",
                      lambda s: asyncio.run(s.store.read_history_async(
                          ptenant, conversation_id=partition)))
        elif kind == 4:
            self.both(f"head {ptenant} {partition}",
                      lambda s: (s.store.head(ptenant, partition),
                                 s.store.read_head(ptenant, partition),
                                 asyncio.run(s.store.read_head_async(ptenant, partition))))
        elif kind == 5:
            self.both(f"locate {tenant} {response_id}",
                      lambda s: (s.store.locate(tenant, response_id),
                                 asyncio.run(s.store.locate_async(tenant, response_id))))
        elif kind == 6:
            self.both(f"read_checkpoint {tenant} {response_id}",
                      lambda s: s.store.read_checkpoint(tenant, response_id))
            self.both(f"get_checkpoint {tenant} {response_id}",
                      lambda s: s.store.get_checkpoint(tenant, response_id))
        elif kind == 7:
            self.both(f"read_promoted {tenant} {response_id}",
                      lambda s: s.store.read_promoted(tenant, response_id))
        elif kind == 8:
            where = self.rng.choice((None, partition))
            self.both(f"turn_lost {tenant} {response_id} in {where}",
                      lambda s: s.store.turn_lost(tenant, response_id, where))
        elif kind == 9:
            if self.rng.random() < 0.7:
                ptenant = tenant
                partition = self.memory._locate(tenant, response_id) or partition
            self.both(f"read_turn {ptenant} {partition} {response_id}",
                      lambda s: (s.store.read_turn(ptenant, partition, response_id),
                                 asyncio.run(s.store.read_turn_async(ptenant, partition,
                                                                     response_id))))
        elif kind == 10 and self.requests:
            request = self.rng.choice(self.requests)
            self.both(f"promoted_request {request.response_id} {request.idempotency_key}",
                      lambda s: s.store.promoted_request(request))
        elif kind == 11 and self.keys:
            ktenant, kpartition, key = self.rng.choice(self.keys)
            first = self.rng.random() < 0.5
            self.both(f"promoted_key {ktenant} {kpartition} {key} first_of_chain={first}",
                      lambda s: s.store.promoted_key(ktenant, kpartition, key, kpartition,
                                                     first_of_chain=first))
        elif kind == 12 and self.keys:
            ktenant, kpartition, key = self.rng.choice(self.keys)
            self.both(f"request_facts_mark {ktenant} {kpartition} {key}",
                      lambda s: s.store.request_facts_mark(ktenant, kpartition, key),
                      lambda s, mark: s.marks.label(mark))

    # -- request facts marks --------------------------------------------------------------

    def facts(self) -> None:
        if self.keys and self.rng.random() < 0.85:
            tenant, partition, key = self.rng.choice(self.keys)
        else:
            tenant, partition = self.any_partition()
            key = self.new("key")
            self.keys.append((tenant, partition, key))
        roll = self.rng.random()
        if roll < 0.45:
            self.both(f"mark_request_facts {tenant} {partition} {key}",
                      lambda s: s.store.mark_request_facts(tenant, partition, key),
                      lambda s, mark: s.marks.label(mark))
        elif roll < 0.85:
            first = self.rng.random() < 0.5
            self.both(f"mark_claim {tenant} {partition} {key} first_of_chain={first}",
                      lambda s: s.store.mark_claim(tenant, partition, key,
                                                   first_of_chain=first))
        else:
            holder = partition
            if self.rng.random() < 0.6:
                tenant, key, holder = self.tenant(), self.new("key"), self.new("resp")
                self.held.append((tenant, key))
            self.both(f"hold_request {tenant} {key} {holder}",
                      lambda s: s.store.hold_request(tenant, key, holder))

    # -- the ledger -----------------------------------------------------------------------

    def ledger_key(self) -> tuple[str, str, str]:
        """A request's key: mostly one the ledger holds facts of already (claims,
        effects, a cancellation meet), else a promoted or tried request's, or a new one."""
        roll = self.rng.random()
        if self.ledger_keys and roll < 0.55:
            return self.rng.choice(self.ledger_keys)
        if self.keys and roll < 0.85:
            found = self.rng.choice(self.keys)
        else:
            tenant, partition = self.any_partition()
            found = (tenant, partition, self.new("key"))
            self.keys.append(found)
        self.ledger_keys.append(found)
        return found

    def now_ms(self) -> int:
        return int(self.clock.now.timestamp() * 1000)

    def effect(self) -> None:
        if self.effects and self.rng.random() < 0.4:
            base = self.rng.choice(self.effects)
            effect = dataclasses.replace(
                base, output_digest=self.rng.choice((base.output_digest, "d2", "d3")),
                scope=self.rng.choice((base.scope, base.scope, "other", "", None)),
                attempt=base.attempt + self.rng.randint(0, 1))
        else:
            tenant, partition, key = self.ledger_key()
            effect = RecordedEffect(
                tenant, key, self.rng.choice(("e0", "e1", "e2")), attempt=1, subturn_index=0,
                call_id=self.new("call"), tool_name="lookup", arguments_digest="args",
                status=self.rng.choice(("succeeded", "failed")), output_item_id="out",
                output_digest="d1", executed_at=self.now_ms(),
                scope=self.rng.choice((partition, partition, "", None)))
        self.effects.append(effect)
        self.both(f"record_effect {effect}", lambda s: s.ledger.record_effect(effect))
        self.both(f"effects_for {effect.tenant_id} {effect.idempotency_key}",
                  lambda s: list(s.ledger.effects_for(effect.tenant_id,
                                                      effect.idempotency_key)))

    def cancel(self) -> None:
        tenant, partition, key = self.ledger_key()
        cancellation = Cancellation(tenant, key, self.new("resp"), self.now_ms(),
                                    self.rng.choice((partition, "", None, "other")))
        self.both(f"record_cancellation {cancellation}",
                  lambda s: s.ledger.record_cancellation(cancellation))
        scope = self.rng.choice((partition, "", None, "other"))
        self.both(f"cancellations {tenant} {key} scope {scope}",
                  lambda s: (list(s.ledger.cancellations(tenant, key)),
                             s.ledger.cancellation(tenant, key, scope)))

    def claim(self) -> None:
        now = self.now_ms()
        if self.claims and self.rng.random() < 0.6:
            base = self.rng.choice(self.claims)
            roll = self.rng.random()
            if roll < 0.3:
                request = base  # the call re-sent (same token)
            else:
                request = dataclasses.replace(
                    base, attempt=base.attempt + 1, call_id=self.new("call"),
                    token=self.new("tok"),
                    arguments_digest=base.arguments_digest if roll < 0.85 else "args2",
                    policy=self.rng.choice(tuple(EffectPolicy)))
        else:
            tenant, _, key = self.ledger_key()
            subturn, occurrence = self.rng.randint(0, 1), self.rng.randint(0, 1)
            request = ClaimRequest(
                tenant, key, claims.effect_id_for_claim(key, subturn, "send_email",
                                                        occurrence),
                attempt=1, subturn_index=subturn, call_id=self.new("call"),
                tool_name="send_email", arguments_digest="args1", token=self.new("tok"),
                lease_ms=LEASE, policy=self.rng.choice(tuple(EffectPolicy)))
        self.claims.append(request)
        self.both(f"claim_effect {request} at {now}",
                  lambda s: s.ledger.claim_effect(request, now))

    def complete(self) -> None:
        if not self.claims:
            return
        base = self.rng.choice(self.claims)
        stored = self.memory_claim(base)
        token = base.token
        if stored is not None and self.rng.random() < 0.5:
            token = stored.token
        elif self.rng.random() < 0.15:
            token = self.new("tok")
        if stored is not None and stored.output is not None and self.rng.random() < 0.5:
            output = stored.output
        else:
            output = item_builders.function_call_output(
                base.call_id, self.rng.choice(("sent", "bounced")), item_id=f"out_{base.effect_id}")
        status = self.rng.choice(("succeeded", "succeeded", "failed"))
        if stored is not None and stored.status is not None and self.rng.random() < 0.5:
            status = stored.status
        now = self.now_ms()
        self.both(f"complete_claim {base.effect_id} token {token} {status} at {now}",
                  lambda s: s.ledger.complete_claim(base.tenant_id, base.idempotency_key,
                                                    base.effect_id, token, status, output,
                                                    now))
        self.both(f"claims_for {base.idempotency_key}",
                  lambda s: (list(s.ledger.claims_for(base.tenant_id, base.idempotency_key)),
                             s.ledger.claim(base.tenant_id, base.idempotency_key,
                                            base.effect_id)))

    def memory_claim(self, request: ClaimRequest):
        ledger = self.sides[0].ledger
        assert isinstance(ledger, MemoryLedger)
        return ledger._claims.get((request.tenant_id, request.idempotency_key), {}).get(
            request.effect_id)

    def decide(self) -> None:
        tenant, partition, key = self.ledger_key()
        if self.events and self.rng.random() < 0.4:
            tenant, key, event = self.rng.choice(self.events)
        else:
            event = self.new("evt")
            self.events.append((tenant, key, event))
        decision = Decision(event, tenant, self.new("resp"), "rejected",
                            self.rng.choice(("CONFLICT", "OUT_OF_ORDER", "DUPLICATE")),
                            self.rng.choice(("", "why")), self.rng.choice((None, 3)),
                            self.now_ms(), self.rng.choice((None, "resp_x")),
                            idempotency_key=key)
        self.both(f"record_decision {decision}", lambda s: s.ledger.record_decision(decision))
        scope = self.rng.choice((partition, None, ""))
        conv = self.rng.choice((None, partition))
        self.both(f"turn_facts {tenant} {key} {event} scope {scope} conv {conv}",
                  lambda s: (s.ledger.decision(event, tenant_id=tenant, idempotency_key=key),
                             s.ledger.turn_facts(event_id=event, tenant_id=tenant,
                                                 idempotency_key=key, conversation_id=conv,
                                                 scope=scope)))

    def status(self) -> None:
        tenant, response_id = self.any_response()
        if self.rng.random() < 0.6:
            reason = self.rng.choice(("CONFLICT", "DUPLICATE", "CANCELLED"))
            existing = self.rng.choice((None, self.new("resp")))
            detail = self.rng.choice(("", "why"))
            self.both(f"mark_rejected {tenant} {response_id} {reason} {existing}",
                      lambda s: s.ledger.mark_rejected(tenant, response_id, reason, detail,
                                                       existing))
        self.both(f"status {tenant} {response_id}",
                  lambda s: (s.ledger.status(tenant, response_id),
                             asyncio.run(s.ledger.status_async(tenant, response_id))))

    def owners(self) -> None:
        tenant, partition = self.any_partition()
        _, response_id = self.any_response()
        response = self.rng.choice((None, response_id))
        conv = self.rng.choice((None, partition))
        self.both(f"owners {tenant} {response} {conv}",
                  lambda s: s.ledger.start_recording_owners(
                      tenant_id=tenant, response_id=response, conversation_id=conv)())
        self.both(f"owner of {partition} / {response_id}",
                  lambda s: (s.ledger.conversation_owner(partition),
                             asyncio.run(s.ledger.conversation_owner_async(partition)),
                             s.ledger.response_owner(response_id)))

    def advance(self) -> None:
        self.clock.advance(self.rng.choice((1, 5, 11, 40, 400, 4000)))
        self.log.append(f"clock now {self.clock.now}")

    # -- the sequence -----------------------------------------------------------------------

    OPERATIONS = (
        ("conversation_turn", 8), ("chain_turn", 9), ("judge", 1), ("read", 9),
        ("facts", 3), ("effect", 2), ("cancel", 2), ("claim", 4), ("complete", 2),
        ("decide", 1), ("status", 1), ("owners", 1), ("advance", 1),
    )

    def run_steps(self) -> int:
        names = [name for name, _ in self.OPERATIONS]
        weights = [weight for _, weight in self.OPERATIONS]
        count = self.rng.randint(MIN_STEPS, MAX_STEPS)
        for self.steps in range(count):
            # Time passes between operations too: leases run out, artifacts and
            # histories expire (``advance`` makes the longer jumps).
            self.clock.advance(self.rng.choice((0, 0, 1, 2, 3, 0.0004, 1.0007)))
            which = int(self.rng.random() < 0.3)  # the step's worker
            for side in self.sides:
                side.current = which
            getattr(self, self.rng.choices(names, weights)[0])()
        self.sweep()
        return count

    def sweep(self) -> None:
        """Everything the sequence touched, read back from both sides."""
        self.steps = -1
        for tenant in self.tenants:
            for _, response_id in self.response_ids:
                self.both(f"sweep history {tenant} {response_id}",
                          lambda s, t=tenant, r=response_id: (
                              s.store.read_history(t, response_id=r),
                              s.store.read_checkpoint(t, r), s.store.locate(t, r)))
                self.both(f"sweep status {tenant} {response_id}",
                          lambda s, t=tenant, r=response_id: s.ledger.status(t, r))
        for tenant, partition in self.convs + self.roots:
            self.both(f"sweep conversation {tenant} {partition}",
                      lambda s, t=tenant, p=partition: (
                          s.store.read_history(t, conversation_id=p), s.store.head(t, p)))
        for tenant, _, key in sorted(set(self.ledger_keys)):
            # A new claimant of a new effect of every request the ledger knows: what
            # the request's facts answer it (a cancellation refuses it).
            probe = ClaimRequest(tenant, key, claims.effect_id_for_claim(key, 9, "probe", 0),
                                 attempt=9, subturn_index=9, call_id="call_probe",
                                 tool_name="probe", arguments_digest="args",
                                 token=f"tok_probe_{key}", lease_ms=LEASE,
                                 policy=EffectPolicy.AT_MOST_ONCE)
            now = self.now_ms()
            self.both(f"sweep claim {tenant} {key}",
                      lambda s, p=probe, n=now: s.ledger.claim_effect(p, n))
        for tenant, partition, key in sorted(set(self.keys)):
            self.both(f"sweep facts {tenant} {partition} {key}",
                      lambda s, t=tenant, p=partition, k=key: (
                          s.marks.label(s.store.request_facts_mark(t, p, k)),
                          list(s.ledger.effects_for(t, k)), list(s.ledger.claims_for(t, k)),
                          list(s.ledger.cancellations(t, k))))


class BackendsAgree:
    """Runs the sequences; a subclass gives the second side (the first is memory)."""

    def make_other(self, options: StoreOptions) -> tuple[CheckpointStore, Ledger]:
        raise NotImplementedError

    def run_sequence(self, seed: int, run: str) -> int:
        clock = FakeClock(T0)
        rng = random.Random(seed)
        options = dict(max_turn_bytes=MAX_TURN_BYTES, clock=clock,
                       logical_retention_s=rng.choice((0, 0, 600)),
                       hint_capacity=rng.choice((4096, 4096, 0)))
        first = MemoryCheckpointStore(StoreOptions(**options))
        second = MemoryCheckpointStore(StoreOptions(**options))
        # Same data and lock, hints of its own: what a second worker process sees.
        second._lock, second._partitions = first._lock, first._partitions
        second._claims, second._request_claims = first._claims, first._request_claims
        memory = Side((first, second), MemoryLedger())
        stores, ledger = zip(*(self.make_other(StoreOptions(**options)) for _ in range(2)),
                             strict=True)
        other = Side((stores[0], stores[1]), ledger[0])
        return Sequence(seed, memory, other, clock, run).run_steps()


@pytest.mark.integration
class TestMemoryAndCassandraAgree(BackendsAgree):
    @pytest.fixture(autouse=True)
    def _sessions(self, store_session, ledger_session, monkeypatch):
        self.store_session, self.ledger_session = store_session, ledger_session
        # A partition is read as WIDE (its structure, then the lineage's items only:
        # ``_load_lineage``) once a read found this many bytes of items outside the
        # lineage; 256 KiB in production, a few turns here, so that the sequences'
        # forks and Conversations reach that path too. Only how it reads changes: the
        # answer must be the same.
        monkeypatch.setattr("services.store.cassandra._WIDE_ITEM_BYTES", 300)

    def make_other(self, options: StoreOptions) -> tuple[CheckpointStore, Ledger]:
        from services.ledger.cassandra import CassandraLedger
        from services.store.cassandra import CassandraCheckpointStore

        return (CassandraCheckpointStore(self.store_session, options, timeout_s=30),
                CassandraLedger(self.ledger_session, timeout_s=30))

    def test_seeded_sequences_agree(self):
        run = uuid.uuid4().hex[:6]
        steps = sum(self.run_sequence(seed, run) for seed in SEEDS)
        assert steps >= len(SEEDS) * MIN_STEPS
