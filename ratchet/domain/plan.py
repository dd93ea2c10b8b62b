"""The promotion plan of the checkpoint store (CONTRACT section 4), pure.

Given one ``PromotionRequest`` and a ``PromotionView`` (what a backend read from the
partition: head, the idempotency record of the key, an existing checkpoint of the
response id, the chain parent), ``plan_promotion`` returns an outcome
(``Duplicate``, ``KeyReused``, ``Conflict`` ...) or a ``Plan``: where the turn goes
(seq, parent, item seqs) and the facts the backend's one conditional write must find
unchanged. ``plan_from_hints`` gives the plan a fresh view would give IF remembered
facts (a head, a parent checkpoint) are true, so a backend may write before reading;
``build_checkpoint`` is the record a plan persists. Every backend shares these rules
(``services/store/promotion.py`` runs the read-plan-write loop around them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property

from ratchet.domain.history import (
    CheckpointRecord,
    Head,
    PromotionMode,
    StoredTokenArtifact,
    backs,
    items_digest,
    lineage_digest,
    utc_ms,
)
from schemas.models import Certification, Item


class CorruptPartition(Exception):
    """The rows a promotion must decide on are inconsistent or cannot be decoded.

    Not retryable and not an outcome: the partition needs an operator. Reads report
    the same damage as ``HistoryFailure(CORRUPT_HISTORY)`` instead.
    """


class HeadDamaged(CorruptPartition):
    """The damage is the Conversation head's own (cells no row backs, a head lost while
    turns stand, a head gone back): ordering's input, not an answer that comes before
    it. A turn that expects another head is still ordered against the cells
    (docs/gateway-protocol.md, section 7)."""


# --- request and outcomes ------------------------------------------------------------


@dataclass(frozen=True)
class PromotionRequest:
    """One turn to promote: its new items plus the checkpoint metadata to persist.

    ``items`` are the turn's NEW items only (its input items then its output items);
    the history before them is already stored. ``expected_head_seq`` is required in
    Conversation mode (0 for a new Conversation) and ignored in chain mode.
    ``router_receipt`` / ``boundary_proof`` are canonical JSON, stored verbatim.
    """

    tenant_id: str
    partition_key: str
    mode: PromotionMode
    response_id: str
    idempotency_key: str
    request_digest: str
    items: tuple[Item, ...]
    certification: Certification
    fingerprint_hash: str | None = None
    previous_response_id: str | None = None
    expected_head_seq: int | None = None
    token_artifact: StoredTokenArtifact | None = None
    router_receipt: str | None = None
    boundary_proof: str | None = None
    # The gateway's logical expiry (``TurnCompleted.expires_at``); the checkpoint keeps
    # the earlier of it and the server's retention (``build_checkpoint``).
    expires_at: datetime | None = None
    # The turn's attempt and the tool effects it uses, kept with its checkpoint.
    attempt: int | None = None
    effect_ids: tuple[str, ...] = ()

    @cached_property
    def turn_items_digest(self) -> str:
        """``history.items_digest`` of ``items``, computed once per request: the plan's
        lineage digest and the checkpoint's items digest are both made of it."""
        return items_digest(self.items)


@dataclass(frozen=True)
class Promoted:
    """The turn is durable and the head (Conversation mode) has moved to ``seq``."""

    checkpoint: CheckpointRecord

    @property
    def seq(self) -> int:
        return self.checkpoint.seq


@dataclass(frozen=True)
class Duplicate:
    """Same idempotency key and same request digest were already promoted."""

    original: CheckpointRecord


@dataclass(frozen=True)
class KeyReused:
    """Same idempotency key already promoted a DIFFERENT request."""

    original_request_digest: str
    original_response_id: str


@dataclass(frozen=True)
class Conflict:
    """Conversation mode: the head already moved past ``expected_head_seq``."""

    current_head_seq: int


@dataclass(frozen=True)
class AheadOfHead:
    """Conversation mode: ``expected_head_seq`` is beyond the head (out of order)."""

    current_head_seq: int


@dataclass(frozen=True)
class ParentMissing:
    """Chain mode: ``previous_response_id`` is not promoted in this tenant/partition."""

    previous_response_id: str


@dataclass(frozen=True)
class ResponseExists:
    """This response id was already promoted under another idempotency key."""

    original: CheckpointRecord


@dataclass(frozen=True)
class ResponseClaim:
    """Who may promote a response id in a tenant: ONE request, in ONE partition.

    Taken once per (tenant, response id) by a linearizable insert before the first
    promotion batch of the id (``CheckpointStore.promote``), never released and never
    changed. The request's identity (idempotency key + request digest) and partition
    are the claim, so a retry or redelivery of the SAME request finds its own claim and
    goes on (also after a crash between the claim and its batch, or after its batch was
    refused), while any other request finds the id taken: ``ResponseClaimed``. The
    claim also says where the response lives (the store's location lookup).
    """

    tenant_id: str
    response_id: str
    partition_key: str
    idempotency_key: str
    request_digest: str

    @classmethod
    def of(cls, request: PromotionRequest) -> ResponseClaim:
        return cls(request.tenant_id, request.response_id, request.partition_key,
                   request.idempotency_key, request.request_digest)


# A claim's cells that name its request and partition, by what a message calls them.
_CLAIM_CELLS = (("partition_key", "partition"), ("idempotency_key", "request"),
                ("request_digest", "request digest"))


def check_claim(holder: ResponseClaim, mine: ResponseClaim) -> None:
    """A claim row with a cell that reads null (or empty) is damage: every claim is
    written whole, from a turn whose key and digest passed validation. Compared as it
    is, such a holder differs from every turn, and the write answered ``CONFLICT``
    "bound to request K in P" also to the very request it may be (session 52).
    A null cell decides nothing either way: where the intact cells all agree with the
    turn's claim (``mine``), the holder may be the turn's own request,
    ``CorruptPartition`` (``CORRUPT``); where one differs (another partition, key or
    digest), the id is bound to another turn whatever the null cell held, and the
    caller answers ``ResponseClaimed`` (``CONFLICT``, CONTRACT 4), so a damaged claim's
    ``CORRUPT`` never reaches a healthy Conversation's turn (session 52's outside
    review). The write asks it only where the holder decides (its view would let the
    turn write), so a turn its view answers (a promoted request's redelivery) is
    answered as before."""
    missing = [name for cell, name in _CLAIM_CELLS if not getattr(holder, cell)]
    if missing and all(getattr(holder, cell) == getattr(mine, cell)
                       for cell, _ in _CLAIM_CELLS if getattr(holder, cell)):
        raise CorruptPartition(
            f"the claim of response {holder.response_id} of tenant {holder.tenant_id} "
            f"names no {' and no '.join(missing)}")


def claimed_partition(tenant_id: str, response_id: str, partition_key: str | None) -> str:
    """The partition a response id's claim names, for a lookup by id. A claim naming
    none (a null or empty cell) is damage, never an unclaimed id: ``CorruptPartition``.
    Both backends read it so (session 53: memory read the null as a partition nobody
    has, ``get_checkpoint`` None, where Cassandra's lookup raised)."""
    if not partition_key:
        raise CorruptPartition(f"the claim of response {response_id} of tenant {tenant_id} "
                               "names no partition")
    return partition_key


def check_request_claim(holder: ResponseClaim) -> ResponseClaim:
    """A request claim (``request_claims``: the response id and partition holding a
    chain's first request) with a null or empty response id or partition cell is damage:
    every such claim is written whole. Trusted as it is, the holder was a response
    "None" the worker waited for without end (memory) or a null key sent to Cassandra
    (refused, ``StoreUnavailable``, retried without end; session 52's outside review).
    Its digest cell is not read (``hold_request`` writes it empty). Returns the holder."""
    missing = [name for cell, name in (("response_id", "response"), ("partition_key", "partition"))
               if not getattr(holder, cell)]
    if missing:
        raise CorruptPartition(
            f"the claim of request {holder.idempotency_key} of tenant {holder.tenant_id} "
            f"names no {' and no '.join(missing)}")
    return holder


@dataclass(frozen=True)
class ResponseClaimed:
    """The response id is claimed by another request (another idempotency key, request
    digest or partition): never rebound, the turn is not written (CONFLICT)."""

    holder: ResponseClaim


@dataclass(frozen=True)
class RequestHeld:
    """A chain's first response: its request (idempotency key) is held by another
    response id, the first response of another chain, which is not promoted (yet).

    A chain's first response is its own partition, so a retry of the request under
    another response id lands in another partition than the first attempt, where the
    partition's idempotency record cannot see it. Such requests are claimed once per
    (tenant, idempotency key), like a response id (``CheckpointStore.promote``); the
    holder promoted answers ``Duplicate`` / ``KeyReused``. Not promoted: the holder's
    decision decides (``streams/processor.py``)."""

    holder: ResponseClaim


def starts_chain(request: PromotionRequest) -> bool:
    """A chain's first response: the one kind of request whose retries under another
    response id land in other partitions (each its own)."""
    return request.mode is PromotionMode.CHAIN and request.previous_response_id is None


@dataclass(frozen=True)
class LineageChanged:
    """The turn would extend another response than the caller said it validated the
    turn against (``promote(..., extends=...)``); nothing was written.

    ``parent_response_id`` is what the turn would have extended (None: nothing).
    Only returned to a caller that passed ``extends``: it re-reads the lineage and
    decides again.
    """

    parent_response_id: str | None


@dataclass(frozen=True)
class FactsChanged:
    """The request's facts (tool effects, effect claims, a cancellation, an earlier
    decision) are not the ones the caller decided with; nothing was written.

    Every writer of a request fact also sets the request's *facts mark* in the
    history partition (after the fact itself); the promotion write asserts the mark
    the caller saw (none, on the fast path that read no facts). ``mark`` is the mark
    found: the caller reads the facts again and promotes with it
    (``promote(..., facts_mark=mark)``).
    """

    mark: str | None


@dataclass(frozen=True)
class TooLarge:
    """The turn's stored size is above what one atomic write can carry; nothing stored."""

    size: int
    limit: int


PromotionOutcome = (
    Promoted
    | Duplicate
    | KeyReused
    | Conflict
    | AheadOfHead
    | ParentMissing
    | ResponseExists
    | ResponseClaimed
    | RequestHeld
    | TooLarge
    | LineageChanged
    | FactsChanged
)


# --- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotencyRecord:
    """Which request an idempotency key promoted (stored with the checkpoint)."""

    idempotency_key: str
    request_digest: str
    response_id: str


@dataclass(frozen=True)
class PromotionView:
    """What a backend read before deciding; ``_write`` applies only if still true.

    ``original`` is the checkpoint the idempotency record points at (if any),
    ``existing`` the checkpoint of the request's response id (if any), ``parent`` the
    checkpoint of ``previous_response_id`` (chain mode, if any), ``facts_mark`` the
    request's facts mark (None: no fact of the request was ever recorded).
    ``head_backing`` is the checkpoint the head names (read for a Conversation
    request), ``conversation_begun`` whether a Conversation's first turn was promoted
    in the partition (its marker row): what the head is checked against.
    """

    head: Head | None
    idempotency: IdempotencyRecord | None = None
    original: CheckpointRecord | None = None
    existing: CheckpointRecord | None = None
    parent: CheckpointRecord | None = None
    facts_mark: str | None = None
    head_backing: CheckpointRecord | None = None
    conversation_begun: bool = False


@dataclass(frozen=True)
class Plan:
    """Where the turn goes: the write a backend must make atomically."""

    seq: int
    parent_response_id: str | None
    first_item_seq: int
    # Conversation mode: the head the write is conditional on (None = no head yet);
    # all three head cells (seq, response id, item count) are conditions.
    expected_head: Head | None = None
    new_head: Head | None = None
    # Chain mode: the parent checkpoint the write is conditional on (its seq, item
    # range, mode and lineage digest must still be what the plan was computed from).
    parent: CheckpointRecord | None = None
    # The new turn's lineage digest (history.lineage_digest): chained from the parent's
    # (the head's in a Conversation), None when the parent has none (promoted before
    # lineage digests existed: an unlinked lineage stays unlinked).
    lineage_digest: str | None = None


def check_view_filing(request: PromotionRequest, view: PromotionView) -> None:
    """Every checkpoint row a view holds must be the one it was asked for: a row whose
    ``response_id`` cell names another id than its place (``ref`` on Cassandra, the key
    on memory) is damage, and a decision from it would answer with another turn's record
    (``Duplicate``, ``ResponseExists``) or plan a child on a parent by the wrong id
    (``CorruptPartition``: a ``CORRUPT`` rejection, as the lookups answer). The head's row
    is ``backs``'s (its response id is a head cell). The rows the view holds anyway: no
    request more. Called by the store on every view before it learns from it."""
    asked = (
        (view.original, None if view.idempotency is None else view.idempotency.response_id),
        (view.existing, request.response_id),
        (view.parent, request.previous_response_id),
    )
    for row, response_id in asked:
        if row is not None and row.response_id != response_id:
            raise CorruptPartition(
                f"partition {request.partition_key} of tenant {request.tenant_id}: the "
                f"checkpoint row filed under {response_id} names {row.response_id}")


def plan_promotion(request: PromotionRequest, view: PromotionView) -> PromotionOutcome | Plan:
    """The promotion rules of contract section 4 for one request over one view."""
    if view.idempotency is not None:
        record = view.idempotency
        if record.request_digest != request.request_digest:
            return KeyReused(record.request_digest, record.response_id)
        if view.original is None:
            raise CorruptPartition(
                f"idempotency key {record.idempotency_key} points at {record.response_id}, "
                "which has no checkpoint: the partition is corrupt"
            )
        return Duplicate(view.original)
    if view.existing is not None:
        return ResponseExists(view.existing)
    if request.mode is PromotionMode.CONVERSATION:
        _check_head(request, view)
        return _plan_conversation(request, view.head)
    no_conversation = view.head is None and not view.conversation_begun
    if view.parent is not None and not _may_be_a_chain_row(view.parent, view.head,
                                                           no_conversation):
        raise CorruptPartition(
            f"partition {request.partition_key} of tenant {request.tenant_id}: the parent "
            f"{view.parent.response_id} reads as a chain row but is a Conversation's "
            "(its mode cell or a link is damaged)")
    return _plan_chain(request, view.parent)


def _may_be_a_chain_row(row: CheckpointRecord, head: Head | None,
                        no_conversation: bool = False) -> bool:
    """False for a row reading ``chain`` that the view shows is none (a damaged ``mode``
    cell or link, docs/store.md): the head names it (a head names a Conversation row
    only), its own links disagree (a chain row's parent is its ``previous_response_id``,
    both None at a root; a Conversation row's parent is the head it was planned on), or
    it is a root outside its own partition in a partition where a Conversation begun
    (a Conversation's first turn, whose cells are a root's, sits under the
    Conversation's id; ``no_conversation``: the view holds neither a head nor the
    Conversation's marker). A root off its key in a partition without a Conversation is
    taken as the chain root it reads as: a chain's first response is its own partition
    key (CONTRACT section 2), and neither the processor (since 2026-12-03) nor
    ``validate_request`` (session 49) writes another, but a gateway that named its
    chain's partition as the first response's ``chain_root_id`` had it filed so before;
    the reads verify such a chain, so its turns are written too (session 49, rrevj).
    A hint cannot show the marker: ``plan_from_hints`` passes False (the view decides).
    What a promotion's view holds anyway, so ``promote`` alone refuses these at no
    request more. Left to a read of the partition (``_check_chain`` in ``history.py``,
    which the processor makes before every chain turn): a Conversation's first turn
    whose response id is the Conversation's own id, not the head; one off its key whose
    Conversation lost both its head and its marker."""
    if row.mode is not PromotionMode.CHAIN:
        return True  # not a chain parent at all: ``_plan_chain`` answers ParentMissing
    named_by_head = head is not None and head.response_id == row.response_id
    return (not named_by_head and row.parent_response_id == row.previous_response_id
            and (row.previous_response_id is not None
                 or row.response_id == row.partition_key or no_conversation))


def _check_head(request: PromotionRequest, view: PromotionView) -> None:
    """The head a Conversation turn is decided on (its ordering) and built on (its item
    seqs, its lineage digest) must be the head turn's own: cells that their row does
    not back, or a head lost while turns stand, are damage (``CorruptPartition``: a
    ``CORRUPT`` rejection), never a new Conversation or a numbering from bad cells."""
    where = f"partition {request.partition_key} of tenant {request.tenant_id}"
    if view.head is None:
        if view.conversation_begun:
            raise HeadDamaged(f"{where}: the Conversation has promoted turns but no head")
        return
    if not backs(view.head, view.head_backing):
        raise HeadDamaged(f"{where}: the head {view.head} is not backed by its checkpoint")


def _plan_conversation(request: PromotionRequest, head: Head | None) -> PromotionOutcome | Plan:
    current = 0 if head is None else head.seq
    expected = request.expected_head_seq
    assert expected is not None  # validate_request guarantees it
    if expected < current:
        return Conflict(current)
    if expected > current:
        return AheadOfHead(current)
    first = 1 if head is None else head.item_count + 1
    seq = current + 1
    digest = _chained(None if head is None else head.lineage_digest, head is None, request)
    return Plan(
        seq=seq,
        parent_response_id=None if head is None else head.response_id,
        first_item_seq=first,
        expected_head=head,
        new_head=Head(seq, request.response_id, first - 1 + len(request.items), digest),
        lineage_digest=digest,
    )


def _chained(parent_digest: str | None, root: bool, request: PromotionRequest) -> str | None:
    """The new turn's lineage digest: from the root, or from a parent that has one."""
    if not root and parent_digest is None:
        return None
    return lineage_digest(parent_digest, request.turn_items_digest)


def _plan_chain(
    request: PromotionRequest, parent: CheckpointRecord | None
) -> PromotionOutcome | Plan:
    if request.previous_response_id is None:
        return Plan(
            seq=1,
            parent_response_id=None,
            first_item_seq=1,
            lineage_digest=_chained(None, True, request),
        )
    if parent is None or parent.mode is not PromotionMode.CHAIN:
        return ParentMissing(request.previous_response_id)
    return Plan(
        seq=parent.seq + 1,
        parent_response_id=parent.response_id,
        first_item_seq=parent.last_item_seq + 1,
        parent=parent,
        lineage_digest=_chained(parent.lineage_digest, False, request),
    )


def plan_from_hints(
    request: PromotionRequest, head_hint: Head | None, parent_hint: CheckpointRecord | None
) -> Plan | None:
    """The plan a fresh view would give IF the hints are true; None if they cannot tell.

    Only plans come out of here, never outcomes: an outcome (``Conflict``,
    ``Duplicate`` ...) is only ever decided on a linearizable view. The plan's write
    carries every fact it rests on as a condition, so a wrong hint costs a refused
    write and a view read, never a wrong promotion.
    """
    if request.mode is PromotionMode.CONVERSATION:
        expected = request.expected_head_seq
        if expected == 0 and head_hint is None:
            return _as_plan(_plan_conversation(request, None))
        if head_hint is None or head_hint.seq != expected:
            return None  # no hint, or one that predicts an outcome: read and decide
        return _as_plan(_plan_conversation(request, head_hint))
    if request.previous_response_id is None:
        return _as_plan(_plan_chain(request, None))
    if (
        parent_hint is None
        or parent_hint.response_id != request.previous_response_id
        or (parent_hint.tenant_id, parent_hint.partition_key)
        != (request.tenant_id, request.partition_key)
        or not _may_be_a_chain_row(parent_hint, head_hint)
    ):
        return None  # (a parent that is no chain row: the view decides, and refuses it)
    return _as_plan(_plan_chain(request, parent_hint))


def _as_plan(decision: PromotionOutcome | Plan) -> Plan | None:
    return decision if isinstance(decision, Plan) else None


def _artifact_as_stored(artifact: StoredTokenArtifact | None) -> StoredTokenArtifact | None:
    """The artifact as every backend keeps it: its expiry to the millisecond, in UTC
    (the Cassandra row's JSON, ``StoredTokenArtifact.to_json``). The processor's are
    already (Avro millis); a caller's with microseconds was kept whole by the memory
    store only, so the backends answered a read in the last millisecond differently
    (found by tests/contract/test_backends_agree.py, session 42)."""
    if artifact is None or artifact.expires_at is None:
        return artifact
    expires = utc_ms(artifact.expires_at)
    if expires == artifact.expires_at and expires.tzinfo is artifact.expires_at.tzinfo:
        return artifact
    return replace(artifact, expires_at=expires)


def build_checkpoint(
    request: PromotionRequest, plan: Plan, promoted_at: datetime, logical_retention_s: int
) -> CheckpointRecord:
    """The checkpoint record a plan persists (same on every backend).

    Logical expiry: the gateway's ``expires_at`` capped by the server's retention
    (``logical_retention_s`` after promotion; 0 = no retention), whichever is earlier."""
    promoted_at = utc_ms(promoted_at)
    limits = [utc_ms(request.expires_at)] if request.expires_at is not None else []
    if logical_retention_s > 0:
        limits.append(promoted_at + timedelta(seconds=logical_retention_s))
    expires = min(limits, default=None)
    return CheckpointRecord(
        tenant_id=request.tenant_id,
        partition_key=request.partition_key,
        response_id=request.response_id,
        seq=plan.seq,
        mode=request.mode,
        parent_response_id=plan.parent_response_id,
        previous_response_id=request.previous_response_id,
        idempotency_key=request.idempotency_key,
        request_digest=request.request_digest,
        certification=request.certification,
        fingerprint_hash=request.fingerprint_hash,
        token_artifact=_artifact_as_stored(request.token_artifact),
        router_receipt=request.router_receipt,
        boundary_proof=request.boundary_proof,
        first_item_seq=plan.first_item_seq,
        last_item_seq=plan.first_item_seq + len(request.items) - 1,
        items_digest=request.turn_items_digest,
        promoted_at=promoted_at,
        logical_expires_at=expires,
        lineage_digest=plan.lineage_digest,
        accepted_attempt=request.attempt,
        accepted_effect_ids=None if request.attempt is None else request.effect_ids,
    )
