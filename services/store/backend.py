"""What a store backend answers: the I/O hooks the store's parts call.

``CheckpointStore`` (``base.py``) is the store's public interface, a facade over parts
with one job each (``promotion.py``, ``history_reader.py``, ``checkpoint_reader.py``,
``request_facts.py``, and the hints in ``hints.py``). The parts are written against this
class, never against the facade, so the imports point one way: ``base.py`` -> its parts
-> this module. A backend (``memory.py``, ``cassandra.py``) subclasses ``CheckpointStore``
and implements every abstract hook here; the awaited forms default to the blocking hook
in a thread (``in_thread``: a ``StopIteration`` out of it would leave the awaiting caller
waiting for ever), and a backend with async I/O overrides them.

A part keeps the store object and looks a hook up on it at each call, so a backend's
hook (or a test's replacement of it on one store) is the one called.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ratchet.domain.history import CheckpointRecord, PartitionSnapshot
from ratchet.domain.plan import (
    IdempotencyRecord,
    Plan,
    PromotionRequest,
    PromotionView,
    ResponseClaim,
)
from services.store.hook_calls import in_thread
from services.store.options import StoreOptions


class StoreBackend(ABC):
    """The hooks a backend implements (see the module docstring) and its options."""

    def __init__(self, options: StoreOptions | None = None) -> None:
        self.options = options or StoreOptions()

    # -- claims -------------------------------------------------------------------------

    @abstractmethod
    def _claim(self, claim: ResponseClaim) -> ResponseClaim:
        """Insert ``claim`` unless the response id is claimed already (linearizable,
        first writer wins); return the holder. An unknown outcome is resolved by a
        linearizable read, never guessed (``StoreUnavailable`` if that fails too)."""

    @abstractmethod
    def _claim_request(self, claim: ResponseClaim) -> ResponseClaim:
        """Insert ``claim`` as the holder of its (tenant, idempotency key) unless the
        key is held already (linearizable, first request wins, never released);
        returns the holder (``claim`` itself when it is ours)."""

    @abstractmethod
    def _request_holder(self, tenant_id: str, idempotency_key: str) -> ResponseClaim | None:
        """The holder of the request's claim (linearizable read), None if unclaimed."""

    # -- a promotion's view and write ---------------------------------------------------

    @abstractmethod
    def _read_view(self, request: PromotionRequest,
                   head_guess: str | None = None) -> PromotionView:
        """Read head / idempotency record / existing / parent, linearizably, and for a
        Conversation request the turn row the head names (``head_backing``; a backend
        may read ``head_guess``'s row with the rest, to spare a second read when the
        head names it)."""

    @abstractmethod
    def _write(self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord,
               facts_mark: str | None) -> bool:
        """Atomically write the turn if the plan's facts still hold; True if applied.

        The conditions: no idempotency record for the key, no checkpoint for the
        response id, and (Conversation) the head is exactly ``plan.expected_head``
        (absent if None) or (chain) the checkpoint ``plan.parent`` is still there with
        the same seq, item range and mode; the request's facts mark is ``facts_mark``
        (absent if None). Nothing is written unless all hold. An
        unknown outcome must be resolved before returning (never guessed).
        """

    async def _write_async(self, request: PromotionRequest, plan: Plan,
                           checkpoint: CheckpointRecord, facts_mark: str | None) -> bool:
        """``_write`` awaited; True if applied, False if refused or (a backend with async
        I/O) if the outcome is unknown: the caller then reads (``promote``)."""
        return await in_thread(self._write, request, plan, checkpoint, facts_mark)

    # -- request facts marks ------------------------------------------------------------

    @abstractmethod
    def _mark_unless_promoted(self, tenant_id: str, partition_key: str, idempotency_key: str,
                              mark: str) -> IdempotencyRecord | None:
        """Write the mark unless a response is bound to the key in the partition
        (linearizable with the promotion batch); returns that binding, or None when the
        mark was written. An unknown outcome raises ``StoreUnavailable``."""

    @abstractmethod
    def _set_facts_mark(self, tenant_id: str, partition_key: str, idempotency_key: str,
                        mark: str) -> None:
        """Write the mark (plain write, durable at write consistency)."""

    # -- where a response is, its checkpoint, a lost row ---------------------------------

    @abstractmethod
    def _locate(self, tenant_id: str, response_id: str) -> str | None:
        """The partition key of the response id's claim (verified against it later)."""

    async def _locate_async(self, tenant_id: str, response_id: str) -> str | None:
        """``_locate`` awaited; a backend with async I/O overrides it."""
        return await in_thread(self._locate, tenant_id, response_id)

    @abstractmethod
    def _located_checkpoint(
        self, tenant_id: str, response_id: str
    ) -> tuple[str | None, CheckpointRecord | None]:
        """The partition the response id's claim names (None: claimed nowhere) and the
        checkpoint row there (``read_checkpoint``'s answer, its errors included)."""

    @abstractmethod
    def _claim_of(self, tenant_id: str, response_id: str) -> ResponseClaim | None:
        """The response id's claim (read consistency), or None: claimed nowhere."""

    @abstractmethod
    def _promoted_response(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        """The response id the request's idempotency record in that partition names (read
        consistency); None without a record (none, or only the request's facts mark)."""

    @abstractmethod
    def _turn_row_serial(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        """Whether the response's turn row is in that partition, read linearizably (a
        promotion in flight is completed first); a row that cannot be decoded is there."""

    # -- partition reads ----------------------------------------------------------------

    @abstractmethod
    def _load_turn(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """One turn row of a partition (see ``read_turn``), or None if absent."""

    @abstractmethod
    def _load_partition(self, tenant_id: str, partition_key: str) -> PartitionSnapshot | None:
        """Every checkpoint and item of one partition, or None if it holds nothing."""

    async def _load_partition_async(
        self, tenant_id: str, partition_key: str
    ) -> PartitionSnapshot | None:
        """``_load_partition`` awaited; a backend with async I/O overrides it."""
        return await in_thread(self._load_partition, tenant_id, partition_key)

    def _load_conversation(self, tenant_id: str, conversation_id: str) -> PartitionSnapshot | None:
        """What the read of a Conversation needs of its partition: all of it (its head's
        lineage is every turn). A backend whose reads cost per byte may answer a
        partition that holds no Conversation from its structure alone."""
        return self._load_partition(tenant_id, conversation_id)

    async def _load_conversation_async(
        self, tenant_id: str, conversation_id: str
    ) -> PartitionSnapshot | None:
        """``_load_conversation`` awaited."""
        return await self._load_partition_async(tenant_id, conversation_id)

    def _load_lineage(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """What the read of one response needs of its partition: every checkpoint and
        the head (the rules check the whole partition's structure) and the items of the
        response's lineage; other turns' items may be left out (``verify_history``
        reads the lineage's only). By default the whole partition; a backend whose
        reads cost per byte overrides it."""
        return self._load_partition(tenant_id, partition_key)

    async def _load_lineage_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """``_load_lineage`` awaited."""
        return await self._load_partition_async(tenant_id, partition_key)
