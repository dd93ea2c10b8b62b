"""A record's range check runs the loops of its nested records of ints (and of its
arrays of them) itself instead of calling their checks (``avro_ranges._nested``). It
must answer exactly what the called checks did: every int, long and timestamp of the
top-level records, at every depth, one beyond each end of its range, through the
inlined check and through one derived with nothing inlined."""

from __future__ import annotations

from typing import Any

import pytest

from ratchet.samples import make_tool_effect, make_tool_loop_turn, make_turn, make_turn_cancelled
from schemas import avro_ranges, avsc
from schemas.models import RouterReceipt

_RECEIPT = RouterReceipt(receipt_id="r", router_key_format="k", covered_tokens=3,
                         expires_at=1_800_000_000_000, issuer="i")


def _samples() -> list[tuple[str, dict[str, Any]]]:
    turn = make_turn(router_receipt=_RECEIPT)
    loop_turn, effects = make_tool_loop_turn(rounds=2, total_items=8)
    assert loop_turn.subturns and turn.boundary_proof and turn.token_artifact
    return [("TurnCompleted", turn.to_avro()), ("TurnCompleted", loop_turn.to_avro()),
            ("ToolEffect", effects[0].to_avro()),
            ("ToolEffect", make_tool_effect("call_1", idempotency_key="i").to_avro()),
            ("TurnCancelled", make_turn_cancelled(turn).to_avro())]


def _int_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """The path of every int (not bool) in a decoded dict."""
    if isinstance(value, dict):
        return [p for key, inner in value.items() for p in _int_paths(inner, (*path, key))]
    if isinstance(value, list | tuple):
        return [p for i, inner in enumerate(value) for p in _int_paths(inner, (*path, i))]
    return [path] if type(value) is int else []


def _with(data: Any, path: tuple, new: int) -> Any:
    if not path:
        return new
    copy = dict(data) if isinstance(data, dict) else list(data)
    copy[path[0]] = _with(data[path[0]], path[1:], new)
    return copy


def _nothing_inlined(record: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patched:
        patched.setattr(avro_ranges, "_nested", lambda name, found: (name, found, None, None,
                                                                     None))
        return avro_ranges._compile(avsc.inlined(record), {}, avsc.NAMESPACE)


@pytest.mark.parametrize("index", range(5))
def test_the_inlined_check_answers_as_the_called_checks(index, monkeypatch):
    record, data = _samples()[index]
    inlined = avro_ranges.range_check(record)
    called = _nothing_inlined(record, monkeypatch)
    assert inlined(data) is None and called(data) is None
    paths = _int_paths(data)
    assert any(len(p) > 1 for p in paths) or record == "TurnCancelled"  # nested ones
    beyond = (2**31, -(2**31) - 1, 2**63, -(2**63) - 1, avro_ranges.INSTANT_RANGE[1] + 1,
              avro_ranges.INSTANT_RANGE[0] - 1)
    refused = 0
    for path in paths:
        for value in beyond:
            answer = inlined(_with(data, path, value))
            assert answer == called(_with(data, path, value)), (path, value)
            if answer is not None:
                refused += 1
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
                assert answer.startswith(f"{where} = {value!r}: outside "), answer
    assert refused >= len(paths)  # every nested int refused for some value


def test_the_nested_records_and_arrays_of_ints_are_inlined():
    check = avro_ranges.range_check("TurnCompleted")
    nested = {name: (inner, items) for name, inner, _s, _i, items
              in check.nested}  # type: ignore[attr-defined]
    assert nested["fingerprint"][0] is None and nested["token_artifact"][0] is None
    assert nested["output_items"][1] == [("format_version", -(2**31), 2**31 - 1)]


_STAMP = {"type": "long", "logicalType": "timestamp-millis"}
# Shapes ratchet's schemas do not have yet (an outside review, session 50): a nested
# record of instants alone, one used twice, optional arrays of flat records, a map of
# them, and recursive records (a recursive use is compiled before its record is
# complete: it must be called, never inlined half-built).
_SHAPES = {"type": "record", "name": "Shapes", "fields": [
    {"name": "stamp", "type": ["null", {"type": "record", "name": "Stamp", "fields": [
        {"name": "at", "type": _STAMP}, {"name": "label", "type": "string"}]}]},
    {"name": "leaf", "type": {"type": "record", "name": "Leaf", "fields": [
        {"name": "a", "type": "int"}, {"name": "t", "type": ["null", _STAMP]},
        {"name": "b", "type": ["null", "long"]}]}},
    {"name": "again", "type": ["null", "Leaf"]},
    {"name": "flats", "type": ["null", {"type": "array", "items": {
        "type": "record", "name": "Flat", "fields": [{"name": "v", "type": "int"}]}}]},
    {"name": "by_key", "type": {"type": "map", "values": "Flat"}},
    {"name": "node", "type": ["null", {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}, {"name": "x", "type": "int"}]}]},
]}
_SHAPED = {"stamp": {"at": 5, "label": "s"}, "leaf": {"a": 1, "t": None, "b": 2},
           "again": {"a": 3, "t": 4, "b": None}, "flats": [{"v": 1}, None, {"v": 2}],
           "by_key": {"k": {"v": 3}}, "node": {"next": {"next": None, "x": 6}, "x": 7}}


def test_the_inlined_check_answers_as_the_called_checks_on_other_shapes(monkeypatch):
    inlined = avro_ranges._compile(_SHAPES, {}, avsc.NAMESPACE)
    called = _nothing_inlined_of(_SHAPES, monkeypatch)
    inlined_fields = {name for name, inner, *_ in inlined.nested if inner is None}
    assert inlined_fields == {"stamp", "leaf", "again", "flats"}  # node: recursive
    assert inlined(_SHAPED) is None and called(_SHAPED) is None
    for path in _int_paths(_SHAPED):
        for value in (2**31, -(2**63) - 1, avro_ranges.INSTANT_RANGE[1] + 1):
            changed = _with(_SHAPED, path, value)
            assert inlined(changed) == called(changed), (path, value)
    for name in ("stamp", "again", "flats", "node"):  # a null branch is skipped
        assert inlined({**_SHAPED, name: None}) is None
    assert inlined({**_SHAPED, "flats": []}) is None
    two_bad = _with(_with(_SHAPED, ("node", "next", "x"), 2**31), ("leaf", "b"), 2**63)
    assert inlined(two_bad) == called(two_bad) == (  # the first in field order
        f".leaf.b = {2**63}: outside the 64-bit range of an Avro long")


def _nothing_inlined_of(schema: dict, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patched:
        patched.setattr(avro_ranges, "_nested", lambda name, found: (name, found, None, None,
                                                                     None))
        return avro_ranges._compile(schema, {}, avsc.NAMESPACE)
