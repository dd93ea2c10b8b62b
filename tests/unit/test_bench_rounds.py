"""The processor bench's verdict on alternated latency rounds: the median of the rounds'
p99 ratios, so one round that met a stall of the shared machine does not decide."""

from __future__ import annotations

from ratchet.bench.table import Row
from ratchet.bench.verdicts import ThroughputRound, round_lines, throughput_lines


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


def _row(name: str, turns: int, seconds: float, cpu_s: float) -> Row:
    return Row(name, turns, seconds, {"client": cpu_s, "cassandra": 0.0, "kafka": 0.0})


def _round(mine_rate: float, mine_cpu_ms: float, floor_rate: float,
           floor_cpu_ms: float) -> ThroughputRound:
    """Rates in turns/s over a 1 s window of 1 000 turns' worth, CPU per turn in ms."""
    def row(name: str, rate: float, cpu_ms: float) -> Row:
        return _row(name, int(rate), 1.0, rate * cpu_ms / 1000)
    floor = row("floor", floor_rate, floor_cpu_ms)
    return ThroughputRound(row("ratchet", mine_rate, mine_cpu_ms),
                           {"lwt": floor, "lwt2": row("floor 1b", floor_rate / 2,
                                                      floor_cpu_ms * 2)})


def test_throughput_rounds_each_printed_and_the_medians_decide():
    rounds = [_round(400, 3.0, 1000, 1.0),   # 0.40, 3.00 x
              _round(800, 1.2, 1000, 1.0),   # 0.80, 1.20 x: a round that meets both
              _round(500, 2.0, 1000, 1.0)]   # 0.50, 2.00 x
    lines = throughput_lines(rounds)
    floor_1 = [line for line in lines if "vs floor 1 " in line and "round" in line]
    assert [line.split("= ")[1].split(" ")[0] for line in floor_1] == ["0.40", "0.80", "0.50"]
    assert lines[-2] == ("  vs floor 1, median of the 3 rounds' ratios: throughput 0.50 "
                         "(target >= 0.7): MISSED; CPU per turn 2.00 (target <= 1.5): MISSED")
    assert lines[-1] == ("  vs floor 1b, median of the 3 rounds' ratios: throughput 1.00; "
                         "CPU per turn 1.00")


def test_throughput_medians_met_when_most_rounds_meet():
    rounds = [_round(800, 1.2, 1000, 1.0), _round(300, 4.0, 1000, 1.0),
              _round(750, 1.4, 1000, 1.0)]
    assert throughput_lines(rounds)[-2].endswith(
        "throughput 0.75 (target >= 0.7): met; CPU per turn 1.40 (target <= 1.5): met")


def test_one_throughput_round_prints_no_median():
    lines = throughput_lines([_round(400, 3.0, 1000, 1.0)])
    assert len(lines) == 2 and not any("median" in line for line in lines)
    assert lines[0].startswith("  vs floor 1   throughput    400 /   1000 turns/s = 0.40")
