"""A response's promoted checkpoint, and whether a response whose row is not found was
promoted and lost (``turn_lost``): what the status endpoint, the processor's lookups and
the history reader ask of one response without reading its history."""

from __future__ import annotations

from ratchet.domain.history import CheckpointRecord
from services.store.backend import StoreBackend
from services.store.errors import CorruptPartition, TurnLost
from services.store.history_answers import lost_turn


class CheckpointReader:
    """``CheckpointStore``'s checkpoint reads and ``turn_lost`` (their promises are
    on the facade's methods of the same names)."""

    def __init__(self, backend: StoreBackend) -> None:
        self._backend = backend

    def turn_lost(self, tenant_id: str, response_id: str,
                  partition_key: str | None = None) -> bool:
        """Promoted: the idempotency record of the request holding the response id's
        claim, in the claimed partition, names this response id (the promotion batch
        writes the record with the turn row, atomically). A claim whose batch was
        refused or is in flight, or whose request promoted another response id, was not
        promoted: False, as for an id claimed nowhere. The row is then looked for once
        more at linearizable consistency (``_turn_row_serial``), which completes a
        promotion still committing: a row that is only late is not lost. A claim that
        names no partition or no request is damage (every claim is written whole):
        ``CorruptPartition``, never "not promoted" (which hid a lost promoted row) nor
        the null key sent to Cassandra (refused: ``StoreUnavailable``, session 51)."""
        backend = self._backend
        claim = backend._claim_of(tenant_id, response_id)
        if claim is None:
            return False
        if not claim.partition_key or not claim.idempotency_key:
            missing = "partition" if not claim.partition_key else "request"
            raise CorruptPartition(f"the claim of response {response_id} of tenant "
                                   f"{tenant_id} names no {missing}")
        if partition_key is not None and claim.partition_key != partition_key:
            return False
        promoted = backend._promoted_response(tenant_id, claim.partition_key,
                                              claim.idempotency_key)
        if promoted != response_id:
            return False
        return not backend._turn_row_serial(tenant_id, claim.partition_key, response_id)

    def read_promoted(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        store = self._backend
        located, checkpoint = store._located_checkpoint(tenant_id, response_id)
        # The store's ``turn_lost`` (the backend object is the ``CheckpointStore``), not
        # this reader's: a subclass's or a test's replacement of it is the one asked.
        if checkpoint is None and located is not None and store.turn_lost(  # type: ignore[attr-defined]
            tenant_id, response_id, located
        ):
            raise TurnLost(lost_turn(tenant_id, located, response_id))
        return checkpoint

    def read_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        return self._backend._located_checkpoint(tenant_id, response_id)[1]

    def get_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        # The hook itself, not ``read_checkpoint``: one call fewer on the worker's path.
        return self._backend._located_checkpoint(tenant_id, response_id)[1]
