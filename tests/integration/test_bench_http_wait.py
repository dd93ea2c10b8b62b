"""The bench's produce -> HTTP ``certified`` figure is of real waits, on the real servers.

``ratchet bench processor`` prints, beside produce -> outcome consumed, the time from
producing a turn to a ``wait_ms`` GET of its response answering ``certified``. This
test makes sure that figure measures what it names: a real worker and a real API, one
certified answer per produced turn, requests that were sent before the promotion (the
API parked them until the promotion record woke them), and the client-overhead
samples taken on responses already promoted.
"""

from __future__ import annotations

import pytest

from ratchet.bench.http_wait import ASYNC_CLIENT, BLOCKING_CLIENT
from ratchet.bench.processor import OutcomeCounter, http_latency, start_worker
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration


def test_each_produced_turn_gets_one_certified_answer_after_waiting(settings, tmp_path):
    turns = 20
    bench = isolated_settings(settings, "httpwait", partitions=2, home=tmp_path / "home")
    rig = Rig(bench)
    worker = None
    try:
        worker = start_worker(rig, tmp_path, OutcomeCounter(bench, rig))
        consumed, figures, overhead = http_latency(bench, rig, tmp_path, rate=10.0,
                                                   turns=turns)
    finally:
        if worker is not None:
            worker.terminate()
        rig.close()

    assert consumed[2] == turns  # every outcome consumed
    assert len(figures.latencies_ms) == turns  # one certified answer per turn
    assert all(ms > 0 for ms in figures.latencies_ms)
    # Sent right after the produce, the requests reach the API before the worker has
    # promoted their turn: the API parks them until the record wakes them.
    assert 0 < figures.waited <= turns
    assert figures.queued == 0  # 10 turns/s never fills the client's slots
    assert {name: len(times) for name, times in overhead.items()} == {
        ASYNC_CLIENT: turns, BLOCKING_CLIENT: turns}
