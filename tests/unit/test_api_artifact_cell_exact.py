"""A token_artifact cell that is not the canonical JSON the store wrote is damage.

Promise (docs/service.md "Damaged rows give the same reason on every load"): "A stored
cell that decodes but cannot be served (a token artifact that is not its JSON object
...) is CORRUPT_HISTORY on every load"; CONTRACT section 5: never an altered history.
A cell holding ``artifact_id`` twice (the last would win) or an unknown key parses, but
is not the canonical JSON of its fields: it is CORRUPT_HISTORY, never served normalised
(found by an outside review: it was served 200 certified).
"""

from __future__ import annotations

import json

import pytest

from tests.unit.test_api_cache import CachingStack, _conv_of, two_turns
from tests.unit.test_api_damaged_artifact_cell import RowCodecStore


def _stack():
    stack = CachingStack()
    stack.store.__class__ = RowCodecStore
    tenant, rid, _ = two_turns(stack)
    conv = _conv_of(stack, tenant, rid)
    ok = stack.fresh(tenant, rid)
    assert ok.status_code == 200 and ok.json()["outcome"] == "certified"
    return stack, tenant, rid, conv


def _written(stack, tenant, conv, rid) -> str:
    return stack.store._partitions[(tenant, conv)].checkpoints[rid].token_artifact.to_json()


@pytest.mark.parametrize("damage", ["duplicate_key", "unknown_key"])
def test_artifact_cell_that_is_not_what_to_json_writes_is_corrupt(damage):
    stack, tenant, rid, conv = _stack()
    text = _written(stack, tenant, conv, rid)
    if damage == "duplicate_key":
        cell = text[:-1] + ',"artifact_id":"forged"}'  # served as "forged" (last wins)
    else:
        cell = text[:-1] + ',"zz_extra":1}'
    assert json.loads(cell) is not None
    stack.store.tampered = {(rid, "token_artifact"): cell}
    resp = stack.fresh(tenant, rid)
    assert (resp.status_code, resp.json().get("reason")) == (500, "CORRUPT_HISTORY"), (
        f"served: {resp.status_code} {resp.json().get('checkpoint')}"
    )
