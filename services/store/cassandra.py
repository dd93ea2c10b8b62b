"""Cassandra backend: one partition per history, one conditional batch per promotion.

Tables: ``turns`` (``infra/migrations/004_turn_rows.cql``: one row per promoted
response, its items in a list column of it) and ``response_locations``
(``001_core.cql``). The promotion batch (``_write``) is::

    UPDATE turns SET head_* = ...                                 -- Conversation mode only
        IF head_seq = ? AND head_response_id = ? AND head_item_count = ?
    UPDATE parent turn row SET seq = seq                          -- chain mode, with a parent
        IF seq = ? AND last_item_seq = ? AND mode = 'chain'
    INSERT turn row (checkpoint + items) IF NOT EXISTS            -- each response once
    INSERT idempotency row           IF NOT EXISTS                -- each key once
    INSERT head marker row (unconditional)                        -- Conversation mode only

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
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
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
from cassandra.query import (
    UNSET_VALUE,
    BatchStatement,
    BatchType,
    PreparedStatement,
    tuple_factory,
)

from ratchet.domain.history import (
    CheckpointRecord,
    Head,
    PartitionSnapshot,
    PromotionMode,
    StoredItem,
    StoredTokenArtifact,
    utc_ms,
)
from ratchet.domain.plan import IdempotencyRecord, Plan, PromotionRequest, PromotionView
from ratchet.settings import Settings
from schemas.models import Certification, Item
from services.store.base import CheckpointStore, CorruptPartition, StoreOptions, StoreUnavailable

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
# The fields of one item record in a turn row's ``items`` cell, in order (see
# ``encode_turn_items``).
ITEM_RECORD_FIELDS = (
    "item_seq",
    "item_id",
    "item_type",
    "role",
    "call_id",
    "content",
    "content_digest",
    "format_version",
)
# What a CheckpointRecord is decoded from (not artifact_expires_at, a copy of the
# artifact's own expiry, nor attempt_token, which only unknown-outcome resolution reads).
_DECODED_CHECKPOINT_NAMES = tuple(
    name
    for name in (c.strip() for c in _CHECKPOINT_COLUMNS.split(","))
    if name not in ("artifact_expires_at", "attempt_token")
)
_ALL_COLUMNS = (
    "kind, ref, head_seq, head_response_id, head_item_count, items, "
    f"{', '.join(_DECODED_CHECKPOINT_NAMES)}"
)
# Positions in a row of ``_ALL_COLUMNS`` (partition reads decode plain tuples).
_KIND, _REF, _HEAD_SEQ, _HEAD_RESPONSE, _HEAD_ITEMS, _ITEMS = range(6)
_CHECKPOINT_AT = 6
# Rows a history read needs: not the idempotency records (one per turn, never read).
# The 'head' marker keeps a Conversation's static head in the answer.
_HISTORY_KINDS = "('checkpoint', 'head')"
# One page holds any history this store accepts in practice (a 50-turn Conversation
# is 51 rows): one round trip. Longer ones page on, still verified as a whole.
_HISTORY_FETCH_SIZE = 5000


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
        table = f"{prefix}turns"
        locations = f"{prefix}response_locations"
        partition = "tenant_id = ? AND partition_key = ?"
        self._select_head = self._prepare(
            f"SELECT head_seq, head_response_id, head_item_count FROM {table} "
            f"WHERE {partition} LIMIT 1",
            serial_consistency,
        )
        self._select_view_rows = self._prepare(
            "SELECT kind, ref, head_seq, head_response_id, head_item_count, "
            f"{_CHECKPOINT_COLUMNS} FROM {table} WHERE {partition} AND (kind, ref) IN "
            "(('head', ''), ('idempotency', ?), ('checkpoint', ?), ('checkpoint', ?))",
            serial_consistency,
        )
        self._select_checkpoint_serial = self._prepare(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ?",
            serial_consistency,
        )
        self._select_checkpoint = self._prepare(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ?",
            read_consistency,
        )
        self._select_partition = self._prepare(
            f"SELECT {_ALL_COLUMNS} FROM {table} WHERE {partition} AND kind IN {_HISTORY_KINDS}",
            read_consistency,
        )
        self._select_partition.fetch_size = _HISTORY_FETCH_SIZE
        self._select_static_head = self._prepare(
            f"SELECT {_ALL_COLUMNS} FROM {table} WHERE {partition} LIMIT 1", read_consistency
        )
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
            f"head_token = ? WHERE {partition} "
            "IF head_seq = ? AND head_response_id = ? AND head_item_count = ?"
        )
        # The chain parent as a condition: its row must still hold the seq and item
        # range the plan extends. The SET rewrites the value the condition proved.
        self._check_parent = self._prepare_lwt(
            f"UPDATE {table} SET seq = ? WHERE {partition} AND kind = 'checkpoint' AND ref = ? "
            "IF seq = ? AND last_item_seq = ? AND mode = 'chain'"
        )
        # The turn row: the checkpoint and the turn's items (one blob of item
        # records, ``encode_turn_items``).
        self._insert_checkpoint = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, {_CHECKPOINT_COLUMNS}, "
            f"items) VALUES (?, ?, 'checkpoint', ?, {', '.join('?' * 20)}) IF NOT EXISTS"
        )
        self._insert_idempotency = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, response_id, "
            "request_digest) VALUES (?, ?, 'idempotency', ?, ?, ?) IF NOT EXISTS"
        )
        self._insert_head_marker = self._prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref) VALUES (?, ?, 'head', '')"
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

    def _read_view(self, request: PromotionRequest, *, located: bool = False) -> PromotionView:
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
            hint = None
            if not located:
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
            if hint is not None:
                hint.result()
            try:
                return self._view(request, head_row, rows)
            except (KeyError, TypeError, ValueError) as exc:
                raise CorruptPartition(
                    f"partition {request.partition_key} of tenant {request.tenant_id}: "
                    f"undecodable row ({exc})"
                ) from exc

        return _guard("promote/read", read)

    def start_locating(
        self, tenant_id: str, response_id: str, partition_key: str
    ) -> Callable[[], None]:
        """The location hint, sent now; the waiter makes sure it is durable (the same
        rule as ``_before_fast_write``: durable before any batch can land)."""
        future = _guard(
            "promote/locate",
            lambda: self._session.execute_async(
                self._insert_location,
                (tenant_id, response_id, partition_key),
                timeout=self._timeout,
            ),
        )
        return lambda: _guard("promote/locate", future.result)

    def _before_fast_write(self, request: PromotionRequest) -> None:
        """The location hint, durable BEFORE a batch planned from hints is sent.

        Same rule as on the read path: a promoted response is always findable by id,
        so the hint must exist before the batch can land (never only "soon after").
        """
        self._execute(
            "promote/locate",
            self._insert_location,
            (request.tenant_id, request.response_id, request.partition_key),
        )

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
            old = plan.expected_head
            expected = (
                (None, None, None) if old is None else (old.seq, old.response_id, old.item_count)
            )
            new = plan.new_head
            batch.add(
                self._advance_head,
                (new.seq, new.response_id, new.item_count, token, *key, *expected),
            )
            batch.add(self._insert_head_marker, key)
        if plan.parent is not None:
            parent = plan.parent
            batch.add(
                self._check_parent,
                (parent.seq, *key, parent.response_id, parent.seq, parent.last_item_seq),
            )
        batch.add(
            self._insert_checkpoint,
            (
                *key,
                request.response_id,
                *_unset_nulls(_checkpoint_values(checkpoint, token)),
                _item_values(request.items, checkpoint.first_item_seq),
            ),
        )
        batch.add(
            self._insert_idempotency,
            (*key, request.idempotency_key, request.response_id, request.request_digest),
        )
        return batch

    def _locate(self, tenant_id: str, response_id: str) -> str | None:
        row = self._execute("locate", self._select_location, (tenant_id, response_id)).one()
        return None if row is None else row.partition_key

    def _load_partition(self, tenant_id: str, partition_key: str) -> PartitionSnapshot | None:
        """ONE query for the checkpoints, items and head (see ``_HISTORY_KINDS``).

        Read at ``read_consistency`` (LOCAL_QUORUM), not SERIAL: every promotion
        commits at LOCAL_QUORUM before it is reported, so a quorum read after it
        overlaps that commit and always sees it; SERIAL would add a Paxos round only
        to also see promotions still in flight, which nobody has been told about.
        """
        key = (tenant_id, partition_key)

        def load() -> list[Any]:
            rows = self._rows(self._select_partition, key)
            if not rows:  # nothing but (possibly) static cells: a head without rows
                rows = self._rows(self._select_static_head, key)
            return rows

        return _snapshot(tenant_id, partition_key, _guard("read_history", load))

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


# --- row mapping ---------------------------------------------------------------------------


def _head(row: Any) -> Head | None:
    if row.head_seq is None:
        return None
    return Head(row.head_seq, row.head_response_id or "", row.head_item_count or 0)


def _unset_nulls(values: Iterable[Any]) -> tuple[Any, ...]:
    """Absent values are left unset, not written as null: a null is a tombstone cell,
    and every read of the partition would scan it (it reads back as null all the same)."""
    return tuple(UNSET_VALUE if v is None else v for v in values)


def _item_values(items: Sequence[Item], first_item_seq: int) -> Any:
    """The ``items`` cell of a turn row (UNSET if the turn has no items)."""
    if not items:
        return UNSET_VALUE
    return encode_turn_items(
        (
            first_item_seq + position,
            item.item_id,
            item.type,
            item.role,
            item.call_id,
            item.content,
            item.content_digest,
            item.format_version,
        )
        for position, item in enumerate(items)
    )


# --- the items cell: one blob of item records ------------------------------------------
#
#   cell   = version byte (1), then one record per item, in turn order, nothing after
#   record = item_seq (int64), format_version (int32), the byte lengths (int32, -1 =
#            null) of item_id, item_type, role, call_id (UTF-8), content (bytes) and
#            content_digest (UTF-8), then those six fields' bytes in that order
#
# Big-endian, like CQL's own encodings; the fixed part of a record is one struct, so
# decoding costs one unpack per item. The decoder is strict: a wrong version, a
# truncated record, trailing bytes, invalid UTF-8 or a null where a value must be
# (everything but role and call_id) raise ``ValueError``, so the turn reads as damaged
# (CORRUPT_HISTORY); what decodes is then verified item by item like any other item.
ITEMS_CELL_VERSION = 1
_RECORD_HEAD = struct.Struct(">qi6i")


def encode_turn_items(records: Iterable[Sequence[Any]]) -> bytes:
    """Encode item records (``ITEM_RECORD_FIELDS`` order) into an ``items`` cell.

    Encodes any value it is given, nulls included (tests use it to write damage)."""
    out = [bytes((ITEMS_CELL_VERSION,))]
    for seq, item_id, item_type, role, call_id, content, digest, format_version in records:
        fields = [
            None if v is None else v.encode() if isinstance(v, str) else bytes(v)
            for v in (item_id, item_type, role, call_id, content, digest)
        ]
        lengths = (-1 if f is None else len(f) for f in fields)
        out.append(_RECORD_HEAD.pack(seq, format_version, *lengths))
        out.extend(f for f in fields if f is not None)
    return b"".join(out)


def decode_turn_items(cell: bytes) -> list[tuple[Any, ...]]:
    """The item records of an ``items`` cell (``ITEM_RECORD_FIELDS`` order), nulls kept;
    raises ``ValueError`` if the cell is not exactly a sequence of whole records."""
    if not cell or cell[0] != ITEMS_CELL_VERSION:
        raise ValueError("items cell of an unknown encoding")
    unpack, head = _RECORD_HEAD.unpack_from, _RECORD_HEAD.size
    records: list[tuple[Any, ...]] = []
    at, end = 1, len(cell)
    while at < end:
        if at + head > end:
            raise ValueError("items cell ends inside a record header")
        seq, format_version, *lengths = unpack(cell, at)
        at += head
        fields: list[Any] = []
        for length in lengths:
            if length < 0:
                fields.append(None)
            else:
                fields.append(cell[at : at + length])
                at += length
        if at > end:
            raise ValueError("items cell ends inside a field")
        item_id, item_type, role, call_id, content, digest = fields
        records.append(
            (
                seq,
                None if item_id is None else item_id.decode(),
                None if item_type is None else item_type.decode(),
                None if role is None else role.decode(),
                None if call_id is None else call_id.decode(),
                content,
                None if digest is None else digest.decode(),
                format_version,
            )
        )
    return records


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


_MODES = {m.value: m for m in PromotionMode}
_CERTIFICATIONS = {c.value: c for c in Certification}


def _utc(value: datetime) -> datetime:
    """``utc_ms`` for a driver timestamp (naive UTC, whole milliseconds): just the zone."""
    if value.tzinfo is None and value.microsecond % 1000 == 0:
        return value.replace(tzinfo=UTC)
    return utc_ms(value)


@functools.lru_cache(maxsize=4096)
def _token_artifact(text: str) -> StoredTokenArtifact:
    """Decoded artifacts by their exact JSON (pure and immutable: safe to share)."""
    return StoredTokenArtifact.from_json(text)


def _checkpoint(tenant_id: str, partition_key: str, row: Any) -> CheckpointRecord:
    """Decode a named checkpoint row; raises ``ValueError``/``TypeError`` if damaged."""
    return _decode_checkpoint(
        tenant_id, partition_key, tuple(getattr(row, name) for name in _DECODED_CHECKPOINT_NAMES)
    )


def _decode_checkpoint(
    tenant_id: str, partition_key: str, values: Sequence[Any]
) -> CheckpointRecord:
    """Decode the ``_DECODED_CHECKPOINT_NAMES`` columns of a row, in that order.

    Raises ``ValueError``/``TypeError``/``KeyError`` if the row is damaged.
    """
    (
        response_id,
        seq,
        mode,
        parent_response_id,
        previous_response_id,
        idempotency_key,
        request_digest,
        certification,
        fingerprint_hash,
        token_artifact,
        router_receipt,
        boundary_proof,
        logical_expires_at,
        promoted_at,
        first_item_seq,
        last_item_seq,
        digest,
    ) = values
    if seq is None or first_item_seq is None or last_item_seq is None:
        raise ValueError("checkpoint row without seq or item range")
    if promoted_at is None or digest is None:
        raise ValueError("checkpoint row without promoted_at or items digest")
    return CheckpointRecord(
        tenant_id=tenant_id,
        partition_key=partition_key,
        response_id=response_id,
        seq=seq,
        mode=_MODES[mode],
        parent_response_id=parent_response_id,
        previous_response_id=previous_response_id,
        idempotency_key=idempotency_key,
        request_digest=request_digest,
        certification=_CERTIFICATIONS[certification],
        fingerprint_hash=fingerprint_hash,
        token_artifact=None if token_artifact is None else _token_artifact(token_artifact),
        router_receipt=router_receipt,
        boundary_proof=boundary_proof,
        first_item_seq=first_item_seq,
        last_item_seq=last_item_seq,
        items_digest=digest,
        promoted_at=_utc(promoted_at),
        logical_expires_at=None if logical_expires_at is None else _utc(logical_expires_at),
    )


_ITEM_FIELDS = frozenset(Item.model_fields)


def _construct_item(
    item_id: str,
    item_type: str,
    role: str | None,
    call_id: str | None,
    content: bytes,
    content_digest: str,
    format_version: int,
) -> Item:
    """An ``Item`` without pydantic validation: what ``model_construct`` builds when
    every field is given, minus its per-field loop (~10x cheaper). The CQL column
    types already hold, and ``verify_history`` checks every value that matters.
    ``_ITEM_CONSTRUCTION_OK`` proves at import that it equals a validated ``Item``."""
    item = Item.__new__(Item)
    _set = object.__setattr__
    _set(
        item,
        "__dict__",
        {
            "item_id": item_id,
            "type": item_type,
            "role": role,
            "call_id": call_id,
            "content": content,
            "content_digest": content_digest,
            "format_version": format_version,
        },
    )
    _set(item, "__pydantic_fields_set__", set(_ITEM_FIELDS))
    _set(item, "__pydantic_extra__", None)
    _set(item, "__pydantic_private__", None)
    return item


def _item_construction_ok() -> bool:
    args = ("i", "message", "user", None, b"{}", "d", 1)
    built = _construct_item(*args)
    fields = dict(zip(Item.model_fields, args, strict=True))
    return (
        built == Item.model_construct(**fields)
        and built.model_dump() == Item.model_construct(**fields).model_dump()
        and built.__pydantic_fields_set__ == Item.model_construct(**fields).__pydantic_fields_set__
    )


# Falls back to pydantic's own ``model_construct`` if a pydantic upgrade changed what
# a constructed model holds.
_ITEM_CONSTRUCTION_OK = _item_construction_ok()
if not _ITEM_CONSTRUCTION_OK:  # pragma: no cover - depends on the pydantic version

    def _construct_item(*args: Any) -> Item:  # type: ignore[no-redef]
        return Item.model_construct(**dict(zip(Item.model_fields, args, strict=True)))


def _stored_items(response_id: str, cell: bytes | None) -> tuple[StoredItem, ...]:
    """Decode the ``items`` cell of a turn row straight into items (the hot path of
    ``decode_turn_items``, unrolled; tests prove they agree). A null cell is a turn
    without items. Raises ``ValueError`` if the cell or an item is damaged (a null where
    a value must be, a truncated record, trailing bytes, invalid UTF-8)."""
    if cell is None:
        return ()
    if not cell or cell[0] != ITEMS_CELL_VERSION:
        raise ValueError("items cell of an unknown encoding")
    unpack, head = _RECORD_HEAD.unpack_from, _RECORD_HEAD.size
    out = []
    at, end, position = 1, len(cell), 0
    while at < end:
        if at + head > end:
            raise ValueError("items cell ends inside a record header")
        seq, format_version, l_id, l_type, l_role, l_call, l_content, l_digest = unpack(cell, at)
        if l_id < 0 or l_type < 0 or l_content < 0 or l_digest < 0:
            raise ValueError("item without id, type, content or digest")
        at += head
        stop = at + l_id
        item_id = cell[at:stop].decode()
        at, stop = stop, stop + l_type
        item_type = cell[at:stop].decode()
        at = stop
        role = call_id = None
        if l_role >= 0:
            stop = at + l_role
            role = cell[at:stop].decode()
            at = stop
        if l_call >= 0:
            stop = at + l_call
            call_id = cell[at:stop].decode()
            at = stop
        stop = at + l_content
        content = cell[at:stop]
        at, stop = stop, stop + l_digest
        content_digest = cell[at:stop].decode()
        at = stop
        if at > end:
            raise ValueError("items cell ends inside a field")
        item = _construct_item(
            item_id, item_type, role, call_id, content, content_digest, format_version
        )
        out.append(StoredItem(response_id, position, seq, item))
        position += 1
    return tuple(out)


def _snapshot(
    tenant_id: str, partition_key: str, rows: Sequence[Sequence[Any]]
) -> PartitionSnapshot | None:
    """Rows of ``_ALL_COLUMNS`` (plain or named tuples, read by position)."""
    if not rows:
        return None
    checkpoints: dict[str, CheckpointRecord] = {}
    items: dict[str, tuple[StoredItem, ...]] = {}
    damaged: set[str] = set()
    for row in rows:
        if row[_KIND] != "checkpoint":
            continue
        ref = row[_REF]
        try:
            checkpoint = _decode_checkpoint(tenant_id, partition_key, row[_CHECKPOINT_AT:])
            if checkpoint.response_id != ref:
                raise ValueError("checkpoint row filed under another response id")
            checkpoints[ref] = checkpoint
            items[ref] = _stored_items(ref, row[_ITEMS])
        except (KeyError, TypeError, ValueError):
            damaged.add(ref)
    first = rows[0]
    head_seq = first[_HEAD_SEQ]
    return PartitionSnapshot(
        tenant_id=tenant_id,
        partition_key=partition_key,
        head=None
        if head_seq is None
        else Head(head_seq, first[_HEAD_RESPONSE] or "", first[_HEAD_ITEMS] or 0),
        checkpoints=checkpoints,
        items=items,
        damaged=frozenset(damaged),
    )
