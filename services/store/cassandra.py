"""Cassandra backend: one partition per history, one conditional batch per promotion.

Tables: ``infra/migrations/001_core.cql``. The promotion batch (``_write``) is::

    UPDATE histories SET head_* = ... IF head_seq = <expected>   -- Conversation mode only
    INSERT checkpoint row            IF NOT EXISTS                -- each response once
    INSERT idempotency row           IF NOT EXISTS                -- each key once
    INSERT item rows (unconditional: applied only if every condition holds)

Cassandra allows these conditions together because they sit on different rows of
one partition (the static row and two clustering rows); the batch is then atomic
and isolated. ``IF head_seq = null`` holds for a partition that does not exist yet.

Unknown outcomes: the batch is sent with a fall-through retry policy (the driver
never re-sends it on its own). If it fails in a way that may have been applied after
all (timeouts, CAS_WRITE_UNKNOWN, a dropped connection), the checkpoint row is read
at SERIAL consistency, which completes or supersedes any in-flight Paxos round, and
its ``attempt_token`` (a fresh uuid per batch) says whether the write was ours.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from cassandra import (
    ConsistencyLevel,
    DriverException,
    InvalidRequest,
    RequestExecutionException,
    RequestValidationException,
    Unavailable,
)
from cassandra.cluster import Cluster, NoHostAvailable, Session
from cassandra.connection import ConnectionException
from cassandra.policies import FallthroughRetryPolicy
from cassandra.protocol import (
    ErrorMessage,
    IsBootstrappingErrorMessage,
    OverloadedErrorMessage,
)
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from ratchet.domain.history import (
    Certification,
    CheckpointRecord,
    Head,
    PartitionSnapshot,
    PromotionMode,
    StoredItem,
    TokenArtifact,
    utc_ms,
)
from ratchet.settings import Settings
from schemas.models import Item
from services.store.base import (
    CheckpointStore,
    CorruptPartition,
    IdempotencyRecord,
    Plan,
    PromotionRequest,
    PromotionView,
    StoreOptions,
    StoreUnavailable,
)

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


_CHECKPOINT_COLUMNS = (
    "response_id, seq, mode, parent_response_id, previous_response_id, idempotency_key, "
    "request_digest, certification, fingerprint_hash, token_artifact, router_receipt, "
    "boundary_proof, artifact_expires_at, logical_expires_at, promoted_at, first_item_seq, "
    "last_item_seq, items_digest, attempt_token"
)
_ITEM_COLUMNS = (
    "item_seq, item_id, item_type, role, call_id, content, content_digest, format_version"
)
_ALL_COLUMNS = (
    "kind, ref, pos, head_seq, head_response_id, head_item_count, "
    f"{_ITEM_COLUMNS}, {_CHECKPOINT_COLUMNS}"
)


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
    except (NoHostAvailable, RequestExecutionException, DriverException, ErrorMessage) as exc:
        raise _unavailable(operation, exc) from exc
    except OSError as exc:
        raise _unavailable(operation, exc) from exc


class CassandraCheckpointStore(CheckpointStore):
    """``CheckpointStore`` on a cassandra-driver ``Session``.

    Statements are prepared once here. ``keyspace`` qualifies the tables (default:
    the session's keyspace). Reads use ``read_consistency``; the promotion batch
    commits at ``write_consistency`` with Paxos at ``serial_consistency``.
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
    ) -> None:
        super().__init__(options)
        self._session = session
        self._timeout = timeout_s
        self._cluster = owned_cluster
        self._read_cl = read_consistency
        self._write_cl = write_consistency
        self._serial_cl = serial_consistency
        prefix = f"{keyspace}." if keyspace else ""
        table = f"{prefix}histories"
        locations = f"{prefix}response_locations"
        partition = "tenant_id = ? AND partition_key = ?"
        self._select_head = self._prepare(
            f"SELECT head_seq, head_response_id, head_item_count FROM {table} "
            f"WHERE {partition} LIMIT 1",
            serial_consistency,
        )
        self._select_view_rows = self._prepare(
            "SELECT kind, ref, request_digest, head_seq, head_response_id, head_item_count, "
            f"{_CHECKPOINT_COLUMNS} FROM {table} WHERE {partition} AND (kind, ref, pos) IN "
            "(('head', '', 0), ('idempotency', ?, 0), ('checkpoint', ?, 0), ('checkpoint', ?, 0))",
            serial_consistency,
        )
        self._select_checkpoint_serial = self._prepare(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ? AND pos = 0",
            serial_consistency,
        )
        self._select_checkpoint = self._prepare(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ? AND pos = 0",
            read_consistency,
        )
        self._select_partition = self._prepare(
            f"SELECT {_ALL_COLUMNS} FROM {table} WHERE {partition}", read_consistency
        )
        self._select_location = self._prepare(
            f"SELECT partition_key FROM {locations} WHERE tenant_id = ? AND response_id = ?",
            read_consistency,
        )
        self._insert_location = self._prepare(
            f"INSERT INTO {locations} (tenant_id, response_id, partition_key) VALUES (?, ?, ?)",
            write_consistency,
        )
        self._advance_head = self._prepare_lwt(
            f"UPDATE {table} SET head_seq = ?, head_response_id = ?, head_item_count = ?, "
            f"head_token = ? WHERE {partition} IF head_seq = ?"
        )
        self._insert_checkpoint = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, pos, {_CHECKPOINT_COLUMNS}) "
            f"VALUES (?, ?, 'checkpoint', ?, 0, {', '.join('?' * 19)}) IF NOT EXISTS"
        )
        self._insert_idempotency = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, pos, response_id, "
            "request_digest) VALUES (?, ?, 'idempotency', ?, 0, ?, ?) IF NOT EXISTS"
        )
        self._insert_head_marker = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, pos) "
            "VALUES (?, ?, 'head', '', 0)"
        )
        self._insert_item = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, pos, {_ITEM_COLUMNS}) "
            "VALUES (?, ?, 'item', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )

    @classmethod
    def connect(
        cls, settings: Settings, options: StoreOptions | None = None
    ) -> CassandraCheckpointStore:
        """A store with its own ``Cluster`` (closed by ``close``)."""
        if options is None:
            options = StoreOptions(logical_retention_s=settings.logical_retention_s)
        cluster = Cluster(list(settings.cassandra_hosts), port=settings.cassandra_port)
        session = _guard("connect", lambda: cluster.connect(settings.keyspace))
        return cls(session, options, owned_cluster=cluster)

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
        row = self._execute("head", self._select_head, (tenant_id, partition_key)).one()
        return None if row is None else _head(row)

    def get_checkpoint(self, tenant_id: str, response_id: str) -> CheckpointRecord | None:
        partition_key = self._locate(tenant_id, response_id)
        if partition_key is None:
            return None
        row = self._execute(
            "get_checkpoint", self._select_checkpoint, (tenant_id, partition_key, response_id)
        ).one()
        if row is None:
            return None
        try:
            return _checkpoint(tenant_id, partition_key, row)
        except (KeyError, TypeError, ValueError):
            return None

    # -- backend hooks ----------------------------------------------------------------------

    def _read_view(self, request: PromotionRequest) -> PromotionView:
        """The view at SERIAL in one round trip, plus the location hint in parallel.

        The rows query also asks for the ``kind='head'`` marker row every Conversation
        batch writes, so the static head columns come back with it; only a partition
        without that row (no Conversation turn yet) needs the separate head query.

        The hint is written here, before any promotion batch can land, so a promoted
        response is always findable by id. A hint for a promotion that then does not
        happen is harmless: readers verify it against the partition.
        """
        key = (request.tenant_id, request.partition_key)
        parent = request.previous_response_id or ""

        def read() -> PromotionView:
            hint = self._session.execute_async(
                self._insert_location,
                (request.tenant_id, request.response_id, request.partition_key),
                timeout=self._timeout,
            )
            rows = list(
                self._session.execute(
                    self._select_view_rows,
                    (*key, request.idempotency_key, request.response_id, parent),
                    timeout=self._timeout,
                )
            )
            head_row = next((r for r in rows if r.kind == "head"), None)
            if head_row is None and request.mode is PromotionMode.CONVERSATION:
                head_row = self._session.execute(
                    self._select_head, key, timeout=self._timeout
                ).one()
            hint.result()
            try:
                return self._view(request, head_row, rows)
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptPartition(
                    f"partition {request.partition_key} of tenant {request.tenant_id}: "
                    f"undecodable row ({exc})"
                ) from exc

        return _guard("promote/read", read)

    def _view(self, request: PromotionRequest, head_row: Any, rows: list[Any]) -> PromotionView:
        checkpoints = {
            r.ref: _checkpoint(request.tenant_id, request.partition_key, r)
            for r in rows
            if r.kind == "checkpoint"
        }
        idempotency = next(
            (
                IdempotencyRecord(r.ref, r.request_digest, r.response_id)
                for r in rows
                if r.kind == "idempotency"
            ),
            None,
        )
        original = None
        if idempotency is not None:
            original = checkpoints.get(idempotency.response_id) or self._serial_checkpoint(
                request.tenant_id, request.partition_key, idempotency.response_id
            )
        return PromotionView(
            head=None if head_row is None else _head(head_row),
            idempotency=idempotency,
            original=original,
            existing=checkpoints.get(request.response_id),
            parent=checkpoints.get(request.previous_response_id or ""),
        )

    def _serial_checkpoint(
        self, tenant_id: str, partition_key: str, response_id: str
    ) -> CheckpointRecord | None:
        row = self._session.execute(
            self._select_checkpoint_serial,
            (tenant_id, partition_key, response_id),
            timeout=self._timeout,
        ).one()
        return None if row is None else _checkpoint(tenant_id, partition_key, row)

    def _write(self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord) -> bool:
        token = uuid.uuid4()
        batch = self._batch(request, plan, checkpoint, token)
        try:
            result = self._session.execute(batch, timeout=self._timeout)
        except _NOT_APPLIED as exc:
            raise _unavailable("promote", exc) from exc
        except _MAYBE_APPLIED as exc:
            return self._resolve_unknown(request, token, exc)
        return bool(result.was_applied)

    def _resolve_unknown(
        self, request: PromotionRequest, token: uuid.UUID, cause: BaseException
    ) -> bool:
        """Did the batch with ``token`` land? A SERIAL read settles any in-flight round."""
        try:
            row = self._session.execute(
                self._select_checkpoint_serial,
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
        self, request: PromotionRequest, plan: Plan, checkpoint: CheckpointRecord, token: uuid.UUID
    ) -> BatchStatement:
        key = (request.tenant_id, request.partition_key)
        batch = BatchStatement(
            batch_type=BatchType.LOGGED,
            consistency_level=self._write_cl,
            serial_consistency_level=self._serial_cl,
            retry_policy=FallthroughRetryPolicy(),
        )
        if plan.new_head is not None:
            expected = None if plan.expected_head is None else plan.expected_head.seq
            new = plan.new_head
            batch.add(
                self._advance_head,
                (new.seq, new.response_id, new.item_count, token, *key, expected),
            )
            batch.add(self._insert_head_marker, key)
        batch.add(
            self._insert_checkpoint,
            (*key, request.response_id, *_checkpoint_values(checkpoint, token)),
        )
        batch.add(
            self._insert_idempotency,
            (*key, request.idempotency_key, request.response_id, request.request_digest),
        )
        for position, item in enumerate(request.items):
            batch.add(
                self._insert_item,
                (
                    *key,
                    request.response_id,
                    position,
                    checkpoint.first_item_seq + position,
                    item.item_id,
                    item.type,
                    item.role,
                    item.call_id,
                    item.content,
                    item.content_digest,
                    item.format_version,
                ),
            )
        return batch

    def _locate(self, tenant_id: str, response_id: str) -> str | None:
        row = self._execute("locate", self._select_location, (tenant_id, response_id)).one()
        return None if row is None else row.partition_key

    def _load_partition(self, tenant_id: str, partition_key: str) -> PartitionSnapshot | None:
        rows = self._execute("read_history", self._select_partition, (tenant_id, partition_key))
        return _snapshot(tenant_id, partition_key, list(rows))


# --- row mapping ---------------------------------------------------------------------------


def _head(row: Any) -> Head | None:
    if row.head_seq is None:
        return None
    return Head(row.head_seq, row.head_response_id or "", row.head_item_count or 0)


def _checkpoint_values(checkpoint: CheckpointRecord, token: uuid.UUID) -> tuple[Any, ...]:
    artifact = checkpoint.token_artifact
    return (
        checkpoint.response_id,
        checkpoint.seq,
        checkpoint.mode.value,
        checkpoint.parent_response_id,
        checkpoint.previous_response_id,
        checkpoint.idempotency_key,
        checkpoint.request_digest,
        checkpoint.certification.value,
        checkpoint.fingerprint_hash,
        None if artifact is None else artifact.to_json(),
        checkpoint.router_receipt,
        checkpoint.boundary_proof,
        checkpoint.artifact_expires_at,
        checkpoint.logical_expires_at,
        checkpoint.promoted_at,
        checkpoint.first_item_seq,
        checkpoint.last_item_seq,
        checkpoint.items_digest,
        token,
    )


def _optional_time(value: Any) -> Any:
    return None if value is None else utc_ms(value)


def _checkpoint(tenant_id: str, partition_key: str, row: Any) -> CheckpointRecord:
    """Decode a checkpoint row; raises ``ValueError``/``TypeError`` if it is damaged."""
    if row.seq is None or row.first_item_seq is None or row.last_item_seq is None:
        raise ValueError("checkpoint row without seq or item range")
    if row.promoted_at is None or row.items_digest is None:
        raise ValueError("checkpoint row without promoted_at or items digest")
    return CheckpointRecord(
        tenant_id=tenant_id,
        partition_key=partition_key,
        response_id=row.response_id,
        seq=row.seq,
        mode=PromotionMode(row.mode),
        parent_response_id=row.parent_response_id,
        previous_response_id=row.previous_response_id,
        idempotency_key=row.idempotency_key,
        request_digest=row.request_digest,
        certification=Certification(row.certification),
        fingerprint_hash=row.fingerprint_hash,
        token_artifact=None
        if row.token_artifact is None
        else TokenArtifact.from_json(row.token_artifact),
        router_receipt=row.router_receipt,
        boundary_proof=row.boundary_proof,
        first_item_seq=row.first_item_seq,
        last_item_seq=row.last_item_seq,
        items_digest=row.items_digest,
        promoted_at=utc_ms(row.promoted_at),
        logical_expires_at=_optional_time(row.logical_expires_at),
    )


def _stored_item(row: Any) -> StoredItem:
    """Decode an item row; raises ``ValueError`` if it is damaged."""
    if None in (row.item_seq, row.item_id, row.item_type, row.content, row.content_digest) or (
        row.format_version is None
    ):
        raise ValueError("item row without seq, content or format version")
    # model_construct skips pydantic validation (~5x cheaper for a 100-item read): the
    # CQL column types already hold, and verify_history checks every value that matters.
    item = Item.model_construct(
        item_id=row.item_id,
        type=row.item_type,
        role=row.role,
        call_id=row.call_id,
        content=row.content,
        content_digest=row.content_digest,
        format_version=row.format_version,
    )
    return StoredItem(row.ref, row.pos, row.item_seq, item)


def _snapshot(tenant_id: str, partition_key: str, rows: list[Any]) -> PartitionSnapshot | None:
    if not rows:
        return None
    checkpoints: dict[str, CheckpointRecord] = {}
    items: dict[str, list[StoredItem]] = defaultdict(list)
    damaged: set[str] = set()
    for row in rows:
        try:
            if row.kind == "checkpoint":
                checkpoint = _checkpoint(tenant_id, partition_key, row)
                if checkpoint.response_id != row.ref:
                    raise ValueError("checkpoint row filed under another response id")
                checkpoints[row.ref] = checkpoint
            elif row.kind == "item":
                items[row.ref].append(_stored_item(row))
        except (KeyError, TypeError, ValueError):
            damaged.add(row.ref)
    return PartitionSnapshot(
        tenant_id=tenant_id,
        partition_key=partition_key,
        head=_head(rows[0]),
        checkpoints=checkpoints,
        items={ref: tuple(entries) for ref, entries in items.items()},
        damaged=frozenset(damaged),
    )
