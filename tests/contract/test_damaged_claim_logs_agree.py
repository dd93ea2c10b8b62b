"""A response id's claim naming no partition logs the same on both backends (session
52's outside review left it: "only a log line differs").

Met by a turn of another request, the claim is ``ResponseClaimed`` (``check_claim``:
an intact cell differs) and the turn is answered ``CONFLICT``; recording that
rejection asks whether the turn stands promoted (``VerdictRecorder.already_promoted``,
``get_checkpoint``), which must locate the response by its claim. Cassandra's lookup
raised ``CorruptPartition`` ("names no partition", ``_claimed_partition``) and the
worker logged the damage (``damaged_rows``: an ERROR an operator acts on); memory's
read the claim's null partition as a partition nobody has and answered None: no line.
The same damage, the same answer, and the operator's log told it on one backend only.
Now memory's location lookups refuse such a claim as Cassandra's do.
"""

from __future__ import annotations

import logging

import pytest

from ratchet.domain.plan import CorruptPartition
from ratchet.samples import TENANT, make_turn, new_id
from schemas.models import PromotionRejected, RejectionReason
from tests.contract.test_claim_without_digest import claim_only, cold, set_null
from tests.contract.test_processor_handover import ENTRIES


def damage_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR and "names no partition" in r.getMessage()]


@ENTRIES
def test_a_conflict_with_a_claim_naming_no_partition_logs_the_damage(
        store_and_ledger, entry, caplog):
    store, _ = store_and_ledger
    held = make_turn(conversation_id=new_id("conv"))
    claim_only(store, held)
    set_null(store, held.response_id, "partition_key")
    other = make_turn(conversation_id=held.conversation_id, response_id=held.response_id)
    caplog.set_level(logging.INFO)
    out = cold(store_and_ledger, entry).handle(other).outbound[0].model
    assert isinstance(out, PromotionRejected), out
    assert out.reason is RejectionReason.CONFLICT, (out.reason, out.detail)
    lines = damage_lines(caplog)
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0] == (f"promotion of {held.response_id} met a corrupt partition: the claim "
                        f"of response {held.response_id} of tenant {TENANT} names no partition")


def test_the_location_lookups_refuse_a_claim_naming_no_partition(store_and_ledger):
    """The reads behind that line, the same on both backends."""
    store, _ = store_and_ledger
    held = make_turn(conversation_id=new_id("conv"))
    claim_only(store, held)
    set_null(store, held.response_id, "partition_key")
    for name, read in {
        "get_checkpoint": lambda: store.get_checkpoint(TENANT, held.response_id),
        "read_checkpoint": lambda: store.read_checkpoint(TENANT, held.response_id),
        "_locate": lambda: store._locate(TENANT, held.response_id),
    }.items():
        with pytest.raises(CorruptPartition, match="names no partition"):
            read()
            pytest.fail(name)
