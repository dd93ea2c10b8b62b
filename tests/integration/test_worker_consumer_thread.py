"""A worker with Faust's own consumer thread (``RATCHET_WORKER_CONSUMER=thread``).

Every other worker of the suites runs its consumer on its event loop (the default,
``streams/consumer_loop.py``); this keeps the documented way back working: the same
turns promote in order, and SIGTERM still finishes, commits and exits 0. With its fetches
held for the default wait and answered at the first record (``RATCHET_FETCH_WAIT_MS=0``),
which together are Faust's consumer as it comes."""

from __future__ import annotations

import time
import uuid

import pytest

from ratchet.samples import make_turn
from schemas.models import CheckpointPromoted
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("fetch_wait_ms", ["5", "0"])
def test_a_worker_on_fausts_consumer_thread_promotes_and_stops_cleanly(settings, tmp_path,
                                                                        fetch_wait_ms):
    rig = Rig(isolated_settings(settings, "thread", home=tmp_path / "home"))
    worker = rig.worker(tmp_path, "thread-worker", {"RATCHET_WORKER_CONSUMER": "thread",
                                                    "RATCHET_FETCH_WAIT_MS": fetch_wait_ms})
    try:
        conversation = f"conv_{uuid.uuid4().hex[:10]}"
        turns = [make_turn(conversation_id=conversation, expected_head_seq=head,
                           now_ms=int(time.time() * 1000),
                           response_id=f"resp_{uuid.uuid4().hex[:12]}",
                           idempotency_key=f"idem_{uuid.uuid4().hex[:12]}")
                 for head in range(2)]
        rig.send(*turns)
        promoted = [rig.collector.outcome(t.response_id, 90) for t in turns]
        assert all(isinstance(p, CheckpointPromoted) for p in promoted), promoted
        assert [p.seq for p in promoted] == [1, 2]
    finally:
        code = worker.terminate()
        rig.close()
    assert code == 0, f"worker exit code {code}:\n{worker.log_tail()}"
