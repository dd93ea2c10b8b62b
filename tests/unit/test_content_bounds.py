"""The bounds of item content that docs/gateway-protocol.md (sections 3 and 5) states:
an integer is exact up to 4 300 digits and one with more is CORRUPT (the Python
runtime's bound on integer text); arrays and objects nest at most 201 deep, the item's
own object counted, and deeper content is CORRUPT (the parser's bound). Both bounds
were found by an outside review where the docs said "at any size" and named no depth.
"""

from __future__ import annotations

import hashlib

import pytest

from ratchet.domain.validation import Valid, validate_turn
from ratchet.samples import NOW_MS, make_turn
from schemas.models import Item, RejectionReason


def _verdict(value: bytes):
    content = (b'{"content":"x","id":"m1","n":' + value
               + b',"role":"assistant","type":"message"}')
    item = Item(item_id="m1", type="message", role="assistant", content=content,
                content_digest=hashlib.sha256(content).hexdigest())
    return validate_turn(make_turn(items=[item], certified=False), NOW_MS)


@pytest.mark.parametrize(("digits", "valid"), [(4300, True), (4301, False)])
def test_an_integer_is_valid_up_to_4300_digits(digits, valid):
    verdict = _verdict(b"7" * digits)
    assert isinstance(verdict, Valid) is valid, verdict
    if not valid:
        assert verdict.reason is RejectionReason.CORRUPT


@pytest.mark.parametrize(("depth", "valid"), [(200, True), (201, False)])
def test_content_nests_at_most_201_deep(depth, valid):
    # The item's object is one level: an array ``depth`` deep inside it nests depth + 1.
    verdict = _verdict(b"[" * depth + b"]" * depth)
    assert isinstance(verdict, Valid) is valid, verdict
    if not valid:
        assert verdict.reason is RejectionReason.CORRUPT
