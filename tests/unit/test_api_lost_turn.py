"""A promoted response whose turn row is gone is an integrity failure on every endpoint.

Rows never expire (docs/store.md), so a promoted turn's row that is not there is data
loss. The damage chaos phase (session 41) deleted such rows: the history endpoint
answered 404 ``NOT_FOUND`` and ``/status`` ``unknown``, the answers docs/gateway-
protocol.md section 8 keeps for ids nothing is known of (a gateway then waits for a
decision that was made, or sends the turn again). The request's idempotency record,
written by the same batch as the row, says the response was promoted: the history is
500 ``MISSING_HISTORY``, and so is ``/status``. A response id claimed but never promoted
keeps its answers (404, ``unknown``)."""

from __future__ import annotations

import pytest

from ratchet.domain.plan import ResponseClaim
from tests.contract.store_support import uid
from tests.unit.test_api_cache import NO_CACHE, CachingStack, _conv_of, two_turns
from tests.unit.test_api_http import FP, Stack


def _status(stack, tenant, rid):
    return stack.client.get(f"/v1/responses/{rid}/status", params={"tenant_id": tenant})


def _delete_turn(stack, tenant: str, conv: str, rid: str) -> None:
    """Delete the turn's row (checkpoint and items), as storage damage would."""
    partition = stack.store._partitions[(tenant, conv)]
    del partition.checkpoints[rid]
    partition.items.pop(rid, None)


@pytest.fixture(params=[(Stack, True), (Stack, False), (CachingStack, True),
                        (CachingStack, False)],
                ids=["fast-path", "fastapi", "cache-fast-path", "cache-fastapi"])
def stack(request):
    kind, fast_path = request.param
    return kind(fast_path=fast_path)


def _lost(stack) -> tuple[str, str, str]:
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    _delete_turn(stack, tenant, conv, rid)
    return tenant, conv, rid


def _reason(answer) -> tuple[int, str]:
    return answer.status_code, answer.json()["reason"]


def test_the_status_of_a_lost_turn_is_missing_history(stack):
    tenant, _, rid = _lost(stack)
    answer = _status(stack, tenant, rid)
    assert answer.status_code == 500, answer.json()
    body = answer.json()
    assert set(body) == {"error", "detail", "retryable"}
    assert (body["error"], body["retryable"]) == ("MISSING_HISTORY", False)
    assert rid in body["detail"]


def test_the_history_of_a_lost_turn_is_missing_history(stack):
    tenant, conv, rid = _lost(stack)
    assert _reason(stack.history(tenant, rid)) == (500, "MISSING_HISTORY")
    assert _reason(stack.history(tenant, rid, partition_key=conv)) == (500, "MISSING_HISTORY")
    assert _reason(stack.client.get(
        f"/v1/responses/{rid}/history",
        params={"tenant_id": tenant, "fingerprint_hash": FP, "partition_key": conv},
        headers=NO_CACHE)) == (500, "MISSING_HISTORY")


def test_a_wait_on_a_lost_turn_answers_missing_history(stack):
    """The wait's first look takes a claim without its row for a turn in flight (it
    does not ask ``turn_lost`` on that hot path); the read at its deadline, or the
    ordinary lookup, answers the loss, never a 409 "not promoted"."""
    tenant, conv, rid = _lost(stack)
    for params in ({}, {"partition_key": conv}):
        answer = stack.history(tenant, rid, wait_ms=300, **params)
        assert _reason(answer) == (500, "MISSING_HISTORY")


def test_a_turn_lost_after_it_was_read_is_missing_once_uncached():
    """Read (and cached) before the damage: the cache may answer it from what it
    verified; a read past the cache finds the loss."""
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200
    _delete_turn(stack, tenant, conv, rid)
    assert _reason(stack.fresh(tenant, rid)) == (500, "MISSING_HISTORY")
    assert _status(stack, tenant, rid).json()["error"] == "MISSING_HISTORY"


def test_a_claimed_response_never_promoted_keeps_its_answers(stack):
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    first_key = next(iter(stack.store._partitions[(tenant, conv)].idempotency))
    claims = (ResponseClaim(tenant, uid("resp"), conv, uid("key"), "d" * 64),
              ResponseClaim(tenant, uid("resp"), conv, first_key, "e" * 64))
    for claim in claims:
        assert stack.store.start_claiming(claim)() == claim
        answer = _status(stack, tenant, claim.response_id)
        assert (answer.status_code, answer.json()["state"]) == (200, "unknown")
        assert _reason(stack.history(tenant, claim.response_id)) == (404, "NOT_FOUND")
        assert _reason(stack.history(tenant, claim.response_id, partition_key=conv)) == (
            404, "NOT_FOUND")
