"""JSON-lines logging: one object per line, with conversation and response ids.

Why JSON lines: the API runs as several replicas; a log pipeline must be able to
filter on ``response_id`` / ``conversation_id`` / ``tenant_id`` without regexes.
Pass ids through ``extra={"ctx": {...}}``; they become top-level keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import orjson


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record. The API writes a line per lookup, so the line is
    cheap: the timestamp's seconds are formatted once per second and the object is
    written by orjson (json.dumps stays for what orjson refuses, e.g. an integer
    beyond 64 bits)."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # handlers format under their lock: no race here
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        line = {
            "ts": f"{self._stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = getattr(record, "ctx", None)
        if isinstance(ctx, dict):
            line.update({k: v for k, v in ctx.items() if v is not None})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        try:
            return orjson.dumps(line, default=str).decode()
        except TypeError:
            return json.dumps(line, separators=(",", ":"), default=str)


def configure(level: str = "INFO") -> None:
    """Route the root logger (and uvicorn's) to stderr as JSON lines."""
    # Fields the lines never show, not gathered per record (the logging HOWTO's
    # "Optimization"): the caller's frame, thread, process.
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # Access logs duplicate our own request lines; keep them quiet.
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
