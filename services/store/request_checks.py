"""What the store refuses before any I/O: a request that is a bug in its caller
(``validate_request``: ``InvalidPromotion``) and a turn above the size bound
(``turn_size`` against ``StoreOptions.max_turn_bytes``: the ``TooLarge`` outcome),
counted the way the bound is documented (docs/store.md)."""

from __future__ import annotations

from ratchet.domain.history import PromotionMode, first_digest_mismatch
from ratchet.domain.plan import PromotionRequest
from services.store.errors import InvalidPromotion

# The store's own guard, above the protocol's maximum event (schemas/limits.py) so that
# every turn an event within it carries is stored ("everything below it travels end to
# end", CONTRACT 4): ``turn_size`` counts ``ROW_OVERHEAD_BYTES`` per item where the
# event's Avro spends ~8 bytes of lengths, and an item takes >= ~125 bytes of Avro (its
# digest alone 65), so a turn counts at most ~1.45 x its event: <= 14.5 MiB for 10 MiB.
# What is written is smaller (the items cell spends 36 bytes per item): one Cassandra
# mutation under half of ``commitlog_segment_size`` (32 MiB -> 16 MiB), the hard cap of
# a single-partition batch, which an LWT writes in its Paxos proposal and on commit.
DEFAULT_MAX_TURN_BYTES = 15 * 1024 * 1024
# Bytes counted per stored row on top of its payload (keys, column names, timestamps).
ROW_OVERHEAD_BYTES = 64


def turn_size(request: PromotionRequest) -> int:
    """Bytes the turn adds to its partition, counted the way the limit is documented."""
    size = ROW_OVERHEAD_BYTES * 2 + len(request.response_id) + len(request.idempotency_key)
    size += len(request.request_digest) * 2 + len(request.fingerprint_hash or "")
    size += len(request.router_receipt or "") + len(request.boundary_proof or "")
    if request.token_artifact is not None:
        size += len(request.token_artifact.to_json())
    for item in request.items:
        size += ROW_OVERHEAD_BYTES + len(item.content) + len(item.content_digest)
        size += len(item.item_id) + len(item.type) + len(item.role or "")
        size += len(item.call_id or "")
    return size


def validate_request(request: PromotionRequest, *, written: bool = True) -> None:
    """Refuse requests that are bugs in the caller, or that could never be read back.
    ``written=False``: a request only looked up (``promoted_request``, ``promoted_key``),
    never written, so no chain root's partition is checked."""
    for name, value in (("tenant_id", request.tenant_id),
                        ("partition_key", request.partition_key),
                        ("response_id", request.response_id),
                        ("idempotency_key", request.idempotency_key)):
        if not value:
            raise InvalidPromotion(f"{name} is empty")
    if request.mode is PromotionMode.CONVERSATION:
        if request.expected_head_seq is None or request.expected_head_seq < 0:
            raise InvalidPromotion("Conversation mode needs expected_head_seq >= 0")
    elif request.previous_response_id == request.response_id:
        raise InvalidPromotion("a response cannot be its own parent")
    elif (written and request.previous_response_id is None
          and request.response_id != request.partition_key):
        # A chain's first response is its own partition key (CONTRACT section 2): its
        # children are keyed by it. The plan tells a damaged Conversation row from a
        # chain root by this (``_may_be_a_chain_row``), so no other root is written.
        raise InvalidPromotion("a chain's first response must be its own partition key")
    # Every item's digest, in one call (in C with ``ratchet._speedups``: one call
    # against three per item by ``Item.digest_ok``): the first that does not match.
    items = request.items
    bad = first_digest_mismatch([item.content for item in items],
                                [item.content_digest for item in items])
    if bad >= 0:
        raise InvalidPromotion(f"item {items[bad].item_id} content does not match its digest")
