"""``ratchet bench memory`` runs end to end against the real servers: a worker drains a
backlog of large turns and its RSS is read from /proc (a suite no other test ran; the
store suite had failed unnoticed for days, session 39)."""

from __future__ import annotations

import pytest

from ratchet.bench import memory

pytestmark = pytest.mark.integration


def test_the_memory_bench_drains_its_backlog_and_reads_the_workers_rss(capsys):
    assert memory.main(["--turns", "2", "--mib", "1", "--partitions", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines()
            if line.startswith(("defaults", "lanes bounded by count only"))]
    assert len(rows) == 2, out
    for line in rows:
        backlog, idle, peak, after, seconds = (float(x) for x in line.split()[-5:])
        assert backlog >= 2 and 0 < idle <= peak and after > 0 and seconds > 0, line
