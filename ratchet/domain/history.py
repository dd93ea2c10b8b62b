"""Checkpoint records and the verification of a stored history (pure, no I/O).

Every backend of the checkpoint store loads the rows of one partition into a
``PartitionSnapshot`` and calls ``verify_history``. The rules live here, once, so the
in-memory and the Cassandra backend cannot disagree about what a valid history is.

A history is the lineage of one response: the response, its parent, the parent's
parent ... down to the root (seq 1). In a Conversation the lineage is every turn up
to the response; in a ``previous_response_id`` chain, forks are legal and the lineage
is one path through the tree. Items are numbered contiguously along the lineage
(``item_seq`` 1..N), so a missing, duplicated or foreign item is always detectable.

Verification order (the first broken rule decides the reason):

1. the response exists for this tenant, else ``NOT_FOUND`` (never leak another
   tenant's ids);
2. its logical retention has not passed, else ``EXPIRED``;
3. the lineage links resolve, else ``MISSING_HISTORY``; seqs step by exactly one
   down to 1 and a Conversation has one checkpoint per seq, else ``CORRUPT_HISTORY``;
4. each turn has exactly its items: too few is ``MISSING_HISTORY``; extra, duplicated,
   renumbered or swapped items are ``CORRUPT_HISTORY``;
5. every item's ``sha256(content) == content_digest``, else ``CORRUPT_HISTORY``;
6. every format version is supported, else ``UNSUPPORTED_FORMAT``; every item type is
   in the catalogue (``catalogue.py``), else ``UNKNOWN_ITEM_TYPE``; every item's
   ``type``, ``role`` and ``call_id`` columns say what its content's top-level
   ``type``, ``role`` and ``call_id`` say (the rule validation promoted it by,
   ``catalogue.shape_problem``: absent or null in the content = None in the column),
   else ``CORRUPT_HISTORY``: those columns are bound by no digest (``items_digest``
   covers ids and content digests), and the processor pairs calls by them. The rest of
   each item's shape was checked when it was promoted, and the digest binds the stored
   bytes to what was checked, so a read checks no more of it;
7. every lineage digest (``lineage_digest``) that can be checked matches its parent's
   and its turn's items digest, else ``CORRUPT_HISTORY``. A history whose every turn
   carries a checked digest is ``linked``: only such a history may later be extended
   by new rows without reading it again (``verify_extension``). Rows promoted before
   lineage digests existed have none: their histories verify as before, unlinked, and
   are always read in full (a missing digest is never taken as a link).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from ratchet.domain.catalogue import KNOWN_ITEM_TYPES, json_object
from ratchet.speedups import SPEEDUPS
from schemas.canonical import canonical_json_text, parse_json
from schemas.models import SUPPORTED_FORMAT_VERSIONS, Certification, Item, sha256_hex

T = TypeVar("T")


class PromotionMode(StrEnum):
    """How the lineage of a turn is decided.

    ``conversation``: the parent is the current head; the head moves by compare-and-swap.
    ``chain``: the parent is ``previous_response_id``; forks are legal, no shared head.
    """

    CONVERSATION = "conversation"
    CHAIN = "chain"


class HistoryFailureReason(StrEnum):
    NOT_FOUND = "NOT_FOUND"
    EXPIRED = "EXPIRED"
    CORRUPT_HISTORY = "CORRUPT_HISTORY"
    MISSING_HISTORY = "MISSING_HISTORY"
    UNKNOWN_ITEM_TYPE = "UNKNOWN_ITEM_TYPE"
    UNSUPPORTED_FORMAT = "UNSUPPORTED_FORMAT"


# Epoch milliseconds of 0001-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z: the
# timestamps a datetime can hold, so the only ones a turn or a stored row may carry.
FIRST_MS, LAST_MS = -62_135_596_800_000, 253_402_300_799_999


# ``now`` of a read that ignores logical expiry: the processor's lineage reads (promotion
# ignores expiry, and a turn's pairing is checked against every stored turn). Not an
# instant: no expiry a row can hold is past as of it, not even one at epoch 0, before
# 1970 or at ``FIRST_MS`` (this very millisecond): ``logically_expired``.
IGNORING_EXPIRY = datetime.min.replace(tzinfo=UTC)


def logically_expired(expires_at: datetime | None, now: datetime) -> bool:
    """Whether a checkpoint whose logical expiry is ``expires_at`` is past it at ``now``:
    from that instant on (``expires_at <= now``, to the millisecond), never for None and
    never as of ``IGNORING_EXPIRY``. The one rule of every read: the full read, an
    extension, the API's cached hit."""
    return expires_at is not None and now != IGNORING_EXPIRY and utc_ms(now) >= expires_at


def utc_ms(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime truncated to milliseconds.

    Cassandra ``timestamp`` cells keep milliseconds and come back naive; every backend
    normalises through here so records compare equal whatever stored them.
    """
    if moment.tzinfo is UTC and moment.microsecond % 1000 == 0:
        return moment  # normalised already (what every promotion passes, 3 times a turn)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)


def items_digest(items: Iterable[Item]) -> str:
    """Digest of a turn's ordered item list (ids and content digests).

    Stored in the checkpoint so that items swapped between turns, reordered, or
    replaced by other valid items are caught even when each item is self-consistent.
    """
    items = tuple(items)
    return ids_digest([i.item_id for i in items], [i.content_digest for i in items])


def ids_digest(item_ids: Sequence[str], content_digests: Sequence[str]) -> str:
    """``items_digest`` from the two columns it covers: sha256 hex of the UTF-8 bytes of
    ``item_id + "\\x00" + content_digest + "\\n"`` for each item, in order. In C when
    ``ratchet._speedups`` is built (ratchet/speedups.py), else ``ids_digest_py``."""
    if SPEEDUPS is None:
        return ids_digest_py(item_ids, content_digests)
    return SPEEDUPS.ids_digest(item_ids, content_digests)


def ids_digest_py(item_ids: Iterable[str], content_digests: Iterable[str]) -> str:
    """``ids_digest`` in Python: the reference the C twin is tested against."""
    text = "".join(map("{}\x00{}\n".format, item_ids, content_digests))
    return hashlib.sha256(text.encode()).hexdigest()


def lineage_digest(parent_lineage_digest: str | None, turn_items_digest: str) -> str:
    """The lineage digest of a turn: sha256 hex of the UTF-8 bytes of
    ``parent + "\\n" + items_digest``, where ``parent`` is the parent's lineage digest
    (lowercase hex) or the empty string for a lineage root (seq 1).

    It binds a turn to its whole lineage, so new rows read after a verified prefix are
    proven attached to it without reading the prefix again (docs/store.md). In C when
    ``ratchet._speedups`` is built (ratchet/speedups.py), else ``lineage_digest_py``."""
    if SPEEDUPS is None:
        return lineage_digest_py(parent_lineage_digest, turn_items_digest)
    return SPEEDUPS.lineage_digest(parent_lineage_digest or None, turn_items_digest)


def lineage_digest_py(parent_lineage_digest: str | None, turn_items_digest: str) -> str:
    """``lineage_digest`` in Python: the reference the C twin is tested against."""
    parent = parent_lineage_digest or ""
    return hashlib.sha256(f"{parent}\n{turn_items_digest}".encode()).hexdigest()


@dataclass(frozen=True)
class StoredTokenArtifact:
    """The token-level identity of a certified turn (contract section 1.3), as its
    checkpoint keeps it: an aware ``datetime`` expiry (the Avro ``TokenArtifact`` has
    epoch millis) and the JSON form the store writes (``to_json`` / ``from_json``)."""

    artifact_id: str
    token_hash: str
    token_count: int
    safe_append_boundary: int
    fingerprint_hash: str
    expires_at: datetime | None = None

    def to_json(self) -> str:
        """Its canonical JSON (remembered for the last few artifacts: a promotion's
        size check and its batch both write it)."""
        return _artifact_json(self)

    def _json(self) -> str:
        data = {
            "artifact_id": self.artifact_id,
            "token_hash": self.token_hash,
            "token_count": self.token_count,
            "safe_append_boundary": self.safe_append_boundary,
            "fingerprint_hash": self.fingerprint_hash,
            "expires_at": None if self.expires_at is None else utc_ms(self.expires_at).isoformat(),
        }
        return canonical_json_text(data)

    @classmethod
    def from_json(cls, text: str) -> StoredTokenArtifact:
        """Raises ``ValueError`` / ``TypeError`` / ``KeyError`` for a cell that is not
        the object ``to_json`` writes (the row reads as damaged)."""
        data = parse_json(text)  # pydantic's parser: ~3x ``json.loads`` (one per turn read)
        if not isinstance(data, dict):
            raise ValueError(f"token artifact is a JSON {type(data).__name__}, not an object")
        expires = data.get("expires_at")
        artifact = frozen_record(
            cls,
            {
                "artifact_id": _text(data["artifact_id"]),
                "token_hash": _text(data["token_hash"]),
                "token_count": _count(data["token_count"]),
                "safe_append_boundary": _count(data["safe_append_boundary"]),
                "fingerprint_hash": _text(data["fingerprint_hash"]),
                "expires_at": None if expires is None else utc_ms(datetime.fromisoformat(expires)),
            },
        )
        # A cell that parses to these fields but is not their canonical JSON (a key twice,
        # an extra key, another spelling) would be served altered: it is damage.
        if artifact.to_json() != text:
            raise ValueError("token artifact is not the canonical JSON of its fields")
        return artifact


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _count(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


@functools.lru_cache(maxsize=64)
def _artifact_json(artifact: StoredTokenArtifact) -> str:
    # Keyed by the artifact's fields (a frozen dataclass): equal artifacts, same JSON.
    return artifact._json()


@dataclass(frozen=True)
class CheckpointRecord:
    """One promoted response: where it sits in its lineage and what it certifies.

    ``parent_response_id`` is the lineage link the store decided (the previous head in
    a Conversation, ``previous_response_id`` in a chain); ``previous_response_id`` is
    what the gateway sent. ``router_receipt`` and ``boundary_proof`` are kept as the
    canonical JSON the processor validated, byte for byte.
    """

    tenant_id: str
    partition_key: str
    response_id: str
    seq: int
    mode: PromotionMode
    parent_response_id: str | None
    previous_response_id: str | None
    idempotency_key: str
    request_digest: str
    certification: Certification
    fingerprint_hash: str | None
    token_artifact: StoredTokenArtifact | None
    router_receipt: str | None
    boundary_proof: str | None
    first_item_seq: int
    last_item_seq: int
    items_digest: str
    promoted_at: datetime
    logical_expires_at: datetime | None = None
    # ``lineage_digest(parent's, items_digest)``; None for rows promoted before it
    # existed, and for their descendants (their parent has none to chain from).
    lineage_digest: str | None = None
    # The attempt whose turn was promoted and the tool effects it used: what a later
    # retry of the request (another attempt, answered with this promotion) is told and
    # orphans against. None for rows promoted before migration 012.
    accepted_attempt: int | None = None
    accepted_effect_ids: tuple[str, ...] | None = None

    @property
    def item_count(self) -> int:
        return self.last_item_seq - self.first_item_seq + 1

    @property
    def artifact_expires_at(self) -> datetime | None:
        return None if self.token_artifact is None else self.token_artifact.expires_at


@dataclass(frozen=True)
class Head:
    """The durable head of a Conversation: the last promoted turn."""

    seq: int
    response_id: str
    item_count: int
    lineage_digest: str | None = None  # the head turn's (None: promoted before it existed)

    @classmethod
    def of(cls, checkpoint: CheckpointRecord) -> Head:
        """The head a Conversation has when ``checkpoint`` is its last turn."""
        return cls(
            checkpoint.seq,
            checkpoint.response_id,
            checkpoint.last_item_seq,
            checkpoint.lineage_digest,
        )


def backs(head: Head, checkpoint: CheckpointRecord | None) -> bool:
    """Whether ``checkpoint`` is the Conversation turn ``head`` names, exactly: the head
    cells are a copy of the head turn's own (seq, response id, last item seq, lineage
    digest), written in the same batch, so any difference is damage. The planner numbers
    the next turn's items and chains its lineage digest from the head cells, so a
    promotion must never build on cells its row does not back (``plan_promotion``), and
    a read answers them ``CORRUPT_HISTORY``."""
    return (
        checkpoint is not None
        and checkpoint.mode is PromotionMode.CONVERSATION
        and head == Head.of(checkpoint)
    )


@dataclass(frozen=True)
class TurnItems:
    """A turn's items as loaded from storage, column by column, in turn order.

    Why columns and not one object per item: a 50-turn read loads 100 items, and
    verification (digests, formats, types) and rendering each walk one or two columns
    in C (``map``, ``zip``, list comparison); a Python object per item cost more than
    the read itself. Every column has one entry per item (the store's decoder and
    ``of_entries`` build them so). ``seqs`` are the items' seqs in the lineage as
    stored (checked against the checkpoint's range); ``items()`` builds ``Item`` models
    for callers that want them (the processor's pairing state, tests).
    """

    seqs: tuple[int, ...]
    ids: tuple[str, ...]
    types: tuple[str, ...]
    roles: tuple[str | None, ...]
    call_ids: tuple[str | None, ...]
    contents: tuple[bytes, ...]
    digests: tuple[str, ...]
    formats: tuple[int, ...]

    @classmethod
    def of(cls, items: Iterable[Item], first_item_seq: int = 1) -> TurnItems:
        """The columns of ``items``, numbered from ``first_item_seq``."""
        return cls.of_entries(enumerate(items, first_item_seq))

    @classmethod
    def of_entries(cls, entries: Iterable[tuple[int, Item]]) -> TurnItems:
        """The columns of (item_seq, item) pairs, in that order."""
        entries = tuple(entries)
        return cls(
            tuple(seq for seq, _ in entries),
            tuple(i.item_id for _, i in entries),
            tuple(i.type for _, i in entries),
            tuple(i.role for _, i in entries),
            tuple(i.call_id for _, i in entries),
            tuple(i.content for _, i in entries),
            tuple(i.content_digest for _, i in entries),
            tuple(i.format_version for _, i in entries),
        )

    def __len__(self) -> int:
        return len(self.ids)

    def entries(self) -> list[tuple[int, Item]]:
        """(item_seq, item) pairs, in order (``of_entries`` builds them back)."""
        return list(zip(self.seqs, self.items(), strict=True))

    def items(self) -> tuple[Item, ...]:
        """The items as models (pydantic's ``model_construct``: stored values, which
        verification checks, are not validated again)."""
        construct = Item.model_construct
        return tuple(
            construct(
                item_id=item_id,
                type=item_type,
                role=role,
                call_id=call_id,
                content=content,
                content_digest=digest,
                format_version=version,
            )
            for item_id, item_type, role, call_id, content, digest, version in self.rows()
        )

    def rows(self) -> Iterator[tuple[str, str, str | None, str | None, bytes, str, int]]:
        """Per item: (item_id, type, role, call_id, content, content_digest,
        format_version), in order."""
        return zip(
            self.ids,
            self.types,
            self.roles,
            self.call_ids,
            self.contents,
            self.digests,
            self.formats,
            strict=True,
        )


NO_ITEMS = TurnItems((), (), (), (), (), (), (), ())


@dataclass(frozen=True)
class PartitionSnapshot:
    """Everything stored under one (tenant, partition key): what verification reads."""

    tenant_id: str
    partition_key: str
    head: Head | None
    checkpoints: Mapping[str, CheckpointRecord]
    items: Mapping[str, TurnItems]
    # Response ids whose stored rows could not even be decoded (a null where a value
    # must be, an unknown enum): any lineage touching them is CORRUPT_HISTORY.
    damaged: frozenset[str] = frozenset()
    # A Conversation's first turn was promoted here (the marker row its first batch
    # writes): with no head, the head is lost, not yet to come.
    conversation_begun: bool = False


def beyond_head(snapshot: PartitionSnapshot) -> int | None:
    """The highest seq of a Conversation checkpoint beyond the snapshot's head, or None.

    In one consistent read there is none (a turn's row and the head move in one batch):
    one means damage, or a read made of several requests that a promotion fell between
    (``as_of_head``)."""
    head = snapshot.head
    if head is None:
        return None
    ahead = [c.seq for c in snapshot.checkpoints.values()
             if c.mode is PromotionMode.CONVERSATION and c.seq > head.seq]
    return max(ahead) if ahead else None


def as_of_head(snapshot: PartitionSnapshot) -> PartitionSnapshot:
    """The snapshot without its Conversation checkpoints beyond its head (and their items):
    the partition as it stood when its head was read. Only for rows that a head read
    after them covers (the caller checks): they were promoted during the read, and
    every turn up to the head was stored before it (rows are never rewritten)."""
    head = snapshot.head
    assert head is not None
    dropped = {ref for ref, c in snapshot.checkpoints.items()
               if c.mode is PromotionMode.CONVERSATION and c.seq > head.seq}
    return dataclasses.replace(
        snapshot,
        checkpoints={ref: c for ref, c in snapshot.checkpoints.items() if ref not in dropped},
        items={ref: i for ref, i in snapshot.items.items() if ref not in dropped},
    )


@dataclass(frozen=True)
class VerifiedHistory:
    """A complete, ordered, verified history ending with ``checkpoint``."""

    checkpoint: CheckpointRecord
    lineage: tuple[CheckpointRecord, ...]  # root first, ``checkpoint`` last
    turns: tuple[TurnItems, ...]  # each turn's items, in ``lineage`` order
    # The Conversation's current head seq (chain mode: the response's own seq). The API
    # answers the response's own seq as ``head_seq`` and this beside it.
    head_seq: int
    # Every turn's lineage digest was checked from the root: the history may be
    # extended by later rows alone (``verify_extension``).
    linked: bool = False
    # A Conversation's head as this verification found it backed by its own checkpoint
    # (chain mode: None). Its row is immutable: the same head cells stay backed.
    head: Head | None = None

    @property
    def response_id(self) -> str:
        return self.checkpoint.response_id

    @property
    def items(self) -> tuple[Item, ...]:
        """The whole history's items as models, in order (built on each call: the API
        renders from ``turns`` and never needs them)."""
        return tuple(item for turn in self.turns for item in turn.items())


@dataclass(frozen=True)
class HistoryFailure:
    """Why no history can be returned; ``detail`` is for logs, never for clients."""

    reason: HistoryFailureReason
    detail: str = ""
    # ``EXPIRED``: the checkpoint found past its expiry (its row verified as far as the
    # rules before expiry go: decodable, this tenant's). Not part of the answer.
    expired: CheckpointRecord | None = dataclasses.field(default=None, compare=False,
                                                          repr=False)


def verify_history(
    snapshot: PartitionSnapshot, response_id: str, now: datetime
) -> VerifiedHistory | HistoryFailure:
    """Verify the lineage ending at ``response_id`` and return it, or why not."""
    if response_id in snapshot.damaged:
        return _corrupt(f"rows of {response_id} cannot be decoded")
    checkpoint = snapshot.checkpoints.get(response_id)
    if checkpoint is None or checkpoint.tenant_id != snapshot.tenant_id:
        return HistoryFailure(HistoryFailureReason.NOT_FOUND, f"no checkpoint {response_id}")
    expires = checkpoint.logical_expires_at
    if expires is not None and logically_expired(expires, now):
        return HistoryFailure(HistoryFailureReason.EXPIRED, f"expired at {expires.isoformat()}",
                              checkpoint)
    lineage = _lineage(snapshot, checkpoint)
    if isinstance(lineage, HistoryFailure):
        return lineage
    failure = _check_conversation(snapshot, checkpoint)
    if failure is not None:
        return failure
    turns = _lineage_items(snapshot, lineage)
    if isinstance(turns, HistoryFailure):
        return turns
    failure = _check_items(turns)
    if failure is not None:
        return failure
    linked = _check_links(lineage)
    if isinstance(linked, HistoryFailure):
        return linked
    head = snapshot.head if _is_conversation(checkpoint, snapshot) else None
    return VerifiedHistory(
        checkpoint=checkpoint, lineage=lineage, turns=turns,
        head_seq=checkpoint.seq if head is None else head.seq, linked=linked, head=head,
    )


def lineage_refs(snapshot: PartitionSnapshot, response_id: str) -> list[str]:
    """The response ids of the lineage ending at ``response_id`` in ``snapshot``'s
    checkpoints, newest first, as far as parent links lead (a missing or damaged
    parent, or a seq that does not step down by one, ends it: ``verify_history`` says
    why). What a response's read must load the items of."""
    refs: list[str] = []
    current = snapshot.checkpoints.get(response_id)
    while current is not None and len(refs) <= len(snapshot.checkpoints):
        refs.append(current.response_id)
        parent = snapshot.checkpoints.get(current.parent_response_id or "")
        if parent is None or parent.seq != current.seq - 1:
            break
        current = parent
    return refs


def verify_extension(
    tip: CheckpointRecord,
    turns: Sequence[CheckpointRecord],
    snapshot: PartitionSnapshot,
    now: datetime,
) -> tuple[TurnItems, ...] | HistoryFailure | None:
    """Verify ``turns`` (oldest first, read from ``snapshot``) as the continuation of a
    LINKED verified history ending at ``tip``; return their items, or why not.

    Each turn must sit in the tip's partition and mode, follow its predecessor (parent
    link, seq + 1, contiguous item seqs), hold exactly its items (count, order, items
    digest, every content digest, formats, types, each item's type, role and call_id
    columns against its content) and carry the lineage digest of its predecessor's and
    its own items digest: a wrong one is ``CORRUPT_HISTORY``. A turn
    without a digest cannot be linked: None, and the caller reads the history in full
    (which accepts such a turn as unlinked, exactly as for any other reader). The rules
    are checked in the full read's order (``verify_history``: the last turn's logical
    expiry first, the lineage digests last), so both answer the same damage alike."""
    if tip.lineage_digest is None or not turns:
        return None
    if any(turn.lineage_digest is None for turn in turns):
        return None
    # The full read's order (module docstring), so every load of the same rows gives the
    # same reason: the response itself, its expiry, the links, the items, the digests.
    last = turns[-1]
    if last.response_id in snapshot.damaged:
        return _corrupt(f"rows of {last.response_id} cannot be decoded")
    expires = last.logical_expires_at
    if expires is not None and logically_expired(expires, now):
        return HistoryFailure(HistoryFailureReason.EXPIRED, f"expired at {expires.isoformat()}",
                              last)
    # The lineage's structure, newest turn first, as the full read walks the parent
    # links (``_lineage``): partition and mode (the mode of the turn read, the newest),
    # the parent link, the seq step; then the tip, the first row of the verified prefix.
    chain = (tip, *turns)
    belongs = (tip.tenant_id, tip.partition_key, last.mode)
    for index in range(len(turns), 0, -1):
        turn, previous = chain[index], chain[index - 1]
        rid = turn.response_id
        if (turn.tenant_id, turn.partition_key, turn.mode) != belongs:
            return _corrupt(f"{rid} does not belong to this partition")
        if turn.parent_response_id in snapshot.damaged:
            return _corrupt(f"rows of {turn.parent_response_id} cannot be decoded")
        if turn.parent_response_id != previous.response_id:
            return _missing(f"parent {turn.parent_response_id} of {rid}")
        if turn.seq != previous.seq + 1:
            return _corrupt(f"{rid} seq {turn.seq} after {previous.seq}")
    if tip.mode is not last.mode:
        return _corrupt(f"{tip.response_id} does not belong to this partition")
    # Then each turn's items, oldest first (``_lineage_items``), all of them together
    # (``_check_items``), and the lineage digests last (``_check_links``).
    previous = tip
    loaded: list[TurnItems] = []
    for turn in turns:
        rid = turn.response_id
        if turn.first_item_seq != previous.last_item_seq + 1 or turn.item_count < 0:
            return _corrupt(
                f"{rid} items {turn.first_item_seq}..{turn.last_item_seq}, expected to "
                f"start at {previous.last_item_seq + 1}"
            )
        items = snapshot.items.get(rid, NO_ITEMS)
        failure = _check_turn_items(turn, items)
        if failure is not None:
            return failure
        loaded.append(items)
        previous = turn
    failure = _check_items(loaded)
    if failure is not None:
        return failure
    previous = tip
    for turn in turns:
        if turn.lineage_digest != lineage_digest(previous.lineage_digest, turn.items_digest):
            return _corrupt(f"{turn.response_id} lineage digest does not match its parent's")
        previous = turn
    return tuple(loaded)


def verify_conversation_history(
    snapshot: PartitionSnapshot, now: datetime
) -> VerifiedHistory | HistoryFailure:
    """Verify the whole Conversation up to its head."""
    head = snapshot.head
    if head is None:
        if snapshot.conversation_begun or any(
            c.mode is PromotionMode.CONVERSATION for c in snapshot.checkpoints.values()
        ):
            return _corrupt("the Conversation has promoted turns but no head")
        return HistoryFailure(HistoryFailureReason.NOT_FOUND, "no head")
    named = snapshot.checkpoints.get(head.response_id)
    if named is not None and named.mode is not PromotionMode.CONVERSATION:
        # A chain turn of the same partition (a chain whose first response id is the
        # Conversation's id), whatever its own history says (expired, broken): no
        # Conversation checkpoint backs the head.
        return _corrupt(f"head seq {head.seq} ({head.response_id}) is backed by no checkpoint")
    result = verify_history(snapshot, head.response_id, now)
    if isinstance(result, HistoryFailure) and result.reason is HistoryFailureReason.NOT_FOUND:
        return _corrupt(f"head names {head.response_id} which has no checkpoint")
    # Verified or not, the head was checked there: ``_check_conversation`` requires
    # the head to be backed by that very checkpoint.
    return result


def _corrupt(detail: str) -> HistoryFailure:
    return HistoryFailure(HistoryFailureReason.CORRUPT_HISTORY, detail)


def _missing(detail: str) -> HistoryFailure:
    return HistoryFailure(HistoryFailureReason.MISSING_HISTORY, detail)


def _is_conversation(checkpoint: CheckpointRecord, snapshot: PartitionSnapshot) -> bool:
    return checkpoint.mode is PromotionMode.CONVERSATION and snapshot.head is not None


def _lineage(
    snapshot: PartitionSnapshot, checkpoint: CheckpointRecord
) -> tuple[CheckpointRecord, ...] | HistoryFailure:
    """Follow parent links to the root; seqs must step down by one to 1."""
    path = [checkpoint]
    current = checkpoint
    while True:
        if (current.tenant_id, current.partition_key) != (
            snapshot.tenant_id,
            snapshot.partition_key,
        ) or current.mode is not checkpoint.mode:
            return _corrupt(f"{current.response_id} does not belong to this partition")
        if current.parent_response_id is None:
            break
        if current.parent_response_id in snapshot.damaged:
            return _corrupt(f"rows of {current.parent_response_id} cannot be decoded")
        parent = snapshot.checkpoints.get(current.parent_response_id)
        if parent is None:
            return _missing(f"parent {current.parent_response_id} of {current.response_id}")
        if parent.seq != current.seq - 1:
            return _corrupt(f"{current.response_id} seq {current.seq} after {parent.seq}")
        path.append(parent)
        current = parent
    if current.seq != 1:
        return _corrupt(f"lineage root {current.response_id} has seq {current.seq}")
    return tuple(reversed(path))


def _check_conversation(
    snapshot: PartitionSnapshot, checkpoint: CheckpointRecord
) -> HistoryFailure | None:
    """A Conversation is a line: one checkpoint per seq, none beyond the head, and a
    head that a checkpoint backs (the one it names, at its seq), whichever turn is read."""
    if checkpoint.mode is not PromotionMode.CONVERSATION:
        return None
    head = snapshot.head
    if head is None or head.seq < checkpoint.seq:
        return _corrupt(f"{checkpoint.response_id} seq {checkpoint.seq} is beyond the head")
    if not backs(head, snapshot.checkpoints.get(head.response_id)):
        return _corrupt(f"head seq {head.seq} ({head.response_id}) is not backed by its checkpoint")
    seqs = [c.seq for c in snapshot.checkpoints.values() if c.mode is PromotionMode.CONVERSATION]
    if max(seqs) > head.seq:  # a turn's row and the head are written in one batch
        return _corrupt(f"a checkpoint at seq {max(seqs)} is beyond the head seq {head.seq}")
    if len(set(seqs)) != len(seqs):  # a set first: counting costs more, and is rare
        doubled = sorted(seq for seq, n in Counter(seqs).items() if n > 1)
        return _corrupt(f"several checkpoints at seq {doubled}")
    return None


def _lineage_items(
    snapshot: PartitionSnapshot, lineage: tuple[CheckpointRecord, ...]
) -> tuple[TurnItems, ...] | HistoryFailure:
    """Each turn's items, in order, numbered contiguously along the lineage."""
    out: list[TurnItems] = []
    next_seq = 1
    for checkpoint in lineage:
        if checkpoint.first_item_seq != next_seq or checkpoint.item_count < 0:
            return _corrupt(
                f"{checkpoint.response_id} items {checkpoint.first_item_seq}.."
                f"{checkpoint.last_item_seq}, expected to start at {next_seq}"
            )
        items = snapshot.items.get(checkpoint.response_id, NO_ITEMS)
        failure = _check_turn_items(checkpoint, items)
        if failure is not None:
            return failure
        out.append(items)
        next_seq = checkpoint.last_item_seq + 1
    return tuple(out)


def verify_turn_items(checkpoint: CheckpointRecord, items: TurnItems) -> HistoryFailure | None:
    """One stored turn's items against its own checkpoint (count, seqs, items digest,
    then every content digest, format, type and column), without its lineage: what a
    reader of one promoted turn's items checks (the processor, asking whether that turn
    carries a tool effect's output). None if they hold."""
    return _check_turn_items(checkpoint, items) or _check_items([items])


def _check_turn_items(checkpoint: CheckpointRecord, items: TurnItems) -> HistoryFailure | None:
    rid = checkpoint.response_id
    count, expected = len(items.ids), checkpoint.item_count
    if count < expected:
        return _missing(f"{rid} has {count} of {expected} items")
    if count > expected:
        return _corrupt(f"{rid} has {count} items, checkpoint says {expected}")
    first = checkpoint.first_item_seq
    if items.seqs != tuple(range(first, first + count)):
        return _corrupt(f"{rid} item seqs {list(items.seqs)}, expected from {first}")
    if ids_digest(items.ids, items.digests) != checkpoint.items_digest:
        return _corrupt(f"{rid} items do not match the checkpoint's items digest")
    return None


def _check_links(lineage: tuple[CheckpointRecord, ...]) -> bool | HistoryFailure:
    """Check every lineage digest whose parent digest is known; True if all are.

    A turn without a digest, or over a parent without one, is unlinked (promoted
    before lineage digests, or by an older worker): nothing to check, but the history
    is not ``linked``. A digest that can be checked and differs is CORRUPT_HISTORY."""
    linked = True
    parent: str | None = ""  # a root's parent digest is the empty string
    for turn in lineage:
        if turn.lineage_digest is None or parent is None:
            linked = False
        elif turn.lineage_digest != lineage_digest(parent, turn.items_digest):
            return _corrupt(f"{turn.response_id} lineage digest does not match its parent's")
        parent = turn.lineage_digest
    return linked


def _check_items(turns: Sequence[TurnItems]) -> HistoryFailure | None:
    """Every item's content digest, format, type, and its type, role and call_id columns
    against its content, column by column over the whole history. The reason is that of
    the first broken rule in this order, whichever item breaks it: a digest mismatch
    (CORRUPT_HISTORY), then an unsupported format, then an unknown type, then columns
    that differ from the content (CORRUPT_HISTORY). Digests and columns are checked in
    one pass over the items (``item_mismatches``)."""
    digest_bad, column_bad = item_mismatches(turns)
    if digest_bad >= 0:
        ids = [i for turn in turns for i in turn.ids]
        return _corrupt(f"item {ids[digest_bad]} content does not match its digest")
    formats = {v for turn in turns for v in turn.formats}
    if not SUPPORTED_FORMAT_VERSIONS.issuperset(formats):
        bad_id, bad_version = _first_outside(turns, lambda t: t.formats, SUPPORTED_FORMAT_VERSIONS)
        return HistoryFailure(
            HistoryFailureReason.UNSUPPORTED_FORMAT, f"item {bad_id} format {bad_version}"
        )
    types = {t for turn in turns for t in turn.types}
    if not KNOWN_ITEM_TYPES.issuperset(types):
        bad_id, bad_type = _first_outside(turns, lambda t: t.types, KNOWN_ITEM_TYPES)
        return HistoryFailure(
            HistoryFailureReason.UNKNOWN_ITEM_TYPE, f"item {bad_id} type {bad_type!r}"
        )
    if column_bad >= 0:
        row = [r for turn in turns for r in turn.rows()][column_bad]
        return _corrupt(_column_mismatch(*row[:5]))
    return None


def item_mismatches(turns: Sequence[TurnItems]) -> tuple[int, int]:
    """(the index of the first item whose content's sha256 hex is not its digest, -1),
    else (-1, the index of the first item whose ``type``, ``role`` and ``call_id``
    columns do not say what its content says (``columns_agree_py``), or -1): indices
    over all items of ``turns`` in order. ValueError if a turn's columns differ in
    length. In C when ``ratchet._speedups`` is built (ratchet/speedups.py: the C
    checker reads the content's top-level fields as it checks the JSON, and hands every
    content it is not sure of to ``columns_agree_py``), else ``item_mismatches_py``."""
    if SPEEDUPS is None:
        return item_mismatches_py(turns)
    return SPEEDUPS.item_mismatches(turns, columns_agree_py)


def item_mismatches_py(turns: Sequence[TurnItems]) -> tuple[int, int]:
    """``item_mismatches`` in Python: the reference the C twin is tested against. Each
    item in order: its digest (a mismatch ends the pass), then, until one disagrees, its
    columns against its content."""
    columns = [(t.contents, t.digests, t.types, t.roles, t.call_ids) for t in turns]
    if any(len(set(map(len, turn))) > 1 for turn in columns):
        raise ValueError("the columns of a turn differ in length")
    column_bad = -1
    rows = (row for turn in columns for row in zip(*turn, strict=True))
    for index, (content, digest, item_type, role, call_id) in enumerate(rows):
        if sha256_hex(content) != digest:
            return index, -1
        if column_bad < 0 and not columns_agree_py(content, item_type, role, call_id):
            column_bad = index
    return -1, column_bad


def columns_agree_py(
    content: bytes, item_type: object, role: object, call_id: object
) -> bool:
    """Do an item's ``type``, ``role`` and ``call_id`` columns say what its content says?
    Validation's rule (``catalogue.shape_problem``): the content is a JSON object whose
    ``type``, ``role`` and ``call_id`` (``dict.get``: absent = None) equal the columns."""
    value = json_object(content)
    return value is not None and (
        value.get("type"), value.get("role"), value.get("call_id")
    ) == (item_type, role, call_id)


def _column_mismatch(
    item_id: str, item_type: object, role: object, call_id: object, content: bytes
) -> str:
    """The detail of an item whose columns are not its content's (the failure path)."""
    value = json_object(content)
    if value is None:
        return f"item {item_id} content is not a JSON object"
    for name, column in (("type", item_type), ("role", role), ("call_id", call_id)):
        if value.get(name) != column:
            return f"item {item_id} {name} {column!r} != content {name} {value.get(name)!r}"
    return f"item {item_id} columns do not match its content"  # pragma: no cover


def first_digest_mismatch(contents: Sequence[bytes], digests: Sequence[str]) -> int:
    """The index of the first content whose sha256 hex is not its digest, or -1. In C
    when ``ratchet._speedups`` is built (ratchet/speedups.py), else
    ``first_digest_mismatch_py``."""
    if SPEEDUPS is None:
        return first_digest_mismatch_py(contents, digests)
    return SPEEDUPS.first_digest_mismatch(contents, digests)


def first_digest_mismatch_py(contents: Sequence[bytes], digests: Sequence[str]) -> int:
    """``first_digest_mismatch`` in Python: the reference the C twin is tested against."""
    if len(contents) != len(digests):
        raise ValueError("contents and digests differ in length")
    if list(map(sha256_hex, contents)) == list(digests):
        return -1
    return next(i for i, c in enumerate(contents) if sha256_hex(c) != digests[i])


def _first_outside(turns: Sequence[TurnItems], column: Callable[[TurnItems], tuple[Any, ...]],
                   allowed: AbstractSet[Any]) -> tuple[str, Any]:
    """(item_id, value) of the first item whose ``column`` value is not ``allowed``."""
    return next(
        (item_id, value)
        for turn in turns
        for item_id, value in zip(turn.ids, column(turn), strict=True)
        if value not in allowed
    )


_new, _set = object.__new__, object.__setattr__


def frozen_record(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass ``cls`` from ALL its fields (``fields``
    becomes its ``__dict__``), without the generated ``__init__``, which sets them one
    ``object.__setattr__`` at a time: 3-8x slower, and a 50-turn read builds 50
    checkpoints, 50 ``TurnItems`` and 50 artifacts. ``_frozen_records_ok`` checks at
    import that the result equals the ``__init__``-built one for the records built so;
    tests/unit/test_store_rows.py that decoded records have all their fields."""
    record = _new(cls)
    _set(record, "__dict__", fields)
    return record


def _frozen_records_ok() -> bool:
    for cls in (CheckpointRecord, TurnItems, StoredTokenArtifact):
        fields = {f.name: f"v{i}" for i, f in enumerate(dataclasses.fields(cls))}
        built = frozen_record(cls, dict(fields))
        if built != cls(**fields) or vars(built) != vars(cls(**fields)):
            return False
    return True


if not _frozen_records_ok():  # pragma: no cover - depends on how dataclasses builds instances

    def frozen_record(cls: type[T], fields: dict[str, Any]) -> T:  # type: ignore[no-redef]
        return cls(**fields)
