"""The lineage a turn extends, as the processor's pairing check needs it.

Known from the turn alone when it starts a lineage (``starts_lineage``), from the tail
cache (``streams/tail_cache.py``) or from a verified history read (``LineageReader``);
``slim`` is what the cache keeps of a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ratchet.domain.history import (
    IGNORING_EXPIRY,
    CheckpointRecord,
    Head,
    HistoryFailure,
    HistoryFailureReason,
    VerifiedHistory,
    frozen_record,
)
from ratchet.domain.validation import EMPTY_PAIRING, PairingState, Unpaired, pairing_state_of
from schemas.keys import partition_key
from schemas.models import TurnCompleted
from services.store.base import CheckpointStore, CorruptPartition
from streams.tail_cache import Tail, TailCache

# ``_head``: no head to tell (a chain turn, or head cells that cannot be decoded).
_UNTOLD = object()


@dataclass(frozen=True)
class Lineage:
    """What pairing needs about the lineage a turn extends.

    ``pairing``: its pairing state (``Unpaired`` if the stored lineage is itself
    broken); ``tail``: the checkpoint it ends at (None: the turn starts a lineage, or
    nothing readable was found); ``cached``: known from the tail cache, not read.
    """

    pairing: PairingState | Unpaired
    tail: CheckpointRecord | None
    cached: bool = False
    # No readable lineage (not found, or unreadable): pairing continues an empty state,
    # the store's rules decide where the turn goes (``unreadable``: it is rejected);
    # nothing learnt.
    unread: bool = False
    # Unread because nothing is stored there: no Conversation head, no chain parent.
    absent: bool = False
    # Unread although something is stored there, and not for expiry: why (corrupt or
    # missing rows, an item type or format this version cannot read). A turn is never
    # promoted on top of it (its pairing could not be checked).
    unreadable: HistoryFailure | None = None
    # A Conversation turn whose expected head is not the current head, this seq (0: no
    # turn yet): the turn continues no stored history, so nothing of it was read (a
    # full read of a long Conversation took seconds, for a rejection); it is judged by
    # every rule but pairing, then the store's answer, and never promoted from here.
    off_head: int | None = None
    # That head's response id (None: no turn yet), the store's guess for its view.
    off_head_response: str | None = None


def starts_lineage(turn: TurnCompleted) -> Lineage | None:
    """A turn that extends nothing: a Conversation's first turn, or a chain root.
    Known from the turn alone (the store's write checks the head is really absent)."""
    if turn.conversation_id is not None:
        return Lineage(EMPTY_PAIRING, None) if not turn.expected_head_seq else None
    return Lineage(EMPTY_PAIRING, None) if turn.previous_response_id is None else None


def utc(epoch_ms: int) -> datetime:
    """``epoch_ms`` as an aware UTC datetime, exactly (integer seconds and milliseconds:
    a float division loses the millisecond from ~1e13 ms on)."""
    seconds, millis = divmod(epoch_ms, 1000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=millis * 1000)


def slim(checkpoint: CheckpointRecord) -> CheckpointRecord:
    """The checkpoint without its bulky certification payloads: what the cache keeps
    (a hint's conditions use only ids, seqs, the item range and the mode)."""
    return frozen_record(CheckpointRecord, {**vars(checkpoint), "token_artifact": None,
                                            "router_receipt": None, "boundary_proof": None})


class LineageReader:
    """The lineage a turn extends: from the tail cache (a hit is safe to promote
    from, see ``streams/tail_cache.py``) or read from the store, and learnt into the
    cache once a promotion extended it. Thread-safe (the cache locks itself)."""

    def __init__(self, store: CheckpointStore, tails: TailCache,
                 clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.tails = tails
        self.clock_ms = clock_ms
        self.cache_hits = self.cache_misses = 0

    def cached(self, turn: TurnCompleted, key: str | None = None) -> Lineage | None:
        """The lineage from the tail cache, or from the turn alone when it starts one;
        None when a read is needed (see ``streams/tail_cache.py`` for why a hit is
        safe to promote from). ``key``: the turn's ``partition_key`` if the caller has it."""
        start = starts_lineage(turn)
        if start is not None:
            return start
        if key is None:
            key = partition_key(turn)
        if turn.conversation_id is not None:
            assert turn.expected_head_seq is not None
            tail = self.tails.head_at(turn.tenant_id, key, turn.expected_head_seq)
        else:
            assert turn.previous_response_id is not None
            tail = self.tails.tail(turn.tenant_id, key, turn.previous_response_id)
        if tail is None or tail.expired(utc(self.clock_ms())):
            self.cache_misses += 1
            return None
        self.cache_hits += 1
        return Lineage(tail.pairing, tail.checkpoint, cached=True)

    def read(self, turn: TurnCompleted, *, head_first: bool = True) -> Lineage:
        """The lineage the turn extends, read from the store (for pairing). A
        Conversation turn's head is looked up first (``head_first``): one that is not
        the expected one is ``off_head``, and nothing else is read."""
        start = starts_lineage(turn)
        if start is not None:
            return start
        off_head = self._off_head(turn) if head_first else None
        if off_head is not None:
            return off_head
        # Read ignoring expiry (``IGNORING_EXPIRY``: no stored expiry is past as of it):
        # an expired lineage may still be extended (its descendant renews it,
        # docs/decisions.md) and its items are still stored: the turn's pairing is checked
        # against all of them, or the new history could repeat a call id. (Until session
        # 42 it was read as of now, then again as of epoch 0 when that said EXPIRED, and a
        # turn continuing one whose ``expires_at`` was 0 or before 1970 was rejected
        # ``CORRUPT``, though promotion ignores expiry.)
        found = self._read_history(turn, now=IGNORING_EXPIRY)
        # No readable history. Nothing stored there: the store's ordering checks decide
        # (CONFLICT, OUT_OF_ORDER, PARENT_NOT_PROMOTED), pairing has nothing to continue.
        # Stored but unreadable: the turn is rejected (``StoreAnswers.on_unreadable_lineage``).
        if isinstance(found, HistoryFailure):
            absent = found.reason is HistoryFailureReason.NOT_FOUND
            return Lineage(EMPTY_PAIRING, None, unread=True, absent=absent,
                           unreadable=None if absent else found)
        pairing = pairing_state_of(found.items)
        if isinstance(pairing, PairingState):
            # What was read is a fact about that response's lineage, whoever promoted it.
            self.tails.learn(Tail(slim(found.checkpoint), pairing))
        return Lineage(pairing, found.checkpoint)

    def _off_head(self, turn: TurnCompleted) -> Lineage | None:
        """The ``off_head`` lineage of a Conversation turn whose current head is not the
        one it expects, else None (a chain turn too): one row, at read consistency. The
        processor confirms it at SERIAL before the turn is decided off its lineage
        (``TurnDecider._decide_off_head``): a promotion still in flight (another
        worker's, across a rebalance) may have made the expected head after all.
        Damaged head cells: None (the full read says what is wrong)."""
        head = self._head(turn, self.store.read_head)
        if head is _UNTOLD:
            return None
        assert head is None or isinstance(head, Head)
        seq = 0 if head is None else head.seq
        if seq == turn.expected_head_seq:
            return None
        return Lineage(EMPTY_PAIRING, None, unread=True, absent=head is None, off_head=seq,
                       off_head_response=None if head is None else head.response_id)

    def _head(self, turn: TurnCompleted,
              read: Callable[[str, str], Head | None]) -> Head | None | object:
        """``read`` of a Conversation turn's head (None: no turn yet); ``_UNTOLD`` for a
        chain turn or head cells that cannot be decoded."""
        if turn.conversation_id is None:
            return _UNTOLD
        try:
            return read(turn.tenant_id, turn.conversation_id)
        except CorruptPartition:
            return _UNTOLD

    def _read_history(self, turn: TurnCompleted,
                              now: datetime) -> VerifiedHistory | HistoryFailure:
        """The store's read. Damage is its typed failure, never a raise: a parent
        outside the turn's partition whose claim names no partition (where it lives
        cannot be told) is ``CORRUPT_HISTORY`` from the read itself since session 51
        (``HistoryReader``'s locate step), as any lineage that cannot be read."""
        if turn.conversation_id is not None:
            return self.store.read_history(
                turn.tenant_id, conversation_id=turn.conversation_id, now=now)
        # The partition the parent must be in (the store checks it there): also saves
        # the location lookup.
        return self.store.read_history(turn.tenant_id,
                                       response_id=turn.previous_response_id,
                                       partition_key=partition_key(turn), now=now)

    def learn(self, lineage: Lineage, pairing: PairingState | None,
                       promoted: CheckpointRecord) -> None:
        """The write extended exactly ``lineage.tail`` (``extends``): the pairing state
        after the turn is a fact about the new response's lineage."""
        if not lineage.unread and pairing is not None:
            self.tails.learn(Tail(slim(promoted), pairing))

    def readable_head_seq(self, turn: TurnCompleted) -> int | None:
        """A Conversation turn's current head seq (0: none), or None: a chain turn, or a
        head whose rows are damaged too (no ordering to check: CORRUPT decides)."""
        head = self._head(turn, self.store.head)
        if head is _UNTOLD:
            return None
        assert head is None or isinstance(head, Head)
        return 0 if head is None else head.seq
