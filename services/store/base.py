"""The checkpoint store interface: frozen records in, typed outcomes out.

Expected results (a lost race, a duplicate, a missing parent, a turn too large) are
*outcomes*, returned. Broken infrastructure is an *exception*: ``StoreUnavailable``,
which says whether retrying the same call can help. A malformed request (a bug in the
caller) is ``InvalidPromotion``.

Promotion protocol, shared by every backend (``CheckpointStore.promote``):

1. refuse a turn above ``max_turn_bytes`` (``TooLarge``) before any I/O;
2. fast path: if the plan can be computed without reading (a new Conversation, a
   chain root, or a hint: the head / parent checkpoint the caller or this store last
   saw), write it at once (step 5). The write's conditions are exactly the facts the
   plan rests on (head cells, no idempotency record, no checkpoint of the response
   id, the parent's checkpoint as hinted), so it applies only where ``plan_promotion``
   on a fresh view would have returned that same plan: a wrong hint can only make it
   refused, never wrong;
3. read the partition's view at linearizable consistency: head, the idempotency
   record of the key, an existing checkpoint of the response id, the parent;
4. plan with the pure ``ratchet.domain.plan.plan_promotion``: an outcome (``Duplicate``, ``KeyReused``,
   ``Conflict`` ...) ends the call; otherwise a ``Plan`` (seq, parent, item seqs);
5. write items + checkpoint + idempotency record + head advance in ONE atomic,
   conditional write that only applies if the plan's facts are still true;
6. applied: ``Promoted``. Not applied: a stale hint or someone else moved first, go
   back to 3 (after a lost race the next decision is an outcome, since every state
   change is monotonic).

Before its first write (step 2 or 5) a promotion holds the response id's claim
(``ResponseClaim``): one linearizable insert per (tenant, response id), first request
wins, never released. A claim held by another request ends the call with
``ResponseClaimed`` once the view shows no ``Duplicate`` / ``KeyReused`` / ``Conflict``
outcome (those are answered first); this is what binds a response id once per tenant
across partitions. A claim whose batch is then refused stays with its request: a later
turn of the same request (same key, digest, partition) finds it and goes on. A claim
row with a null partition, key or digest cell is damage: where the holder would decide
and every intact cell agrees with the turn's, ``promote`` raises ``CorruptPartition``
(``ratchet.domain.plan.check_claim``; session 52); an intact cell that differs is
``ResponseClaimed``. A request claim with a null response id or partition:
``CorruptPartition`` (``check_request_claim``).

A request's facts (kept by the ledger) are asserted, not read: every fact writer
sets the request's facts mark (``mark_request_facts``) and the write of step 5 also
requires the mark the caller decided with; a different mark ends the call with
``FactsChanged`` before any write.

A chain's first response also claims its request, (tenant, idempotency key), the same
way (``RequestFacts.request_held``): its retries under other response ids are other partitions.

A response located by its claim whose turn row is not there was either never promoted
(refused, in flight) or promoted and its row lost to storage damage (rows never expire):
``turn_lost`` tells them apart by the claim's request's idempotency record, and a lost
one reads ``MISSING_HISTORY`` (``TurnLost`` from ``read_promoted``), never ``NOT_FOUND``.

``CheckpointStore`` is a facade over parts with one job each, built in ``__init__``; the
imports point one way, from here to the parts to the backend hooks:

- ``promotion.py``, ``PromotionWriter``: ``promote``, ``judge``, the awaited fast path;
- ``history_reader.py``, ``HistoryReader``: ``read_history`` and its awaited form (one
  generator of steps, two drivers);
- ``checkpoint_reader.py``, ``CheckpointReader``: a response's checkpoint, ``turn_lost``;
- ``request_facts.py``, ``RequestFacts``: a request standing promoted, its holder, the
  facts marks;
- ``hints.py``, ``StoreHints``: what this store saw, shared by the writer and the reader;
- ``backend.py``, ``StoreBackend``: the hooks a backend implements (the claims, the
  view and the batch, the facts marks, the location and lost-row reads, the partition
  loads), which every part calls on the store object.

The public reads a backend answers itself (``head``, ``read_head``,
``request_facts_mark``) and the claim's start (``start_claiming``, ``claim_async``) are
declared here.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from datetime import datetime

from ratchet.domain.history import (
    CheckpointRecord,
    Head,
    HistoryFailure,
    PartitionSnapshot,
    VerifiedHistory,
)
from ratchet.domain.plan import (
    CorruptPartition,
    HeadDamaged,
    IdempotencyRecord,
    Plan,
    Promoted,
    PromotionOutcome,
    PromotionRequest,
    ResponseClaim,
)
from services.store.backend import StoreBackend
from services.store.checkpoint_reader import CheckpointReader
from services.store.errors import (
    InvalidPromotion,
    StoreError,
    StoreUnavailable,
    StrayStopIteration,
    TurnLost,
)
from services.store.hints import StoreHints
from services.store.history_reader import HistoryReader
from services.store.hook_calls import call_hook, in_thread
from services.store.options import StoreOptions
from services.store.promotion import PromotionWriter
from services.store.promotion_checks import ANY_LINEAGE
from services.store.request_checks import DEFAULT_MAX_TURN_BYTES, turn_size, validate_request
from services.store.request_facts import RequestFacts

__all__ = [
    "ANY_LINEAGE",
    "CheckpointStore",
    "CorruptPartition",  # raised by backends too; defined with the plan it breaks
    "HeadDamaged",
    "DEFAULT_MAX_TURN_BYTES",
    "InvalidPromotion",
    "StoreError",
    "StoreOptions",
    "StoreUnavailable",
    "StrayStopIteration",
    "TurnLost",
    "turn_size",
    "validate_request",
]


class CheckpointStore(StoreBackend):
    """Atomic promotion of turns and verified reads of histories.

    Thread-safe. Every method either returns a typed result or raises
    ``StoreUnavailable`` / ``InvalidPromotion`` (``StrayStopIteration`` for a hook
    that raised ``StopIteration``: ``hook_calls.py``).
    """

    def __init__(self, options: StoreOptions | None = None) -> None:
        super().__init__(options)
        # One hints object, shared: the writer learns from its writes and views, the
        # reader from its verified reads, and each plans or locates with all of it.
        self._hints = StoreHints(self.options.hint_capacity)
        self._checkpoints = CheckpointReader(self)
        self._requests = RequestFacts(self)
        self._promotion = PromotionWriter(self, self._hints, self._requests)
        self._histories = HistoryReader(self, self._hints)

    # -- promotion ----------------------------------------------------------------------

    def promote(
        self,
        request: PromotionRequest,
        *,
        head_hint: Head | None = None,
        parent_hint: CheckpointRecord | None = None,
        extends: str | None | object = ANY_LINEAGE,
        claimed: ResponseClaim | None = None,
        facts_mark: str | None = None,
    ) -> PromotionOutcome:
        """Persist the turn atomically, or say why not (see the module docstring).

        ``head_hint`` (Conversation mode: the head the caller last saw) and
        ``parent_hint`` (chain mode: the parent's checkpoint the caller read) let the
        store write without reading first. They are optional and never trusted: a
        wrong hint costs one refused write, never a wrong outcome. Without them the
        store uses what it saw itself (its own promotions and verified reads).

        ``extends``: the response id whose lineage the caller validated the turn
        against (None: the turn starts a lineage). A plan that would extend any other
        response is not written; ``LineageChanged`` says what it would have extended.
        Because a plan's parent is also a condition of its write, a promotion
        returned with ``extends`` given really extends that response.

        ``claimed``: the holder of the response id's claim, as the waiter of
        ``start_claiming`` returned it (the caller overlapped the claim with its own
        reads); without it the store takes the claim itself before its first write.

        ``facts_mark``: the request's facts mark the caller decided with (None: no
        fact of the request recorded, what a caller that read no facts asserts). The
        write applies only if the mark is still that; otherwise ``FactsChanged`` with
        the mark found, and nothing is written (see ``mark_request_facts``).
        """
        return call_hook(self._promotion.promote, request, head_hint, parent_hint, extends,
                         claimed, facts_mark)

    def judge(self, request: PromotionRequest,
              head_guess: str | None = None) -> PromotionOutcome | Plan:
        """What ``promote`` would answer ``request`` now, in its order, with nothing
        written: the size rule, then the view read at SERIAL (one round trip) and the
        promotion rules (the request standing promoted, the response id in this
        partition, the head's damage, ordering). A ``Plan`` when the request could be
        written after all (the caller validates the turn against its lineage first).
        For a turn whose lineage was not read because it cannot be written where it was
        sent (a Conversation turn that expects another head than the head).
        ``head_guess``: the response id of the head the caller read, so that its row
        comes with the view (one round trip); any guess is checked, none trusted."""
        return call_hook(self._promotion.judge, request, head_guess)

    async def promote_from_hints_async(
        self,
        request: PromotionRequest,
        *,
        head_hint: Head | None = None,
        parent_hint: CheckpointRecord | None = None,
        extends: str | None | object = ANY_LINEAGE,
        facts_mark: str | None = None,
    ) -> Promoted | None:
        """``promote``'s first step, awaited: the one conditional write of the plan the
        hints give, for a caller that holds the response id's claim already (it must:
        this does not take it). ``Promoted``, or None when that step did not promote (no
        plan from the hints, a plan that does not extend ``extends``, a turn above the
        size limit, a refused write or one whose outcome is unknown): the caller then
        calls ``promote``, which reads and decides (a write that did land is found
        there as this request's own promotion)."""
        return await self._promotion.promote_from_hints_async(
            request, head_hint, parent_hint, extends, facts_mark)

    def start_claiming(self, claim: ResponseClaim) -> Callable[[], ResponseClaim]:
        """Start taking the response id's claim ahead of ``promote``; returns the waiter
        that gives the claim's holder (``claim`` itself when it is ours), to pass as
        ``promote(..., claimed=...)``. Lets a caller overlap the claim with its own
        reads. The waiter raises ``StoreUnavailable`` if the outcome stays unknown.
        Taken now, as a backend with async I/O sends it now: a turn that ends up
        rejected binds its response id whether or not the waiter is called (the memory
        store took it only when waited for, so its rejected turns bound nothing: an
        outside review, session 32)."""
        holder = call_hook(self._claim, claim)
        return lambda: holder

    async def claim_async(self, claim: ResponseClaim) -> ResponseClaim:
        """``start_claiming``'s waiter, awaited: the claim's holder (``claim`` itself
        when it is ours). ``StoreUnavailable`` when the outcome is not known at once (a
        backend with async I/O leaves the settling SERIAL read to ``promote``)."""
        return await in_thread(call_hook(self.start_claiming, claim))

    # -- history reads ------------------------------------------------------------------

    def read_history(
        self,
        tenant_id: str,
        *,
        response_id: str | None = None,
        conversation_id: str | None = None,
        now: datetime | None = None,
        partition_key: str | None = None,
    ) -> VerifiedHistory | HistoryFailure:
        """The complete verified history of a response or a Conversation, or why not.

        Give exactly one of ``response_id`` / ``conversation_id``. Another tenant's
        id is ``NOT_FOUND``, exactly like an unknown id. With ``response_id``, an
        optional ``partition_key`` (the Conversation id or chain root the caller
        knows) saves the location lookup; it is a hint: if the response is not in
        that partition, the location index is asked as without it.

        A failure that says the stored rows are wrong (``CONFIRMED_FAILURES``) is
        decided from two reads: the read is made once more, and its answer stands
        (``_confirmed``).
        """
        return self._histories.read(tenant_id, response_id, conversation_id, now, partition_key)

    async def read_history_async(
        self,
        tenant_id: str,
        *,
        response_id: str | None = None,
        conversation_id: str | None = None,
        now: datetime | None = None,
        partition_key: str | None = None,
    ) -> VerifiedHistory | HistoryFailure:
        """``read_history`` for an event loop: the same reads, awaited
        (``_load_partition_async``, ``_locate_async``), then the same verification and
        the same confirmation of a failure."""
        return await self._histories.read_async(tenant_id, response_id, conversation_id,
                                                 now, partition_key)

    @abstractmethod
    def head(self, tenant_id: str, partition_key: str) -> Head | None:
        """The Conversation's head, or None if nothing was promoted (or chain mode)."""

    @abstractmethod
    def read_head(self, tenant_id: str, partition_key: str) -> Head | None:
        """``head`` at read consistency (not linearizable): what a history reader
        needs, one row, never a Paxos round."""

    async def read_head_async(self, tenant_id: str, partition_key: str) -> Head | None:
        """``read_head`` for an event loop; a backend with async I/O overrides it so a
        Conversation cache hit never takes the thread-pool hop."""
        return await in_thread(self.read_head, tenant_id, partition_key)

    def read_turn(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """ONE turn row (its checkpoint and items, UNverified, with the partition's
        head): what extending an already verified history reads. None if absent.
        The caller verifies it (``ratchet.domain.history.verify_extension``)."""
        return call_hook(self._load_turn, tenant_id, partition_key, response_id)

    async def read_turn_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """``read_turn`` for an event loop (a backend with async I/O overrides it)."""
        return await in_thread(self.read_turn, tenant_id, partition_key, response_id)

    def locate(self, tenant_id: str, response_id: str) -> str | None:
        """The partition a response id was promoted under (a hint, verified by reads)."""
        return call_hook(self._locate, tenant_id, response_id)

    async def locate_async(self, tenant_id: str, response_id: str) -> str | None:
        """``locate`` for an event loop."""
        return await self._locate_async(tenant_id, response_id)

    # -- one response's checkpoint -------------------------------------------------------

    def turn_lost(self, tenant_id: str, response_id: str,
                  partition_key: str | None = None) -> bool:
        """True when the response was promoted and its turn row is gone (storage
        damage: rows never expire, docs/store.md). Only for a response whose row a read
        did not find where its claim says (``partition_key``, when the caller located
        it): never on the common read path. How promoted is told from never promoted,
        and a late row from a lost one: ``CheckpointReader.turn_lost``. Raises
        ``CorruptPartition`` for a claim that names no partition or no request (it
        cannot tell; ``read_history`` answers it ``CORRUPT_HISTORY``)."""
        return call_hook(self._checkpoints.turn_lost, tenant_id, response_id, partition_key)

    async def turn_lost_async(self, tenant_id: str, response_id: str,
                              partition_key: str | None = None) -> bool:
        """``turn_lost`` for an event loop (a rare path: the thread pool's hop is fine);
        the store's ``turn_lost``, so that a subclass overriding it is asked here too."""
        return await in_thread(self.turn_lost, tenant_id, response_id, partition_key)

    def read_promoted(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        """``read_checkpoint`` for an answer that must tell a promoted response from an
        unknown one (the status endpoint): raises ``TurnLost`` where ``read_checkpoint``
        finds no row but the response was promoted (``turn_lost``), else its answer."""
        return call_hook(self._checkpoints.read_promoted, tenant_id, response_id)

    def read_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        """The promoted checkpoint of a response, or None (also for another tenant);
        raises ``CorruptPartition`` for a row that cannot be decoded or is filed under
        another response id (the status endpoint answers it, never as "unknown")."""
        return call_hook(self._checkpoints.read_checkpoint, tenant_id, response_id)

    def get_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        """The promoted checkpoint of a response, or None (also for another tenant);
        raises ``CorruptPartition`` for a row that cannot be decoded or is filed under
        another response id, as ``read_checkpoint`` does: whether the id stands
        promoted cannot be told, and the processor's lookups (``already_promoted``,
        ``chain_owner``, a cancellation's check) answer it ``CORRUPT``, as the write
        does. Until session 49 a damaged row read as absent here."""
        return call_hook(self._checkpoints.get_checkpoint, tenant_id, response_id)

    # -- a request's standing and facts marks ---------------------------------------------

    def hold_request(self, tenant_id: str, idempotency_key: str,
                     response_id: str) -> ResponseClaim:
        """Claim the request of a chain's first response ``response_id`` (its partition
        key) for it unless another first response holds it; returns the holder. Asked
        for a fact of the request, not a turn (the processor, before orphaning a late
        effect of a cancelled request): the claim's ``request_digest`` is empty, and
        only its ``response_id`` is ever compared (``RequestFacts.request_held``). Held by
        ``response_id``, no other attempt of the request can ever be promoted."""
        return call_hook(self._requests.hold_request, tenant_id, idempotency_key, response_id)

    def promoted_request(self, request: PromotionRequest) -> CheckpointRecord | None:
        """The checkpoint the request (its idempotency key) stands promoted with, by
        whichever attempt or response id, or None: its partition's idempotency record,
        and for a chain's first response the partition of the response holding its
        request claim (a retry under another response id is another partition). Read at
        linearizable consistency, like a promotion's view. Asked on the rare paths that
        must know whether the request stands promoted (a cancellation that came after
        its promotion; effects a rejected attempt must not orphan)."""
        return call_hook(self._requests.promoted_request, request)

    def promoted_key(self, tenant_id: str, partition_key: str, idempotency_key: str,
                     response_id: str, *, first_of_chain: bool) -> CheckpointRecord | None:
        """``promoted_request`` for a fact of a request that knows only the request's
        key and one attempt's partition and response id (a tool effect): the view's
        idempotency record there, and, for an attempt that is a chain's first response
        (``first_of_chain``: its partition is its own response id, in chain mode), the
        request claim's holder's: its request may stand promoted in another attempt's
        partition."""
        return call_hook(self._requests.promoted_key, tenant_id, partition_key,
                         idempotency_key, response_id, first_of_chain=first_of_chain)

    def mark_request_facts(self, tenant_id: str, partition_key: str, idempotency_key: str) -> str:
        """Say that a fact of this request (a tool effect, an effect claim or its
        outcome, a cancellation, a rejection decision) was recorded, AFTER recording
        it; returns the new mark. A plain write in the history partition: a promotion
        decided without that fact asserts the old mark and is refused
        (``FactsChanged``), so a promotion never misses a fact recorded before it.
        One recorded after the promotion's write is ordered after the promotion."""
        return call_hook(self._requests.mark_request_facts, tenant_id, partition_key,
                         idempotency_key)

    def mark_claim(self, tenant_id: str, partition_key: str, idempotency_key: str, *,
                   first_of_chain: bool = False) -> IdempotencyRecord | None:
        """``mark_request_facts`` around an effect claim, which must not let its holder
        run the tool once the request stands promoted: nothing would ever use the run,
        and a holder that vanished would leave it published nowhere. Returns the record
        of the promotion the request stands with (the claims API then answers
        ``PROMOTED``), else None once the mark is written.

        The mark is conditional (no response bound to the key in that partition), so it
        and a promotion batch, which asserts the mark its decision saw, are ordered by
        one Paxos round: a batch before it promoted (we learn it here), one after it is
        refused and decided again with the claim among the facts.

        ``first_of_chain``: the claim is an attempt of a chain's first response (its
        partition is its own response id). Its request may stand promoted under another
        response id, in the partition of the response holding the request
        (``hold_request``): that partition is marked the same way. Only then: the same
        key in another chain or a Conversation is another request, whose holder this is
        not. A claim made before the holder held the request is seen by the holder's
        own read of the request's facts after its batch (the processor's
        ``TurnPromotion.handle``, streams/turn_promotion.py)."""
        return call_hook(self._requests.mark_claim, tenant_id, partition_key, idempotency_key,
                         first_of_chain=first_of_chain)

    @abstractmethod
    def request_facts_mark(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        """The request's facts mark (None: no fact recorded). Read it BEFORE reading
        the facts: a fact recorded after this read changes the mark."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; the in-memory backend has nothing to release."""
