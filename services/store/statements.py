"""Every statement the Cassandra checkpoint store sends, prepared once per store.

The CQL in one place, beside the tables it reads and writes (``infra/migrations/``):
``turns`` (one partition per history: the static head, a turn row per response, an
idempotency row per request, the head marker) and the claims tables
(``response_claims``, ``request_claims``). Reads carry the consistency they are
prepared with: ``read_consistency`` for the API's reads, ``serial_consistency`` where
a decision or an unknown outcome needs Paxos's view; the parts of the promotion batch
and the claims are LWTs, prepared by ``prepare_lwt`` so that the driver never re-sends
one by itself (their commit at the store's write consistency). The one plain write, the
facts mark, is at ``MARK_CONSISTENCY`` (QUORUM): a Paxos condition reads it. How the store sends them is ``services/store/cassandra.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from cassandra import ConsistencyLevel
from cassandra.query import PreparedStatement

from services.store.rows import (
    CHECKPOINT_COLUMNS,
    CHECKPOINT_SELECT,
    HISTORY_KINDS,
    HISTORY_SELECT,
    STRUCTURE_SELECT,
)

# One page holds any history this store accepts in practice (a 50-turn Conversation
# is 51 rows): one round trip. Longer ones page on, still verified as a whole.
HISTORY_FETCH_SIZE = 5000
# The facts mark's plain write (``set_mark``). Paxos reads a condition's cells at QUORUM
# of every datacenter's replicas (SERIAL), so a plain write it must see needs QUORUM
# too: LOCAL_QUORUM (the store's write consistency) is 2 of the 6 replicas of two
# datacenters of 3, the Paxos read 4 of 6, and the two need not share one. With every
# replica in one datacenter QUORUM is the same replicas as LOCAL_QUORUM: no cost there.
# docs/decisions.md, "Plain writes a Paxos condition reads".
MARK_CONSISTENCY = ConsistencyLevel.QUORUM
# A claim row as both claims tables return it (the key columns come back with an
# ``[applied]=false`` answer too).
CLAIM_COLUMNS = "response_id, partition_key, idempotency_key, request_digest"


class StoreStatements:
    """The store's prepared statements, by what each asks (``store.cql.select_head``)."""

    def __init__(
        self,
        prepare: Callable[[str, int], PreparedStatement],
        prepare_lwt: Callable[[str], PreparedStatement],
        *,
        keyspace: str,
        read_consistency: int,
        serial_consistency: int,
    ) -> None:
        prefix = f"{keyspace}."  # never left to the session's USE (keyspace_of says why)
        table = f"{prefix}turns"
        claims = f"{prefix}response_claims"
        partition = "tenant_id = ? AND partition_key = ?"
        self.select_head = prepare(
            f"SELECT head_seq, head_response_id, head_item_count, head_lineage_digest FROM {table} "
            f"WHERE {partition} LIMIT 1",
            serial_consistency,
        )
        self.select_view_rows = prepare(
            "SELECT kind, ref, head_seq, head_response_id, head_item_count, "
            f"head_lineage_digest, facts_mark, {CHECKPOINT_SELECT} FROM {table} "
            f"WHERE {partition} AND (kind, ref) IN "
            "(('head', ''), ('idempotency', ?), ('checkpoint', ?), ('checkpoint', ?))",
            serial_consistency,
        )
        self.select_checkpoint_serial = prepare(
            f"SELECT {CHECKPOINT_SELECT} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ?",
            serial_consistency,
        )
        self.select_checkpoint = prepare(
            f"SELECT {CHECKPOINT_SELECT} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ?",
            read_consistency,
        )
        self.select_partition = prepare(
            f"SELECT {HISTORY_SELECT} FROM {table} WHERE {partition} AND kind IN {HISTORY_KINDS}",
            read_consistency,
        )
        self.select_partition.fetch_size = HISTORY_FETCH_SIZE
        # A response's read: the partition's structure, then its lineage's items.
        self.select_structure = prepare(
            f"SELECT {STRUCTURE_SELECT} FROM {table} "
            f"WHERE {partition} AND kind IN {HISTORY_KINDS}",
            read_consistency,
        )
        self.select_structure.fetch_size = HISTORY_FETCH_SIZE
        self.select_items_of = prepare(
            f"SELECT ref, items FROM {table} WHERE {partition} AND kind = 'checkpoint' "
            "AND ref IN ?",
            read_consistency,
        )
        self.select_all_items = prepare(
            f"SELECT ref, items FROM {table} WHERE {partition} AND kind = 'checkpoint'",
            read_consistency,
        )
        self.select_all_items.fetch_size = HISTORY_FETCH_SIZE
        # The API's reads (read consistency, never SERIAL): a Conversation's head alone,
        # and one turn row (with the static head) by response id.
        self.read_head = prepare(
            f"SELECT head_seq, head_response_id, head_item_count, head_lineage_digest "
            f"FROM {table} WHERE {partition} LIMIT 1",
            read_consistency,
        )
        self.select_turn = prepare(
            f"SELECT {HISTORY_SELECT} FROM {table} "
            f"WHERE {partition} AND kind = 'checkpoint' AND ref = ?",
            read_consistency,
        )
        self.select_static_head = prepare(
            f"SELECT {HISTORY_SELECT} FROM {table} WHERE {partition} LIMIT 1", read_consistency
        )
        self.select_location = prepare(
            f"SELECT partition_key FROM {claims} WHERE tenant_id = ? AND response_id = ?",
            read_consistency,
        )
        self.select_claim = prepare(
            f"SELECT {CLAIM_COLUMNS} FROM {claims} WHERE tenant_id = ? AND response_id = ?",
            read_consistency,
        )
        self.insert_claim = prepare_lwt(
            f"INSERT INTO {claims} (tenant_id, response_id, partition_key, idempotency_key, "
            "request_digest) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self.select_claim_serial = prepare(
            f"SELECT {CLAIM_COLUMNS} FROM {claims} WHERE tenant_id = ? AND response_id = ?",
            serial_consistency,
        )
        # A chain's first response also claims its request (tenant, idempotency key):
        # the same claim, keyed by the key (request_facts.py, ``request_held``).
        request_claims = f"{prefix}request_claims"
        self.insert_request_claim = prepare_lwt(
            f"INSERT INTO {request_claims} (tenant_id, idempotency_key, response_id, "
            "partition_key, request_digest) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self.select_request_claim_serial = prepare(
            f"SELECT {CLAIM_COLUMNS} FROM {request_claims} "
            "WHERE tenant_id = ? AND idempotency_key = ?",
            serial_consistency,
        )
        self.advance_head = prepare_lwt(
            f"UPDATE {table} SET head_seq = ?, head_response_id = ?, head_item_count = ?, "
            f"head_lineage_digest = ?, head_token = ? WHERE {partition} "
            "IF head_seq = ? AND head_response_id = ? AND head_item_count = ? "
            "AND head_lineage_digest = ?"
        )
        # The chain parent as a condition: its row must still hold the seq and item
        # range the plan extends, and be filed under its own response id (a row naming
        # another is damage the view refuses, ``check_view_filing``; a hint taken before
        # it would not tell). The SET rewrites the value the condition proved.
        self.check_parent = prepare_lwt(
            f"UPDATE {table} SET seq = ? WHERE {partition} AND kind = 'checkpoint' AND ref = ? "
            "IF seq = ? AND last_item_seq = ? AND mode = 'chain' AND lineage_digest = ? "
            "AND response_id = ?"
        )
        # The turn row: the checkpoint and the turn's items (one blob of item
        # records, ``encode_turn_items``).
        self.insert_checkpoint = prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, {CHECKPOINT_COLUMNS}, "
            f"items) VALUES (?, ?, 'checkpoint', ?, {', '.join('?' * 23)}) IF NOT EXISTS"
        )
        self.insert_idempotency = prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref, response_id, "
            "request_digest) VALUES (?, ?, 'idempotency', ?, ?, ?) IF NOT EXISTS"
        )
        # The request's idempotency row when facts were recorded before it: the mark
        # the caller decided with is a condition, and no request may own the key yet.
        self.claim_marked_idempotency = prepare_lwt(
            f"UPDATE {table} SET response_id = ?, request_digest = ? WHERE {partition} "
            "AND kind = 'idempotency' AND ref = ? IF response_id = null AND facts_mark = ?"
        )
        idempotency_row = f"{partition} AND kind = 'idempotency' AND ref = ?"
        # A plain write whose value a Paxos condition decides on (``IF facts_mark = ?``
        # above, and the view's SERIAL read): at MARK_CONSISTENCY, never the store's
        # write consistency (see MARK_CONSISTENCY).
        self.set_mark = prepare(
            f"UPDATE {table} SET facts_mark = ? WHERE {idempotency_row}", MARK_CONSISTENCY
        )
        # A claim's mark (``mark_claim``): not once a response is bound to the key, in
        # one Paxos round with the promotion batch that binds it.
        self.set_mark_unless_promoted = prepare_lwt(
            f"UPDATE {table} SET facts_mark = ? WHERE {idempotency_row} "
            # Both are set together by a promotion: the refusal returns them both.
            "IF response_id = null AND request_digest = null"
        )
        self.select_mark = prepare(
            f"SELECT facts_mark FROM {table} WHERE {idempotency_row}", read_consistency
        )
        # ``turn_lost``: the response the request promoted, and its turn row at SERIAL
        # (completes a promotion in flight: a row only late is not lost).
        self.select_promoted = prepare(
            f"SELECT response_id FROM {table} WHERE {idempotency_row}", read_consistency
        )
        self.select_turn_ref_serial = prepare(
            f"SELECT ref FROM {table} WHERE {partition} AND kind = 'checkpoint' AND ref = ?",
            serial_consistency,
        )
        # A Conversation's first batch only: the marker must not exist yet, so a
        # partition whose head cells were lost (damage) is not begun again over its
        # turns (the refusal's view reads the marker: ``CorruptPartition``).
        self.insert_head_marker = prepare_lwt(
            f"INSERT INTO {table} (tenant_id, partition_key, kind, ref) VALUES (?, ?, 'head', '') "
            "IF NOT EXISTS"
        )

