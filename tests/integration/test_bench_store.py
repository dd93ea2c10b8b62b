"""``ratchet bench store`` runs end to end against the real Cassandra: every operation it
times is checked as it is timed (a promotion is ``Promoted``, a read ``VerifiedHistory``,
a new claim ``CLAIMED``), so a setup the store refuses fails here. Until session 39 its
keyspace lacked the migrations after 010 and its items a content type, and the command
failed in an operator's hands."""

from __future__ import annotations

import pytest

from ratchet.bench import store

pytestmark = pytest.mark.integration


def test_the_store_bench_times_every_operation_it_names(settings):
    figures = store.run(settings, promotes=4, reads=4)
    names = {figure.name for figure in figures}
    assert {"store.promote (2 items)", "claims API writes, mark_claim",
            "claims API writes, plain mark"} <= names
    assert all(figure.samples > 0 and figure.p50_ms > 0 for figure in figures)
