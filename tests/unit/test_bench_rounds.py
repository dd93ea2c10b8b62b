"""The processor bench's verdict on alternated latency rounds: the median of the rounds'
p99 ratios, so one round that met a stall of the shared machine does not decide."""

from __future__ import annotations

from ratchet.bench.processor import round_lines


def test_each_round_is_printed_and_the_median_ratio_decides():
    rounds = [([10.0] * 100, [5.0] * 100),   # ratio 2
              ([40.0] * 100, [10.0] * 100),  # ratio 4
              ([9.0] * 100, [100.0] * 100)]  # a stalled floor: ratio 0.09
    lines = round_lines(rounds)
    assert [line.split("ratio ")[-1] for line in lines[:3]] == ["2.00", "4.00", "0.09"]
    assert lines[3].endswith("median of the 3 rounds 2.00 (target <= 3): met")


def test_a_median_above_three_is_missed():
    rounds = [([40.0] * 100, [10.0] * 100), ([35.0] * 100, [10.0] * 100)]
    assert round_lines(rounds)[-1].endswith("3.75 (target <= 3): MISSED")


def test_no_rounds_no_lines():
    assert round_lines([]) == []
