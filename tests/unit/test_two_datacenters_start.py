"""The two-datacenter test's cluster start (``tests/integration/test_two_datacenters.py``'s
session fixture) without a cluster: ``ratchet infra cluster`` is a stand-in.

A start that times out (or a status that never answers) is a cluster that cannot
start: a failure in CI, a skip elsewhere, and the nodes the killed ``up`` launched (they
outlive it, recorded in the cluster's state) are stopped at once. Before (session 53's
outside review) ``subprocess.TimeoutExpired`` escaped the fixture: an error outside CI
too, and nothing stopped the nodes (only ``.ci/run``'s cleanup, in CI)."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration import test_two_datacenters as two_dc


class Stand:
    """``_ratchet``: records each command; ``hangs`` names the one that times out."""

    def __init__(self, hangs: str, status_rc: int = 1) -> None:
        self.hangs, self.status_rc, self.calls = hangs, status_rc, []

    def __call__(self, _env, *args: str, timeout: float) -> subprocess.CompletedProcess:
        self.calls.append(args[2])
        if args[2] == self.hangs:
            raise subprocess.TimeoutExpired(["ratchet", *args], timeout)
        rc = self.status_rc if args[2] == "status" else 0
        return subprocess.CompletedProcess(args, rc, "", "")


def _start(monkeypatch, stand: Stand, ci: bool) -> None:
    monkeypatch.setattr(two_dc, "_ratchet", stand)
    monkeypatch.setenv("CI", "1" if ci else "")
    next(two_dc.two_datacenters.__wrapped__())


@pytest.mark.parametrize("ci", [True, False])
def test_an_up_that_times_out_stops_its_nodes_and_fails_in_ci(monkeypatch, ci):
    stand = Stand(hangs="up")
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    with pytest.raises(expected, match="did not finish"):
        _start(monkeypatch, stand, ci)
    assert stand.calls == ["status", "up", "down"]


def test_a_status_that_never_answers_fails_in_ci(monkeypatch):
    stand = Stand(hangs="status")
    with pytest.raises(pytest.fail.Exception, match="did not answer"):
        _start(monkeypatch, stand, ci=True)
    assert stand.calls == ["status"]
