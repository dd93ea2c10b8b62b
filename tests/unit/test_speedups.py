"""The C twins (ratchet/_speedups.c) against their Python references.

Each C function must give what its Python twin gives for the same input, valid or
damaged: the same value, or an error of the same kind (the callers catch ValueError
and report the row damaged; nothing reads the message). Hypothesis writes the inputs;
the damage is random truncation, random bytes and random lengths. In CI the C module
must be built (no silent fall-back to the slower path the benchmarks do not measure).
"""

from __future__ import annotations

import hashlib
import json
import os

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ratchet import speedups
from ratchet.domain import history
from ratchet.domain.catalogue import json_object
from ratchet.settings import SettingsError
from services.api import render
from services.store import rows

C = speedups.load()


@pytest.fixture(scope="module")
def c():
    if C is None:
        if os.environ.get("CI"):
            pytest.fail("ratchet._speedups is not built (needs gcc, Python and OpenSSL headers)")
        pytest.skip("ratchet._speedups is not built here")
    return C


def test_ci_builds_the_c_module_and_the_read_path_uses_it():
    if not os.environ.get("CI"):
        pytest.skip("outside CI the C module is optional")
    assert C is not None, "ratchet._speedups is not built (needs gcc, Python and OpenSSL headers)"
    assert speedups.SPEEDUPS is C


def test_the_switch_turns_the_c_module_off_and_refuses_other_values(monkeypatch):
    monkeypatch.setenv("RATCHET_SPEEDUPS", "0")
    assert speedups.load() is None
    monkeypatch.setenv("RATCHET_SPEEDUPS", "1")
    assert speedups.load() is C
    for bad in ("", "yes", "2"):
        monkeypatch.setenv("RATCHET_SPEEDUPS", bad)
        with pytest.raises(SettingsError, match="RATCHET_SPEEDUPS"):
            speedups.load()


def test_processes_say_which_twins_they_run(monkeypatch):
    assert speedups.describe() == (
        "C (ratchet._speedups)" if speedups.SPEEDUPS is not None
        else "Python (ratchet._speedups is not built: slower history reads, the same answers)"
    )
    monkeypatch.setattr(speedups, "SPEEDUPS", None)
    monkeypatch.setenv("RATCHET_SPEEDUPS", "0")
    assert speedups.describe() == "Python (RATCHET_SPEEDUPS=0)"


# --- strategies -----------------------------------------------------------------------

texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


exact_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)


@st.composite
def json_object_bytes(draw):
    """A JSON object written in one of several styles (spacing, escaping)."""
    value = draw(st.dictionaries(texts, json_values, max_size=5))
    style = draw(st.sampled_from(["orjson", "ascii", "spaced", "plain"]))
    if style == "orjson":
        return orjson.dumps(value)
    if style == "ascii":
        return json.dumps(value).encode()
    if style == "spaced":
        return (" \n" + json.dumps(value, indent=2, ensure_ascii=False) + "\t\r ").encode()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


contents = json_object_bytes() | st.binary(max_size=40) | json_values.map(
    lambda v: json.dumps(v).encode()
)


@st.composite
def mutated(draw, strategy):
    """A value of ``strategy``, maybe damaged: a byte changed, inserted or cut."""
    data = draw(strategy)
    how = draw(st.sampled_from(["none", "flip", "insert", "cut"]))
    if how == "none" or not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    if how == "flip":
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    if how == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=3)) + data[at:]
    return data[:at]


records = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        texts,
        texts,
        st.none() | texts,
        st.none() | texts,
        st.binary(max_size=30),
        texts,
        st.integers(-(2**31), 2**31 - 1),
    ),
    max_size=5,
)


def _outcome(fn, *args):
    """("ok", value) or ("error", the error's kind) of ``fn(*args)``."""
    try:
        return "ok", fn(*args)
    except ValueError:  # UnicodeDecodeError included: the callers catch ValueError
        return "error", ValueError
    except TypeError:
        return "error", TypeError


# --- the items cell ----------------------------------------------------------------------


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(records=records, damage=st.data())
def test_decode_items_cell_agrees_with_python_on_valid_and_damaged_cells(c, records, damage):
    cell = rows.encode_turn_items(records)
    assert _outcome(rows.decode_items_cell, cell) == _outcome(rows.decode_items_cell_py, cell)
    assert rows.decode_turn_items(cell) == [tuple(r) for r in records]
    damaged = damage.draw(mutated(st.just(cell)))
    assert _outcome(rows.decode_items_cell, damaged) == _outcome(rows.decode_items_cell_py, damaged)


def test_decode_items_cell_refuses_what_python_refuses(c):
    good = rows.encode_turn_items([(1, "i", "message", None, None, b"{}", "d", 1)])
    for damaged in (
        b"",
        b"\x02" + good[1:],
        good[:-1],
        good[:20],
        good + b"\x00",
        rows.encode_turn_items([(1, b"\xff", "message", None, None, b"", "d", 1)]),
        rows.encode_turn_items([(1, "i", "message", None, None, b"", None, 1)]),
        rows.encode_turn_items([(1, "i", "message", None, None, None, "d", 1)]),
    ):
        with pytest.raises(ValueError):
            c.decode_items_cell(damaged)
        with pytest.raises(ValueError):
            rows.decode_items_cell_py(damaged)


# --- digests -------------------------------------------------------------------------------


@given(ids=st.lists(texts, max_size=6), digests=st.lists(texts, max_size=6))
def test_ids_digest_agrees_with_python(c, ids, digests):
    assert c.ids_digest(ids, digests) == history.ids_digest_py(ids, digests)
    assert c.ids_digest(tuple(ids), tuple(digests)) == history.ids_digest_py(ids, digests)


@given(parent=st.none() | st.just("") | texts, digest=texts)
def test_lineage_digest_agrees_with_python(c, parent, digest):
    assert c.lineage_digest(parent or None, digest) == history.lineage_digest_py(parent, digest)
    assert history.lineage_digest(parent, digest) == history.lineage_digest_py(parent, digest)


@given(blobs=st.lists(st.binary(max_size=300), max_size=8), data=st.data())
def test_first_digest_mismatch_agrees_with_python(c, blobs, data):
    digests = [hashlib.sha256(b).hexdigest() for b in blobs]
    assert c.first_digest_mismatch(blobs, digests) == -1
    if blobs:
        bad = data.draw(st.integers(0, len(blobs) - 1))
        wrong = data.draw(st.sampled_from(["upper", "other", "short"]))
        digests[bad] = {
            "upper": digests[bad].upper(),
            "other": hashlib.sha256(blobs[bad] + b"x").hexdigest(),
            "short": digests[bad][:-1],
        }[wrong]
        assume(digests[bad] != hashlib.sha256(blobs[bad]).hexdigest())
        want = history.first_digest_mismatch_py(blobs, digests)
        assert c.first_digest_mismatch(blobs, digests) == want <= bad


def test_digest_helpers_refuse_what_python_refuses(c):
    with pytest.raises(ValueError):
        c.first_digest_mismatch([b"a"], [])
    with pytest.raises(ValueError):
        history.first_digest_mismatch_py([b"a"], [])
    with pytest.raises(UnicodeEncodeError):
        c.ids_digest(["\ud800"], ["d"])
    with pytest.raises(UnicodeEncodeError):
        history.ids_digest_py(["\ud800"], ["d"])


# --- the JSON-object checker and the items array --------------------------------------------


def _python_accepts(content: bytes) -> bool:
    if json_object(content) is None:
        return False
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=500)
@given(content=mutated(contents))
def test_the_checker_accepts_only_what_python_accepts(c, content):
    if c.is_json_object(content):
        assert _python_accepts(content)


@given(value=st.dictionaries(texts, exact_values, max_size=5), ascii_only=st.booleans())
def test_the_checker_is_sure_of_json_objects_without_exponents(c, value, ascii_only):
    """The fast path is taken for what items hold: every object without a number in
    exponent form (those, Python decides), escaped or not."""
    assert c.is_json_object(json.dumps(value, ensure_ascii=ascii_only).encode())
    assert c.is_json_object(orjson.dumps(value))


@pytest.mark.parametrize(
    "content",
    [b'{"a":1e400}', b'{"a":1E2}', b"[" * 100 + b"]" * 100, b'{"a":-0.0E5}'],
)
def test_what_the_checker_doubts_python_decides(c, content):
    wrapped = content if content.startswith(b"{") else b'{"a":' + content + b"}"
    assert not c.is_json_object(wrapped)
    assert _python_accepts(wrapped)  # all of these are JSON objects Python reads
    cols = [(("i",), ("message",), (None,), (None,), (wrapped,), ("d",), (1,))]
    assert c.render_items(cols, render.content_text) == orjson.dumps(
            [{"item_id": "i", "type": "message", "role": None, "call_id": None,
              "content": wrapped.decode(), "content_digest": "d", "format_version": 1}]
        )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=st.lists(
        st.lists(
            st.tuples(texts, texts, st.none() | texts, st.none() | texts, mutated(contents),
                      texts, st.integers(-(2**31), 2**31 - 1)),
            max_size=4,
        ),
        max_size=4,
    )
)
def test_render_items_agrees_with_python(c, turns):
    columns = [tuple(map(tuple, zip(*turn, strict=True))) if turn else ((),) * 7 for turn in turns]
    items = [
        history.TurnItems(
            seqs=tuple(range(len(col[0]))), ids=col[0], types=col[1], roles=col[2],
            call_ids=col[3], contents=col[4], digests=col[5], formats=col[6],
        )
        for col in columns
    ]
    want = _render_outcome(render.items_json_py, items)
    got = _render_outcome(lambda ts: c.render_items(
        [(t.ids, t.types, t.roles, t.call_ids, t.contents, t.digests, t.formats) for t in ts],
        render.content_text,
    ), items)
    assert got == want
    assert _render_outcome(render.items_json, items) == want


def _render_outcome(fn, turns):
    try:
        return "ok", fn(turns)
    except render._Undecodable as exc:
        return "undecodable", str(exc)


def test_every_code_point_is_escaped_as_orjson_does(c):
    points = "".join(chr(p) for p in range(0x110000) if not 0xD800 <= p <= 0xDFFF)
    content = orjson.dumps({"s": points})
    cols = [(("i",), ("t",), (points,), (None,), (content,), ("d",), (1,))]
    want = orjson.dumps([{"item_id": "i", "type": "t", "role": points, "call_id": None,
                          "content": content.decode(), "content_digest": "d",
                          "format_version": 1}])
    assert c.is_json_object(content)
    assert c.render_items(cols, render.content_text) == want
