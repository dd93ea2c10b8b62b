"""What the store says of a request apart from promoting one of its turns: whether it
stands promoted (by whichever attempt), which chain's first response holds it, and the
facts mark that orders a fact of the request (kept by the ledger) against a promotion.
For a chain's first response "does this request stand promoted" asks two partitions,
its own and that of the response holding its request claim (``promoted_at``)."""

from __future__ import annotations

import dataclasses
import uuid

from ratchet.domain.history import CheckpointRecord, PromotionMode
from ratchet.domain.plan import (
    Duplicate,
    IdempotencyRecord,
    KeyReused,
    PromotionRequest,
    RequestHeld,
    ResponseClaim,
    check_request_claim,
    check_view_filing,
    starts_chain,
)
from schemas.models import Certification
from services.store.backend import StoreBackend
from services.store.request_checks import validate_request


class RequestFacts:
    """``CheckpointStore``'s request reads and marks (their promises are on the
    facade's methods of the same names) and ``request_held``, the promotion's check of
    a chain's first request."""

    def __init__(self, backend: StoreBackend) -> None:
        self._backend = backend

    def request_held(
        self, request: PromotionRequest
    ) -> Duplicate | KeyReused | RequestHeld | None:
        """None when the request may be written. A chain's first response claims its
        request (tenant, idempotency key) before its first write, as it claims its
        response id: a retry under another response id would land in another partition,
        where no idempotency record can see the first attempt. Held by another response
        id: that response's own partition says whether it stands promoted (``Duplicate``
        or ``KeyReused``, as a partition's own record would), else ``RequestHeld``."""
        if not starts_chain(request):
            return None
        mine = ResponseClaim.of(request)
        holder = check_request_claim(self._backend._claim_request(mine))
        if holder.response_id == request.response_id:
            return None
        original = self.promoted_at(request, holder)
        if original is None:
            return RequestHeld(holder)
        if original.request_digest == request.request_digest:
            return Duplicate(original)
        return KeyReused(original.request_digest, original.response_id)

    def promoted_at(self, request: PromotionRequest,
                    holder: ResponseClaim) -> CheckpointRecord | None:
        """What the partition of ``holder`` (another first response of a chain) says
        ``request``'s key promoted: its view's idempotency record, at SERIAL."""
        return self._original(dataclasses.replace(
            request, partition_key=holder.partition_key, response_id=holder.response_id
        ))

    def _request_holder(self, tenant_id: str, idempotency_key: str) -> ResponseClaim | None:
        """The request's claim read at SERIAL, checked whole (``check_request_claim``)."""
        holder = self._backend._request_holder(tenant_id, idempotency_key)
        return None if holder is None else check_request_claim(holder)

    def _original(self, request: PromotionRequest) -> CheckpointRecord | None:
        """The view's original, from a view whose rows are filed under their ids
        (``check_view_filing``: a row naming another id is ``CorruptPartition``, never
        another response's record answered as this request's promotion)."""
        view = self._backend._read_view(request)
        check_view_filing(request, view)
        return view.original

    def hold_request(self, tenant_id: str, idempotency_key: str,
                     response_id: str) -> ResponseClaim:
        return check_request_claim(self._backend._claim_request(ResponseClaim(
            tenant_id, response_id, response_id, idempotency_key, "")))

    def promoted_request(self, request: PromotionRequest) -> CheckpointRecord | None:
        validate_request(request, written=False)
        original = self._original(request)
        if original is None and starts_chain(request):
            holder = self._request_holder(request.tenant_id, request.idempotency_key)
            if holder is not None and holder.partition_key != request.partition_key:
                original = self.promoted_at(request, holder)
        return original

    def promoted_key(self, tenant_id: str, partition_key: str, idempotency_key: str,
                     response_id: str, *, first_of_chain: bool) -> CheckpointRecord | None:
        # One attempt's request with only what the store's reads look at: its key,
        # partition and response id (a chain-mode view of its partition).
        request = PromotionRequest(
            tenant_id=tenant_id, partition_key=partition_key, mode=PromotionMode.CHAIN,
            response_id=response_id, idempotency_key=idempotency_key, request_digest="",
            items=(), certification=Certification.LOGICAL_ONLY)
        validate_request(request, written=False)
        original = self._original(request)
        if original is None and first_of_chain:
            holder = self._request_holder(tenant_id, idempotency_key)
            if holder is not None and holder.partition_key != partition_key:
                original = self.promoted_at(request, holder)
        return original

    def mark_request_facts(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str:
        mark = uuid.uuid4().hex
        self._backend._set_facts_mark(tenant_id, partition_key, idempotency_key, mark)
        return mark

    def mark_claim(self, tenant_id: str, partition_key: str, idempotency_key: str, *,
                   first_of_chain: bool = False) -> IdempotencyRecord | None:
        backend = self._backend
        promoted = backend._mark_unless_promoted(tenant_id, partition_key, idempotency_key,
                                                 uuid.uuid4().hex)
        if promoted is not None or not first_of_chain:
            return promoted
        holder = self._request_holder(tenant_id, idempotency_key)
        if holder is None or holder.partition_key == partition_key:
            return None
        return backend._mark_unless_promoted(tenant_id, holder.partition_key, idempotency_key,
                                             uuid.uuid4().hex)
