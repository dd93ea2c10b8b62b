"""Session 52's leftovers of the router receipt and token artifact rules (session 53).

1. A ``receipt_id`` or ``issuer`` of only whitespace names no receipt or issuer, as an
   empty one does: ``INVALID_BOUNDARY_PROOF`` at promotion, ``NO_ARTIFACT`` on a read
   of a row stored before the rule (or damaged since).
2. A token artifact's ``artifact_id`` empty or only whitespace names no artifact: the
   same two answers, also for a turn promoted logical_only and for an artifact sent
   without a proof (the checks run whenever the record is present).
3. An ``expires_at`` of a stored proof or receipt beyond year 9999 (or before year 1)
   is no instant a datetime holds: the processor never keeps one (its turn is
   dead-lettered ``CORRUPT_PAYLOAD`` by Avro, or refused ``CORRUPT`` by the rules), so
   a stored one is damage, and reads fail closed like an unreadable expiry:
   ``ARTIFACT_EXPIRED``, never ``certified`` with an artifact that never expires.
   Zero and negative expiries are instants in the past: expired, nothing else.

"Whitespace" is Python's ``str.strip`` / ``str.isspace`` (the fingerprint's rule for a
blank component, ``ratchet.domain.fingerprint``): ``docs/gateway-protocol.md``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ratchet.domain.history import FIRST_MS, LAST_MS, VerifiedHistory
from ratchet.domain.rehydration import Certified, Fallback, FallbackReason, rehydrate
from ratchet.domain.validation import Rejected, Valid, validate_turn
from ratchet.samples import NOW_MS, make_turn
from schemas.canonical import canonical_json_text
from schemas.models import Certification, RejectionReason, RouterReceipt, TurnStatus
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import T0, FakeClock, binding_proof, conversation_turn, uid

BLANKS = [" ", "\t", "\n", "  \r\n ", "\u00a0", "\u3000"]
BLANK_IDS = ["space", "tab", "newline", "mixed", "nbsp", "ideographic-space"]


def _receipt_turn(**receipt_changes):
    turn = make_turn()
    fields = {"receipt_id": "rc1", "router_key_format": turn.fingerprint.router_key_format,
              "covered_tokens": turn.token_artifact.token_count,
              "expires_at": NOW_MS + 60_000, "issuer": "router-0", **receipt_changes}
    return turn.model_copy(update={"router_receipt": RouterReceipt(**fields)})


def _with_artifact_id(turn, artifact_id: str):
    return turn.model_copy(update={"token_artifact": turn.token_artifact.model_copy(
        update={"artifact_id": artifact_id})})


def _refused(result) -> str:
    assert isinstance(result, Rejected), result
    assert result.reason is RejectionReason.INVALID_BOUNDARY_PROOF, result
    return result.detail


# --- 1. receipt_id / issuer of only whitespace: refused at promotion ----------------


@pytest.mark.parametrize("blank", BLANKS, ids=BLANK_IDS)
@pytest.mark.parametrize("field", ["receipt_id", "issuer"])
def test_a_receipt_naming_a_blank_id_or_issuer_is_refused(field, blank):
    detail = _refused(validate_turn(_receipt_turn(**{field: blank}), NOW_MS))
    assert field in detail


@pytest.mark.parametrize("field", ["receipt_id", "issuer"])
def test_a_blank_receipt_is_refused_for_a_logical_only_turn_too(field):
    turn = _receipt_turn(**{field: " "}).model_copy(
        update={"status": TurnStatus.INCOMPLETE})
    _refused(validate_turn(turn, NOW_MS))


@pytest.mark.parametrize("name", ["rc 1", " rc1", "rc1\t", "\u00e9"])
def test_a_receipt_whose_names_hold_more_than_whitespace_binds(name):
    result = validate_turn(_receipt_turn(receipt_id=name, issuer=name), NOW_MS)
    assert isinstance(result, Valid) and result.artifact_reusable, result


# --- 2. artifact_id empty or only whitespace: refused at promotion ------------------


@pytest.mark.parametrize("blank", ["", *BLANKS], ids=["empty", *BLANK_IDS])
def test_an_artifact_with_a_blank_artifact_id_is_refused(blank):
    detail = _refused(validate_turn(_with_artifact_id(make_turn(), blank), NOW_MS))
    assert "artifact_id" in detail


def test_a_blank_artifact_id_is_refused_without_a_proof_and_when_logical_only():
    turn = _with_artifact_id(make_turn(), " ")
    _refused(validate_turn(turn.model_copy(update={"boundary_proof": None}), NOW_MS))
    _refused(validate_turn(turn.model_copy(update={"status": TurnStatus.INCOMPLETE}), NOW_MS))


def test_an_artifact_id_with_inner_spaces_binds():
    result = validate_turn(_with_artifact_id(make_turn(), "art 1"), NOW_MS)
    assert isinstance(result, Valid) and result.artifact_reusable, result
    assert result.certification is Certification.CERTIFIED


# --- reads of rows stored before the rules (or damaged since) -----------------------


@pytest.fixture
def history() -> VerifiedHistory:
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, conv = uid("tenant"), uid("conv")
    store.promote(conversation_turn(tenant, conv, 0))
    result = store.read_history(tenant, conversation_id=conv)
    assert isinstance(result, VerifiedHistory)
    assert isinstance(rehydrate(result, "fp1", T0), Certified)
    return result


def _receipt(**changes) -> str:
    return canonical_json_text({"receipt_id": "rc1", "router_key_format": "prefix-blocks-v1",
                                "covered_tokens": 42, "expires_at": _ms(T0) + 3_600_000,
                                "issuer": "router-0", **changes})


def _proof(**changes) -> str:
    return canonical_json_text({**json.loads(binding_proof()), **changes})


def _ms(moment) -> int:
    return int(moment.timestamp() * 1000)


def _reason(history, **changes):
    damaged = replace(history, checkpoint=replace(history.checkpoint, **changes))
    result = rehydrate(damaged, "fp1", T0)
    if isinstance(result, Certified):
        return "certified"
    assert isinstance(result, Fallback), result
    assert result.items == history.items  # a fallback carries every item
    return result.reason


@pytest.mark.parametrize("blank", BLANKS, ids=BLANK_IDS)
@pytest.mark.parametrize("field", ["receipt_id", "issuer", "router_key_format"])
def test_a_stored_receipt_with_a_blank_name_is_never_reused(history, field, blank):
    assert _reason(history, router_receipt=_receipt(**{field: blank})) is (
        FallbackReason.NO_ARTIFACT)


@pytest.mark.parametrize("blank", ["", *BLANKS], ids=["empty", *BLANK_IDS])
def test_a_stored_artifact_with_a_blank_artifact_id_is_never_reused(history, blank):
    artifact = replace(history.checkpoint.token_artifact, artifact_id=blank)
    assert _reason(history, token_artifact=artifact) is FallbackReason.NO_ARTIFACT


# --- 3. expiries a datetime cannot hold, zero and negative ---------------------------


BEYOND = [LAST_MS + 1, 10**15, 10**30, FIRST_MS - 1, -(10**30)]
BEYOND_IDS = ["9999+1ms", "1e15", "1e30", "year0", "-1e30"]


@pytest.mark.parametrize("expires", BEYOND, ids=BEYOND_IDS)
@pytest.mark.parametrize("record", ["router_receipt", "boundary_proof"])
def test_a_stored_expiry_outside_years_1_to_9999_is_never_reused(history, record, expires):
    stored = _receipt(expires_at=expires) if record == "router_receipt" else _proof(
        expires_at=expires)
    assert _reason(history, **{record: stored}) is FallbackReason.ARTIFACT_EXPIRED


@pytest.mark.parametrize("record", ["router_receipt", "boundary_proof"])
def test_the_last_readable_millisecond_is_an_expiry_like_any_other(history, record):
    stored = _receipt(expires_at=LAST_MS) if record == "router_receipt" else _proof(
        expires_at=LAST_MS)
    assert _reason(history, **{record: stored}) == "certified"


@pytest.mark.parametrize("expires", [0, -1, FIRST_MS], ids=["epoch", "before-1970", "year1"])
@pytest.mark.parametrize("record", ["router_receipt", "boundary_proof"])
def test_zero_and_negative_stored_expiries_are_past(history, record, expires):
    stored = _receipt(expires_at=expires) if record == "router_receipt" else _proof(
        expires_at=expires)
    assert _reason(history, **{record: stored}) is FallbackReason.ARTIFACT_EXPIRED


@pytest.mark.parametrize("expires", [0, -1, FIRST_MS])
def test_a_receipt_expired_before_processing_is_kept_and_the_turn_promoted(expires):
    """At promotion a zero or negative receipt expiry is time, not a broken gateway:
    the turn is promoted with its artifact, and its reads fall back ARTIFACT_EXPIRED
    (docs/gateway-protocol.md, section 6)."""
    result = validate_turn(_receipt_turn(expires_at=expires), NOW_MS)
    assert isinstance(result, Valid) and result.artifact_reusable, result


@pytest.mark.parametrize("expires", [0, -1, FIRST_MS])
@pytest.mark.parametrize("record", ["token_artifact", "boundary_proof"])
def test_an_artifact_or_proof_expired_before_processing_costs_reuse_only(record, expires):
    turn = make_turn()
    turn = turn.model_copy(update={record: getattr(turn, record).model_copy(
        update={"expires_at": expires})})
    result = validate_turn(turn, NOW_MS)
    assert isinstance(result, Valid) and not result.artifact_reusable, result
    assert result.certification is Certification.CERTIFIED
