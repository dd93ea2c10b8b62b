"""The C twins (ratchet/_speedups.c) against their Python references.

Each C function must give what its Python twin gives for the same input, valid or
damaged: the same value, or an error of the same kind (the callers catch ValueError
and report the row damaged; nothing reads the message). Hypothesis writes the inputs;
the damage is random truncation, random bytes and random lengths. In CI the C module
must be built (no silent fall-back to the slower path the benchmarks do not measure).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import replace

import fastavro
import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ratchet import speedups
from ratchet.domain import history
from ratchet.domain.catalogue import json_object
from ratchet.settings import SettingsError
from schemas import avsc, strict
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
    [b'{"a":1e300}', b'{"a":1E2}', b"[" * 200 + b"]" * 200, b'{"a":-0.0E5}',
     b"9" * 301, b"-" + b"9" * 301 + b".5"],  # long integer parts: Python decides
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


def test_the_checker_takes_content_as_deep_as_the_parser_takes_it(c):
    """Up to 200 levels (the item's object the first), the parser's own bound: checked
    in C, not handed to Python on every read (~33 ms for 131 072 arrays 150 deep)."""
    from schemas.canonical import parse_json
    for levels in (64, 65, 150, 200):
        content = b'{"a":' + b"[" * (levels - 1) + b"1" + b"]" * (levels - 1) + b"}"
        assert c.is_json_object(content), levels
        parse_json(content)  # the parser takes it too


def test_a_number_beyond_a_double_is_no_json_object_for_either(c):
    # Python reads it as infinity, which has no canonical JSON: refused (parse_json);
    # the checker doubts every exponent, so Python decides.
    content = b'{"a":1e400}'
    assert not c.is_json_object(content) and not _python_accepts(content)


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


# --- an item's type, role and call_id columns against its content ---------------------------

FIELDS = ("type", "role", "call_id")
# Text with nothing a JSON string must escape (what stored types, roles and call_ids are).
plain_texts = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters='"\\'
                  + "".join(map(chr, range(0x20)))), max_size=12)
field_values = (
    st.none() | plain_texts | texts | st.sampled_from(["message", "user", "call_1"])
    | st.integers(-3, 3) | st.booleans() | st.lists(st.none(), max_size=1)
    | st.dictionaries(texts, st.none(), max_size=1)
)


@st.composite
def item_contents(draw):
    """(content bytes, the parsed object or None): an object with some of the fields the
    columns mirror (any JSON type, or absent) among other keys, written in one of several
    styles, maybe damaged; sometimes a field twice."""
    value = draw(st.dictionaries(texts, exact_values | json_values, max_size=3))
    for name in FIELDS:
        if draw(st.booleans()):
            value[name] = draw(field_values)
    style = draw(st.sampled_from(["orjson", "ascii", "spaced", "plain", "twice"]))
    if style == "twice" and value:
        name = draw(st.sampled_from(FIELDS))
        text = json.dumps(value, ensure_ascii=False)
        extra = json.dumps({name: draw(field_values)}, ensure_ascii=False)[1:-1]
        content = (text[:-1] + ("," if text != "{}" else "") + extra + "}").encode()
    elif style in ("orjson", "twice"):
        content = orjson.dumps(value)
    elif style == "ascii":
        content = json.dumps(value).encode()
    elif style == "spaced":
        content = (" \n" + json.dumps(value, indent=2, ensure_ascii=False) + "\t\r ").encode()
    else:
        content = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return draw(mutated(st.just(content))) if draw(st.integers(0, 3)) == 0 else content


@st.composite
def columns_for(draw, content):
    """type, role, call_id columns for ``content``: each its content's value when that is
    a str or absent/null (so agreeing columns are common), or another str, None, or a
    value no column holds."""
    parsed = json_object(content) or {}
    columns = []
    for name in FIELDS:
        own = parsed.get(name)
        agreeing = own is None or isinstance(own, str)
        if agreeing and draw(st.integers(0, 3)):
            columns.append(own)
        else:
            columns.append(draw(st.none() | texts | plain_texts if draw(st.integers(0, 29))
                                else st.just(5)))
    return tuple(columns)


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fast_column_check_answers_only_what_python_answers(c, data):
    content = data.draw(item_contents())
    columns = data.draw(columns_for(content))
    sure = c.columns_agree(content, *columns)
    if sure is not None:
        assert sure is history.columns_agree_py(content, *columns)
        assert c.is_json_object(content)  # sure of the fields: sure of the object


@given(value=st.dictionaries(plain_texts, exact_values, max_size=4),
       fields=st.fixed_dictionaries({}, optional={
           name: st.none() | plain_texts for name in FIELDS}),
       agree=st.booleans())
def test_the_fast_column_check_is_sure_of_stored_items(c, value, fields, agree):
    """Stored items (orjson, nothing in their fields to escape) never leave C: what their
    columns say is decided there, agreeing or not."""
    value = {k: v for k, v in value.items() if k not in FIELDS} | fields
    content = orjson.dumps(value)
    columns = tuple(value.get(name) for name in FIELDS)
    if not agree:
        columns = (columns[0], "system" if columns[1] != "system" else None, columns[2])
    assert c.columns_agree(content, *columns) is agree is history.columns_agree_py(
        content, *columns)


@pytest.mark.parametrize(
    "content,columns,fast",
    [
        (b'{"type":"message","role":"user"}', ("message", "user", None), True),
        (b'{"type":"message","role":null,"call_id":null}', ("message", None, None), True),
        (b'{"type":"message"}', ("message", "user", None), False),
        (b'{"type":"message","role":"user"}', ("message", None, None), False),
        (b'{"type":"message","role":"user"}', ("reasoning", "user", None), False),
        (b'{"type":"function_call","call_id":"c1"}', ("function_call", None, "c2"), False),
        (b'{"type":"message","role":5}', ("message", "5", None), False),
        (b'{"type":"message","role":{"a":1}}', ("message", None, None), False),
        (b'{"type":"message","role":"\xc3\xa9"}', ("message", "\u00e9", None), True),
        (b'{"a":{"type":"x"},"type":"m"}', ("m", None, None), True),  # only the top level
        # What C doubts, Python decides (with the same rule):
        (b'{"type":"message","type":"reasoning"}', ("reasoning", None, None), None),
        (b'{"type":"message","role":"a","role":"b"}', ("message", "b", None), None),
        (b'{"\\u0074ype":"message"}', ("message", None, None), None),
        (b'{"type":"mess\\u0061ge"}', ("message", None, None), None),
        (b'{"type":"message","n":1e2}', ("message", None, None), None),
        (b'{"type":"message"}', ("message", 5, None), None),
        (b'{"type":"message","role":"x"}', ("message", "\ud800", None), None),
        (b'{"type":"message"}', ("message", "\ud800", None), False),
        (b'["type","message"]', ("message", None, None), None),
        (b'{"type":"message"', ("message", None, None), None),
    ],
)
def test_the_column_check_reads_the_top_level_fields(c, content, columns, fast):
    assert c.columns_agree(content, *columns) is fast
    want = history.columns_agree_py(content, *columns)
    if fast is not None:
        assert want is fast
    assert c.item_mismatches([_turn([content], columns=[columns])], history.columns_agree_py) \
        == (-1, -1 if want else 0)


def _turn(contents, *, digests=None, columns=None):
    columns = columns or [("message", None, None)] * len(contents)
    digests = digests or [hashlib.sha256(x).hexdigest() for x in contents]
    types, roles, call_ids = (tuple(col) for col in zip(*columns, strict=True)) if columns \
        else ((), (), ())
    return history.TurnItems(
        seqs=tuple(range(len(contents))), ids=tuple(f"i{n}" for n in range(len(contents))),
        types=types, roles=roles, call_ids=call_ids, contents=tuple(contents),
        digests=tuple(digests), formats=(1,) * len(contents),
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=st.lists(st.integers(0, 3), max_size=4))
def test_item_mismatches_agrees_with_python(c, data, shape):
    """Digests right or wrong, columns agreeing or not, over several turns: the same
    (first digest mismatch, first column mismatch) as the Python twin."""
    turns = []
    for size in shape:
        contents = [data.draw(item_contents()) for _ in range(size)]
        columns = [data.draw(columns_for(x)) for x in contents]
        digests = [hashlib.sha256(x).hexdigest() if data.draw(st.integers(0, 9)) else
                   data.draw(st.sampled_from(["0" * 64, "", 5])) for x in contents]
        turns.append(_turn(contents, digests=digests, columns=columns))
    want = _outcome(history.item_mismatches_py, turns)
    assert _outcome(c.item_mismatches, turns, history.columns_agree_py) == want
    assert _outcome(history.item_mismatches, turns) == want
    if want[0] == "ok":
        digest_bad, column_bad = want[1]
        assert digest_bad < 0 or column_bad < 0


def test_item_mismatches_refuses_what_python_refuses(c):
    good = _turn([b'{"type":"message"}'])
    ragged = replace(good, roles=())
    for turns in ([good, ragged], [ragged, good],
                  [replace(_turn([b"{}"], digests=["0" * 64]), call_ids=())]):
        with pytest.raises(ValueError):
            c.item_mismatches(turns, history.columns_agree_py)
        with pytest.raises(ValueError):
            history.item_mismatches_py(turns)
    # A digest that is no str, or a str with no UTF-8 form, is a mismatch, not an error.
    odd = _turn([b"{}", b"{}"], digests=[hashlib.sha256(b"{}").hexdigest(), "\ud800"])
    assert c.item_mismatches([odd], history.columns_agree_py) == (1, -1)
    assert history.item_mismatches_py([odd]) == (1, -1)
    assert c.first_digest_mismatch([b"{}"], ["\ud800"]) == 0


def test_the_python_twin_decides_what_c_doubts(c):
    asked = []

    def agrees(*args):
        asked.append(args)
        return history.columns_agree_py(*args)

    doubtful = b'{"type":"message","n":1e2}'
    turn = _turn([b'{"type":"message"}', doubtful, b'{"type":"reasoning"}'])
    assert c.item_mismatches([turn], agrees) == (-1, 2)
    assert asked == [(doubtful, "message", None, None)]


@pytest.mark.parametrize("special", [b"\x00", b"\x1f", b'"', b"\\", b"\\n", b"\\u00e9", b"\x7f",
                                     b"\x80", b"\xc3\xa9", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                     b"\xff"])
def test_the_string_scan_finds_every_special_byte_wherever_it_sits(c, special):
    """The scan skips plain bytes 16 at a time: a byte it must look at, at every offset
    of a block and in the tail, is found as the byte-by-byte scan finds it."""
    for before in range(0, 40):
        for after in (0, 1, 15, 16, 17, 40):
            content = b'{"type":"' + b"x" * before + special + b"y" * after + b'"}'
            accepted = _python_accepts(content)
            assert c.is_json_object(content) == accepted or not c.is_json_object(content)
            if special in (b"\x7f", b"\xc3\xa9", b"\\n", b"\\u00e9"):
                assert c.is_json_object(content) and accepted
            if special in (b"\x00", b"\x1f", b"\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                           b"\xff"):
                assert not c.is_json_object(content)
            value = json_object(content)
            column = value["type"] if value is not None else "x"
            fast = c.columns_agree(content, column, None, None)
            assert fast is None or fast is history.columns_agree_py(content, column, None, None)


@pytest.mark.parametrize("digits", [300, 301, 309, 4300, 4301])
def test_the_checker_doubts_integer_parts_python_may_refuse(c, digits):
    """Python refuses an integer of more than 4300 digits and a float beyond a double's
    range: the checker is sure of no integer part longer than 300 digits, so it never
    accepts what Python refuses (nor does the column check)."""
    for number in (b"9" * digits, b"9" * digits + b".5", b"-" + b"9" * digits):
        content = b'{"type":"message","a":' + number + b"}"
        assert c.is_json_object(content) is (digits <= 300)
        assert c.columns_agree(content, "message", None, None) is (
            True if digits <= 300 else None)
        if c.is_json_object(content):
            assert _python_accepts(content)
        want = history.columns_agree_py(content, "message", None, None)
        assert c.item_mismatches([_turn([content], columns=[("message", None, None)])],
                                 history.columns_agree_py) == (-1, -1 if want else 0)


# --- avro_conforms against strict_violation (schemas/strict.py) --------------------------

def _avro_bodies() -> list[tuple[str, bytes]]:
    """Plain bodies of every record ratchet reads from gateways, and of one outcome."""
    from ratchet import samples
    turn, effects = samples.make_tool_loop_turn()
    records = [("TurnCompleted", samples.make_turn()), ("TurnCompleted", turn),
               ("ToolEffect", effects[0]), ("TurnCancelled", samples.make_turn_cancelled(turn)),
               ("CheckpointPromoted", samples.make_checkpoint_promoted())]
    bodies = []
    for name, record in records:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, avsc.parsed(name), record.to_avro())
        bodies.append((name, out.getvalue()))
    return bodies


AVRO_BODIES = _avro_bodies()


AVRO_PLANS = {name: strict.plan_of(avsc.parsed(name)) for name, _ in AVRO_BODIES}


def _strict_twins(c, name: str, body: bytes) -> tuple[bool, str | None]:
    return (c.avro_conforms(AVRO_PLANS[name], body),
            strict.strict_violation(body, avsc.parsed(name)))


def test_the_c_walk_passes_every_plain_body(c):
    for name, body in AVRO_BODIES:
        assert _strict_twins(c, name, body) == (True, None), name


def test_the_c_walk_refuses_what_the_python_walk_refuses_byte_by_byte(c):
    """Every byte of every body set to each of a few values, and every truncation: the
    C walk says what the Python walk says. (None of these bodies meets what the C walk
    is not sure of: a varint beyond 64 bits, a block count beyond the bytes left.) The
    5.8 KB tool-loop turn is left to the random test below: it has no other field kind."""
    for name, body in AVRO_BODIES[:1] + AVRO_BODIES[2:]:
        for at in range(len(body)):
            for byte in (0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF):
                damaged = body[:at] + bytes([byte]) + body[at + 1:]
                fast, found = _strict_twins(c, name, damaged)
                assert fast is (found is None), (name, at, byte, found)
            fast, found = _strict_twins(c, name, body[:at])
            assert fast is (found is None), (name, at, "truncated", found)


@given(st.sampled_from(range(len(AVRO_BODIES))), st.integers(0, 10_000),
       st.binary(min_size=1, max_size=24), st.booleans())
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_the_c_walk_never_passes_a_body_the_python_walk_refuses(c, which, at, noise, insert):
    """Random bytes written over or into a body: when the C walk says it conforms, so
    does the Python walk. (The other way round the C walk may be not sure: then the
    decode asks the Python walk, so only this direction could let a body through.)"""
    name, body = AVRO_BODIES[which]
    at %= len(body)
    damaged = body[:at] + noise + body[at + (0 if insert else len(noise)):]
    fast, found = _strict_twins(c, name, damaged)
    assert not fast or found is None, (name, at, noise, found)


def test_the_c_walk_is_not_sure_of_what_it_cannot_bound(c):
    """A count beyond the bytes left (items of no bytes) and a plan node it does not
    take: False, and the Python walk passes both. (A varint beyond 64 bits was a third;
    both walks refuse it now.)"""
    nulls = fastavro.parse_schema({"type": "array", "items": "null"})
    for schema, body in ((nulls, b"\x0a\x00"),):
        assert strict.strict_violation(body, schema) is None
        assert c.avro_conforms(strict.plan_of(schema), body) is False
    assert c.avro_conforms(bytes(4 * [strict.PLAN_REFUSE, 0, 0, 0]), b"") is False


def test_a_recursive_schema_is_walked_to_a_bound_depth(c):
    """A linked list: the plan loops on itself; nesting beyond the C walk's depth bound
    is not sure (False), never a crash; shallower lists conform in both walks."""
    linked = fastavro.parse_schema({"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]})
    plan = strict.plan_of(linked)
    shallow = b"\x02" * 10 + b"\x00"
    assert c.avro_conforms(plan, shallow) and strict.strict_violation(shallow, linked) is None
    assert c.avro_conforms(plan, b"\x02" * 5000 + b"\x00") is False
    assert c.avro_conforms(plan, b"\x02" * 10 + b"\x04") is False
    assert "union index 2" in strict.strict_violation(b"\x02" * 10 + b"\x04", linked)


@st.composite
def _writer_schemas(draw, depth: int = 0, named: list[str] | None = None):
    """A writer schema a registry might hold: every Avro type, nested, named types
    referenced again after their definition (recursion included, through a union)."""
    named = [] if named is None else named
    kinds = ["null", "boolean", "int", "long", "float", "double", "bytes", "string",
             "enum", "fixed"] + (["record", "array", "map", "union"] if depth < 3 else [])
    if named:
        kinds.append("reference")
    kind = draw(st.sampled_from(kinds))
    if kind == "reference":
        return draw(st.sampled_from(named))
    if kind in ("enum", "fixed", "record"):
        name = f"T{len(named)}"
        named.append(name)
        if kind == "enum":
            return {"type": "enum", "name": name,
                    "symbols": [f"s{i}" for i in range(draw(st.integers(1, 4)))]}
        if kind == "fixed":
            return {"type": "fixed", "name": name, "size": draw(st.integers(0, 3))}
        fields = [{"name": f"f{i}", "type": draw(_writer_schemas(depth + 1, named))}
                  for i in range(draw(st.integers(0, 3)))]
        return {"type": "record", "name": name, "fields": fields}
    if kind == "array":
        return {"type": "array", "items": draw(_writer_schemas(depth + 1, named))}
    if kind == "map":
        return {"type": "map", "values": draw(_writer_schemas(depth + 1, named))}
    if kind == "union":  # null first, so a recursive reference can end
        branch = draw(_writer_schemas(depth + 1, named))
        return ["null", branch] if branch != "null" and not isinstance(branch, list) else "null"
    return draw(st.sampled_from([kind, {"type": kind}]))


def _rooted(schema):
    """``schema`` as the one field of a record, parsed (a schema fastavro refuses is
    not a case)."""
    try:
        return fastavro.parse_schema({"type": "record", "name": "Root",
                                      "fields": [{"name": "v", "type": schema}]})
    except fastavro.schema.SchemaParseException:
        assume(False)


def _walked(walk):
    """The Python walk's answer; a record containing itself outside any union has no
    finite value (the decode refuses such a schema first: unsafe_shape): not a case."""
    try:
        return walk()
    except RecursionError:
        assume(False)


@given(_writer_schemas(), st.binary(max_size=48))
@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
def test_the_c_walk_over_any_writer_schema_passes_only_what_python_passes(c, schema, body):
    """Any schema's plan (every type, named references, recursion) against any bytes:
    the C walk conforms only where the Python walk does."""
    parsed = _rooted(schema)
    found = _walked(lambda: strict.strict_violation(body, parsed))
    fast = c.avro_conforms(strict.plan_of(parsed), body)
    assert not fast or found is None, found


# --- avro_counted against refusal_of with a bound on items (schemas/strict.py) ------------

def _elements(body: bytes, schema) -> int:
    """How many array items and map entries ``body`` holds (the Python walk's count)."""
    most = 0
    while (refusal := strict.refusal_of(body, schema, most_elements=most)) is not None:
        assert refusal.too_many, refusal
        most += 1
    return most


def test_the_counted_walks_agree_at_the_bound_and_one_below(c):
    """The plain 20-item tool-loop turn (and the others) at exactly its count of array
    items and map entries conforms in both walks; one fewer allowed is too many in both,
    and the C walk says so without the Python walk (2)."""
    counts = []
    for name, body in AVRO_BODIES:
        schema = avsc.parsed(name)
        count = _elements(body, schema)
        counts.append(count)
        plan = AVRO_PLANS[name]
        assert c.avro_counted(plan, body, count)[0] == 1
        assert strict.refusal_of(body, schema, most_elements=count) is None
        if count:
            assert c.avro_counted(plan, body, count - 1)[0] == 2, name
            refusal = strict.refusal_of(body, schema, most_elements=count - 1)
            assert refusal is not None and refusal.too_many and not refusal.ran_out
    assert counts[1] > 20  # the tool-loop turn's items and effect ids are counted


def test_a_body_damaged_before_the_bound_is_not_too_many(c):
    """Damage met before the first item too many is what both walks answer (the C walk
    3 and where, the Python walk the damage), not 'too many'."""
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "flag", "type": "boolean"}, {"name": "xs", "type": {"type": "array",
                                                                     "items": "int"}}]})
    plan = strict.plan_of(schema)
    body = b"\x02" + b"\x06\x02\x04\x06\x00"  # boolean byte 2, then 3 ints
    assert c.avro_counted(plan, body, 1)[:2] == (3, 1)
    refusal = strict.refusal_of(body, schema, most_elements=1)
    assert refusal is not None and not refusal.too_many and "boolean byte 2" in refusal.detail
    good = b"\x01" + b"\x06\x02\x04\x06\x00"
    assert c.avro_counted(plan, good, 3)[0] == 1 and c.avro_counted(plan, good, 2)[0] == 2
    assert c.avro_counted(plan, good[:-2], 5)[0] == 4  # ends early
    assert c.avro_counted(plan, good + b"\x00", 5)[0] == 3  # a byte after the record
    assert strict.refusal_of(good, schema, most_elements=2).too_many


@given(_writer_schemas(), st.binary(max_size=48), st.integers(0, 6))
@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
def test_the_counted_c_walk_over_any_writer_schema_agrees_with_python(c, schema, body, most):
    """Any schema, any bytes, any small bound: where the C walk answers (1: conforms
    within the bound, 2: too many, 3: damaged, 4: ends early; 0: not sure), the Python
    walk answers the same."""
    parsed = _rooted(schema)
    found = _walked(lambda: strict.refusal_of(body, parsed, most_elements=most))
    fast, _, _ = c.avro_counted(strict.plan_of(parsed), body, most)
    if fast == 1:
        assert found is None
    elif fast == 2:
        assert found is not None and found.too_many, found
    elif fast == 3:
        assert found is not None and not found.too_many and not found.ran_out, found
    elif fast == 4:
        assert found is not None and found.ran_out, found


def test_the_counted_walk_counts_item_by_item_as_its_twin():
    """A nested array in the first of two records: the C walk reserved the outer
    block's whole count first and said "too many" where the Python walk, counting item
    by item, reaches a damaged boolean first (found by a review)."""
    c = speedups.load()
    if c is None:
        pytest.fail("ratchet._speedups is not built")
    schema = fastavro.parse_schema({"type": "record", "name": "Root", "fields": [
        {"name": "v", "type": {"type": "array", "items": {"type": "record", "name": "E",
                                                          "fields": [
            {"name": "xs", "type": {"type": "array", "items": "int"}},
            {"name": "b", "type": "boolean"}]}}}]})
    body = bytes([0x04, 0x02, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00])  # b = 5
    refusal = strict.refusal_of(body, schema, most_elements=2)
    assert refusal is not None and "boolean byte 5" in refusal.detail
    assert c.avro_counted(strict.plan_of(schema), body, 2)[0] == 3


def test_a_long_beyond_64_bits_is_refused_by_both_walks(c):
    """Java refuses it; fastavro read it and the range check refused it after the body
    was built. The C walk refused it as "not sure", and the Python walk then walked the
    whole body to accept it (26 s for a long one, a review): both refuse it now."""
    wide = fastavro.parse_schema({"type": "record", "name": "W", "fields": [
        {"name": "n", "type": "long"}]})
    body = b"\xff" * 9 + b"\x7f"
    assert "beyond 64 bits" in strict.strict_violation(body, wide)
    assert c.avro_counted(strict.plan_of(wide), body, 10)[0] == 3
    assert strict.strict_violation(b"\xff" * 9 + b"\x01", wide) is None  # 2^64 - 1 zigzag


# --- json_containers against its Python twin (schemas/canonical.py) -----------------------

@given(st.lists(st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b",", b":",
                                 b"\xc3\xa9", b"\x00"]), max_size=60).map(b"".join),
       st.integers(0, 12))
@settings(max_examples=3000)
def test_json_containers_twins_agree_on_any_bytes(c, text, most):
    """Brackets, quotes and backslashes in any order (strings left open, lone
    backslashes at the end): the C scan counts what the Python twin counts."""
    from schemas.canonical import json_containers
    assert c.json_containers(text, most) == json_containers(text, most)
