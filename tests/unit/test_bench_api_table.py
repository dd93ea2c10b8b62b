"""The API bench judges each line against the floor measured in the same rounds: the
hits and the cold miss against the first rounds' raw reads, the continuation lines
against the raw read of the row just promoted (read in their own rounds)."""

from __future__ import annotations

from ratchet.bench import api
from ratchet.bench.store import Figure


def _figures(p99: dict[str, float]) -> list[Figure]:
    return [Figure(name, 1, 300, value / 2, value) for name, value in p99.items()]


def _verdicts(table: str) -> dict[str, tuple[str, str]]:
    """name -> (limit, verdict) of each judged line of the table."""
    judged = {}
    for line in table.splitlines():
        for name in api.TARGETS:
            if line.startswith(name):
                parts = line.split()
                judged[name] = (parts[-2], parts[-1])
    return judged


FLOORS = {api.RAW_ROW: 2.0, api.RAW_PARTITION: 3.0, api.RAW_NEW_ROW: 1.0}


def test_continuation_lines_are_judged_against_the_new_row_floor():
    table = api.format_table(_figures({
        **FLOORS,
        api.INCREMENTAL: 1.6,   # <= 1.5 x new row (1.5): missed, though <= 1.5 x row (3.0)
        api.PREWARMED: 1.9,     # <= new row + 1 (2.0): met
    }), (0.0, 0.0, 0.0))
    judged = _verdicts(table)
    assert judged[api.INCREMENTAL] == ("1.50", "MISSED")
    assert judged[api.PREWARMED] == ("2.00", "met")
    # ... and the first rounds' row floor is shown beside, not as the verdict
    assert (f"{api.INCREMENTAL} against the first rounds' row floor: limit 3.00, met"
            in table)


def test_hits_and_the_cold_miss_are_judged_against_the_first_rounds_floors():
    table = api.format_table(_figures({
        **FLOORS,
        api.RESPONSE_HIT: 2.0,               # <= max(2, 0.5 x row)
        api.CONVERSATION_HIT: 3.1,           # <= row + 1 = 3.0
        api.COLD: 4.5,                       # <= 1.5 x partition = 4.5
    }), (0.0, 0.0, 0.0))
    judged = _verdicts(table)
    assert judged[api.RESPONSE_HIT] == ("2.00", "met")
    assert judged[api.CONVERSATION_HIT] == ("3.00", "MISSED")
    assert judged[api.COLD] == ("4.50", "met")


def test_the_command_line_sets_the_rounds_and_defaults_to_a_thousand(monkeypatch, capsys):
    """A p99 of 300 samples is its 3 slowest: the defaults are 1 000 rounds a line."""
    asked = []

    def fake_run(**kwargs):
        asked.append(kwargs)
        return _figures(FLOORS)

    monkeypatch.setattr(api, "run", fake_run)
    api.main([])
    api.main(["--reads", "20", "--turns", "30", "--waits", "5"])
    assert asked == [{"reads": 1000, "turns": 1000, "waits": 200},
                     {"reads": 20, "turns": 30, "waits": 5}]
    assert api.RAW_NEW_ROW in capsys.readouterr().out
