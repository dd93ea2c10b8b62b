"""The row codec of the Cassandra backend: records <-> CQL row values, no I/O.

``services/store/cassandra.py`` sends the statements; this module says what the columns
are and how a ``CheckpointRecord``, a turn's items and a whole partition are encoded
into, and decoded from, rows of the ``turns`` table. Decoding is strict: a damaged
row raises ``ValueError`` / ``TypeError`` / ``KeyError``, and a partition read marks
that response as damaged (``PartitionSnapshot.damaged``) for verification to report.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra.query import UNSET_VALUE

from ratchet.domain.history import (
    FIRST_MS,
    LAST_MS,
    NO_ITEMS,
    CheckpointRecord,
    Head,
    PartitionSnapshot,
    PromotionMode,
    StoredTokenArtifact,
    TurnItems,
    frozen_record,
    utc_ms,
)
from ratchet.speedups import SPEEDUPS
from schemas.models import Certification, Item

CHECKPOINT_COLUMNS = (
    "response_id, seq, mode, parent_response_id, previous_response_id, idempotency_key, "
    "request_digest, certification, fingerprint_hash, token_artifact, router_receipt, "
    "boundary_proof, artifact_expires_at, logical_expires_at, promoted_at, first_item_seq, "
    "last_item_seq, items_digest, attempt_token, lineage_digest, accepted_attempt, "
    "accepted_effect_ids"
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
DECODED_CHECKPOINT_NAMES = tuple(
    name
    for name in (c.strip() for c in CHECKPOINT_COLUMNS.split(","))
    if name not in ("artifact_expires_at", "attempt_token")
)
HISTORY_COLUMNS = (
    "kind, ref, head_seq, head_response_id, head_item_count, head_lineage_digest, items, "
    f"{', '.join(DECODED_CHECKPOINT_NAMES)}"
)
# A partition's structure: every column of ``HISTORY_COLUMNS`` but the items, which
# hold nearly all of a turn's bytes. A response's read takes the structure of the whole
# partition (the rules check it), then the items of its lineage only (``with_items``).
STRUCTURE_COLUMNS = HISTORY_COLUMNS.replace(" items,", "")
# Timestamp cells are selected as epoch milliseconds (bigint), not as the drivers'
# datetimes: cassandra-driver fails a whole response, and closes its connection, on a
# timestamp it cannot make a datetime of (past year 9999: only damage writes one), so
# one damaged cell took every tenant's reads on that connection down for a moment. As
# integers they are range-checked here (``_utc``) and a bad one is a damaged row like
# any other. SELECTs name these; INSERTs the plain ``*_COLUMNS``.
_TIMESTAMP_COLUMNS = frozenset({"artifact_expires_at", "logical_expires_at", "promoted_at"})


def selected(columns: str) -> str:
    """``columns`` as a SELECT list, each timestamp as its epoch milliseconds."""
    return ", ".join(f"to_unix_timestamp({c}) AS {c}" if c in _TIMESTAMP_COLUMNS else c
                     for c in (name.strip() for name in columns.split(",")))


CHECKPOINT_SELECT = selected(CHECKPOINT_COLUMNS)
HISTORY_SELECT = selected(HISTORY_COLUMNS)
STRUCTURE_SELECT = selected(STRUCTURE_COLUMNS)
# Positions in a row of ``HISTORY_COLUMNS`` (partition reads decode plain tuples); a
# row of ``STRUCTURE_COLUMNS`` has no items and its checkpoint one place earlier.
_KIND, _REF, _HEAD_SEQ, _HEAD_RESPONSE, _HEAD_ITEMS, _HEAD_LINEAGE, _ITEMS = range(7)
_CHECKPOINT_AT = 7
# Rows a history read needs (``kind IN HISTORY_KINDS``): not the idempotency records (one per turn, never read).
# The 'head' marker keeps a Conversation's static head in the answer.
HISTORY_KINDS = "('checkpoint', 'head')"


# --- row mapping ---------------------------------------------------------------------------


def head_of(row: Any) -> Head | None:
    """The head of a row read with its head columns by name."""
    return head_from(row.head_seq, row.head_response_id, row.head_item_count,
                     row.head_lineage_digest)


def head_from(seq: int | None, response_id: str | None, item_count: int | None,
              lineage_digest: str | None) -> Head | None:
    """The head of the static head cells (none before a Conversation's first turn)."""
    if seq is None:
        return None
    return Head(seq, response_id or "", item_count or 0, lineage_digest)


def unset_nulls(values: Iterable[Any]) -> tuple[Any, ...]:
    """Absent values are left unset, not written as null: a null is a tombstone cell,
    and every read of the partition would scan it (it reads back as null all the same)."""
    return tuple([UNSET_VALUE if v is None else v for v in values])  # a list: one call,
    # where a generator resumes once per value (22 values a promotion)


def item_values(items: Sequence[Item], first_item_seq: int) -> Any:
    """The ``items`` cell of a turn row (UNSET if the turn has no items): what
    ``encode_turn_items`` makes of the items' records, written out for ``Item``'s own
    types (str fields, bytes content), one promotion's items at a time. The generic
    encoder spent a comprehension, a type test and a copy of the content per field
    (~33 calls an item); ``test_store_rows`` holds this one to it."""
    if not items:
        return UNSET_VALUE
    pack = _RECORD_HEAD.pack
    out = [_CELL_VERSION]
    for seq, item in enumerate(items, first_item_seq):
        item_id, item_type = item.item_id.encode(), item.type.encode()
        digest = item.content_digest.encode()
        role, call_id, content = item.role, item.call_id, item.content
        role_bytes = b"" if role is None else role.encode()
        call_id_bytes = b"" if call_id is None else call_id.encode()
        out += (pack(seq, item.format_version, len(item_id), len(item_type),
                     -1 if role is None else len(role_bytes),
                     -1 if call_id is None else len(call_id_bytes),
                     len(content), len(digest)),
                item_id, item_type, role_bytes, call_id_bytes, content, digest)
    return b"".join(out)


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
_CELL_VERSION = bytes((ITEMS_CELL_VERSION,))


def encode_turn_items(records: Iterable[Sequence[Any]]) -> bytes:
    """Encode item records (``ITEM_RECORD_FIELDS`` order) into an ``items`` cell.

    Encodes any value it is given, nulls included (tests use it to write damage)."""
    out = [_CELL_VERSION]
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
    """The item records of an ``items`` cell (``ITEM_RECORD_FIELDS`` order), decoded by
    ``decode_items_cell`` (tests use it to rewrite stored rows); raises ``ValueError``
    like it."""
    turn = decode_items_cell(cell)
    return [(seq, *row) for seq, row in zip(turn.seqs, turn.rows(), strict=True)]


def decode_items_cell(cell: bytes | None) -> TurnItems:
    """Decode the ``items`` cell of a turn row into its columns (``TurnItems``: no
    object per item). A null cell is a turn without items. Raises ``ValueError`` if the
    cell or an item is damaged: a wrong version, a truncated record, trailing bytes,
    invalid UTF-8, a null where a value must be (everything but role and call_id).

    In C when ``ratchet._speedups`` is built (ratchet/speedups.py), else in Python
    (``decode_items_cell_py``, the reference)."""
    if cell is None:
        return NO_ITEMS
    if SPEEDUPS is None:
        return decode_items_cell_py(cell)
    fields = SPEEDUPS.decode_items_cell(cell)  # TurnItems' fields, or None for no items
    return NO_ITEMS if fields is None else frozen_record(TurnItems, fields)


def decode_items_cell_py(cell: bytes) -> TurnItems:
    """``decode_items_cell`` in Python: the reference the C twin is tested against."""
    if not cell or cell[0] != ITEMS_CELL_VERSION:
        raise ValueError("items cell of an unknown encoding")
    unpack, head = _RECORD_HEAD.unpack_from, _RECORD_HEAD.size
    # Each field goes straight to its column (no record tuple per item to transpose
    # after): the fastest of the shapes measured (docs/decisions.md, "Cold miss").
    seqs: list[int] = []
    ids: list[str] = []
    types: list[str] = []
    roles: list[str | None] = []
    call_ids: list[str | None] = []
    contents: list[bytes] = []
    digests: list[str] = []
    formats: list[int] = []
    at, end = 1, len(cell)
    while at < end:
        if at + head > end:
            raise ValueError("items cell ends inside a record header")
        seq, format_version, l_id, l_type, l_role, l_call, l_content, l_digest = unpack(cell, at)
        if l_id < 0 or l_type < 0 or l_content < 0 or l_digest < 0:
            raise ValueError("item without id, type, content or digest")
        at += head
        stop = at + l_id
        ids.append(cell[at:stop].decode())
        at, stop = stop, stop + l_type
        types.append(cell[at:stop].decode())
        at = stop
        if l_role >= 0:
            stop = at + l_role
            roles.append(cell[at:stop].decode())
            at = stop
        else:
            roles.append(None)
        if l_call >= 0:
            stop = at + l_call
            call_ids.append(cell[at:stop].decode())
            at = stop
        else:
            call_ids.append(None)
        stop = at + l_content
        contents.append(cell[at:stop])
        at, stop = stop, stop + l_digest
        digests.append(cell[at:stop].decode())
        at = stop
        if at > end:
            raise ValueError("items cell ends inside a field")
        seqs.append(seq)
        formats.append(format_version)
    if not seqs:
        return NO_ITEMS
    # Every field of the record (tests/unit/test_store_rows.py checks a decoded one).
    return frozen_record(
        TurnItems,
        {
            "seqs": tuple(seqs),
            "ids": tuple(ids),
            "types": tuple(types),
            "roles": tuple(roles),
            "call_ids": tuple(call_ids),
            "contents": tuple(contents),
            "digests": tuple(digests),
            "formats": tuple(formats),
        },
    )


def checkpoint_values(checkpoint: CheckpointRecord, token: uuid.UUID) -> tuple[Any, ...]:
    """The turn row's checkpoint columns. The enums' values are read as ``_value_``
    (the member's value attribute, enum's own documented name for it): ``.value`` is
    a property, two Python calls each, per promoted turn."""
    artifact = checkpoint.token_artifact
    return (
        checkpoint.response_id,
        checkpoint.seq,
        checkpoint.mode._value_,
        checkpoint.parent_response_id,
        checkpoint.previous_response_id,
        checkpoint.idempotency_key,
        checkpoint.request_digest,
        checkpoint.certification._value_,
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
        checkpoint.lineage_digest,
        checkpoint.accepted_attempt,
        # An empty list is a null cell to Cassandra: unset here, () again when read
        # beside an accepted_attempt (``_decode_checkpoint``).
        list(checkpoint.accepted_effect_ids or ()) or None,
    )


_MODES = {m.value: m for m in PromotionMode}
_CERTIFICATIONS = {c.value: c for c in Certification}


# A driver timestamp's offset from the naive epoch, added to the aware one, is the same
# instant with the UTC zone: two C operations, where ``replace(tzinfo=UTC)`` parses
# keyword arguments and costs ~8x more (a 50-turn read decodes 50 timestamps).
_NAIVE_EPOCH = datetime(1970, 1, 1)
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# What decoding a damaged row raises: a missing or unknown value (KeyError, TypeError,
# ValueError), a date past the calendar's edge (OverflowError), JSON nested too deep.
DAMAGED_ROW_ERRORS = (KeyError, TypeError, ValueError, ArithmeticError, RecursionError)


def _utc(value: int | datetime) -> datetime:
    """A stored timestamp as an aware UTC datetime of whole milliseconds. Reads select
    epoch milliseconds (``selected``): range-checked, years 1-9999 as every writer
    keeps them. A row returned by a refused LWT carries the driver's datetime:
    cassandra-driver's (naive UTC, whole milliseconds) gets just the zone; the C++
    driver's (already UTC) is returned as it is (``utc_ms`` would give an equal value
    at ~10x the cost)."""
    if type(value) is int:
        if not FIRST_MS <= value <= LAST_MS:
            raise ValueError(f"timestamp {value} ms is outside years 1-9999")
        return _UTC_EPOCH + timedelta(milliseconds=value)
    if value.microsecond % 1000 == 0:
        if value.tzinfo is None:
            return _UTC_EPOCH + (value - _NAIVE_EPOCH)
        if value.tzinfo is UTC:
            return value
    return utc_ms(value)


@functools.lru_cache(maxsize=4096)
def _token_artifact(text: str) -> StoredTokenArtifact:
    """Decoded artifacts by their exact JSON (pure and immutable: safe to share)."""
    return StoredTokenArtifact.from_json(text)


def checkpoint_of(tenant_id: str, partition_key: str, row: Any) -> CheckpointRecord:
    """Decode a named checkpoint row; raises ``ValueError``/``TypeError`` if damaged."""
    return _decode_checkpoint(
        tenant_id, partition_key, tuple(getattr(row, name) for name in DECODED_CHECKPOINT_NAMES)
    )


def _decode_checkpoint(
    tenant_id: str, partition_key: str, values: Sequence[Any]
) -> CheckpointRecord:
    """Decode the ``DECODED_CHECKPOINT_NAMES`` columns of a row, in that order.

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
        lineage,
        accepted_attempt,
        accepted_effect_ids,
    ) = values
    if seq is None or first_item_seq is None or last_item_seq is None:
        raise ValueError("checkpoint row without seq or item range")
    if promoted_at is None or digest is None:
        raise ValueError("checkpoint row without promoted_at or items digest")
    return frozen_record(
        CheckpointRecord,
        {
            "tenant_id": tenant_id,
            "partition_key": partition_key,
            "response_id": response_id,
            "seq": seq,
            "mode": _MODES[mode],
            "parent_response_id": parent_response_id,
            "previous_response_id": previous_response_id,
            "idempotency_key": idempotency_key,
            "request_digest": request_digest,
            "certification": _CERTIFICATIONS[certification],
            "fingerprint_hash": fingerprint_hash,
            "token_artifact": None if token_artifact is None else _token_artifact(token_artifact),
            "router_receipt": router_receipt,
            "boundary_proof": boundary_proof,
            "first_item_seq": first_item_seq,
            "last_item_seq": last_item_seq,
            "items_digest": digest,
            "promoted_at": _utc(promoted_at),
            "logical_expires_at": None
            if logical_expires_at is None
            else _utc(logical_expires_at),
            "lineage_digest": lineage,
            "accepted_attempt": accepted_attempt,
            "accepted_effect_ids": None
            if accepted_attempt is None
            else tuple(accepted_effect_ids or ()),
        },
    )


def decode_snapshot(
    tenant_id: str, partition_key: str, rows: Sequence[Sequence[Any]]
) -> PartitionSnapshot | None:
    """Rows of ``HISTORY_COLUMNS`` (plain or named tuples, read by position)."""
    return _decode_rows(tenant_id, partition_key, rows, with_items=True)


def decode_structure(
    tenant_id: str, partition_key: str, rows: Sequence[Sequence[Any]]
) -> PartitionSnapshot | None:
    """Rows of ``STRUCTURE_COLUMNS``: every checkpoint and the head, no turn's items
    (``with_items`` adds those a read returns)."""
    return _decode_rows(tenant_id, partition_key, rows, with_items=False)


def with_items(
    snapshot: PartitionSnapshot, cells: Mapping[str, bytes | None]
) -> PartitionSnapshot:
    """``snapshot`` (a structure) with the items of the turns in ``cells`` (their
    ``items`` cells by response id), decoded as ``decode_snapshot`` does: a cell that
    cannot be decoded marks its response damaged. Turns left out hold no items."""
    items: dict[str, TurnItems] = {}
    damaged = set(snapshot.damaged)
    for ref, cell in cells.items():
        if ref not in snapshot.checkpoints:
            continue  # promoted after the structure was read: not part of this answer
        try:
            items[ref] = decode_items_cell(cell)
        except DAMAGED_ROW_ERRORS:
            damaged.add(ref)
    return dataclasses.replace(snapshot, items=items, damaged=frozenset(damaged))


def _decode_rows(
    tenant_id: str, partition_key: str, rows: Sequence[Sequence[Any]], *, with_items: bool
) -> PartitionSnapshot | None:
    if not rows:
        return None
    checkpoint_at = _CHECKPOINT_AT if with_items else _ITEMS
    checkpoints: dict[str, CheckpointRecord] = {}
    items: dict[str, TurnItems] = {}
    damaged: set[str] = set()
    for row in rows:
        if row[_KIND] != "checkpoint":
            continue
        ref = row[_REF]
        try:
            checkpoint = _decode_checkpoint(tenant_id, partition_key, row[checkpoint_at:])
            if checkpoint.response_id != ref:
                raise ValueError("checkpoint row filed under another response id")
            checkpoints[ref] = checkpoint
            if with_items:
                items[ref] = decode_items_cell(row[_ITEMS])
        except DAMAGED_ROW_ERRORS:
            damaged.add(ref)
    first = rows[0]
    head_seq = first[_HEAD_SEQ]
    begun = any(row[_KIND] == "head" for row in rows)
    if head_seq is None and not checkpoints and not damaged and not begun:
        return None  # only request facts marks: nothing promoted here yet
    return PartitionSnapshot(
        tenant_id=tenant_id,
        partition_key=partition_key,
        head=None
        if head_seq is None
        else Head(
            head_seq, first[_HEAD_RESPONSE] or "", first[_HEAD_ITEMS] or 0, first[_HEAD_LINEAGE]
        ),
        checkpoints=checkpoints,
        items=items,
        damaged=frozenset(damaged),
        conversation_begun=begun,
    )
