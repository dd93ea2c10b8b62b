"""librdkafka's calls that run delivery reports (``poll``, ``flush``, ``close``), with a
Ctrl-C that landed inside a report raised as ``KeyboardInterrupt``.

confluent-kafka (2.16, on CPython 3.11) keeps the exception that ends a delivery report
and raises it out of the call that ran the report, but it keeps only the exception's
value, and Python's SIGINT handler sets ``KeyboardInterrupt`` without one (no instance
until an ``except`` clause catches it). So Ctrl-C landing inside a report came out of
the call as ``SystemError: <method 'flush' ...> returned NULL without setting an
exception``: ``ratchet smoke`` printed FAILED and exited 1 instead of its stop line and
130 (a CI flake, session 49), the gateway library's user got a ``SystemError`` and the
chaos producer's ``except Exception`` took it for a failed round and sent it again, the
Ctrl-C gone (session 50). A ``try`` in the report cannot catch it: Python runs a
signal's handler at a function's first instruction, before any ``try`` in it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# CPython's words for a C call that failed and set no exception.
_LOST = "without setting an exception"


def interruptible(call: Callable[..., T], *args: object) -> T:
    """``call(*args)``; its ``SystemError`` for an exception lost (above) in the main
    thread is ``KeyboardInterrupt``: the one exception lost so is the SIGINT handler's
    (a handler that raises an exception of its own, as SIGTERM's ``Terminated``, raises
    an instance, which confluent-kafka carries out). Elsewhere no signal lands, and the
    ``SystemError`` is left as it is. Its report was dropped by confluent-kafka, as for
    a ``KeyboardInterrupt`` it carries out."""
    try:
        return call(*args)
    except SystemError as exc:
        if _LOST not in str(exc) or threading.current_thread() is not threading.main_thread():
            raise
        raise KeyboardInterrupt from exc
