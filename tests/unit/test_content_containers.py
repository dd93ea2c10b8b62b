"""An item's content holds at most ``MAX_ITEM_CONTAINERS`` arrays and objects, and one
event's items at most ``MAX_EVENT_CONTAINERS`` in all (``schemas/limits.py``,
docs/gateway-protocol.md "Size limit"); above either the turn is ``UNSUPPORTED_FORMAT``,
decided from the text before any content is parsed.

Why: parsing builds an object per array and object. Content of 20 000 arrays nested 199
deep (7.6 MiB, valid, canonical) cost the worker 2.6 s and +320 MB before it was
promoted; written with spaces, 13 s and +685 MB, in parser calls holding the GIL for
seconds (a review saw the consumer group rebalance).
"""

from __future__ import annotations

import hashlib
import tracemalloc

import pytest

from ratchet import speedups
from ratchet.domain import bounds
from ratchet.domain.validation import Rejected, Valid, validate_turn
from ratchet.samples import NOW_MS, make_turn
from schemas import canonical
from schemas.items import message
from schemas.limits import MAX_EVENT_CONTAINERS, MAX_ITEM_CONTAINERS
from schemas.models import Item, RejectionReason

C = speedups.load()


@pytest.fixture(params=["C", "Python"])
def twin(request, monkeypatch):
    """Which counter runs: the C scan, or the Python twin alone."""
    if request.param == "C" and C is None:
        pytest.fail("ratchet._speedups is not built (needs gcc, Python and OpenSSL headers)")
    monkeypatch.setattr(bounds, "SPEEDUPS", C if request.param == "C" else None)
    return request.param


def item_with(containers: int, *, item_id: str = "m_many", spaced: bool = False,
              nested: bool = False) -> Item:
    """A valid message item whose content holds exactly ``containers`` arrays and
    objects: its own, then an extra field ``x`` of empty arrays (side by side, or nested
    as deep as the parser allows), canonical unless ``spaced``."""
    item = message("hi", role="assistant", item_id=item_id)
    extra = containers - canonical.json_containers(item.content, 10**9) - 1
    if nested:
        depth = 150
        inner = b",".join([b"[" * depth + b"]" * depth] * (extra // depth)
                          + [b"[]"] * (extra % depth))
    else:
        inner = b",".join([b"[]"] * extra)
    content = item.content[:-1] + b',"x":[' + inner + b"]}"
    if spaced:
        content = content.replace(b",", b", ")
    return item.model_copy(update={"content": content,
                                   "content_digest": hashlib.sha256(content).hexdigest()})


def outcome(items: list[Item]):
    return validate_turn(make_turn(items=items), NOW_MS)


@pytest.mark.parametrize("nested", [False, True])
def test_an_item_at_the_bound_is_valid_and_one_more_is_unsupported(twin, nested):
    assert isinstance(outcome([item_with(MAX_ITEM_CONTAINERS, nested=nested)]), Valid)
    rejected = outcome([item_with(MAX_ITEM_CONTAINERS + 1, nested=nested)])
    assert isinstance(rejected, Rejected)
    assert rejected.reason is RejectionReason.UNSUPPORTED_FORMAT
    assert rejected.detail == (f"item m_many: content holds more than {MAX_ITEM_CONTAINERS} "
                               "arrays and objects")


def test_the_items_of_one_event_are_bounded_together(twin):
    """Eight items at the item bound are the event bound exactly (with the input item:
    one fewer in the last); one container more in all is UNSUPPORTED_FORMAT."""
    first = make_turn().input_items[0]
    own = canonical.json_containers(first.content, 10**9)
    sizes = [MAX_ITEM_CONTAINERS] * 7 + [MAX_ITEM_CONTAINERS - own]
    assert own + sum(sizes) == MAX_EVENT_CONTAINERS
    items = [item_with(n, item_id=f"m{i}") for i, n in enumerate(sizes)]
    assert isinstance(outcome(items), Valid)
    items[-1] = item_with(sizes[-1] + 1, item_id="m7")
    rejected = outcome(items)
    assert rejected.reason is RejectionReason.UNSUPPORTED_FORMAT
    assert f"more than {MAX_EVENT_CONTAINERS} arrays and objects in all" in rejected.detail


def test_content_beyond_the_bound_is_refused_before_it_is_parsed(twin):
    """The review's content (20 000 arrays nested 199 deep, not canonical): refused
    without building it (the parse took +685 MB and 13 s)."""
    item = message("hi", role="assistant", item_id="m_deep")
    nested = b"[" * 199 + b"]" * 199
    content = item.content[:-1] + b', "x": [' + b", ".join([nested] * 20_000) + b"]}"
    deep = item.model_copy(update={"content": content,
                                   "content_digest": hashlib.sha256(content).hexdigest()})
    tracemalloc.start()
    try:
        rejected = outcome([deep])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rejected.reason is RejectionReason.UNSUPPORTED_FORMAT
    assert peak < 8 * 2**20, f"{peak / 2**20:.0f} MiB built"


def test_brackets_inside_strings_are_not_counted(twin):
    """Text (code, say) full of brackets inside a JSON string builds no arrays."""
    item = message("[{" * MAX_ITEM_CONTAINERS, role="assistant", item_id="m_code")
    assert isinstance(outcome([item]), Valid)


# --- the two counters: C and Python twins ---------------------------------------------------

CASES = [b"", b"[]", b"{}", b'{"a":[1,{}]}', b'"[{"', b'"\\"["[', b'["\\', b'["\\\\"[',
         b'"\\\\\\"[{"[', b"[[[", b'{"k":"\\u005b"}', b"no json [ {", b'"open [ { ',
         "{\"\u00e9[\":[]}".encode(), b'["a\\"b", [], {"c": "]"}]']


@pytest.mark.parametrize("text", CASES)
def test_the_twins_count_alike(text):
    if C is None:
        pytest.fail("ratchet._speedups is not built")
    for most in (0, 1, 2, 10):
        assert C.json_containers(text, most) == canonical.json_containers(text, most), (
            text, most)


def test_the_count_stops_above_most():
    text = b"[" * 50
    assert canonical.json_containers(text, 9) == 10
    if C is not None:
        assert C.json_containers(text, 9) == 10
    assert canonical.json_containers(text, 100) == 50


def test_the_count_is_what_the_parser_builds():
    """For JSON text, the count is the arrays and objects its parsed value holds."""
    def containers(value) -> int:
        if isinstance(value, dict):
            return 1 + sum(containers(v) for v in value.values())
        if isinstance(value, list):
            return 1 + sum(containers(v) for v in value)
        return 0

    for text in (b'{"a":[1,{"b":"[{"}],"c":{"d":[[],[[]]]}}', b'["\\"[", {"\\\\": []}]',
                 item_with(500, nested=True).content):
        assert canonical.json_containers(text, 10**9) == containers(
            canonical.parse_json(text))


def test_an_effect_whose_output_no_turn_could_carry_is_dead_lettered():
    """Recorded, it would be an effect no promotion can use (every turn carrying its
    output is UNSUPPORTED_FORMAT), and the claims API refuses the same output."""
    from ratchet.samples import make_tool_effect
    from schemas.models import DeadLetter, DeadLetterReason
    from tests.unit.test_processor_rules import Harness

    h = Harness()
    effect = make_tool_effect("call_1", idempotency_key="idem_many")
    too_many = item_with(MAX_ITEM_CONTAINERS + 1, item_id=effect.output.item_id)
    content = too_many.content.replace(b'"type":"message"', b'"type":"function_call_output"')
    output = effect.output.model_copy(update={
        "content": content, "content_digest": hashlib.sha256(content).hexdigest()})
    [letter] = h.processor.handle(h.record(effect.model_copy(update={"output": output}))).outbound
    assert isinstance(letter.model, DeadLetter)
    assert letter.model.reason is DeadLetterReason.INVALID_EVENT
    assert f"more than {MAX_ITEM_CONTAINERS} arrays and objects" in letter.model.error
    assert h.ledger.turn_facts(event_id="e", tenant_id=effect.tenant_id,
                               idempotency_key=effect.idempotency_key, conversation_id=None,
                               scope=None).effects == ()
