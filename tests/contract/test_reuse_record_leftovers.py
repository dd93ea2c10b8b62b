"""Stored reuse records the processor no longer keeps read as a typed fallback, on both
store backends (session 53; ``tests/unit/test_receipt_leftovers.py`` has the rules).

A row written before session 53 (or damaged since) may hold a token artifact whose
``artifact_id`` is empty or only whitespace, a router receipt whose ``receipt_id`` or
``issuer`` is only whitespace, or a receipt or boundary proof whose ``expires_at`` is
beyond year 9999. Each is written here straight through the store (the processor's
checks bypassed, as an older worker wrote it), read back through the backend, and
rehydrated: the history is served whole, the artifact never offered (``NO_ARTIFACT``
for a record that names nothing, ``ARTIFACT_EXPIRED`` for an expiry no datetime holds).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from ratchet.domain.history import LAST_MS, VerifiedHistory
from ratchet.domain.rehydration import Certified, Fallback, FallbackReason, rehydrate
from schemas.canonical import canonical_json_text
from services.store.base import CheckpointStore, StoreOptions
from services.store.memory import MemoryCheckpointStore
from tests.contract.store_support import (
    T0,
    FakeClock,
    OnCassandra,
    artifact,
    binding_proof,
    conversation_turn,
    stored_receipt,
    uid,
)

CASES = {
    "artifact_id empty": ({"artifact_id": ""}, None, None, FallbackReason.NO_ARTIFACT),
    "artifact_id blank": ({"artifact_id": " \t"}, None, None, FallbackReason.NO_ARTIFACT),
    "receipt_id blank": ({}, {"receipt_id": " "}, None, FallbackReason.NO_ARTIFACT),
    "issuer blank": ({}, {"issuer": "\u00a0"}, None, FallbackReason.NO_ARTIFACT),
    "receipt expiry 1e30": ({}, {"expires_at": 10**30}, None, FallbackReason.ARTIFACT_EXPIRED),
    "receipt expiry 9999+1ms": ({}, {"expires_at": LAST_MS + 1}, None,
                                FallbackReason.ARTIFACT_EXPIRED),
    "proof expiry 1e30": ({}, None, 10**30, FallbackReason.ARTIFACT_EXPIRED),
    # session 53's outside review: no record the processor keeps lacks an expiry
    "receipt expiry null": ({}, {"expires_at": None}, None, FallbackReason.ARTIFACT_EXPIRED),
    "proof expiry null": ({}, None, "null", FallbackReason.ARTIFACT_EXPIRED),
}


class ReuseRecordContract:
    def make_store(self, options: StoreOptions) -> CheckpointStore:
        raise NotImplementedError

    def _promote_and_read(self, artifact_changes, receipt_changes, proof_expiry):
        store = self.make_store(StoreOptions(clock=FakeClock()))
        tenant, conv = uid("tenant"), uid("conv")
        proof = binding_proof()
        if proof_expiry is not None:
            proof = proof.replace('"expires_at":4102444800000', f'"expires_at":{proof_expiry}')
            assert str(proof_expiry) in proof
        request = dataclasses.replace(
            conversation_turn(tenant, conv, 0),
            token_artifact=dataclasses.replace(artifact(), **artifact_changes),
            router_receipt=stored_receipt(**(receipt_changes or {})),
            boundary_proof=proof)
        store.promote(request)
        history = store.read_history(tenant, conversation_id=conv)
        assert isinstance(history, VerifiedHistory), history
        return request, history

    def test_a_healthy_row_is_certified(self):
        _, history = self._promote_and_read({}, None, None)
        assert isinstance(rehydrate(history, "fp1", T0), Certified)

    @pytest.mark.parametrize("case", list(CASES))
    def test_a_record_the_processor_no_longer_keeps_falls_back(self, case):
        artifact_changes, receipt_changes, proof_expiry, reason = CASES[case]
        request, history = self._promote_and_read(artifact_changes, receipt_changes,
                                                  proof_expiry)
        result = rehydrate(history, "fp1", T0)
        assert isinstance(result, Fallback), result
        assert result.reason is reason
        assert result.items == request.items  # the whole history, never shortened
        if receipt_changes:  # kept as written: the row itself is not damaged
            assert history.checkpoint.router_receipt == canonical_json_text(
                {**json.loads(stored_receipt()), **receipt_changes})


class TestMemoryBackend(ReuseRecordContract):
    def make_store(self, options: StoreOptions) -> CheckpointStore:
        return MemoryCheckpointStore(options)


@pytest.mark.integration
class TestCassandraBackend(OnCassandra, ReuseRecordContract):
    pass
