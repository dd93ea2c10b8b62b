"""A token_artifact cell that is JSON but not the artifact's object is a damaged row.

services/store/rows.py: a damaged row marks that response as damaged
(``PartitionSnapshot.damaged``), and verification reports it as CORRUPT_HISTORY for the
lineages that touch it, while a sibling fork of the partition is still served. The
memory store below serves its rows through the Cassandra backend's own row codec
(``checkpoint_values`` / ``encode_turn_items`` -> ``decode_snapshot``), with one cell
tampered. Found by an outside review (session 21); each test failed before its fix
(an ``AttributeError`` escaped the decoder: HTTP 500 ``INTERNAL`` for the whole partition).
"""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest

from services.store import rows
from services.store.memory import MemoryCheckpointStore
from tests.unit.test_api_cache import CachingStack, uid

_HISTORY = [c.strip() for c in rows.HISTORY_COLUMNS.split(",")]
_CHECKPOINT = [c.strip() for c in rows.CHECKPOINT_COLUMNS.split(",")]


class RowCodecStore(MemoryCheckpointStore):
    """The memory store, read back through the Cassandra row codec."""

    tampered: dict[tuple[str, str], object]

    def _rows(self, tenant_id, partition_key, only=None):
        with self._lock:
            partition = self._partitions.get((tenant_id, partition_key))
            if partition is None:
                return []
            out = []
            head = partition.head
            for rid, cp in partition.checkpoints.items():
                if only is not None and rid != only:
                    continue
                turn = partition.items[rid]
                row = dict(zip(_CHECKPOINT, rows.checkpoint_values(cp, uuid.uuid4()), strict=True))
                row.update(kind="checkpoint", ref=rid,
                           head_seq=None if head is None else head.seq,
                           head_response_id=None if head is None else head.response_id,
                           head_item_count=None if head is None else head.item_count,
                           head_lineage_digest=None if head is None else head.lineage_digest,
                           items=rows.encode_turn_items(zip(
                               turn.seqs, turn.ids, turn.types, turn.roles, turn.call_ids,
                               turn.contents, turn.digests, turn.formats, strict=True)))
                for (t_rid, column), value in getattr(self, "tampered", {}).items():
                    if t_rid == rid:
                        row[column] = value
                out.append(tuple(row[c] for c in _HISTORY))
            return out

    def _load_partition(self, tenant_id, partition_key):
        return rows.decode_snapshot(tenant_id, partition_key, self._rows(tenant_id, partition_key))

    def _load_turn(self, tenant_id, partition_key, response_id):
        return rows.decode_snapshot(
            tenant_id, partition_key, self._rows(tenant_id, partition_key, response_id))


@pytest.fixture
def forks():
    stack = CachingStack()
    stack.store.__class__ = RowCodecStore
    tenant, root = uid("tenant"), uid("resp")
    stack.chain(tenant, root, root, None)
    a = stack.chain(tenant, root, uid("resp"), root)
    b = stack.chain(tenant, root, uid("resp"), root)
    assert stack.fresh(tenant, a).status_code == 200  # the codec round-trips intact rows
    stack.store.tampered = {(b, "token_artifact"): "null"}
    return stack, tenant, root, a, b


def test_the_damaged_response_is_a_typed_corrupt_history(forks):
    stack, tenant, _, _, b = forks
    resp = stack.fresh(tenant, b)
    assert resp.json().get("reason") == "CORRUPT_HISTORY", f"{resp.status_code} {resp.text}"


def test_a_sibling_fork_is_still_served(forks):
    stack, tenant, _, a, _ = forks
    resp = stack.fresh(tenant, a)
    assert resp.status_code == 200, f"{resp.status_code} {resp.text}"


def test_decode_snapshot_reports_the_row_as_damaged():
    cell = rows.encode_turn_items([(1, "i", "message", "user", None, b"{}", "d", 1)])
    values = dict.fromkeys(_HISTORY)
    values.update(kind="checkpoint", ref="resp_a", response_id="resp_a", seq=1, mode="chain",
                  certification="certified", first_item_seq=1, last_item_seq=1,
                  promoted_at=datetime(2030, 1, 1), items_digest="d",
                  items=cell, token_artifact="[1]")
    snapshot = rows.decode_snapshot("t", "p", [tuple(values[c] for c in _HISTORY)])
    assert snapshot is not None and snapshot.damaged == frozenset({"resp_a"})
