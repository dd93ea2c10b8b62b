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


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = getattr(record, "ctx", None)
        if isinstance(ctx, dict):
            line.update({k: v for k, v in ctx.items() if v is not None})
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


def configure(level: str = "INFO") -> None:
    """Route the root logger (and uvicorn's) to stderr as JSON lines."""
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
