"""A bench run that cannot measure what it set out to ends in one line, not a traceback.

Session 50's first `ratchet bench processor` ran beside seven engineers' suites (load 12
on 2 cores); a paced turn's HTTP wait was answered 409 "no decision within 10000 ms" and
the bench died in a 40-line traceback of click's frames. A run's failure is a verdict
(`RunFailed`): `ratchet bench <suite>: FAILED: <why>`, exit 1."""

from __future__ import annotations

import sys
import types

import pytest
from click.testing import CliRunner

from ratchet import cli
from ratchet.bench.http_wait import _check_certified
from ratchet.bench.measure import RunFailed

NO_DECISION = (b'{"outcome":"failure","reason":"NOT_PROMOTED","response_id":"resp_1",'
               b'"detail":"no decision within 10000 ms"}')


def test_a_wait_answered_without_a_certified_history_fails_the_run_by_name():
    with pytest.raises(RunFailed) as failed:
        _check_certified("resp_1", 409, NO_DECISION)
    assert "resp_1" in str(failed.value) and "409" in str(failed.value)
    assert "no decision within 10000 ms" in str(failed.value)
    _check_certified("resp_1", 200, b'{"outcome":"certified"}')  # a sample: no raise


@pytest.mark.parametrize("cause", [None, OSError("broker away")])
def test_a_failed_run_is_one_line_and_exit_1(monkeypatch, cause):
    suite = types.ModuleType("fake_suite")

    def main():
        if cause is None:
            raise RunFailed("latency run: 3 of 200 turns rejected")
        raise RunFailed("the floor's process failed") from cause

    suite.main = main
    monkeypatch.setitem(sys.modules, "fake_suite", suite)
    monkeypatch.setitem(cli.BENCH_SUITES, "fake", ("fake_suite", "a suite that fails"))
    result = CliRunner().invoke(cli.main, ["bench", "fake"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    if cause is None:
        assert last == "ratchet bench fake: FAILED: latency run: 3 of 200 turns rejected"
    else:
        assert last == "ratchet bench fake: FAILED: the floor's process failed (broker away)"


def test_a_bug_in_a_suite_is_still_its_traceback(monkeypatch):
    suite = types.ModuleType("buggy_suite")
    suite.main = lambda: {}["missing"]
    monkeypatch.setitem(sys.modules, "buggy_suite", suite)
    monkeypatch.setitem(cli.BENCH_SUITES, "buggy", ("buggy_suite", "a suite with a bug"))
    result = CliRunner().invoke(cli.main, ["bench", "buggy"])
    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)
