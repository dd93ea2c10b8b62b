"""A chain turn whose parent is not there gets the write's answer whatever its own
pairing (gateway-protocol.md section 7): a retry of a promoted request ``DUPLICATE`` /
``IDEMPOTENCY_KEY_REUSED`` (session 47), its original's own response id that
promotion again, a response id another request promoted in the partition ``CONFLICT``
naming it (session 48), else ``PARENT_NOT_PROMOTED``. Both backends, both entry
points, on a worker that never saw the chain (after a rebalance)."""

from __future__ import annotations

import pytest

from ratchet.samples import new_id
from schemas.canonical import canonical_digest
from schemas.models import CheckpointPromoted
from schemas.models import RejectionReason as R
from tests.contract.test_processor_handover import ENTRIES
from tests.unit.test_processor_order_before_pairing import self_unpaired
from tests.unit.test_processor_retry_at_head import tool_items
from tests.unit.test_processor_rules import chain_turn


def _answer(out) -> tuple:
    if isinstance(out, CheckpointPromoted):
        return ("promoted", out.response_id)
    return (out.reason, out.existing_response_id)


@ENTRIES
@pytest.mark.parametrize("case", ["retry", "key reused", "own id", "bound id", "new"])
def test_a_chain_turn_with_no_parent_gets_the_writes_answer_whatever_its_pairing(
        data, entry, case):
    first = data.worker()
    original = chain_turn(None, None)
    assert first.outcome(original).seq == 1
    root = original.response_id
    kw: dict = {}
    if case in ("retry", "key reused", "own id"):
        kw["idempotency_key"] = original.idempotency_key
    if case == "key reused":
        kw["request_digest"] = canonical_digest(["another request"])
    if case in ("own id", "bound id"):
        kw["response_id"] = root
    expected = {"retry": (R.DUPLICATE, root), "key reused": (R.IDEMPOTENCY_KEY_REUSED, root),
                "own id": ("promoted", root), "bound id": (R.CONFLICT, root),
                "new": (R.PARENT_NOT_PROMOTED, None)}[case]
    cold = data.worker(entry)  # another worker: no cache of the chain
    answers = [_answer(cold.outcome(chain_turn(root, new_id("resp"), items=items, attempt=2,
                                               **kw)))
               for items in (tool_items("call_p"), self_unpaired())]
    assert answers == [expected, expected]
