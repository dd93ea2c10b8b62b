"""The store's own checks around the pure plan (``ratchet.domain.plan``) in
``CheckpointStore.promote`` and ``judge``: what the view read may not contradict of what
the store and its caller knew (a head gone back, a chain parent changed) and whether a
plan extends the lineage the caller validated the turn against (``extends``)."""

from __future__ import annotations

from ratchet.domain.history import CheckpointRecord, Head, PromotionMode
from ratchet.domain.plan import HeadDamaged, Plan, PromotionRequest, PromotionView

# ``promote(extends=ANY_LINEAGE)``: the caller does not care which response the turn
# extends (the store's rules alone decide).
ANY_LINEAGE = object()


def _check_not_behind(request: PromotionRequest, known: Head | None, head: Head | None) -> None:
    """A Conversation head is never behind one this store promoted or verified: its own
    hints come from durable heads only (a caller's ``head_hint`` is a guess, not
    checked so), and a head only moves forward. One behind is a
    head rolled back onto an earlier turn (its cells that turn's own, so its row backs
    it), and a turn planned on it would stand beside the later turn at its seq (a
    review, session 31): ``CorruptPartition`` (a ``CORRUPT`` rejection). A store with
    no hint cannot tell; full reads see the rows beyond the head."""
    if (request.mode is PromotionMode.CONVERSATION and known is not None
            and (head is None or head.seq < known.seq)):
        raise HeadDamaged(
            f"partition {request.partition_key} of tenant {request.tenant_id}: the head went "
            f"back from seq {known.seq} to {None if head is None else head.seq}")


def _parent_changed(request: PromotionRequest, known: CheckpointRecord | None,
                    view: PromotionView) -> bool:
    """Whether the chain parent row read now differs from the caller's copy of it in
    anything the child is built from. A parent row never changes once written, so for a
    caller that validated the turn against that copy (``extends``) the difference is
    damage since, or a copy that was never right: either way the view must not number
    the child (an outside review: a parent whose seq was rewritten to 7 got a child at
    seq 8). ``LineageChanged`` sends the caller back to a verified read of the lineage,
    which reports the damage (``CORRUPT``). A caller that validated nothing keeps the
    rule "a wrong hint costs a refused write": the view decides."""
    found = view.parent
    if (known is None or found is None or request.previous_response_id is None
            or known.response_id != found.response_id
            or (known.tenant_id, known.partition_key)
            != (request.tenant_id, request.partition_key)):
        return False
    return _built_from(known) != _built_from(found)


def _built_from(parent: CheckpointRecord) -> tuple[object, ...]:
    return (parent.tenant_id, parent.partition_key, parent.mode, parent.seq,
            parent.first_item_seq, parent.last_item_seq, parent.items_digest,
            parent.lineage_digest)


def _extends(plan: Plan, extends: str | None | object) -> bool:
    return extends is ANY_LINEAGE or plan.parent_response_id == extends
