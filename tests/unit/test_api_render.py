"""The rendered history body is byte for byte what the response model renders.

The API renders a verified history straight from the loaded item columns
(``render.items_json`` over ``TurnItems``, spliced by ``history_json``), never through
one ``HistoryItem`` model per item. These tests hold it to the model rendering
(``history_outcome_body``: ``HistoryBody`` with a ``HistoryItem`` per ``Item``,
serialised by pydantic), for every item type of the catalogue and for contents that
need escaping, whether the items come from the memory backend or are decoded from
Cassandra row values (``services/store/rows.py``).
"""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from pydantic_core import to_json

from ratchet.domain.history import VerifiedHistory, verify_history
from ratchet.domain.rehydration import fallback_reason
from schemas.items import message
from services.api.render import history_json, history_outcome_body, render_history
from services.store import rows
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import T0, FakeClock, conversation_turn, uid
from tests.unit.test_catalogue import every_type_history

FP = "fp1"  # the fingerprint the store_support turns are certified for


def _escapes() -> list:
    return [
        message('héllo \u2028 "quoted" \\ </script> \x00\x1f\x7f\t\n\r\b\f', item_id=uid("m")),
        message("ünïcode ✓ \U0001f600", role="assistant", item_id=uid("m")),
        message("", role="user", item_id='id "with" \\ quotes\u00e9'),
    ]


def _promoted(items: list, per_turn: int = 3):
    """A Conversation holding ``items``, ``per_turn`` to a turn, in the memory store."""
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, conv = uid("tenant"), uid("conv")
    chunks = [tuple(items[i : i + per_turn]) for i in range(0, len(items), per_turn)]
    for seq, chunk in enumerate(chunks):
        store.promote(conversation_turn(tenant, conv, seq, items=chunk))
    return store, tenant, conv


def _row_values(store, tenant, conv) -> list[tuple]:
    """The partition as the Cassandra backend reads it: ``HISTORY_COLUMNS`` tuples
    encoded by the row codec (items cell included), timestamps naive like the
    driver's."""
    snapshot = store._load_partition(tenant, conv)
    head = snapshot.head
    names = [c.strip() for c in rows.CHECKPOINT_COLUMNS.split(",")]
    columns = [c.strip() for c in rows.HISTORY_COLUMNS.split(",")]
    out = []
    for rid, checkpoint in snapshot.checkpoints.items():
        values = dict(zip(names, rows.checkpoint_values(checkpoint, None), strict=True))
        for name in ("promoted_at", "logical_expires_at"):
            if values[name] is not None:
                values[name] = values[name].replace(tzinfo=None)
        values["items"] = rows.item_values(
            snapshot.items[rid].items(), checkpoint.first_item_seq
        )
        values.update(kind="checkpoint", ref=rid, head_seq=head.seq)
        values.update(head_response_id=head.response_id, head_item_count=head.item_count)
        values.update(head_lineage_digest=head.lineage_digest)
        out.append(tuple(values.get(c) for c in columns))
    return out


def _bodies(history: VerifiedHistory, fp: str, now):
    """(the API's spliced body, the response model's body) for the same answer."""
    expected, status = history_outcome_body(history, fp, now)
    assert status == 200
    rendered = render_history(history)
    spliced = history_json(
        rendered,
        history.checkpoint.seq,
        history.head_seq,
        fallback_reason(history.checkpoint, fp, now),
    )
    return spliced, expected.model_dump_json().encode()


@pytest.mark.parametrize("source", ["memory", "cassandra rows"])
@pytest.mark.parametrize(
    ("fp", "later"), [(FP, False), ("other-fp", False), (FP, True)], ids=["certified", "fp", "expired"]
)
def test_every_item_type_renders_as_the_model_does(source, fp, later):
    items = [*every_type_history(), *_escapes()]
    store, tenant, conv = _promoted(items)
    if source == "memory":
        history = store.read_history(tenant, conversation_id=conv, now=T0)
    else:
        snapshot = rows.decode_snapshot(tenant, conv, _row_values(store, tenant, conv))
        history = verify_history(snapshot, snapshot.head.response_id, T0)
    assert isinstance(history, VerifiedHistory)
    # The items verified and rendered are the promoted ones, in order, all types.
    assert history.items == tuple(items)
    now = T0 + timedelta(hours=2) if later else T0
    spliced, expected = _bodies(history, fp, now)
    assert spliced == expected
    assert expected.count(b'"content_digest"') == len(items)


def test_every_prefix_extended_by_its_next_turns_renders_the_same_bytes():
    """An extension's body is the cached prefix's items JSON with the new turns'
    appended: the same bytes as rendering the whole history at once."""
    from services.api.render import render_extension

    items = [*every_type_history(), *_escapes()]
    store, tenant, conv = _promoted(items, per_turn=4)
    whole = store.read_history(tenant, conversation_id=conv, now=T0)
    assert isinstance(whole, VerifiedHistory)
    for cut in range(1, len(whole.lineage)):
        prefix = verify_history(
            store._load_partition(tenant, conv), whole.lineage[cut - 1].response_id, T0
        )
        assert isinstance(prefix, VerifiedHistory)
        extended = render_extension(
            whole.checkpoint, render_history(prefix).items_json, whole.turns[cut:]
        )
        assert extended == render_history(whole)


def test_orjson_escapes_every_code_point_as_pydantic_does():
    """``items_json`` writes the body with orjson; the bytes pinned above are
    pydantic's. Every code point (surrogates cannot come from UTF-8 bytes), alone and
    in one string, serialises to the same JSON string in both."""
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    assert orjson.dumps("".join(points)) == to_json("".join(points))
    for start in range(0, len(points), 4096):
        chunk = points[start : start + 4096]
        assert orjson.dumps(chunk) == to_json(chunk)
