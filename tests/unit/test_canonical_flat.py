"""``canonical_json``'s orjson path for flat objects gives the bytes of its reference
path (``json.dumps``, sorted keys, no whitespace, UTF-8) or raises what it raised."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.canonical import canonical_json


def reference(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def outcome(encode, value: object) -> bytes | type:
    try:
        return encode(value)
    except Exception as exc:  # noqa: BLE001 - the kind of refusal is compared
        return type(exc)


_CODE_POINTS = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def test_every_code_point_is_escaped_as_the_reference_escapes_it() -> None:
    for start in range(0, len(_CODE_POINTS), 4096):
        text = "".join(_CODE_POINTS[start:start + 4096])
        value = {"k": text, text[:7]: None}
        assert canonical_json(value) == reference(value), hex(ord(text[0]))


def test_keys_sort_by_code_point_as_the_reference_sorts_them() -> None:
    for start in range(0, 0x3000):
        c = _CODE_POINTS[start]
        value = {"k" + c: 1, "k": 2, c: True, "\U0001f600" + c: False}
        assert canonical_json(value) == reference(value), hex(ord(c))


_flat_values = st.one_of(st.text(), st.integers(), st.booleans(), st.none())


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(), _flat_values, max_size=8))
def test_a_flat_object_encodes_as_the_reference_encodes_it(value: dict) -> None:
    assert canonical_json(value) == reference(value)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), st.one_of(_flat_values, st.floats(),
                                            st.lists(st.integers(), max_size=3)),
                       max_size=5))
def test_any_other_object_answers_as_the_reference_answers(value: dict) -> None:
    assert outcome(canonical_json, value) == outcome(reference, value)


@pytest.mark.parametrize("value", [
    {"a": 2 ** 64}, {"a": -(2 ** 63) - 1}, {"a": 2 ** 63},  # beyond orjson's integers
    {1: "a"}, {None: 1}, {"a": 1, 2: 3},  # keys that are not strings
    {"a": "\ud800"}, {"\udfff": 1},  # lone surrogates: no UTF-8
    {"a": 1.0}, {"a": 1e16}, {"a": float("nan")}, {"a": float("inf")},  # floats
])
def test_what_orjson_refuses_or_writes_otherwise_answers_as_the_reference(value: dict) -> None:
    assert outcome(canonical_json, value) == outcome(reference, value)


def test_a_subclass_of_str_takes_the_reference_path() -> None:
    from schemas.models import Certification

    value = {"c": Certification.CERTIFIED, "n": 3}
    assert canonical_json(value) == reference(value) == b'{"c":"certified","n":3}'
