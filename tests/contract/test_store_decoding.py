"""The Cassandra backend's row decoding shortcuts equal the slow, validated way."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from services.store import cassandra as backend
from tests.contract.store_support import item


def test_constructed_item_equals_a_validated_item():
    assert backend._ITEM_CONSTRUCTION_OK
    original = item("hello", role=None)
    built = backend._construct_item(
        original.item_id,
        original.type,
        original.role,
        original.call_id,
        original.content,
        original.content_digest,
        original.format_version,
    )
    assert built == original and hash(built) == hash(original)
    assert built.model_dump() == original.model_dump()
    assert built.digest_ok()


def test_driver_timestamps_decode_like_utc_ms():
    naive = datetime(2030, 1, 1, 12, 0, 0, 123000)
    aware = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert backend._utc(naive) == backend.utc_ms(naive) == naive.replace(tzinfo=UTC)
    assert backend._utc(aware) == backend.utc_ms(aware)
    assert backend._utc(naive).tzinfo is UTC


def test_damaged_rows_are_reported_not_raised():
    columns = [c.strip() for c in backend._ALL_COLUMNS.split(",")]
    row = dict.fromkeys(columns)
    row.update(kind="checkpoint", ref="resp_a", pos=0, head_seq=1, head_response_id="resp_a")
    row.update(head_item_count=1, response_id="resp_a", seq=1, mode="nonsense")
    row.update(certification="certified", first_item_seq=1, last_item_seq=1)
    row.update(promoted_at=datetime(2030, 1, 1), items_digest="d", attempt_token=uuid.uuid4())
    item_row = dict.fromkeys(columns)
    item_row.update(kind="item", ref="resp_a", pos=0, item_seq=1, item_id="i", item_type="message")
    snapshot = backend._snapshot(
        "t", "p", [tuple(row[c] for c in columns), tuple(item_row[c] for c in columns)]
    )
    assert snapshot is not None and snapshot.damaged == frozenset({"resp_a"})
    assert snapshot.head is not None and snapshot.head.seq == 1
