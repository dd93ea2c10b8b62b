"""What a promotion passes the store about the lineage it was decided on
(``CheckpointStore.promote``'s hints and ``extends``), on the loop path and the thread
path alike (``loop_promotion.py``, ``turn_decider.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode
from ratchet.domain.promotion import Promote
from streams.lineage import Lineage


@dataclass(frozen=True)
class _Hints:
    """What a promotion passes the store about the lineage it was decided on."""

    head: Head | None
    parent: CheckpointRecord | None
    extends: str | None

    @classmethod
    def of(cls, decided: Promote, lineage: Lineage) -> _Hints:
        head = parent = None
        if lineage.cached and lineage.tail is not None:
            # The cached tail is the plan's premise; the batch checks it as a condition.
            if decided.request.mode is PromotionMode.CONVERSATION:
                head = Head.of(lineage.tail)
            else:
                parent = lineage.tail
        # A turn validated on no lineage (none read: a chain parent or a Conversation
        # not found) extends nothing: a parent or head the store finds after all (its
        # promotion in flight when the lineage was read, another worker's) is
        # ``LineageChanged``, and the lineage is read again, never written on unpaired
        # (until session 43 ``ANY_LINEAGE``: a child whose parent landed after the read
        # was promoted on it with its pairing checked against nothing).
        extends: str | None = None if lineage.tail is None else lineage.tail.response_id
        return cls(head, parent, extends)
