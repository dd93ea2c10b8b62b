"""Cassandra backend: one partition per history, one conditional batch per promotion.

Tables: ``turns`` (``infra/migrations/004_turn_rows.cql``: one row per promoted
response, its items in a list column of it) and ``response_claims``
(``007_response_claims.cql``: who may promote a response id, and where it lives; one
``INSERT ... IF NOT EXISTS`` per response id, before its first batch, ``_claim``).
The promotion batch (``_write``) is::

    UPDATE turns SET head_* = ...                                 -- Conversation mode only
        IF head_seq = ? AND head_response_id = ? AND head_item_count = ?
        AND head_lineage_digest = ?
    UPDATE parent turn row SET seq = seq                          -- chain mode, with a parent
        IF seq = ? AND last_item_seq = ? AND mode = 'chain' AND lineage_digest = ?
        AND response_id = ?                                       -- filed under its id
    INSERT turn row (checkpoint + items) IF NOT EXISTS            -- each response once
    INSERT idempotency row           IF NOT EXISTS                -- each key once
      (or, when the request has recorded facts: UPDATE it IF response_id = null AND
       facts_mark = <the mark the decision saw>; see ``mark_request_facts``)
    INSERT head marker row IF NOT EXISTS                          -- a Conversation's first turn

Cassandra allows these conditions together because they sit on different rows of
one partition (the static row and up to three clustering rows); the batch is then
atomic and isolated. ``IF head_seq = null AND ...`` holds for a partition that does
not exist yet. Because the batch carries every fact its plan rests on, it can be sent
FIRST when the plan is known from hints (one Paxos round per promotion); only a
refused batch costs the SERIAL view read (see ``services/store/base.py``).

Unknown outcomes: the batch is sent with a fall-through retry policy (the driver
never re-sends it on its own). If it fails in a way that may have been applied after
all (timeouts, CAS_WRITE_UNKNOWN, a dropped connection), the checkpoint row is read
at SERIAL consistency, which completes or supersedes any in-flight Paxos round, and
its ``attempt_token`` (a fresh uuid per batch) says whether the write was ours.

This module sends statements and handles the driver's errors; what the columns hold
and how records are encoded into them is the row codec, ``services/store/rows.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

from cassandra import (
    ConsistencyLevel,
    DriverException,
    InvalidRequest,
    RequestExecutionException,
    RequestValidationException,
    Unavailable,
)
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, NoHostAvailable, Session
from cassandra.connection import ConnectionException
from cassandra.policies import FallthroughRetryPolicy
from cassandra.protocol import (
    ErrorMessage,
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
)
from cassandra.query import BatchStatement, BatchType, PreparedStatement, tuple_factory

from ratchet.domain.history import (
    CheckpointRecord,
    Head,
    PartitionSnapshot,
    PromotionMode,
    as_of_head,
    beyond_head,
    lineage_refs,
)
from ratchet.domain.plan import (
    CorruptPartition,
    IdempotencyRecord,
    Plan,
    PromotionRequest,
    PromotionView,
    ResponseClaim,
    claimed_partition,
)
from ratchet.settings import Settings
from services.cassandra_cluster import (
    DRIVER_OUTAGES,
    completed,
    keyspace_of,
    open_cluster,
    store_levels,
)
from services.cassandra_loop import LoopRequestFailed, LoopResult, LoopSession
from services.store.base import CheckpointStore, StoreOptions, StoreUnavailable
from services.store.hints import _Hints
from services.store.rows import (
    DAMAGED_ROW_ERRORS,
    checkpoint_of,
    checkpoint_values,
    decode_snapshot,
    decode_structure,
    head_from,
    head_of,
    item_values,
    unset_nulls,
    with_items,
)
from services.store.statements import StoreStatements

T = TypeVar("T")

# Protocol v5 error code "CAS_WRITE_UNKNOWN"; driver 3.30 has no class for it (it
# arrives as a bare ``ErrorMessage``) and, like every error not listed below, it is
# resolved as an unknown outcome.
CAS_WRITE_UNKNOWN = 0x1700
# Errors that prove the batch was NOT applied: refused before any replica wrote.
_NOT_APPLIED = (
    NoHostAvailable,
    Unavailable,
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
    RequestValidationException,
)
# Driver errors after which the batch may or may not have been applied: timeouts
# (WriteTimeout of any write type, OperationTimedOut), CAS_WRITE_UNKNOWN, a connection
# lost after sending, server errors.
_MAYBE_APPLIED = (
    DriverException,
    RequestExecutionException,
    ErrorMessage,
    ConnectionException,
    OSError,
)


# A response's read in a WIDE partition (``_load_lineage``): one whose turns outside the
# lineage read held at least this many bytes of items. Below, the whole read in one
# round trip costs less than a second one (an outside review, session 36: counted by
# turns, 70 turns of small items became two queries, 2.25 -> 2.77 ms a read).
_WIDE_ITEM_BYTES = 256 * 1024
# There, the lineage's items are asked for by response id (``ref IN ?``) when it is at
# most this many turns and under half of the partition's; else every turn's items come
# in one slice, as the whole-partition read does.
_LINEAGE_IN_MAX = 256




def _holder(tenant_id: str, found: dict[str, Any]) -> ResponseClaim:
    return ResponseClaim(tenant_id, found["response_id"], found["partition_key"],
                         found["idempotency_key"], found["request_digest"])


def _claimed_partition(tenant_id: str, response_id: str, row: Any) -> str | None:
    """The partition a claim row names; None: no claim. A claim row naming none is
    damage (every claim is written with its partition), not an unclaimed id: read as
    absent it made a promoted response ``NOT_FOUND`` and its status ``unknown``."""
    return None if row is None else claimed_partition(tenant_id, response_id, row[0])


def _unavailable(operation: str, exc: BaseException) -> StoreUnavailable:
    permanent = isinstance(exc, RequestValidationException)  # schema missing, CQL refused
    unconfigured = isinstance(exc, InvalidRequest) and "unconfigured table" in str(exc)
    hint = " (did `ratchet migrate` run?)" if unconfigured else ""
    return StoreUnavailable(
        f"store {operation}: {type(exc).__name__}: {exc}{hint}",
        retryable=not permanent,
        operation=operation,
    )


def _guard(operation: str, call: Callable[[], T]) -> T:
    """Run driver calls, turning infrastructure failures into ``StoreUnavailable``."""
    try:
        return call()
    except DRIVER_OUTAGES as exc:
        raise _unavailable(operation, exc) from exc


async def _on_loop(operation: str, request: Awaitable[LoopResult]) -> LoopResult:
    """A request of the C++ driver; its failure as ``StoreUnavailable`` (an unknown
    outcome included: the worker's thread path settles it with a SERIAL read)."""
    try:
        return await request
    except LoopRequestFailed as exc:
        raise StoreUnavailable(f"store {operation}: {exc}", retryable=not exc.permanent,
                               operation=operation) from exc


def _with_lineage_items(structure: PartitionSnapshot, refs: list[str],
                        cells: Sequence[Any]) -> PartitionSnapshot:
    """The structure with the items of its lineage ``refs`` (a slice brings others)."""
    lineage = set(refs)
    return with_items(structure, {ref: cell for ref, cell in cells if ref in lineage})


def _holds_a_conversation(snapshot: PartitionSnapshot | None) -> bool:
    """A head, the first batch's marker, or a Conversation turn (even a damaged
    partition's: verification says what is wrong with it, from the whole read)."""
    return snapshot is not None and (
        snapshot.head is not None or snapshot.conversation_begun or bool(snapshot.damaged)
        or any(c.mode is PromotionMode.CONVERSATION for c in snapshot.checkpoints.values()))


class CassandraCheckpointStore(CheckpointStore):
    """``CheckpointStore`` on a cassandra-driver ``Session``.

    Statements are prepared once here. ``keyspace`` qualifies the tables (default:
    the session's keyspace; neither is ``NoKeyspace``). Reads use
    ``read_consistency``; the promotion batch and the claims commit at
    ``write_consistency`` with Paxos at ``serial_consistency``; the facts mark, a plain
    write that Paxos conditions read, at QUORUM whatever these are
    (``statements.MARK_CONSISTENCY``).
    """

    def __init__(
        self,
        session: Session,
        options: StoreOptions | None = None,
        *,
        keyspace: str | None = None,
        read_consistency: int = ConsistencyLevel.LOCAL_QUORUM,
        write_consistency: int = ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency: int = ConsistencyLevel.SERIAL,
        timeout_s: float = 5.0,
        owned_cluster: Cluster | None = None,
        loop_session: LoopSession | None = None,
    ) -> None:
        super().__init__(options)
        self._session = session
        self._timeout = timeout_s
        # (tenant, partition_key) of partitions whose responses are read as structure
        # and lineage items (``_load_lineage``), and of partitions a read found holding
        # turns but no Conversation (``_load_conversation``): learnt, never a
        # correctness input (every answer is verified from what is read).
        self._wide = _Hints(self.options.hint_capacity)
        self._no_conversation = _Hints(self.options.hint_capacity)
        # The requests awaited on an event loop go through the C++ driver when the process
        # gives a session of it (services/cassandra_loop.py); else cassandra-driver's
        # callbacks. Only the loop that session connected on may use it.
        self.loop_session = loop_session
        self._cluster = owned_cluster
        self._read_cl = read_consistency
        self._write_cl = write_consistency
        self._serial_cl = serial_consistency
        # Partition reads decode plain tuples by position: the driver's default
        # named-tuple rows build a class per result. A profile object passed per call
        # changes nothing on the shared session (legacy-configured clusters, which
        # refuse profiles, keep named tuples: they index the same).
        self._tuple_rows: Any = EXEC_PROFILE_DEFAULT
        try:
            self._tuple_rows = session.execution_profile_clone_update(
                EXEC_PROFILE_DEFAULT, row_factory=tuple_factory
            )
        except Exception:  # noqa: BLE001 - legacy mode or a session wrapper: keep defaults
            self._tuple_rows = EXEC_PROFILE_DEFAULT
        self.cql = StoreStatements(
            self._prepare, self._prepare_lwt, keyspace=keyspace_of(session, keyspace),
            read_consistency=read_consistency, serial_consistency=serial_consistency)

    @classmethod
    def connect(
        cls, settings: Settings, options: StoreOptions | None = None
    ) -> CassandraCheckpointStore:
        """A store with its own ``Cluster`` (closed by ``close``)."""
        if options is None:
            options = StoreOptions(logical_retention_s=settings.logical_retention_s)
        cluster = open_cluster(settings)
        session = _guard("connect", lambda: cluster.connect(settings.keyspace))
        return cls(session, options, owned_cluster=cluster, **store_levels(settings))

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()

    # -- statements -----------------------------------------------------------------------

    def _prepare(self, cql: str, consistency: int) -> PreparedStatement:
        statement = _guard("prepare", lambda: self._session.prepare(cql))
        statement.consistency_level = consistency
        return statement

    def _prepare_lwt(self, cql: str) -> PreparedStatement:
        """An LWT part: the driver must never re-send it by itself (not idempotent)."""
        statement = self._prepare(cql, self._write_cl)
        statement.retry_policy = FallthroughRetryPolicy()
        statement.is_idempotent = False
        return statement

    def _execute(self, operation: str, statement: Any, params: Iterable[Any] | None = None):
        return _guard(
            operation, lambda: self._session.execute(statement, params, timeout=self._timeout)
        )

    # -- public reads -----------------------------------------------------------------------

    def head(self, tenant_id: str, partition_key: str) -> Head | None:
        row = self._execute("head", self.cql.select_head, (tenant_id, partition_key)).one()
        return None if row is None else head_of(row)

    def read_head(self, tenant_id: str, partition_key: str) -> Head | None:
        row = self._execute("read_head", self.cql.read_head, (tenant_id, partition_key)).one()
        return None if row is None else head_of(row)

    async def read_head_async(self, tenant_id: str, partition_key: str) -> Head | None:
        """The head read on the driver's own I/O thread: the event loop only awaits."""
        rows = await self._rows_async("read_head", self.cql.read_head, (tenant_id, partition_key))
        return head_from(*rows[0]) if rows else None

    async def read_turn_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        rows = await self._rows_async(
            "read_turn", self.cql.select_turn, (tenant_id, partition_key, response_id)
        )
        return decode_snapshot(tenant_id, partition_key, rows)

    async def _locate_async(self, tenant_id: str, response_id: str) -> str | None:
        rows = await self._rows_async("locate", self.cql.select_location, (tenant_id, response_id))
        return _claimed_partition(tenant_id, response_id, rows[0] if rows else None)

    async def _load_partition_async(
        self, tenant_id: str, partition_key: str
    ) -> PartitionSnapshot | None:
        """``_load_partition`` on the driver's I/O thread (the same queries)."""
        return await self._whole_async(tenant_id, partition_key, self.cql.select_partition,
                                       decode_snapshot)

    async def _load_conversation_async(
        self, tenant_id: str, conversation_id: str
    ) -> PartitionSnapshot | None:
        """``_load_conversation`` on the driver's I/O thread (the same queries)."""
        key = (tenant_id, conversation_id)
        if self._no_conversation.get(key) is not None:
            structure = await self._whole_async(tenant_id, conversation_id,
                                                self.cql.select_structure, decode_structure)
            if not _holds_a_conversation(structure):
                return structure
        snapshot = await self._load_partition_async(tenant_id, conversation_id)
        self._learn_no_conversation(key, snapshot)
        return snapshot

    async def _load_lineage_async(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """``_load_lineage`` on the driver's I/O thread (the same queries)."""
        if self._wide.get((tenant_id, partition_key)) is None:
            snapshot = await self._whole_async(tenant_id, partition_key,
                                               self.cql.select_partition, decode_snapshot)
            self._learn_width(snapshot, response_id)
            return snapshot
        structure = await self._whole_async(tenant_id, partition_key, self.cql.select_structure,
                                            decode_structure)
        if structure is None:
            return None
        refs = lineage_refs(structure, response_id)
        if not refs:  # not there, or damaged: verification answers from the structure
            return structure
        cells = await self._rows_async("read_history", *self._items_query(structure, refs))
        return _with_lineage_items(structure, refs, cells)

    async def _whole_async(
        self, tenant_id: str, partition_key: str, statement: PreparedStatement,
        decode: Callable[[str, str, Sequence[Any]], PartitionSnapshot | None],
    ) -> PartitionSnapshot | None:
        """``_whole`` awaited."""
        key = (tenant_id, partition_key)
        for _ in range(2):
            rows = await self._rows_async("read_history", statement, key)
            if not rows:
                rows = await self._rows_async("read_history", self.cql.select_static_head, key)
            snapshot = decode(tenant_id, partition_key, rows)
            ahead = self._ahead_across_pages(snapshot, rows, statement)
            if ahead is None:
                return snapshot
            head = await self.read_head_async(tenant_id, partition_key)
            if head is None or head.seq < ahead:
                return snapshot  # beyond the head even now: the verification's CORRUPT
        return as_of_head(snapshot)

    async def _rows_async(
        self, operation: str, statement: PreparedStatement, params: tuple[Any, ...]
    ) -> list[Any]:
        """Every row (all pages), as plain tuples (or named tuples on a legacy session),
        awaited on the event loop: through the C++ driver if the store has a
        ``loop_session``, else with cassandra-driver's ``execute_async`` (its I/O thread
        collects the pages and hands the rows to the loop; no thread-pool hop)."""
        if self.loop_session is not None:
            answer = await _on_loop(operation, self.loop_session.execute(statement, params))
            return list(answer.rows)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Any]] = loop.create_future()
        rows: list[Any] = []

        def settle(error: BaseException | None) -> None:
            if done.done():
                return
            if error is not None:
                done.set_exception(_unavailable(operation, error))
            else:
                done.set_result(rows)

        def on_rows(page: list[Any]) -> None:
            rows.extend(page)
            if future.has_more_pages:
                future.start_fetching_next_page()  # the callbacks run again with it
            else:
                loop.call_soon_threadsafe(settle, None)

        def on_error(exc: BaseException) -> None:
            loop.call_soon_threadsafe(settle, exc)

        def send() -> Any:
            chosen = self._tuple_rows
            try:
                return self._session.execute_async(
                    statement, params, timeout=self._timeout, execution_profile=chosen
                )
            except ValueError:  # a legacy-configured session refuses profiles
                if chosen is EXEC_PROFILE_DEFAULT:
                    raise
                self._tuple_rows = EXEC_PROFILE_DEFAULT
                return self._session.execute_async(statement, params, timeout=self._timeout)

        future = _guard(operation, send)
        future.add_callbacks(on_rows, on_error)
        return await done

    def _load_turn(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        key = (tenant_id, partition_key, response_id)
        rows = _guard("read_turn", lambda: self._rows(self.cql.select_turn, key))
        return decode_snapshot(tenant_id, partition_key, rows)

    def _located_checkpoint(
        self, tenant_id: str, response_id: str
    ) -> tuple[str | None, CheckpointRecord | None]:
        partition_key = self._locate(tenant_id, response_id)
        if partition_key is None:
            return None, None
        row = self._execute(
            "get_checkpoint", self.cql.select_checkpoint, (tenant_id, partition_key, response_id)
        ).one()
        if row is None:
            return partition_key, None
        try:
            checkpoint = checkpoint_of(tenant_id, partition_key, row)
        except DAMAGED_ROW_ERRORS as exc:
            raise CorruptPartition(f"checkpoint row of {response_id} in {partition_key} "
                                   f"cannot be decoded: {exc!r}") from exc
        if checkpoint.response_id != response_id:
            raise CorruptPartition(f"checkpoint row of {response_id} in {partition_key} is "
                                   f"filed under another response id")
        return partition_key, checkpoint

    def request_facts_mark(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        row = self._execute(
            "facts_mark", self.cql.select_mark, (tenant_id, partition_key, idempotency_key)
        ).one()
        return None if row is None else row.facts_mark

    def _mark_unless_promoted(self, tenant_id: str, partition_key: str, idempotency_key: str,
                              mark: str) -> IdempotencyRecord | None:
        # An unknown outcome is StoreUnavailable (the claims API answers 503): the
        # gateway sends its claim again with the same token, and it is marked again.
        rows = self._execute("claim_mark", self.cql.set_mark_unless_promoted,
                             (mark, tenant_id, partition_key, idempotency_key))
        if rows.was_applied:
            return None
        row = rows.one()
        if row is None or row.response_id is None or row.request_digest is None:
            raise CorruptPartition(f"idempotency row of {idempotency_key} in {partition_key} "
                                   "refused a mark without a whole binding")
        return IdempotencyRecord(idempotency_key, row.request_digest, row.response_id)

    def _set_facts_mark(self, tenant_id: str, partition_key: str, idempotency_key: str,
                        mark: str) -> None:
        self._execute("facts_mark", self.cql.set_mark,
                      (mark, tenant_id, partition_key, idempotency_key))

    # -- backend hooks ----------------------------------------------------------------------

    def _read_view(self, request: PromotionRequest,
                   head_guess: str | None = None) -> PromotionView:
        """The view at SERIAL in one round trip.

        The rows query also asks for the ``kind='head'`` marker row a Conversation's
        first batch writes, so the static head columns come back with it; only a partition
        without that row (no Conversation turn yet) needs the separate head query.
        """
        key = (request.tenant_id, request.partition_key)
        # The second turn row asked for: a chain turn's parent, or the row of the head a
        # Conversation turn expects (checked against the head cells, ``_view``).
        # (Its own row is asked for already, third.)
        if request.mode is not PromotionMode.CONVERSATION or head_guess == request.response_id:
            head_guess = None
        parent = request.previous_response_id or head_guess or ""

        def read() -> PromotionView:
            rows = list(
                self._session.execute(
                    self.cql.select_view_rows,
                    (*key, request.idempotency_key, request.response_id, parent),
                    timeout=self._timeout,
                )
            )
            head_row = next((r for r in rows if r.kind == "head"), None)
            if head_row is None and request.mode is PromotionMode.CONVERSATION:
                head_row = self._session.execute(
                    self.cql.select_head, key, timeout=self._timeout
                ).one()
            try:
                return self._view(request, head_row, rows)
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptPartition(
                    f"partition {request.partition_key} of tenant {request.tenant_id}: "
                    f"undecodable row ({exc})"
                ) from exc

        return _guard("promote/read", read)

    def start_claiming(self, claim: ResponseClaim) -> Callable[[], ResponseClaim]:
        """The claim's LWT, sent now; the waiter gives its holder (see ``_claim``)."""
        future = _guard(
            "promote/claim",
            lambda: self._session.execute_async(
                self.cql.insert_claim, self._claim_values(claim), timeout=self._timeout,
                execution_profile=self._tuple_rows,
            ),
        )
        return lambda: self._claim_holder(claim, future.result)

    async def claim_async(self, claim: ResponseClaim) -> ResponseClaim:
        """The claim's LWT, awaited on the event loop. An unknown outcome is not settled
        here (its SERIAL read would block the loop): ``StoreUnavailable``, and
        ``promote`` takes the claim again (same request: the same holder)."""
        if self.loop_session is not None:
            answer = await _on_loop("promote/claim", self.loop_session.execute(
                self.cql.insert_claim, self._claim_values(claim), serial_consistency=self._serial_cl))
            return self._claim_holder(claim, lambda: answer)
        future = _guard(
            "promote/claim",
            lambda: self._session.execute_async(
                self.cql.insert_claim, self._claim_values(claim), timeout=self._timeout,
                execution_profile=self._tuple_rows,
            ),
        )
        await completed(future)
        try:
            rows = future.result()  # answered already: does not block
        except _NOT_APPLIED + _MAYBE_APPLIED as exc:  # one flat tuple: a nested one is a
            # TypeError when the except clause is matched (Python 3.11), not a match
            raise _unavailable("promote/claim", exc) from exc
        return self._claim_holder(claim, lambda: rows)

    def _claim(self, claim: ResponseClaim) -> ResponseClaim:
        return self._claim_holder(
            claim,
            lambda: self._session.execute(
                self.cql.insert_claim, self._claim_values(claim), timeout=self._timeout,
                execution_profile=self._tuple_rows,
            ),
        )

    def _request_holder(self, tenant_id: str, idempotency_key: str) -> ResponseClaim | None:
        return _guard("promote/request-claim", lambda: self._read_claim(
            self.cql.select_request_claim_serial, (tenant_id, idempotency_key)))

    def _read_claim(self, statement: Any, key: tuple[str, str]) -> ResponseClaim | None:
        """A claim row read at SERIAL (``key`` = tenant, then the claim's own key), or
        None when there is none."""
        rows = self._session.execute(statement, key, timeout=self._timeout,
                                     execution_profile=self._tuple_rows)
        row = rows.one()
        return None if row is None else _holder(
            key[0], dict(zip(rows.column_names, row, strict=True)))

    def _claim_request(self, claim: ResponseClaim) -> ResponseClaim:
        values = (claim.tenant_id, claim.idempotency_key, claim.response_id,
                  claim.partition_key, claim.request_digest)
        return self._claim_holder(
            claim,
            lambda: self._session.execute(
                self.cql.insert_request_claim, values, timeout=self._timeout,
                execution_profile=self._tuple_rows,
            ),
            serial=(self.cql.select_request_claim_serial, (claim.tenant_id, claim.idempotency_key)),
        )

    @staticmethod
    def _claim_values(claim: ResponseClaim) -> tuple[str, ...]:
        return (claim.tenant_id, claim.response_id, claim.partition_key,
                claim.idempotency_key, claim.request_digest)

    def _claim_holder(self, claim: ResponseClaim, result: Callable[[], Any],
                      serial: tuple[Any, tuple[str, str]] | None = None) -> ResponseClaim:
        """The holder after the claim's LWT: ours if applied, else the row it found; an
        unknown outcome is settled by a SERIAL read of the claim (never guessed).
        ``serial``: the statement and key of that read (default: the response id's)."""
        try:
            rows = result()
        except _NOT_APPLIED as exc:
            raise _unavailable("promote/claim", exc) from exc
        except _MAYBE_APPLIED as exc:
            return self._serial_claim(claim, exc, serial or (
                self.cql.select_claim_serial, (claim.tenant_id, claim.response_id)))
        if rows.was_applied:
            return claim
        # Plain tuples (a named-tuple row builds a class per result: 5 % of the worker's
        # CPU in a py-spy profile), read by the column names the answer carries.
        found = dict(zip(rows.column_names, rows.one(), strict=True))
        return _holder(claim.tenant_id, found)

    def _serial_claim(self, claim: ResponseClaim, cause: BaseException,
                      serial: tuple[Any, tuple[str, str]]) -> ResponseClaim:
        try:
            found = self._read_claim(*serial)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the outcome unknown
            raise StoreUnavailable(
                f"claim of {claim.response_id} has an unknown outcome ({cause!r}) and the "
                f"SERIAL read failed too ({exc!r})", retryable=True, operation="promote/claim",
            ) from exc
        if found is None:  # the SERIAL read settled the round: it did not land
            raise StoreUnavailable(
                f"claim of {claim.response_id} did not land ({cause!r})", retryable=True,
                operation="promote/claim",
            )
        return found

    def _view(self, request: PromotionRequest, head_row: Any, rows: list[Any]) -> PromotionView:
        checkpoints = {
            r.ref: checkpoint_of(request.tenant_id, request.partition_key, r)
            for r in rows
            if r.kind == "checkpoint"
        }
        # The idempotency row exists for a promoted request and for one with recorded
        # facts (its mark alone); only the former is an idempotency record.
        key_row = next((r for r in rows if r.kind == "idempotency"), None)
        idempotency = (
            None
            if key_row is None or key_row.response_id is None
            else IdempotencyRecord(key_row.ref, key_row.request_digest, key_row.response_id)
        )
        original = None
        if idempotency is not None:
            original = checkpoints.get(idempotency.response_id) or self._serial_checkpoint(
                request.tenant_id, request.partition_key, idempotency.response_id
            )
        head = None if head_row is None else head_of(head_row)
        backing = None
        if head is not None and request.mode is PromotionMode.CONVERSATION:
            backing = checkpoints.get(head.response_id) or self._serial_checkpoint(
                request.tenant_id, request.partition_key, head.response_id
            )
        return PromotionView(
            head=head,
            head_backing=backing,
            conversation_begun=any(r.kind == "head" for r in rows),
            idempotency=idempotency,
            original=original,
            existing=checkpoints.get(request.response_id),
            parent=checkpoints.get(request.previous_response_id or ""),
            facts_mark=None if key_row is None else key_row.facts_mark,
        )

    def _serial_checkpoint(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> CheckpointRecord | None:
        row = self._session.execute(
            self.cql.select_checkpoint_serial,
            (tenant_id, partition_key, response_id),
            timeout=self._timeout,
        ).one()
        return None if row is None else checkpoint_of(tenant_id, partition_key, row)

    def _write(self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord,
               facts_mark: str | None) -> bool:
        token = uuid.uuid4()
        batch = self._batch(request, plan, checkpoint, token, facts_mark)
        try:
            # Plain-tuple rows: ``was_applied`` reads them the same, and the default
            # named tuples would build a class for every result.
            result = self._session.execute(
                batch, timeout=self._timeout, execution_profile=self._tuple_rows
            )
        except _NOT_APPLIED as exc:
            raise _unavailable("promote", exc) from exc
        except _MAYBE_APPLIED as exc:
            return self._resolve_unknown(request, token, exc)
        return bool(result.was_applied)

    async def _write_async(self, request: PromotionRequest, plan: Plan,
                           checkpoint: CheckpointRecord, facts_mark: str | None) -> bool:
        """The batch awaited on the event loop; an unknown outcome is not settled here
        (its SERIAL read would block the loop): False on cassandra-driver, a retryable
        ``StoreUnavailable`` through the C++ driver (its failure is all it says); the
        caller's ``promote`` finds out."""
        if self.loop_session is not None:
            parts = self._batch_parts(request, plan, checkpoint, uuid.uuid4(), facts_mark)
            answer = await _on_loop("promote", self.loop_session.execute_batch(
                parts, consistency=self._write_cl, serial_consistency=self._serial_cl))
            return answer.was_applied
        batch = self._batch(request, plan, checkpoint, uuid.uuid4(), facts_mark)
        future = _guard("promote", lambda: self._session.execute_async(
            batch, timeout=self._timeout, execution_profile=self._tuple_rows))
        await completed(future)
        try:
            return bool(future.result().was_applied)  # answered already: does not block
        except _NOT_APPLIED as exc:
            raise _unavailable("promote", exc) from exc
        except _MAYBE_APPLIED:
            return False

    def _resolve_unknown(
        self, request: PromotionRequest, token: uuid.UUID, cause: BaseException
    ) -> bool:
        """Did the batch with ``token`` land? A SERIAL read settles any in-flight round."""
        try:
            row = self._session.execute(
                self.cql.select_checkpoint_serial,
                (request.tenant_id, request.partition_key, request.response_id),
                timeout=self._timeout,
            ).one()
        except Exception as exc:  # noqa: BLE001 - any failure leaves the outcome unknown
            raise StoreUnavailable(
                f"promotion of {request.response_id} has an unknown outcome ({cause!r}) and "
                f"the SERIAL read failed too ({exc!r}); promote again with the same "
                "idempotency key to learn it",
                retryable=True,
                operation="promote/resolve",
            ) from exc
        return row is not None and row.attempt_token == token

    def _batch(
        self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord,
        token: uuid.UUID, facts_mark: str | None,
    ) -> BatchStatement:
        batch = BatchStatement(
            batch_type=BatchType.LOGGED,
            consistency_level=self._write_cl,
            serial_consistency_level=self._serial_cl,
            retry_policy=FallthroughRetryPolicy(),
        )
        for statement, values in self._batch_parts(request, plan, checkpoint, token,
                                                   facts_mark):
            batch.add(statement, values)
        return batch

    def _batch_parts(
        self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord,
        token: uuid.UUID, facts_mark: str | None,
    ) -> list[tuple[PreparedStatement, tuple[Any, ...]]]:
        """The promotion batch's statements and values, in order (one driver's batch)."""
        key = (request.tenant_id, request.partition_key)
        parts: list[tuple[PreparedStatement, tuple[Any, ...]]] = []
        if plan.new_head is not None:
            old = plan.expected_head
            expected = (
                (None, None, None, None)
                if old is None
                else (old.seq, old.response_id, old.item_count, old.lineage_digest)
            )
            new = plan.new_head
            parts.append((
                self.cql.advance_head,
                (new.seq, new.response_id, new.item_count, new.lineage_digest, token,
                 *key, *expected),
            ))
            if old is None:
                # The Conversation's first batch; the row has no TTL, so later batches
                # need not write it again (a partition that lost it only costs the
                # view's separate head query, see ``_read_view``).
                parts.append((self.cql.insert_head_marker, key))
        if plan.parent is not None:
            parent = plan.parent
            parts.append((
                self.cql.check_parent,
                (parent.seq, *key, parent.response_id, parent.seq, parent.last_item_seq,
                 parent.lineage_digest, parent.response_id),
            ))
        parts.append((
            self.cql.insert_checkpoint,
            (
                *key,
                request.response_id,
                *unset_nulls(checkpoint_values(checkpoint, token)),
                item_values(request.items, checkpoint.first_item_seq),
            ),
        ))
        if facts_mark is None:  # no fact recorded: the row must not exist at all
            parts.append((
                self.cql.insert_idempotency,
                (*key, request.idempotency_key, request.response_id, request.request_digest),
            ))
        else:
            parts.append((
                self.cql.claim_marked_idempotency,
                (request.response_id, request.request_digest, *key, request.idempotency_key,
                 facts_mark),
            ))
        return parts

    # A promoted response's row not found where its claim says (``turn_lost``, rare):
    # the claim, the request's idempotency row, then the turn row at SERIAL.

    def _claim_of(self, tenant_id: str, response_id: str) -> ResponseClaim | None:
        return _guard("turn_lost/claim", lambda: self._read_claim(
            self.cql.select_claim, (tenant_id, response_id)))

    def _promoted_response(self, tenant_id: str, partition_key: str,
                           idempotency_key: str) -> str | None:
        row = self._execute("turn_lost/idempotency", self.cql.select_promoted,
                            (tenant_id, partition_key, idempotency_key)).one()
        return None if row is None else row.response_id

    def _turn_row_serial(self, tenant_id: str, partition_key: str, response_id: str) -> bool:
        row = self._execute("turn_lost/turn", self.cql.select_turn_ref_serial,
                            (tenant_id, partition_key, response_id)).one()
        return row is not None

    def _locate(self, tenant_id: str, response_id: str) -> str | None:
        row = _guard("locate", lambda: self._session.execute(
            self.cql.select_location, (tenant_id, response_id), timeout=self._timeout,
            execution_profile=self._tuple_rows)).one()
        return _claimed_partition(tenant_id, response_id, row)

    def _load_partition(self, tenant_id: str, partition_key: str) -> PartitionSnapshot | None:
        """ONE query for the checkpoints, items and head (see ``HISTORY_KINDS``).

        Read at ``read_consistency`` (LOCAL_QUORUM; QUORUM with several datacenters,
        ``store_levels``), not SERIAL: every promotion commits at the same level before
        it is reported, so a quorum read after it in the same datacenter (any, at
        QUORUM) overlaps that commit and always sees it; SERIAL would add a Paxos round only
        to also see promotions still in flight, which nobody has been told about.

        **A history longer than a page** (``HISTORY_FETCH_SIZE`` rows) is read in
        several requests, and a promotion between them shows its turn row on a later
        page with the head of the first: a turn beyond the head, which one consistent
        read never has (an outside review, session 31: a Conversation of 5 100 turns
        read while it grew answered ``CORRUPT_HISTORY`` 48 times in 52, and the read made
        again raced the same way). Such rows stand only if the head read after them
        covers them (else they stay, and the verification says ``CORRUPT_HISTORY``):
        the partition is then read once more, and the rows that raced that read too are
        left out (``as_of_head``), so the answer is the partition as of its head, whole.
        The second read is needed for a response promoted during the first: every turn
        up to the second read's head was stored before it.
        """
        return self._whole(tenant_id, partition_key, self.cql.select_partition, decode_snapshot)

    def _load_lineage(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> PartitionSnapshot | None:
        """A response's read. In a partition this store found WIDE (``_learn_width``:
        the turns outside a lineage it read held many bytes of items): the
        partition's structure (every row but its items, read as ``_load_partition``
        reads the whole), then the items of the response's lineage only. The turns of
        other forks of a chain, or a Conversation's turns after the response, are then
        most of the partition's bytes, and the answer holds none of them (an outside
        review, session 34: a 3-turn response beside 12 forks of 8 MB took 0.9 s;
        docs/decisions.md, "Reads in proportion to the answer"). Elsewhere the whole
        partition in one round trip, which costs less than two for a small one.
        Rows are never rewritten, so the two reads agree on every turn the structure
        holds; a row changed between them fails its digests, and the failure is read
        again (``_confirmed``)."""
        if self._wide.get((tenant_id, partition_key)) is None:
            snapshot = self._whole(tenant_id, partition_key, self.cql.select_partition,
                                   decode_snapshot)
            self._learn_width(snapshot, response_id)
            return snapshot
        structure = self._whole(tenant_id, partition_key, self.cql.select_structure,
                                decode_structure)
        if structure is None:
            return None
        refs = lineage_refs(structure, response_id)
        if not refs:  # not there, or damaged: verification answers from the structure
            return structure
        query = self._items_query(structure, refs)
        cells = _guard("read_history", lambda: self._rows(*query))
        return _with_lineage_items(structure, refs, cells)

    def _load_conversation(self, tenant_id: str, conversation_id: str) -> PartitionSnapshot | None:
        """A Conversation's read: the whole partition, except where a read found turns
        but no Conversation (a chain's partition, asked for by its root's id on the
        Conversation endpoint): there the structure alone says so again, with no turn's
        items (an outside review, session 36: each such 404 read a 20 x 200 KB chain
        whole). A Conversation found there after all is read whole."""
        key = (tenant_id, conversation_id)
        if self._no_conversation.get(key) is not None:
            structure = self._whole(tenant_id, conversation_id, self.cql.select_structure,
                                    decode_structure)
            if not _holds_a_conversation(structure):
                return structure
        snapshot = self._load_partition(tenant_id, conversation_id)
        self._learn_no_conversation(key, snapshot)
        return snapshot

    def _learn_no_conversation(self, key: tuple[str, str],
                               snapshot: PartitionSnapshot | None) -> None:
        if snapshot is not None and snapshot.checkpoints and not _holds_a_conversation(
                snapshot):
            self._no_conversation.put(key, True)

    def _learn_width(self, snapshot: PartitionSnapshot | None, response_id: str) -> None:
        """Remember the partition as wide when the turns outside ``response_id``'s
        lineage hold ``_WIDE_ITEM_BYTES`` of items or more. Partitions only grow: it
        stays so until evicted (LRU, ``hint_capacity``)."""
        if snapshot is None:
            return
        lineage = set(lineage_refs(snapshot, response_id))
        outside = 0
        for ref, items in snapshot.items.items():
            if ref not in lineage:
                outside += sum(len(content) for content in items.contents)
        if outside >= _WIDE_ITEM_BYTES:
            self._wide.put((snapshot.tenant_id, snapshot.partition_key), True)

    def _items_query(self, structure: PartitionSnapshot,
                     refs: list[str]) -> tuple[PreparedStatement, tuple[Any, ...]]:
        """The lineage's items by response id when it is a small part of the partition;
        else every turn's items in one slice (an ``IN`` of many keys costs more)."""
        key = (structure.tenant_id, structure.partition_key)
        if len(refs) <= _LINEAGE_IN_MAX and 2 * len(refs) < len(structure.checkpoints):
            return self.cql.select_items_of, (*key, refs)
        return self.cql.select_all_items, key

    def _whole(
        self, tenant_id: str, partition_key: str, statement: PreparedStatement,
        decode: Callable[[str, str, Sequence[Any]], PartitionSnapshot | None],
    ) -> PartitionSnapshot | None:
        """Every row of ``statement``'s partition read (all pages) and decoded, as of
        its head (see ``_load_partition``)."""
        key = (tenant_id, partition_key)

        def load() -> list[Any]:
            rows = self._rows(statement, key)
            if not rows:  # nothing but (possibly) static cells: a head without rows
                rows = self._rows(self.cql.select_static_head, key)
            return rows

        for _ in range(2):
            rows = _guard("read_history", load)
            snapshot = decode(tenant_id, partition_key, rows)
            ahead = self._ahead_across_pages(snapshot, rows, statement)
            if ahead is None:
                return snapshot
            head = self.read_head(tenant_id, partition_key)
            if head is None or head.seq < ahead:
                return snapshot  # beyond the head even now: the verification's CORRUPT
        return as_of_head(snapshot)

    @staticmethod
    def _ahead_across_pages(
        snapshot: PartitionSnapshot | None, rows: list[Any], statement: PreparedStatement
    ) -> int | None:
        """The highest seq beyond the head of a read that took several pages (None:
        one page, one consistent read, or nothing beyond the head)."""
        if snapshot is None or len(rows) <= statement.fetch_size:
            return None
        return beyond_head(snapshot)

    def _rows(self, statement: PreparedStatement, params: tuple[Any, ...]) -> list[Any]:
        """Every row (all pages) as plain tuples, or named tuples on a legacy session."""
        try:
            result = self._session.execute(
                statement, params, timeout=self._timeout, execution_profile=self._tuple_rows
            )
        except ValueError:  # the session was switched to legacy configuration since
            if self._tuple_rows is EXEC_PROFILE_DEFAULT:
                raise
            self._tuple_rows = EXEC_PROFILE_DEFAULT
            result = self._session.execute(statement, params, timeout=self._timeout)
        return list(result)
