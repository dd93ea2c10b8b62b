"""Damaged token_artifact / router_receipt / boundary_proof cells that escape the typing.

Promised (docs/service.md "Damaged rows give the same reason on every load", CONTRACT
section 5, commit da7719d): a stored cell that decodes but cannot be served (a token
artifact, router receipt or boundary proof that is not its JSON object) is
CORRUPT_HISTORY on every load, certified or fallback, never an untyped 500, and a
sibling fork of the partition is still served. rows.py: "Decoding is strict: a damaged
row raises ValueError / TypeError / KeyError, and a partition read marks that response
as damaged".

Before its fix (found by an outside review, session 21):
- token_artifact whose expires_at is an ISO date at the edge of the calendar with an
  offset ("9999-12-31T23:00:00-05:00"): ``utc_ms`` raises OverflowError (an
  ArithmeticError, not ValueError), which ``decode_snapshot`` does not catch: the whole
  partition read fails, HTTP 500 {"error": "INTERNAL"}, and the sibling fork is not
  served either.
- router_receipt / boundary_proof that is a deeply nested JSON object: ``json.loads``
  raises RecursionError, which ``checkpoint_body`` (``except ValueError``) does not
  catch: untyped 500.
- router_receipt that is a JSON object holding a lone surrogate escape ("\\ud800"):
  ``json.loads`` accepts it, pydantic's ``dump_json`` in ``render_extension`` raises
  PydanticSerializationError, which only ``except _Undecodable`` surrounds: untyped 500.
"""

from __future__ import annotations

import pytest

from tests.unit.test_api_cache import (
    OTHER_FP,
    CachingStack,
    _conv_of,
    turn_to_damage,
    two_turns,
    uid,
)
from tests.unit.test_api_damaged_artifact_cell import RowCodecStore

_EDGE_ARTIFACT = (
    '{"artifact_id":"a","expires_at":"9999-12-31T23:00:00-05:00","fingerprint_hash":"f",'
    '"safe_append_boundary":1,"token_count":1,"token_hash":"h"}'
)


def _typed(resp) -> dict:
    body = resp.json()
    assert body.get("outcome") in ("certified", "fallback", "failure"), (
        f"untyped {resp.status_code}: {body}"
    )
    return body


def test_artifact_expiry_out_of_calendar_range_is_typed_and_sibling_served():
    stack = CachingStack()
    stack.store.__class__ = RowCodecStore
    tenant, root = uid("tenant"), uid("resp")
    stack.chain(tenant, root, root, None)
    a = stack.chain(tenant, root, uid("resp"), root)
    b = stack.chain(tenant, root, uid("resp"), root)
    stack.store.tampered = {(b, "token_artifact"): _EDGE_ARTIFACT}
    body = _typed(stack.fresh(tenant, b))
    assert body["reason"] == "CORRUPT_HISTORY"
    sibling = stack.fresh(tenant, a)
    assert sibling.status_code == 200, f"sibling fork: {sibling.status_code} {sibling.text}"


@pytest.mark.parametrize("field", ["router_receipt", "boundary_proof"])
def test_deeply_nested_record_cell_is_typed(field):
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    nested = '{"a":' * 5000 + "1" + "}" * 5000
    stack.rewrite_checkpoint(tenant, _conv_of(stack, tenant, rid), rid, **{field: nested})
    body = _typed(stack.fresh(tenant, rid))
    assert body["reason"] == "CORRUPT_HISTORY"


@pytest.mark.parametrize("load", ["cold", "fallback", "extension"])
def test_record_cell_with_lone_surrogate_is_typed(load):
    stack, tenant, conv, target = turn_to_damage(load)
    stack.rewrite_checkpoint(tenant, conv, target, router_receipt='{"receipt_id":"\\ud800"}')
    if load == "cold":
        resp = stack.fresh(tenant, target)
    elif load == "fallback":
        resp = stack.history(tenant, target, fp=OTHER_FP)
    else:
        resp = stack.history(tenant, target, partition_key=conv)
    body = _typed(resp)
    assert body["reason"] == "CORRUPT_HISTORY"


@pytest.mark.parametrize("cell", [
    '{"receipt_id":"r","receipt_id":"other"}',  # a duplicate key: the last would win
    '{"receipt_id":NaN}',  # not JSON: NaN would be served as null
    '{"receipt_id": "r"}',  # not the canonical text the processor wrote
])
def test_a_record_cell_that_is_not_its_canonical_json_is_corrupt(cell):
    """A receipt or proof is served exactly as the processor wrote it (canonical JSON):
    a cell that parses to something else would be served altered."""
    stack = CachingStack()
    tenant, rid, _ = two_turns(stack)
    stack.rewrite_checkpoint(tenant, _conv_of(stack, tenant, rid), rid, router_receipt=cell)
    body = _typed(stack.fresh(tenant, rid))
    assert body["reason"] == "CORRUPT_HISTORY"
