"""Orphans the worker withholds on damage are told to the operator in one typed way: the
error line ``orphans withheld (<where>): ...`` and the counter
``ratchet_worker_orphans_withheld_total{where}`` (docs/operations.md, "Troubleshooting").

The case session 51 left (decisions, "The processor's leftovers of session 50"): a
claim's completion (the effect's execution) arrives as a ``ToolEffect`` after a stale
holder's run was recorded first; that earlier run is "the other execution", which only
this record would ever publish (``EFFECT_CONFLICT``). When the read of whether the
request stands promoted meets damage, nothing is published, the earlier run included:
that read is the one that says whether a promotion carries the earlier output, and an
orphan published wrongly orders a used side effect undone. Kept so (session 52); what
is new is that the operator is told which executions were withheld, by output digest,
and the counter moves, on every delivery of the record.
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY

from ratchet.domain.plan import CorruptPartition
from tests.unit.test_late_effect_conflicts import _attempt_effect, _stale_run_then_completion
from tests.unit.test_processor_rules import Harness

METRIC = "ratchet_worker_orphans_withheld_total"


def withheld(where: str) -> float:
    return REGISTRY.get_sample_value(METRIC, {"where": where}) or 0.0


class DamagedStanding:
    """The worker's store whose reads of a request's standing meet damaged rows."""

    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def promoted_key(self, *args, **kwargs):
        raise CorruptPartition("partition p: undecodable row (test damage)")


def test_an_earlier_execution_withheld_on_damage_is_told_by_line_and_counter(caplog):
    h = Harness()
    conv, key, effect_id, stale, done = _stale_run_then_completion(h)
    h.rewire(store=DamagedStanding(h.store))
    completion = _attempt_effect(conv, key, done, effect_id, 2)
    before = withheld("late_effect")
    for delivery in (1, 2):
        with caplog.at_level(logging.ERROR, logger="streams.request_facts"):
            caplog.clear()
            handled = h.processor.handle(h.record(completion))
        assert (handled.kind, handled.outbound) == ("effect", ()), (delivery, handled)
        lines = [r.getMessage() for r in caplog.records
                 if r.getMessage().startswith("orphans withheld (late_effect): ")]
        assert len(lines) == 1, (delivery, [r.getMessage() for r in caplog.records])
        # Both executions named by their output digests: what the operator decides on.
        assert effect_id in lines[0] and key in lines[0], lines[0]
        assert f"earlier execution (output digest {stale.content_digest})" in lines[0]
        assert f"this execution (output digest {done.content_digest})" in lines[0]
        assert withheld("late_effect") == before + delivery
    # Recorded all the same (the facts stand for the operator and later turns).
    assert {e.output_digest for e in h.ledger.effects_for(completion.tenant_id, key)
            if e.effect_id == effect_id} >= {stale.content_digest}


def test_the_same_record_on_an_intact_store_publishes_the_earlier_execution():
    """The control: the line and the counter are for damage only; undamaged, the
    earlier execution is published ``EFFECT_CONFLICT`` under its own digest."""
    h = Harness()
    conv, key, effect_id, stale, done = _stale_run_then_completion(h)
    before = withheld("late_effect")
    handled = h.processor.handle(h.record(_attempt_effect(conv, key, done, effect_id, 2)))
    assert [(o.model.effect_id, o.model.output_digest) for o in handled.outbound] == [
        (effect_id, stale.content_digest)]
    assert withheld("late_effect") == before
