"""``ratchet bench gateway``'s pure parts: send_turn over the floor per round, the median
of the rounds' ratios, the table's rows; its options (no server)."""

from __future__ import annotations

import pytest

from ratchet.bench.gateway import ENCODE, FLOOR, SEND, Line, format_report, parse_args, ratio
from ratchet.bench.table import Row


def line(number: int, name: str, seconds: float, thread_s: float, process_s: float,
         turns: int = 1000) -> Line:
    return Line(number, Row(name, turns, seconds, {"thread": thread_s, "process": process_s}),
                2 * turns)


def test_ratio_is_send_turn_over_the_floor():
    floor = line(1, FLOOR, 0.5, 0.01, 0.05)       # 2000 turns/s, 10 us, 50 us
    send = line(1, SEND, 2.0, 0.3, 0.4)           # 500 turns/s, 300 us, 400 us
    got = ratio(send, floor)
    assert got == pytest.approx({"turns/s": 0.25, "thread": 30.0, "process": 8.0})
    assert line(1, SEND, 1.0, 0.3, 0.4).cpu_us("thread") == pytest.approx(300)


def test_a_floor_that_took_no_cpu_has_no_ratio_rather_than_a_crash():
    floor = Line(1, Row(FLOOR, 10, 0.0, {"thread": 0.0, "process": 0.0}), 20)
    assert ratio(line(1, SEND, 1.0, 0.1, 0.1), floor) == {
        "turns/s": None, "thread": None, "process": None}


def test_the_report_rows_each_round_and_the_median_of_the_rounds_ratios():
    lines = []
    # Floor 10 us thread CPU each round; send_turn 200, 300, 250 us: ratios 20, 30, 25.
    for number, send_thread in ((1, 0.2), (2, 0.3), (3, 0.25)):
        lines += [line(number, ENCODE, 0.2, 0.12, 0.13),
                  line(number, FLOOR, 0.5, 0.01, 0.05),
                  line(number, SEND, 1.0 * number, send_thread, send_thread + 0.05)]
    text = format_report(lines, "1.00, 2.00, 3.00").splitlines()
    assert text[0].startswith("load average 1.00, 2.00, 3.00 before, ")
    rows = [t.split() for t in text if t[:5].strip().isdigit()]
    assert len(rows) == 9
    # round, name..., turns, s, turns/s, thread us, process us, kafka us (unknown: "-")
    assert rows[2][:1] == ["1"] and rows[2][-6:] == ["1000", "1.00", "1000", "200", "250", "-"]
    assert rows[1][-6:] == ["1000", "0.50", "2000", "10", "50", "-"]
    assert " ".join(rows[4][1:4]) == "raw produce (floor)"
    # "own": send_turn's thread CPU less the encode's (120 us) and the floor's (10 us).
    assert ("  round 2: turns/s 0.250 x, thread CPU per turn 30.0 x, process CPU per turn "
            "7.0 x; own 170 us") in text
    assert ("  round 3: turns/s 0.167 x, thread CPU per turn 25.0 x, process CPU per turn "
            "6.0 x; own 120 us") in text
    # Medians of the rounds' ratios: turns/s (0.5, 0.25, 0.1667), thread (20, 30, 25),
    # process (5, 7, 6).
    assert text[-1] == ("  median of 3 round(s): turns/s 0.250 x, thread CPU per turn "
                        "25.0 x, process CPU per turn 6.0 x")


def test_options_and_their_usage_errors():
    args = parse_args([])
    assert (args.turns, args.rounds) == (3000, 3)
    assert vars(parse_args(["--turns", "20", "--rounds", "1"])) == {"turns": 20, "rounds": 1}
    for bad in (["--turns", "0"], ["--rounds", "-1"], ["--turns", "x"]):
        with pytest.raises(SystemExit) as exited:
            parse_args(bad)
        assert exited.value.code == 2
