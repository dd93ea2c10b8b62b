"""Session 53's receipt rules, reviewed from outside (helper rreva, session 53).

1. A stored boundary proof's or router receipt's ``expires_at`` that is null, or no key
   at all, is no expiry the processor ever writes: both Avro records declare it a
   required ``timestamp-millis`` long (``schemas/BoundaryProof.avsc``,
   ``RouterReceipt.avsc``; ``EpochMillis`` in ``schemas/models.py``), so only damage (or a
   hand-written row) stores one. It read as "never expires" (``record_expires_at_ms``
   returned None), served ``certified`` forever, while docs/gateway-protocol.md section 8
   says an ``expires_at`` that is not an integer within years 1 to 9999 counts as
   expired. Now ``ARTIFACT_EXPIRED`` like 10^30 and ``"soon"``.
2. "Whitespace" for a blank ``receipt_id``, ``issuer`` or ``artifact_id`` is Python's
   ``str.isspace``; a gateway in another language implements it from the doc alone, and
   its own trim differs (JavaScript's ``trim()`` strips U+FEFF and keeps U+0085 and
   U+001C..U+001F; Go's ``strings.TrimSpace`` keeps U+001C..U+001F). The doc lists every
   code point and names those traps; this pins the list against ``blank`` over all of
   Unicode.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from ratchet.domain.history import VerifiedHistory
from ratchet.domain.rehydration import Certified, Fallback, FallbackReason, rehydrate
from ratchet.domain.validation import Valid, blank, validate_turn
from ratchet.samples import NOW_MS, make_turn
from schemas.canonical import canonical_json_text
from schemas.models import RouterReceipt
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.testing import ROOT
from tests.contract.store_support import T0, FakeClock, binding_proof, conversation_turn, uid

_MISSING = object()


@pytest.fixture
def history() -> VerifiedHistory:
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, conv = uid("tenant"), uid("conv")
    store.promote(conversation_turn(tenant, conv, 0))
    result = store.read_history(tenant, conversation_id=conv)
    assert isinstance(result, VerifiedHistory)
    assert isinstance(rehydrate(result, "fp1", T0), Certified)
    return result


def _record(record: str, expires) -> str:
    if record == "router_receipt":
        fields = {"receipt_id": "rc1", "router_key_format": "prefix-blocks-v1",
                  "covered_tokens": 42, "issuer": "router-0"}
    else:
        fields = {k: v for k, v in json.loads(binding_proof()).items() if k != "expires_at"}
    if expires is not _MISSING:
        fields["expires_at"] = expires
    return canonical_json_text(fields)


def _reason(history: VerifiedHistory, **changes):
    damaged = replace(history, checkpoint=replace(history.checkpoint, **changes))
    result = rehydrate(damaged, "fp1", T0)
    if isinstance(result, Certified):
        return "certified"
    assert isinstance(result, Fallback), result
    assert result.items == history.items  # a fallback carries every item
    return result.reason


# --- 1. a stored proof or receipt without an expiry ----------------------------------


@pytest.mark.parametrize("expires", [None, _MISSING], ids=["null", "no key"])
@pytest.mark.parametrize("record", ["router_receipt", "boundary_proof"])
def test_a_stored_proof_or_receipt_without_an_expiry_is_never_reused(history, record,
                                                                        expires):
    assert _reason(history, **{record: _record(record, expires)}) is (
        FallbackReason.ARTIFACT_EXPIRED)


@pytest.mark.parametrize("record", ["router_receipt", "boundary_proof"])
def test_a_stored_proof_or_receipt_with_a_future_expiry_is_reused(history, record):
    future = int(T0.timestamp() * 1000) + 3_600_000
    assert _reason(history, **{record: _record(record, future)}) == "certified"


def test_the_processor_never_keeps_a_receipt_or_proof_without_an_expiry():
    """Why a stored null is damage: both records require ``expires_at``, so no event
    without one gets a decision, and every kept record has an integer there."""
    turn = make_turn()
    for record in (turn.router_receipt, turn.boundary_proof):
        if record is None:
            continue
        with pytest.raises(ValueError):
            type(record)(**{**record.model_dump(), "expires_at": None})
    with pytest.raises(ValueError):
        RouterReceipt(receipt_id="rc1", router_key_format="k", covered_tokens=1,
                      issuer="router-0")


# --- 2. which characters are whitespace, as the gateway doc lists them ---------------

# Python's str.isspace (Unicode 14's White_Space plus U+001C..U+001F), written out.
WHITESPACE = frozenset([*range(0x09, 0x0E), *range(0x1C, 0x21), 0x85, 0xA0, 0x1680,
                        *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
NOT_WHITESPACE = (0xFEFF, 0x200B, 0x180E, 0x2060)  # trimmed by some languages, or look blank
DOC = ROOT / "docs" / "gateway-protocol.md"


def test_blank_is_exactly_the_listed_whitespace_over_all_of_unicode():
    found = {c for c in range(0x110000) if blank(chr(c))}
    assert found == WHITESPACE
    assert not any(blank(chr(c)) for c in NOT_WHITESPACE)


def _doc_rule() -> str:
    text = DOC.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `router_receipt` |")]
    assert len(rows) == 1, rows
    return rows[0]


def _code_points(spec: str) -> set[int]:
    points: set[int] = set()
    for first, last in re.findall(r"U\+([0-9A-F]{4,6})(?:\.\.U\+([0-9A-F]{4,6}))?", spec):
        points.update(range(int(first, 16), int(last or first, 16) + 1))
    return points


def test_the_gateway_doc_lists_every_whitespace_code_point_and_the_traps():
    """A gateway in another language builds the rule from the doc alone: the doc's list
    (after "whitespace is exactly", up to "; not") is every code point ``blank`` takes,
    and it names the ones other languages' trims treat otherwise."""
    row = _doc_rule()
    listed = re.search(r"whitespace is exactly (.*?); not ", row)
    assert listed, "the doc lists the whitespace code points: 'whitespace is exactly ...; not'"
    assert _code_points(listed.group(1)) == WHITESPACE
    tail = row[listed.end():]
    assert "U+FEFF" in tail.split(")")[0] and "U+200B" in tail.split(")")[0]
    for trap in ("trim()", "strings.TrimSpace"):
        assert trap in row, trap


@pytest.mark.parametrize("c", NOT_WHITESPACE)
def test_a_name_of_a_character_javascript_trims_is_taken_as_sent(c):
    turn = make_turn()
    receipt = RouterReceipt(receipt_id=chr(c), router_key_format=
                            turn.fingerprint.router_key_format,
                            covered_tokens=turn.token_artifact.token_count,
                            expires_at=NOW_MS + 60_000, issuer=chr(c))
    result = validate_turn(turn.model_copy(update={"router_receipt": receipt}), NOW_MS)
    assert isinstance(result, Valid) and result.artifact_reusable, result
