"""The pure rehydration decision: certified, fallback (with every item) or failure."""

from __future__ import annotations

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
from tests.contract.store_support import T0, FakeClock, conversation_turn, uid


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
    stored = canonical_json_text({"receipt_id": "rc1", "boundary_kind": "append",
                                  "expires_at": _ms(expires)})
    damaged = with_checkpoint(history, **{record: stored})
    assert damaged.checkpoint.token_artifact.expires_at > expires
    before = expires - timedelta(milliseconds=1)
    assert isinstance(rehydrate(damaged, "fp1", before), Certified)
    result = rehydrate(damaged, "fp1", expires)  # expires_at <= now: the artifact's rule
    assert result == Fallback(
        FallbackReason.ARTIFACT_EXPIRED, damaged.checkpoint, damaged.items, damaged.head_seq
    )


def test_fingerprint_mismatch_wins_over_an_expired_proof(history):
    stored = canonical_json_text({"expires_at": _ms(T0)})
    damaged = with_checkpoint(history, boundary_proof=stored)
    assert rehydrate(damaged, "fp2", T0).reason is FallbackReason.FINGERPRINT_MISMATCH


def test_a_proof_without_a_readable_expiry_is_not_reused(history):
    for stored in ('{"expires_at":"soon"}', "[]", "not json"):
        damaged = with_checkpoint(history, boundary_proof=stored)
        assert rehydrate(damaged, "fp1", T0).reason is FallbackReason.ARTIFACT_EXPIRED
