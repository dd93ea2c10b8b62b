"""The row codec of the Cassandra backend (services/store/rows.py): its decoding
shortcuts equal the slow, validated way."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from ratchet.domain import history
from ratchet.domain.history import NO_ITEMS, StoredTokenArtifact, TurnItems
from schemas.models import Item
from services.store import rows as backend
from tests.contract.store_support import item


def test_turn_items_give_back_the_items_they_were_built_from():
    original = (item("hello", role=None), item("bye"))
    turn = TurnItems.of(original, first_item_seq=5)
    assert turn.seqs == (5, 6) and len(turn) == 2
    assert turn.items() == original
    assert [i.model_dump() for i in turn.items()] == [i.model_dump() for i in original]
    assert all(i.digest_ok() for i in turn.items())
    assert TurnItems.of_entries(turn.entries()) == turn


def test_driver_timestamps_decode_like_utc_ms():
    naive = datetime(2030, 1, 1, 12, 0, 0, 123000)
    aware = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert backend._utc(naive) == backend.utc_ms(naive) == naive.replace(tzinfo=UTC)
    assert backend._utc(aware) == backend.utc_ms(aware)
    assert backend._utc(naive).tzinfo is UTC


def _row(**values):
    columns = [c.strip() for c in backend.HISTORY_COLUMNS.split(",")]
    row = dict.fromkeys(columns)
    row.update(values)
    return tuple(row[c] for c in columns)


def _turn_row(ref, **values):
    fields = dict(kind="checkpoint", ref=ref, head_seq=1, head_response_id="resp_a")
    fields.update(head_item_count=1, response_id=ref, seq=1, mode="conversation")
    fields.update(certification="certified", first_item_seq=1, last_item_seq=1)
    fields.update(promoted_at=datetime(2030, 1, 1), items_digest="d")
    fields.update(values)
    return _row(**fields)


def test_damaged_rows_are_reported_not_raised():
    good_item = backend.encode_turn_items([(1, "i", "message", "user", None, b"{}", "d", 1)])
    null_content = backend.encode_turn_items([(1, "i", "message", "user", None, None, "d", 1)])
    snapshot = backend.decode_snapshot(
        "t",
        "p",
        [
            _turn_row("resp_a", mode="nonsense", items=good_item),
            _turn_row("resp_b", items=null_content),
            _turn_row("resp_c", items=good_item),
            _row(kind="head", ref="", head_seq=1, head_response_id="resp_a"),
        ],
    )
    assert snapshot is not None and snapshot.damaged == frozenset({"resp_a", "resp_b"})
    assert snapshot.head is not None and snapshot.head.seq == 1
    stored = snapshot.items["resp_c"]
    assert stored.seqs == (1,) and stored.ids == ("i",) and stored.contents == (b"{}",)
    assert stored.roles == ("user",) and stored.call_ids == (None,)


def test_a_structure_and_its_items_decode_as_the_whole_rows_do():
    """A response's read: the rows without their items (``decode_structure``), then
    some turns' items cells (``with_items``): the same checkpoints, head and damage as
    ``decode_snapshot`` of the whole rows, for the turns whose items are given."""
    good = backend.encode_turn_items([(1, "i", "message", "user", None, b"{}", "d", 1)])
    whole = [
        _turn_row("resp_a", items=good),
        _turn_row("resp_b", items=b"\x09damaged"),
        _turn_row("resp_c", mode="nonsense", items=good),
        _turn_row("resp_d", items=good),
        _row(kind="head", ref="", head_seq=1, head_response_id="resp_a"),
    ]
    columns = [c.strip() for c in backend.HISTORY_COLUMNS.split(",")]
    at = columns.index("items")
    structure = backend.decode_structure("t", "p", [r[:at] + r[at + 1:] for r in whole])
    expected = backend.decode_snapshot("t", "p", whole)
    assert structure is not None and expected is not None
    assert structure.checkpoints == expected.checkpoints and structure.head == expected.head
    assert structure.items == {} and structure.damaged == frozenset({"resp_c"})
    cells = {r[1]: r[at] for r in whole if r[0] == "checkpoint"}
    given = backend.with_items(structure, {ref: cells[ref] for ref in ("resp_a", "resp_b")})
    assert given.items == {"resp_a": expected.items["resp_a"]}
    assert given.damaged == frozenset({"resp_b", "resp_c"})
    # A cell of a turn the structure does not hold (promoted after it) is left out.
    assert backend.with_items(structure, {"resp_z": good}).items == {}


def test_decoded_records_equal_records_built_by_their_constructors():
    """``history.frozen_record`` skips the dataclasses' ``__init__``: every field must
    still be there (a field added to a record but not to the decoder fails here) and
    equal."""
    assert history._frozen_records_ok()
    cell = backend.encode_turn_items([(1, "i", "message", "user", None, b"{}", "d", 1)])
    snapshot = backend.decode_snapshot("t", "p", [_turn_row("resp_a", items=cell)])
    assert snapshot is not None
    checkpoint = snapshot.checkpoints["resp_a"]
    stored = snapshot.items["resp_a"]
    artifact = StoredTokenArtifact("a", "th", 3, 2, "fp", datetime(2030, 1, 1, tzinfo=UTC))
    assert StoredTokenArtifact.from_json(artifact.to_json()) == artifact
    for record in (checkpoint, stored, StoredTokenArtifact.from_json(artifact.to_json())):
        rebuilt = dataclasses.replace(record)  # the generated __init__, every field read
        assert rebuilt == record and hash(rebuilt) == hash(record)
        assert vars(rebuilt) == vars(record)


def test_a_null_items_cell_is_a_turn_without_items():
    snapshot = backend.decode_snapshot("t", "p", [_turn_row("resp_a", items=None)])
    assert snapshot is not None and snapshot.items["resp_a"] == NO_ITEMS
    assert snapshot.damaged == frozenset()


def test_items_cell_round_trips_and_refuses_damage():
    records = [
        (7, "item_a", "message", "user", None, b"\x00{}\xff", "d1", 1),
        (8, "item_\u00e9", "function_call", None, "call_1", b"", "d2", 2),
    ]
    cell = backend.encode_turn_items(records)
    assert backend.decode_turn_items(cell) == records
    assert backend.decode_turn_items(backend.encode_turn_items([])) == []
    for damaged in (
        b"",  # no version byte
        b"\x02" + cell[1:],  # unknown encoding
        cell[:-1],  # truncated inside a field
        cell[:20],  # truncated inside a length
        cell + b"\x00",  # trailing bytes
        cell[:13] + b"\x7f" + cell[14:],  # a length pointing past the end
    ):
        with pytest.raises(ValueError):
            backend.decode_turn_items(damaged)
    bad_utf8 = backend.encode_turn_items([(1, b"\xff", "message", None, None, b"", "d", 1)])
    null_digest = backend.encode_turn_items([(1, "i", "message", None, None, b"", None, 1)])
    null_id = backend.encode_turn_items([(1, None, "message", None, None, b"", "d", 1)])
    null_type = backend.encode_turn_items([(1, "i", None, None, None, b"", "d", 1)])
    null_content = backend.encode_turn_items([(1, "i", "message", None, None, None, "d", 1)])
    for damaged in (bad_utf8, null_digest, null_id, null_type, null_content):
        with pytest.raises(ValueError):
            backend.decode_turn_items(damaged)
        with pytest.raises(ValueError):
            backend.decode_items_cell(damaged)
    # the read path's columns are the records, field by field
    turn = backend.decode_items_cell(cell)
    columns = (turn.seqs, turn.ids, turn.types, turn.roles, turn.call_ids)
    columns += (turn.contents, turn.digests, turn.formats)
    assert list(zip(*columns, strict=True)) == records
    assert backend.decode_items_cell(None) == NO_ITEMS


def test_a_promotions_items_cell_is_the_generic_encoders():
    """``item_values`` (the promotion's own encoder) writes what ``encode_turn_items``
    (the generic one, the decoder's reference) makes of the same records: nulls,
    non-ASCII text, empty and binary content, another format version."""
    items = (
        Item(item_id="item_a", type="message", role="user", content=b'{"a": 1}',
             content_digest="d1"),
        Item(item_id="item_\u00e9\u4e2d", type="function_call", role=None, call_id="call_\u00e9",
             content=b"", content_digest="d\u00e92", format_version=2),
        Item(item_id="i", type="reasoning", role="assistant", call_id="c", content=b"\x00\xff",
             content_digest=""),
        Item(item_id="j", type="function_call_output", call_id="", content=b"{}",
             content_digest="d4"),
    )
    for first_seq, turn in ((1, items), (41, items[1:]), (7, items[:1])):
        records = [(first_seq + n, i.item_id, i.type, i.role, i.call_id, i.content,
                    i.content_digest, i.format_version) for n, i in enumerate(turn)]
        cell = backend.item_values(turn, first_seq)
        assert cell == backend.encode_turn_items(records)
        assert backend.decode_turn_items(cell) == records
    assert backend.item_values((), 1) is backend.UNSET_VALUE


def test_utc_ms_gives_what_it_gave_before_its_shortcut():
    """``utc_ms`` returns a moment already aware in UTC and whole in milliseconds as it
    is (since session 46); every other moment goes through the conversion, and both
    give what the conversion alone gives, zone and fold included."""
    from datetime import timedelta, timezone

    def converted(moment):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
        return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)

    plus_two = timezone(timedelta(hours=2))
    moments = [
        datetime(2030, 1, 1, 12, 0, 0, 123000, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, 0, 123000),
        datetime(2030, 1, 1, 12, 0, 0, 999999),
        datetime(2030, 1, 1, 14, 0, 0, 5000, tzinfo=plus_two),
        datetime(2030, 1, 1, 14, 0, 0, 5001, tzinfo=plus_two),
        datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone(timedelta(0))),
        datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0, 0, 1000, tzinfo=UTC, fold=1),
    ]
    for moment in moments:
        got, want = backend.utc_ms(moment), converted(moment)
        assert got == want and got.tzinfo is want.tzinfo is UTC
        assert got.microsecond % 1000 == 0 and got.fold == want.fold
        assert got.isoformat() == want.isoformat()


@pytest.mark.parametrize("mode", list(history.PromotionMode))
@pytest.mark.parametrize("certification", list(history.Certification))
def test_a_checkpoints_enum_cells_are_their_values_as_plain_text(mode, certification):
    """``checkpoint_values`` reads the enums' ``_value_`` (session 46, not the ``value``
    property): the cells are still each member's value, as plain ``str``."""
    cp = history.CheckpointRecord(
        tenant_id="t", partition_key="c", response_id="r", seq=1, mode=mode,
        parent_response_id=None, previous_response_id=None, idempotency_key="k",
        request_digest="d" * 64, certification=certification, fingerprint_hash=None,
        token_artifact=None, router_receipt=None, boundary_proof=None, first_item_seq=1,
        last_item_seq=1, items_digest="e" * 64, promoted_at=datetime(2026, 1, 1, tzinfo=UTC))
    values = backend.checkpoint_values(cp, None)
    assert (values[2], values[7]) == (mode.value, certification.value)
    assert type(values[2]) is str and type(values[7]) is str
