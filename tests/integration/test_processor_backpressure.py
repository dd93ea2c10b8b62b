"""Backpressure and group sharing with a real Faust worker.

* A burst above the lanes' bound (2000 queued events) makes the dispatcher wait for
  room and go on; every event is still handled once.
* Two workers in one consumer group share the partitions; SIGTERM on one drains it
  and its partitions move to the other without losing or duplicating a promotion.
"""

from __future__ import annotations

import time
import uuid

import pytest

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration


def single_turn_conversations(n: int):
    now = int(time.time() * 1000)
    return [make_turn(conversation_id=f"conv_{uuid.uuid4().hex[:12]}", expected_head_seq=0,
                      now_ms=now, response_id=f"resp_{uuid.uuid4().hex[:12]}",
                      idempotency_key=f"idem_{uuid.uuid4().hex[:12]}") for _ in range(n)]


def promoted(rig: Rig) -> dict[str, set[int]]:
    with rig.collector._lock:
        seen = list(rig.collector.all)
    out: dict[str, set[int]] = {}
    for s in seen:
        if isinstance(s.model, CheckpointPromoted):
            out.setdefault(s.model.response_id, set()).add(s.model.seq)
    return out


def test_burst_above_the_lane_bound_waits_for_room_and_completes(settings, tmp_path):
    rig = Rig(isolated_settings(settings, "burst", partitions=2, home=tmp_path / "home"))
    worker = rig.worker(tmp_path)
    try:
        turns = single_turn_conversations(2500)  # more than the 2000 the lanes may hold
        rig.send(*turns)
        rig.collector.wait(lambda: len(promoted(rig)) == len(turns), 240, "all promoted")
        assert all(seqs == {1} for seqs in promoted(rig).values())
        assert worker.alive(), worker.log_tail()
    finally:
        code = worker.terminate()
        rig.close()
    assert code == 0, worker.log_tail()


def test_two_workers_share_the_group_and_sigterm_hands_over_cleanly(settings, tmp_path):
    rig = Rig(isolated_settings(settings, "group", partitions=4, home=tmp_path / "home"))
    first, second = rig.worker(tmp_path, "first"), rig.worker(tmp_path, "second")
    try:
        early = single_turn_conversations(200)
        rig.send(*early)
        rig.collector.wait(lambda: len(promoted(rig)) >= 100, 120, "first promotions")
        assert first.terminate() == 0, first.log_tail()  # drains, commits, leaves
        late = single_turn_conversations(200)
        rig.send(*late)
        rig.collector.wait(lambda: len(promoted(rig)) == 400, 180, "all promoted")
        assert all(seqs == {1} for seqs in promoted(rig).values())
    finally:
        for worker in (first, second):
            worker.terminate()
        rig.close()
