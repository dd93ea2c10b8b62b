"""A turn answering many claims digests each output's result once (a review, session 34).

Each claimed effect compared its recorded result with the turn's outputs by parsing and
canonicalising every output again (``claims.result_digest``): a retry answering N
regenerated calls cost N x N parses (N = 2 000: 26 s on one worker thread). The
decision must parse each output and each claim's outcome a bounded number of times,
and still find the one output that carries a claim's result.
"""

from __future__ import annotations

import uuid

import pytest

from ratchet.domain import promotion
from ratchet.domain.claims import ClaimRequest, EffectPolicy, effect_id_for_claim
from ratchet.samples import NOW_MS, TENANT, new_id
from schemas.items import arguments_digest, function_call, function_call_output, message
from schemas.models import CheckpointPromoted, RejectionReason
from tests.unit.test_processor_rules import Harness, conv_id, turn


def _retry_answering(h: Harness, n: int, *, carried: bool):
    """n completed claims (results under old call ids), then a retry turn with n new
    call ids whose LAST output carries the claims' shared result when ``carried``."""
    conv, key = conv_id(), new_id("idem")
    effect_ids = []
    for i in range(n):
        effect_id = effect_id_for_claim(key, 0, "lookup", i)
        request = ClaimRequest(TENANT, key, effect_id, 1, 0, f"old_{i}", "lookup",
                               arguments_digest({}), uuid.uuid4().hex, 60_000,
                               EffectPolicy.AT_LEAST_ONCE)
        h.store.mark_request_facts(TENANT, conv, key)
        h.ledger.claim_effect(request, NOW_MS)
        h.store.mark_request_facts(TENANT, conv, key)
        h.ledger.complete_claim(TENANT, key, effect_id, request.token, "succeeded",
                                function_call_output(f"old_{i}", "the result", item_id=f"oo{i}"),
                                NOW_MS)
        effect_ids.append(effect_id)
    items = [function_call(f"new_{i}", "lookup", {}, item_id=f"fc{i}") for i in range(n)]
    items += [function_call_output(f"new_{i}", "the result" if carried and i == n - 1
                                   else f"another {i}", item_id=f"fo{i}") for i in range(n)]
    items.append(message("done", role="assistant", item_id=new_id("msg")))
    return turn(conv, 0, items=items, idempotency_key=key, tool_effect_ids=tuple(effect_ids))


@pytest.mark.parametrize("carried", [True, False])
def test_each_output_is_digested_once_however_many_claims(monkeypatch, carried):
    h = Harness()
    n = 60
    retry = _retry_answering(h, n, carried=carried)
    calls = 0
    real = promotion.result_digest

    def counted(item):
        nonlocal calls
        calls += 1
        return real(item)

    monkeypatch.setattr(promotion, "result_digest", counted)
    outcome = h.outcome(retry)
    if carried:
        assert isinstance(outcome, CheckpointPromoted)
    else:
        assert outcome.reason is RejectionReason.DUPLICATE_TOOL_EFFECT
    # n outputs, n claims' outcomes, each a few times at most: before, n * n (3 600)
    assert calls <= 4 * n, calls
