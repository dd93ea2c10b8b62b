"""``ratchet bench validation`` runs end to end (no servers): it validates its turn,
times it warm and cold and prints a verdict its exit status agrees with (a suite no
other test ran; another suite had failed unnoticed for days, session 39)."""

from __future__ import annotations

from ratchet.bench import validation


def test_the_validation_bench_prints_every_line_and_a_verdict_its_status_agrees_with(capsys):
    status = validation.main(["--runs", "50", "--items", "8", "--rounds", "2"])
    out = capsys.readouterr().out
    for name in ("warm wall", "warm cpu", "cold wall", "cold cpu"):
        assert any(line.startswith(name) for line in out.splitlines()), out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("target wall p99 <= 200 us: ")
    assert status == (0 if verdict.endswith("OK") else 1)
