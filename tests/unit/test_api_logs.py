"""The API's JSON-lines log format (services/api/logs.py): one JSON object per line,
with the request's ids as top-level keys, absent values left out."""

from __future__ import annotations

import json
import logging
import re

from services.api.logs import JsonLinesFormatter


def _line(msg: str, *args: object, ctx: dict | None = None, exc: bool = False,
          created: float = 1_764_590_400.25) -> dict:
    record = logging.LogRecord("ratchet.api", logging.INFO, __file__, 1, msg, args, None)
    record.created, record.msecs = created, (created % 1) * 1000
    if ctx is not None:
        record.ctx = ctx
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            record.exc_info = sys.exc_info()
    text = JsonLinesFormatter().format(record)
    assert "\n" not in text
    return json.loads(text)


def test_a_line_has_the_time_level_logger_message_and_the_ids():
    line = _line("history %s", "certified", ctx={
        "tenant_id": "t1", "response_id": "resp_1", "head_seq": 3, "reason": None,
    })
    assert line == {
        "ts": "2025-12-01T12:00:00.250Z", "level": "info", "logger": "ratchet.api",
        "msg": "history certified", "tenant_id": "t1", "response_id": "resp_1", "head_seq": 3,
    }


def test_the_timestamp_follows_each_record_across_seconds():
    formatter = JsonLinesFormatter()
    stamps = []
    for created in (100.5, 100.9, 101.0, 99.001):
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
        record.created, record.msecs = created, (created % 1) * 1000
        stamps.append(json.loads(formatter.format(record))["ts"])
    assert stamps == ["1970-01-01T00:01:40.500Z", "1970-01-01T00:01:40.900Z",
                      "1970-01-01T00:01:41.000Z", "1970-01-01T00:01:39.001Z"]


def test_values_json_cannot_hold_are_written_as_text_and_exceptions_are_kept():
    line = _line("m", ctx={"big": 2**70, "odd": frozenset({1}), "name": "é"}, exc=True)
    assert line["big"] == 2**70 and line["odd"] == "frozenset({1})" and line["name"] == "é"
    assert re.search(r"ValueError: boom", line["exc"])
