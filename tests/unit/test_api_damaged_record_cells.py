"""A stored boundary proof or router receipt that is not a JSON object is CORRUPT_HISTORY.

CONTRACT section 5: failures are typed (``outcome`` failure with a reason; integrity
failures are 500 with that body). Every load renders the checkpoint (cold read,
no-cache, extension), for certified and fallback answers alike, so a damaged record
cell is a typed failure on each, never ``{"error": "INTERNAL"}``. Found by an outside
review (session 21); each test failed before its fix.
"""

from __future__ import annotations

import pytest

from tests.unit.test_api_cache import OTHER_FP, CachingStack, _conv_of, _third_turn, two_turns


def _body_is_typed(resp) -> None:
    body = resp.json()
    assert body.get("outcome") in ("certified", "fallback", "failure"), (
        f"untyped {resp.status_code}: {body}"
    )


@pytest.mark.parametrize("field", ["boundary_proof", "router_receipt"])
@pytest.mark.parametrize("stored", ["[1]", "not json"])
def test_cold_read_of_a_tampered_record_is_typed(field, stored):
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    stack.rewrite_checkpoint(tenant, _conv_of(stack, tenant, rid), rid, **{field: stored})
    _body_is_typed(stack.fresh(tenant, rid))
    # A fallback (other fingerprint) does not even carry the checkpoint.
    _body_is_typed(stack.history(tenant, rid, fp=OTHER_FP))


def test_extension_of_a_tampered_record_is_typed():
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    assert stack.history(tenant, rid).status_code == 200  # linked prefix cached
    third = _third_turn(stack, tenant, conv)
    stack.rewrite_checkpoint(tenant, conv, third, boundary_proof="[1]")
    _body_is_typed(stack.history(tenant, third, partition_key=conv))
