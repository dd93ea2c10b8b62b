"""The pure rehydration decision: certified, fallback (with every item) or failure."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from ratchet.domain.history import (
    HistoryFailure,
    HistoryFailureReason,
    VerifiedHistory,
)
from ratchet.domain.rehydration import Certified, Failure, Fallback, FallbackReason, rehydrate
from schemas.canonical import canonical_json_text
from schemas.models import Certification
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import T0, FakeClock, binding_proof, conversation_turn, uid


@pytest.fixture
def history() -> VerifiedHistory:
    """A real two-turn history (built through the in-memory store)."""
    store = MemoryCheckpointStore(StoreOptions(clock=FakeClock()))
    tenant, conv = uid("tenant"), uid("conv")
    store.promote(conversation_turn(tenant, conv, 0))
    store.promote(conversation_turn(tenant, conv, 1))
    result = store.read_history(tenant, conversation_id=conv)
    assert isinstance(result, VerifiedHistory)
    return result


def proof(**changes) -> str:
    """The stored proof of ``conversation_turn`` (it binds the artifact), changed."""
    return canonical_json_text({**json.loads(binding_proof()), **changes})


def receipt(**changes) -> str:
    """A stored router receipt that covers the stored artifact (42 tokens), changed."""
    return canonical_json_text({"receipt_id": "rc1", "router_key_format": "prefix-blocks-v1",
                                "covered_tokens": 42, "expires_at": _ms(T0 + timedelta(hours=1)),
                                "issuer": "router-0", **changes})


def with_checkpoint(history: VerifiedHistory, **changes) -> VerifiedHistory:
    return replace(history, checkpoint=replace(history.checkpoint, **changes))


def test_matching_fingerprint_and_live_artifact_is_certified(history):
    result = rehydrate(history, "fp1", T0)
    assert result == Certified(history.checkpoint, history.items, history.head_seq)
    assert len(result.items) == 4


@pytest.mark.parametrize("caller", ["fp2", None])
def test_fingerprint_change_falls_back_with_all_items(history, caller):
    result = rehydrate(history, caller, T0)
    assert isinstance(result, Fallback)
    assert result.reason is FallbackReason.FINGERPRINT_MISMATCH
    assert result.items == history.items


def test_artifact_bound_to_another_fingerprint_is_a_mismatch(history):
    artifact = replace(history.checkpoint.token_artifact, fingerprint_hash="fp9")
    result = rehydrate(with_checkpoint(history, token_artifact=artifact), "fp1", T0)
    assert result.reason is FallbackReason.FINGERPRINT_MISMATCH


def test_expired_artifact_falls_back(history):
    expires = history.checkpoint.token_artifact.expires_at
    assert isinstance(rehydrate(history, "fp1", expires - timedelta(milliseconds=1)), Certified)
    result = rehydrate(history, "fp1", expires)
    assert result == Fallback(
        FallbackReason.ARTIFACT_EXPIRED, history.checkpoint, history.items, history.head_seq
    )


def test_logical_only_is_not_certified(history):
    logical = with_checkpoint(history, certification=Certification.LOGICAL_ONLY)
    assert rehydrate(logical, "fp1", T0).reason is FallbackReason.NOT_CERTIFIED


def test_certified_without_artifact(history):
    bare = with_checkpoint(history, token_artifact=None)
    assert rehydrate(bare, "fp1", T0).reason is FallbackReason.NO_ARTIFACT


def test_not_certified_wins_over_other_reasons(history):
    logical = with_checkpoint(
        history, certification=Certification.LOGICAL_ONLY, token_artifact=None
    )
    assert rehydrate(logical, "other", T0 + timedelta(days=9)).reason is (
        FallbackReason.NOT_CERTIFIED
    )


@pytest.mark.parametrize("reason", list(HistoryFailureReason))
def test_history_failures_pass_through(reason):
    assert rehydrate(HistoryFailure(reason, "x"), "fp1", T0) == Failure(reason, "x")


def _ms(moment) -> int:
    return int(moment.timestamp() * 1000)


@pytest.mark.parametrize("record", ["boundary_proof", "router_receipt"])
def test_expired_proof_or_receipt_falls_back_like_an_expired_artifact(history, record):
    # Reuse needs an unexpired artifact with a valid proof (docs/gateway-protocol.md);
    # the artifact lives another hour, its proof (or receipt) expires at T0 + 1 min.
    expires = T0 + timedelta(minutes=1)
    stored = (proof(expires_at=_ms(expires)) if record == "boundary_proof" else
              receipt(expires_at=_ms(expires)))
    damaged = with_checkpoint(history, **{record: stored})
    assert damaged.checkpoint.token_artifact.expires_at > expires
    before = expires - timedelta(milliseconds=1)
    assert isinstance(rehydrate(damaged, "fp1", before), Certified)
    result = rehydrate(damaged, "fp1", expires)  # expires_at <= now: the artifact's rule
    assert result == Fallback(
        FallbackReason.ARTIFACT_EXPIRED, damaged.checkpoint, damaged.items, damaged.head_seq
    )


def test_fingerprint_mismatch_wins_over_an_expired_proof(history):
    damaged = with_checkpoint(history, boundary_proof=proof(expires_at=_ms(T0)))
    assert rehydrate(damaged, "fp2", T0).reason is FallbackReason.FINGERPRINT_MISMATCH


def test_a_proof_without_a_readable_expiry_is_not_reused(history):
    damaged = with_checkpoint(history, boundary_proof=proof(expires_at="soon"))
    assert rehydrate(damaged, "fp1", T0).reason is FallbackReason.ARTIFACT_EXPIRED
    for stored in ("[]", "not json"):  # not a proof at all: nothing binds the artifact
        damaged = with_checkpoint(history, boundary_proof=stored)
        assert rehydrate(damaged, "fp1", T0).reason is FallbackReason.NO_ARTIFACT


@pytest.mark.parametrize("damage", [
    {"boundary_proof": None},
    {"boundary_proof": proof(fingerprint_hash="fpX")},
    {"boundary_proof": proof(combined_count=43)},
    {"boundary_proof": proof(append_count=3)},
    {"boundary_proof": proof(combined_hash="other")},
    {"boundary_proof": proof(prefix_count=-2, append_count=44)},
    {"boundary_proof": proof(prefix_count=True)},
    {"artifact": {"token_count": 999}},
    {"artifact": {"token_hash": "other"}},
    {"artifact": {"safe_append_boundary": 43}},
    {"fingerprint": "fpX"},  # the row's and the artifact's, as a caller with fpX asks
])
def test_an_artifact_its_stored_proof_does_not_bind_is_never_reused(history, damage):
    """CONTRACT 1.5: the proof binds to the turn's fingerprint and its counts are the
    artifact's. Stored cells bound by no digest, damaged after promotion, are checked
    again on read: the history is served, the artifact never offered (an outside
    review found each of these served ``certified``)."""
    assert isinstance(rehydrate(history, "fp1", T0), Certified)
    caller = "fp1"
    if "artifact" in damage:
        artifact = replace(history.checkpoint.token_artifact, **damage["artifact"])
        damaged = with_checkpoint(history, token_artifact=artifact)
    elif "fingerprint" in damage:
        caller = damage["fingerprint"]
        artifact = replace(history.checkpoint.token_artifact, fingerprint_hash=caller)
        damaged = with_checkpoint(history, token_artifact=artifact, fingerprint_hash=caller)
    else:
        damaged = with_checkpoint(history, **damage)
    result = rehydrate(damaged, caller, T0)
    assert result == Fallback(
        FallbackReason.NO_ARTIFACT, damaged.checkpoint, damaged.items, damaged.head_seq
    )


@pytest.mark.parametrize("covered", [0, 42])
def test_a_stored_receipt_that_covers_the_artifact_is_served_certified(history, covered):
    kept = with_checkpoint(history, router_receipt=receipt(covered_tokens=covered))
    assert isinstance(rehydrate(kept, "fp1", T0), Certified)


@pytest.mark.parametrize("stored", [
    receipt(covered_tokens=43),  # more than the artifact's 42 tokens
    receipt(covered_tokens=-1),
    receipt(covered_tokens=True),
    receipt(covered_tokens="42"),
    receipt(receipt_id=""),
    receipt(issuer=""),
    receipt(router_key_format=""),
    receipt(router_key_format=None),
    "[]",
    "not json",
], ids=["over", "negative", "bool", "text", "no-id", "no-issuer", "no-key-format",
        "null-key-format", "not-an-object", "not-json"])
def test_a_stored_receipt_that_does_not_cover_the_artifact_is_never_reused(history, stored):
    """A receipt stored before session 52 (when none of its fields but the expiry was
    checked), or damaged since: its cell is bound by no digest, so a read checks again
    what the row itself can tell (the row keeps the fingerprint's hash, not its router
    key format), as it does for the proof. The history is served, the artifact never
    offered: ``NO_ARTIFACT``, never ``certified`` with a receipt that does not bind."""
    damaged = with_checkpoint(history, router_receipt=stored)
    result = rehydrate(damaged, "fp1", T0)
    assert result == Fallback(
        FallbackReason.NO_ARTIFACT, damaged.checkpoint, damaged.items, damaged.head_seq
    )
