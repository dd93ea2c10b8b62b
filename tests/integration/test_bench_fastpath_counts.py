"""``python -m ratchet.bench.fastpath_counts`` on the real servers: the worker's runtime
(C++ driver on the loop, registry codec) over a small fixed workload. Its counts pin
the Cassandra requests of every kind of event the promotion path handles, so work that
creeps into the path fails here (docs/decisions.md, "The promotion path's work
counted", session 43)."""

from __future__ import annotations

import pytest

from ratchet.bench import fastpath_counts
from streams.testing import isolated_settings

pytestmark = pytest.mark.integration

LOOP_CLAIM = "loop INSERT response_claims IF"
LOOP_BATCH = "loop BATCH IF [2x INSERT turns IF, UPDATE turns IF]"
FIRST_BATCH = "loop BATCH IF [3x INSERT turns IF, UPDATE turns IF]"  # + the head marker


def test_requests_per_kind_of_event(settings):
    result = fastpath_counts.measure(isolated_settings(settings, "fpc"), conversations=4,
                                     chains=2, tools=2, top=5)
    assert result["promoted"] == 4 * 3 + 2 * 3 + 2
    assert result["loop_promotions"] == 4 * 3 + 2 * 2  # all but chains' first responses
    per_event = result["per_event"]
    assert per_event["conversation, later"] == {LOOP_CLAIM: 1, LOOP_BATCH: 1}
    assert per_event["conversation, first"] == {
        LOOP_CLAIM: 1, FIRST_BATCH: 1, "loop SELECT conversation_owners": 1,
        "loop INSERT conversation_owners": 1}
    assert per_event["chain, later"] == {LOOP_CLAIM: 1, LOOP_BATCH: 1,
                                         "loop INSERT response_owners": 1}
    totals = {kind: sum(requests.values()) for kind, requests in per_event.items()}
    assert totals["chain, first"] == 7
    assert totals["tool turn (first of a Conversation)"] == 5
    assert totals["tool effect"] == 5  # 7 before session 43
    assert "produced CheckpointPromoted" in result["kinds"]
    assert result["kinds"]["produced CheckpointPromoted"] == result["promoted"]
