"""The bench's raw pipeline floor does the work its figure claims, on the real servers.

``ratchet bench processor`` prints, beside the end-to-end rate, the rate of a raw
pipeline (consume -> LWT -> publish -> commit, plus the plain requests of each
shape) that uses none of ratchet's code. That row is the evidence of what this machine
allows; this test makes sure it is real work: every event consumed, one applied LWT
and one published outcome per event, offsets committed, and exactly the Cassandra
requests per turn that its shape names.
"""

from __future__ import annotations

import gc

import pytest

from ratchet.bench.floors import (
    FAUST_FLOOR,
    FLOOR_SHAPES,
    PacedFloor,
    faust_pipeline,
    raw_pipeline,
)
from streams.testing import isolated_settings

pytestmark = pytest.mark.integration

REQUESTS_PER_TURN = {"lwt": 1, "lwt2": 2, "read": 2, "ratchet": 4}
LWT_ROWS_PER_TURN = {"lwt": 1, "lwt2": 2, "read": 1, "ratchet": 2}  # + the claim's row


@pytest.mark.parametrize("shape", sorted(FLOOR_SHAPES))
def test_raw_pipeline_does_every_step_once_per_event(settings, shape):
    events = 48
    gc.unfreeze()
    row, result = raw_pipeline(isolated_settings(settings, "floor", partitions=4), events, {},
                               shape=shape)
    # The floor froze its start-up heap before its clock ran, as the worker does: a
    # full collection over it would otherwise stall a paced floor run mid-way.
    assert gc.get_freeze_count() > 0

    assert row.name == FLOOR_SHAPES[shape]
    assert row.count == result.consumed == events
    assert result.applied == events  # every LWT applied: one fresh row per event
    assert result.rows == LWT_ROWS_PER_TURN[shape] * events
    assert result.published == events
    assert sum(result.committed.values()) == events  # offsets = events per partition
    assert len(result.committed) == 4
    assert result.requests == REQUESTS_PER_TURN[shape] * events
    assert row.per_second > 0 and "client" in row.cpu_s
    # Timed from the consumer's join to the last event done: its start-up (group join)
    # and its stop are not in the floor's rate, as the worker's start is not in ratchet's.
    assert 0 < row.seconds < result.run_s


def test_raw_pipeline_keeps_the_workers_lane_window(settings):
    """With ``RATCHET_LANE_WINDOW`` 4, as the worker, a lane of the floor has several
    events in flight (never more than 4), and still does every step once per event
    and commits every offset."""
    from dataclasses import replace

    events = 48
    floor_settings = replace(isolated_settings(settings, "floorw", partitions=2), lane_window=4)
    row, result = raw_pipeline(floor_settings, events, {}, shape="lwt2")
    assert row.count == result.consumed == result.published == result.applied == events
    assert sum(result.committed.values()) == events and len(result.committed) == 2
    assert result.requests == 2 * events
    assert 1 < result.most_in_flight <= 4
    single = replace(isolated_settings(settings, "floor1", partitions=2), lane_window=1)
    _, one_at_a_time = raw_pipeline(single, 8, {}, shape="lwt")
    assert one_at_a_time.most_in_flight == 1


def test_floor_0_publishes_one_outcome_per_record_on_a_backlog_and_paced(settings, tmp_path):
    """The Faust-only floor: every record's outcome arrives (``faust_pipeline`` fails
    otherwise), its worker's CPU is counted, and paced records get a latency each."""
    floor_settings = isolated_settings(settings, "floor0", partitions=4)
    row, latency = faust_pipeline(floor_settings, 40, {}, tmp_path)
    assert (row.name, row.count, latency) == (FAUST_FLOOR, 40, None)
    assert row.cpu_s["client"] > 0
    row, latency = faust_pipeline(floor_settings, 40, {}, tmp_path, rate=50)
    assert row.count == 40 and latency is not None
    p50, p99, samples = latency
    assert samples == 40 and 0 < p50 <= p99


def test_paced_floor_runs_again_on_the_same_keyspace_and_topics(settings):
    """``PacedFloor``: run after run on one keyspace and topic pair, each from the
    topics' end with keys of its own (every LWT applied, or ``run`` raises); one
    produce -> outcome latency per record of the run."""
    with PacedFloor(isolated_settings(settings, "paced", partitions=2), {}, "lwt2") as floor:
        floor.warm_up(20.0, 10)
        assert (floor.cpu_s, floor.seconds) == ({}, 0.0)  # the warm-up is not counted
        first = floor.run(20.0, 12)
        seconds = floor.seconds
        second = floor.run(20.0, 8)
    assert (len(first), len(second)) == (12, 8)
    assert all(ms > 0 for ms in first + second)
    # The floor's own process's CPU over both runs: its share of the machine at the rate.
    assert floor.cpu_s["floor"] > 0 and floor.seconds > seconds > 0
