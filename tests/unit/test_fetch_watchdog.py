"""The fetch watchdog's decision (streams/fetchwatch.py), on plain figures.

The watchdog must name a partition that owes records and does not move while the
worker could take them, and must never blame the fetcher for time the worker itself
held a partition back (no room in the lanes, rebalancing), nor a partition that is
simply caught up.
"""

from __future__ import annotations

import pytest

from streams.fetchwatch import FetchWatchdog, PartitionFigures


def figures(**next_and_end):
    return [PartitionFigures(tp, nxt, end) for tp, (nxt, end) in next_and_end.items()]


def test_a_partition_that_owes_records_and_does_not_move_is_named_after_the_delay():
    dog = FetchWatchdog(stall_after_s=15)
    assert dog.observe(0, figures(a=(10, 20), b=(5, 9)), room=True, settled=True) == []
    assert dog.observe(14, figures(a=(10, 20), b=(6, 9)), room=True, settled=True) == []
    stalls = dog.observe(15, figures(a=(10, 20), b=(7, 9)), room=True, settled=True)
    assert [(s.tp, s.next_offset, s.end_offset, s.idle_s) for s in stalls] == [
        ("a", 10, 20, 15)]


def test_a_caught_up_partition_is_never_stalled():
    dog = FetchWatchdog(stall_after_s=1)
    for now in range(10):
        assert dog.observe(now, figures(a=(20, 20)), room=True, settled=True) == []


def test_unknown_offsets_are_not_judged():
    dog = FetchWatchdog(stall_after_s=1)
    for now in range(10):
        assert dog.observe(now, figures(a=(None, 20), b=(3, None)), room=True,
                           settled=True) == []


@pytest.mark.parametrize("room,settled", [(False, True), (True, False)])
def test_time_the_worker_holds_partitions_back_does_not_count(room, settled):
    dog = FetchWatchdog(stall_after_s=10)
    dog.observe(0, figures(a=(10, 20)), room=True, settled=True)
    # 9 s idle, then 100 s where the worker has no room or is rebalancing ...
    dog.observe(9, figures(a=(10, 20)), room=True, settled=True)
    assert dog.observe(109, figures(a=(10, 20)), room=room, settled=settled) == []
    # ... and the clock starts again once it could take records.
    assert dog.observe(118, figures(a=(10, 20)), room=True, settled=True) == []
    assert [s.tp for s in dog.observe(119, figures(a=(10, 20)), room=True,
                                      settled=True)] == ["a"]


def test_reset_gives_a_partition_a_fresh_delay_and_unassigned_ones_are_forgotten():
    dog = FetchWatchdog(stall_after_s=5)
    dog.observe(0, figures(a=(1, 2), b=(1, 2)), room=True, settled=True)
    assert {s.tp for s in dog.observe(5, figures(a=(1, 2), b=(1, 2)), room=True,
                                      settled=True)} == {"a", "b"}
    dog.reset(["a"])
    assert [s.tp for s in dog.observe(6, figures(a=(1, 2), b=(1, 2)), room=True,
                                      settled=True)] == ["b"]
    # b is revoked, then assigned again: it starts from scratch.
    dog.observe(7, figures(a=(1, 2)), room=True, settled=True)
    assert [s.tp for s in dog.observe(11, figures(a=(1, 2), b=(1, 2)), room=True,
                                      settled=True)] == ["a"]


def test_the_delay_must_be_positive():
    with pytest.raises(ValueError):
        FetchWatchdog(stall_after_s=0)
