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
    assert [(s.tp, s.next_offset, s.end_offset, s.idle_s, s.attempt) for s in stalls] == [
        ("a", 10, 20, 15, 1)]


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


def test_each_report_counts_an_attempt_and_gives_the_recovery_a_fresh_delay():
    dog = FetchWatchdog(stall_after_s=5)
    dog.observe(0, figures(a=(1, 9)), room=True, settled=True)
    assert [s.attempt for s in dog.observe(5, figures(a=(1, 9)), room=True,
                                           settled=True)] == [1]
    assert dog.observe(9, figures(a=(1, 9)), room=True, settled=True) == []
    assert [s.attempt for s in dog.observe(10, figures(a=(1, 9)), room=True,
                                           settled=True)] == [2]
    # The recovery worked: the partition moved. A later stall is a new first attempt.
    dog.observe(11, figures(a=(4, 9)), room=True, settled=True)
    assert [s.attempt for s in dog.observe(16, figures(a=(4, 9)), room=True,
                                           settled=True)] == [1]


def test_reset_and_unassignment_forget_a_partition():
    dog = FetchWatchdog(stall_after_s=5)
    dog.observe(0, figures(a=(1, 2), b=(1, 2)), room=True, settled=True)
    dog.reset(["a"])
    assert [s.tp for s in dog.observe(5, figures(a=(1, 2), b=(1, 2)), room=True,
                                      settled=True)] == ["b"]
    # b is revoked, then assigned again: it starts from scratch (delay and attempts).
    dog.observe(6, figures(a=(1, 2)), room=True, settled=True)
    stalls = dog.observe(11, figures(a=(1, 2), b=(1, 2)), room=True, settled=True)
    assert [(s.tp, s.attempt) for s in stalls] == [("a", 1)]
    assert [(s.tp, s.attempt) for s in dog.observe(16, figures(a=(1, 2), b=(1, 2)),
                                                   room=True, settled=True)] == [
        ("a", 2), ("b", 1)]


def test_the_delay_must_be_positive():
    with pytest.raises(ValueError):
        FetchWatchdog(stall_after_s=0)


# --- FetchGuard (streams/app.py): what the worker does with a verdict -----------------

class FakeConsumer:
    def __init__(self, tps):
        self.tps = set(tps)
        self.flow_active = True
        self.resumed: list = []
        self.seeks: list = []

    def assignment(self):
        return set(self.tps)

    def resume_partitions(self, tps):
        self.resumed.extend(tps)

    async def seek_wait(self, offsets):
        self.seeks.append(dict(offsets))


class FakeLanes:
    def has_room(self):
        return True

    def in_flight(self, tp):
        return None


class FakeEndOffsets:
    def __init__(self, offsets):
        self.offsets = offsets

    def query(self, tps):
        return {tp: self.offsets[tp] for tp in tps}


def make_guard(fetched, end_offsets, *, max_recoveries=2):
    from types import SimpleNamespace

    from faust.types import TP

    from streams.app import FetchGuard

    tps = [TP("events", 0), TP("events", 1)]
    consumer = FakeConsumer(tps)
    from streams.health import Health

    app = SimpleNamespace(consumer=consumer, rebalancing=False,
                          runtime=SimpleNamespace(fatal=None, health=Health()))
    clock = SimpleNamespace(now=0.0)
    stops = []
    guard = FetchGuard(app, FakeLanes(), {tps[i]: o for i, o in fetched.items()},
                       FetchWatchdog(stall_after_s=15), "events",
                       FakeEndOffsets({tps[i]: o for i, o in end_offsets.items()}),
                       max_recoveries=max_recoveries, clock=lambda: clock.now,
                       stop=lambda: stops.append(True))
    return guard, app, clock, stops, tps


def test_guard_resumes_and_seeks_a_stalled_partition_to_the_next_offset_it_needs():
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 7}, end_offsets={0: 10, 1: 9})

    async def scenario():
        await guard.check()
        clock.now = 10
        guard.fetched[tps[1]] = 8  # partition 1 moves, partition 0 does not
        await guard.check()
        assert app.consumer.seeks == []  # not yet: 10 s < 15 s
        clock.now = 15
        await guard.check()

    asyncio.run(scenario())
    assert app.consumer.resumed == [tps[0]]
    assert app.consumer.seeks == [{tps[0]: 5}]  # last dispatched + 1: nothing skipped
    assert stops == [] and app.runtime.fatal is None


def test_guard_stops_the_worker_when_recoveries_do_not_move_the_partition():
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 8}, end_offsets={0: 10, 1: 9},
                                               max_recoveries=2)

    async def scenario():
        for now in range(0, 100, 5):
            clock.now = now
            await guard.check()

    asyncio.run(scenario())
    assert app.consumer.seeks == [{tps[0]: 5}, {tps[0]: 5}]  # two recoveries, at 15 s and 30 s
    assert stops == [True]  # third stall (45 s): stop once, never again
    assert "[0]" in app.runtime.fatal


def test_guard_does_nothing_while_rebalancing():
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4}, end_offsets={0: 10, 1: 0})
    app.rebalancing = True

    async def scenario():
        for now in range(0, 100, 5):
            clock.now = now
            await guard.check()

    asyncio.run(scenario())
    assert app.consumer.seeks == [] and stops == []


def test_guard_judges_a_partition_with_nothing_dispatched_from_its_committed_offset():
    """Faust may drop a batch it no longer considers active after aiokafka moved the
    position past it: the partition needs its committed offset, not the position."""
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={1: 8}, end_offsets={0: 6, 1: 9})
    app.consumer._read_offset = {tps[0]: 3}  # Faust sought partition 0 to offset 3

    async def scenario():
        for now in (0, 15):
            clock.now = now
            await guard.check()

    asyncio.run(scenario())
    assert app.consumer.seeks == [{tps[0]: 3}]


def test_guard_never_seeks_with_figures_taken_before_a_rebalance():
    """Two partitions stalled in one check: the first one's seek waits on the broker
    (``seek_wait`` awaits the new position), and a whole rebalance can run meanwhile
    (revoked, the lanes' queued records dropped unacked, assigned again from the
    committed offset). The second one's offset was taken before it: its last dispatched
    record + 1 of the old assignment, past the records the revoked lane dropped. Sought
    there, the new assignment would skip them, and a commit of a later record would pass
    them: never handled (CONTRACT 4). (An outside review of the worker across
    rebalances, session 42.)"""
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 7}, end_offsets={0: 10, 1: 10})
    app.rebalancing_count = 0
    seek = app.consumer.seek_wait

    async def seek_during_which_a_rebalance_runs(offsets):
        await seek(offsets)
        if len(app.consumer.seeks) == 1:
            # what on_revoked / on_assigned and Faust do, all within this await
            app.rebalancing, app.rebalancing_count = True, app.rebalancing_count + 1
            guard.fetched.clear()
            guard.watchdog.reset()
            app.consumer._read_offset = {tps[0]: 3, tps[1]: 5}  # the committed offsets
            await asyncio.sleep(0)
            app.rebalancing = False

    app.consumer.seek_wait = seek_during_which_a_rebalance_runs

    async def scenario():
        for now in (0, 15):
            clock.now = now
            await guard.check()

    asyncio.run(scenario())
    # Which stalled partition is sought first is the stalls' order (a set's): either one,
    # to its next offset, before any rebalance. The other one's figure is the old
    # assignment's: it must not be sought at all.
    first = app.consumer.seeks[0]
    assert first in ({tps[0]: 5}, {tps[1]: 8})
    assert app.consumer.seeks == [first], (
        f"sought again with a next offset from before the rebalance; the new assignment "
        f"starts at the committed offsets (seeks: {app.consumer.seeks})")


def test_a_reported_hang_keeps_no_record_once_its_lane_is_idle_or_revoked(caplog):
    """The guard names a hung event once; what it keeps to know that must not be the
    record itself: a turn of up to 16 MiB per partition stayed alive after its event
    was done, and after its partition was revoked (state per partition must be dropped
    on revoke, bounded). (An outside review of the worker across rebalances, session 42.)"""
    import asyncio
    import gc
    import weakref

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 7}, end_offsets={0: 5, 1: 8})

    class Record:
        offset = 5

    record = Record()
    busy = {tps[0]: (record, 20.0)}
    guard.lanes.in_flight = lambda tp: busy.get(tp)
    kept = weakref.ref(record)

    async def scenario():
        await guard.check()  # reported
        await guard.check()  # not twice
        busy.clear()  # the event is done
        app.consumer.tps = {tps[1]}  # and partition 0 revoked
        await guard.check()

    asyncio.run(scenario())
    assert sum("in flight for" in r.getMessage() for r in caplog.records) == 1
    del record
    gc.collect()
    assert kept() is None, "the guard still holds the record of a finished, revoked event"


def test_guard_resumes_nothing_after_a_rebalance_began_during_its_seek():
    """A rebalance during the seek (it awaits the broker): the partition may be another
    worker's by now. Faust's resume only adds it to the set Faust fetches from, so a
    partition revoked meanwhile was put back into that set while not assigned; Faust
    sets the fetch state of its new assignment itself. (An outside review of the
    worker across rebalances, session 42.)"""
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 7}, end_offsets={0: 10, 1: 8})
    app.rebalancing_count = 0
    seek = app.consumer.seek_wait

    async def seek_during_which_a_rebalance_runs(offsets):
        await seek(offsets)
        app.rebalancing_count += 1
        app.consumer.tps = {tps[1]}  # partition 0 went to another worker

    app.consumer.seek_wait = seek_during_which_a_rebalance_runs

    async def scenario():
        for now in (0, 15):
            clock.now = now
            await guard.check()

    asyncio.run(scenario())
    assert app.consumer.seeks == [{tps[0]: 5}]
    assert app.consumer.resumed == [], app.consumer.resumed


def test_a_parked_partition_is_no_stall_and_is_never_sought_by_the_guard():
    """A partition the worker parked itself (streams/parking.py) owes records and does
    not move: no stall, no seek, no resume, and never the worker's stop; one parked
    after a check began (its end offsets being read) is left to its resumption too.
    A mutation review, session 43."""
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 8}, end_offsets={0: 10, 1: 9})
    guard._parked = lambda: {tps[0]}

    async def parked_for_ever():
        for now in range(0, 100, 5):
            clock.now = now
            await guard.check()

    asyncio.run(parked_for_ever())
    assert app.consumer.seeks == [] and app.consumer.resumed == [] and stops == []

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 8}, end_offsets={0: 10, 1: 9})
    asks = []

    def parked():  # not parked when the check lists partitions, parked right after
        asks.append(1)
        return set() if len(asks) == 1 else {tps[0]}

    async def parked_during_the_check():
        await guard.check()
        clock.now = 15
        guard._parked = parked
        await guard.check()

    asyncio.run(parked_during_the_check())
    assert app.consumer.seeks == [] and app.consumer.resumed == []


def test_an_event_retrying_an_outage_is_not_reported_hung(caplog):
    """A lane whose event in flight retries a persistence outage has said so itself
    (the retry's warning, ``degraded``): the guard names only other hangs."""
    import asyncio

    guard, app, clock, stops, tps = make_guard(fetched={0: 4, 1: 7}, end_offsets={0: 5, 1: 8})

    class Record:
        offset = 5

    busy = {tps[0]: (Record(), 20.0), tps[1]: (Record(), 20.0)}
    guard.lanes.in_flight = lambda tp: busy.get(tp)
    app.runtime.health.retrying("events[0]", "store: timeout")
    asyncio.run(guard.check())
    hung = [r.getMessage() for r in caplog.records if "in flight for" in r.getMessage()]
    assert len(hung) == 1 and hung[0].startswith("lane 1:"), hung


def test_the_lag_gauge_counts_what_the_lanes_still_owe():
    """Consumer lag: records not fetched yet plus those the partition's lane has not
    acked (an event in flight included: one retrying through an outage read 0 before
    session 38)."""
    from types import SimpleNamespace

    from faust.types import TP

    from streams import metrics
    from streams.app import _update_lag

    tp = TP("events", 0)
    consumer = SimpleNamespace(assignment=lambda: {tp}, highwater=lambda _tp: 10)
    lanes = SimpleNamespace(owed=lambda _tp: 1)  # offset 9, in flight
    _update_lag(SimpleNamespace(consumer=consumer), lanes, {tp: 9})
    assert metrics.CONSUMER_LAG.labels("events", "0")._value.get() == 1
