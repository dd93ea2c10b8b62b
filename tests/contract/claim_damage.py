"""An effect claim row with one cell nulled, on either ledger: the damage the claims API
and the processor must both answer as damage (``claims.claim_damage``; session 53)."""

from __future__ import annotations

import dataclasses

from ratchet.samples import TENANT
from services.ledger.cassandra import CassandraLedger

# Every cell a claim row is written with (the completed ones: status and output too):
# the row's cell, the memory ledger's record field.
CLAIM_CELLS = {
    "claim_token": "token", "claim_completed": "completed", "lease_until": "lease_until",
    "attempt": "attempt", "status": "status", "output_item": "output",
    "claimed_at": "claimed_at",
    # the claim's identity (written with every claim: ``ClaimIn`` requires each)
    "call_id": "call_id", "tool_name": "tool_name", "arguments_digest": "arguments_digest",
    "subturn_index": "subturn_index",
}
IDENTITY_CELLS = ("call_id", "tool_name", "arguments_digest", "subturn_index")


def null_claim_cell(ledger, key: str, effect_id: str, cell: str) -> None:
    """Null ``cell`` of the claim ``effect_id`` of request ``key`` (tenant ``TENANT``)."""
    if isinstance(ledger, CassandraLedger):
        ledger._session.execute(
            f"UPDATE request_facts SET {cell} = null WHERE tenant_id = %s AND "
            "idempotency_key = %s AND kind = 'claim' AND ref = %s",
            (TENANT, key, effect_id), timeout=30)
        return
    by_id = ledger._claims[(TENANT, key)]
    by_id[effect_id] = dataclasses.replace(by_id[effect_id], **{CLAIM_CELLS[cell]: None})
