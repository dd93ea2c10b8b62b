"""Ctrl-C landing inside a delivery report that librdkafka's call runs (session 50).

confluent-kafka raised such a Ctrl-C out of that call as ``SystemError: ... returned
NULL without setting an exception`` (``services/gateway/kafka_calls.py``, why). Real: SIGINT is
sent to this process inside the report, and Python's own handler raises it there, in
the ``time.sleep`` it interrupts, before the report's first line."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any


def ctrl_c_in(report: Callable[..., Any]) -> Callable[..., Any]:
    """``report``, entered with Ctrl-C: SIGINT to this process, raised by Python's
    handler in the sleep it cuts short (``report`` is then never run)."""
    def interrupted(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # cut short by the signal: KeyboardInterrupt here
        return report(*args)
    return interrupted


@contextlib.contextmanager
def python_ctrl_c() -> Iterator[None]:
    """SIGINT as Python's default handler (``KeyboardInterrupt``) while inside: a run in
    the background (``trap "" INT``, ``&``) ignores it, and the test then proved nothing."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
