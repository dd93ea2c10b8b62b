"""The lineage a turn extends, as the processor's pairing check needs it.

Known from the turn alone when it starts a lineage (``starts_lineage``), from the tail
cache (``streams/tail_cache.py``) or from a verified history read; ``slim`` is what
the cache keeps of a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from ratchet.domain.history import CheckpointRecord, HistoryFailure, frozen_record
from ratchet.domain.validation import EMPTY_PAIRING, PairingState, Unpaired
from schemas.models import TurnCompleted


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
