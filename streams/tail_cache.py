"""A bounded, in-process memory of facts about promoted lineages: the tail cache.

Deciding a ``TurnCompleted`` needs, besides the ledger's facts, the pairing state of
the lineage the turn extends (CONTRACT section 4, pairing) and, in Conversation mode,
the conversation's owner. Reading them from Cassandra costs a whole-partition history
read and an owner read per turn. This cache remembers them for the conversations and
chains this worker promoted recently, so the next turn of the same conversation is
decided without either read.

What is cached, and why each fact cannot go stale:

* ``Tail`` per (tenant, partition key, response id): the checkpoint of a promoted
  response and the pairing state of the lineage ENDING at it. A promoted response's
  lineage never changes (its items and its ancestors' are immutable; seqs are unique
  and gap-free per Conversation), so the fact is true forever for that response id.
  The one thing that can end it is logical expiry, which the caller checks
  (``Tail.expired``) exactly like a history read would.
* the last known head per (tenant, conversation id): a pointer to one ``Tail``. This
  one CAN be stale (another worker, or a zombie after a rebalance, may have moved the
  head since). It is only used when the turn's ``expected_head_seq`` equals the
  cached head's seq, and the seq -> response mapping of a Conversation is immutable,
  so a hit means "the response at that seq is the one described", never "the head is
  still there". Whether the head is still there is decided by the store's LWT: its
  head condition (or the SERIAL view read after a refused fast write) only lets the
  turn promote on top of that very response.
* conversation owner per conversation id: the tenant that promoted its first turn.
  First claim wins and it never changes, so only claimed owners are cached (never
  "no owner yet").

* the request facts mark per (tenant, partition key, idempotency key) that this
  worker last wrote (after recording a tool effect, a cancellation or a rejection
  of the request). It CAN be stale (a claim or another worker wrote a newer one): it
  is only asserted by the promotion batch, which refuses a stale mark
  (``FactsChanged``) and costs one more read, never a wrong outcome.

The processor's safety rules on top (``streams/processor.py``): a promotion decided
from cached facts is correct because the LWT checks the head/parent the facts
describe; any REJECTION decided with cached facts is decided again from fresh reads
before it is made durable, so a stale or wrong entry can cost a read, never a wrong
outcome.

Memory is bounded: at most ``capacity`` entries in each of the four maps (LRU), a
tail weighing one more per 4 KiB of the ids its pairing state holds, each id counted
with what holding it costs beside its characters (``tail_weight``). A lineage's
pairing state grows with its Conversation (every call id of the history); a long one
is cached up to 1/16 of a map's weight (``MAX_TAIL_SHARE``, ~30 000 ordinary call
ids): until session 35 a lineage of more than 256 call ids was not cached at all, and
every turn of a long agent loop read its whole history (4 ms a turn up to 256 calls,
21 ms at 300, 46 ms at 800: quadratic). A Conversation's tails are kept as its head
only (its turns look up nothing else), so a long loop holds one tail, not its last
few. The default (10 000) keeps each map's ids within ~40 MB at the worst and a few
MB for ordinary conversations.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode, logically_expired
from ratchet.domain.validation import PairingState
from ratchet.lru import Lru

DEFAULT_CAPACITY = 10_000


@dataclass(frozen=True, slots=True)
class Tail:
    """A promoted response and the pairing state of the lineage ending at it."""

    checkpoint: CheckpointRecord
    pairing: PairingState
    # ``tail_weight``, computed once: the cache weighs a tail when it is put and again
    # when it is evicted, and a long lineage holds thousands of ids.
    weight: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight", _weight_of(self.pairing, self.checkpoint))

    @property
    def head(self) -> Head:
        """The Conversation head this response is (when it is the head)."""
        return Head.of(self.checkpoint)

    def expired(self, now: datetime) -> bool:
        """Logically expired: a history read would fail with EXPIRED; do not use it."""
        return logically_expired(self.checkpoint.logical_expires_at, now)


# A tail's weight: one per entry, and one more per WEIGHT_CHARS characters of the ids
# its pairing state holds, each id counted ID_OVERHEAD characters more (a str object's
# header and its slot in a set: ~80 bytes). Counted by entries alone, a gateway's 4 MB
# call ids held 4 MB a Conversation (100 turns: 400 MB; an outside review, session 34);
# weighed, a map holds at most ~capacity x WEIGHT_CHARS characters of ids and their
# overhead, whatever their size and number (10 000 x 4 KiB: ~40 MB a map).
WEIGHT_CHARS = 4096
ID_OVERHEAD = 80
# The largest share of a map one tail may weigh (1/16 of 10 000: ~2.5 MB of ids, ~30 000
# call ids of 8 characters); a heavier one is not cached.
MAX_TAIL_SHARE = 1 / 16


def _weight_of(pairing: PairingState, checkpoint: CheckpointRecord) -> int:
    """The pairing state's ids and the effect ids the cached checkpoint keeps (one per
    effect its turn used: 3 000 of them held 0.28 MB at weight 1, a review found)."""
    effects = checkpoint.accepted_effect_ids or ()
    if not (pairing.call_ids or pairing.request_ids or pairing.open_calls
            or pairing.open_requests or effects):
        return 1  # no ids held (a lineage without calls): what the sums below give
    ids = (len(pairing.call_ids) + len(pairing.request_ids) + len(pairing.open_calls)
           + len(pairing.open_requests) + len(effects))
    chars = (sum(map(len, pairing.call_ids)) + sum(map(len, pairing.request_ids))
             + sum(len(call_id) for call_id, _ in pairing.open_calls)
             + sum(map(len, pairing.open_requests)) + sum(map(len, effects)))
    return 1 + (chars + ID_OVERHEAD * ids) // WEIGHT_CHARS


def tail_weight(tail: object) -> int:
    return tail.weight if isinstance(tail, Tail) else 1


class TailCache:
    """Thread-safe (the processor runs in a pool of threads, one lane per partition)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        # (tenant, partition key, response id) -> Tail; (tenant, conversation id) -> Tail
        # of the last head. Weighed by their ids' size (``tail_weight``).
        self._tails = Lru(capacity, tail_weight)
        self._heads = Lru(capacity, tail_weight)
        self._owners = Lru(capacity)  # conversation id -> owning tenant
        self._marks = Lru(capacity)  # (tenant, partition key, idempotency key) -> mark

    def __len__(self) -> int:
        with self._lock:
            return len(self._tails) + len(self._heads) + len(self._owners) + len(self._marks)

    # -- lookups --------------------------------------------------------------------
    def tail(self, tenant_id: str, partition_key: str, response_id: str) -> Tail | None:
        with self._lock:
            found = self._tails.get((tenant_id, partition_key, response_id))
        return found if isinstance(found, Tail) else None

    def head_at(self, tenant_id: str, conversation_id: str, seq: int) -> Tail | None:
        """The cached tail of the conversation's response at ``seq``, if it is the last
        head this cache saw (the only seq it remembers per conversation)."""
        with self._lock:
            found = self._heads.get((tenant_id, conversation_id))
        if isinstance(found, Tail) and found.checkpoint.seq == seq:
            return found
        return None

    def owner(self, conversation_id: str) -> str | None:
        with self._lock:
            found = self._owners.get(conversation_id)
        return found if isinstance(found, str) else None

    def facts_mark(self, tenant_id: str, partition_key: str, idempotency_key: str) -> str | None:
        """The request facts mark this worker last wrote for the request (a hint)."""
        with self._lock:
            found = self._marks.get((tenant_id, partition_key, idempotency_key))
        return found if isinstance(found, str) else None

    # -- learning ---------------------------------------------------------------------
    def learn(self, tail: Tail) -> bool:
        """Remember a promoted response's tail: a chain's by its response id, a
        Conversation's as its head (the only way a Conversation turn looks one up: its
        expected head). False when the cache is off, or the tail weighs more than
        ``MAX_TAIL_SHARE`` of it: one long agent loop's tails evicted every other
        lineage, and one heavier than the whole cache emptied it (a review); such a
        lineage's turns read their history, as every lineage did before session 35's
        "Long agent loops"."""
        if self.capacity <= 0 or tail.weight > max(1.0, self.capacity * MAX_TAIL_SHARE):
            return False  # (a tail of weight 1 fits any cache: a small one is no cache off)
        cp = tail.checkpoint
        with self._lock:
            if cp.mode is PromotionMode.CONVERSATION:
                key = (cp.tenant_id, cp.partition_key)
                known = self._heads.get(key)
                # Heads only move forward: an older response never replaces a newer one.
                if not isinstance(known, Tail) or known.checkpoint.seq <= cp.seq:
                    self._heads.put(key, tail)
            else:
                self._tails.put((cp.tenant_id, cp.partition_key, cp.response_id), tail)
        return True

    def learn_owner(self, conversation_id: str, tenant_id: str) -> None:
        with self._lock:
            self._owners.put(conversation_id, tenant_id)

    def learn_facts_mark(self, tenant_id: str, partition_key: str, idempotency_key: str,
                         mark: str) -> None:
        if self.capacity > 0:
            with self._lock:
                self._marks.put((tenant_id, partition_key, idempotency_key), mark)

    def forget_head(self, tenant_id: str, conversation_id: str) -> None:
        """Drop the conversation's head pointer (e.g. it proved not to be the head)."""
        with self._lock:
            self._heads.pop((tenant_id, conversation_id))
