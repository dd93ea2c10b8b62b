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

import signal
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# CPython's words for a C call that failed and set no exception.
_LOST = "without setting an exception"


def interruptible(call: Callable[..., T], *args: object) -> T:
    """``call(*args)``; its ``SystemError`` for an exception lost (above) is
    ``KeyboardInterrupt`` where a Ctrl-C can be the one lost (``_ctrl_c_may_be_lost``),
    else left as it is. Its report was dropped by confluent-kafka, as for a
    ``KeyboardInterrupt`` it carries out."""
    try:
        return call(*args)
    except SystemError as exc:
        if _LOST not in str(exc) or not _ctrl_c_may_be_lost():
            raise
        raise KeyboardInterrupt from exc


def _ctrl_c_may_be_lost() -> bool:
    """Whether the exception lost can be Ctrl-C's: in the main thread (no signal's
    handler runs elsewhere) with Python's own SIGINT handler, the one that raises
    without an instance (a handler that raises an exception of its own, as SIGTERM's
    ``Terminated`` or asyncio's second Ctrl-C, raises an instance, which confluent-kafka
    carries out). Python sets other exceptions so too (``MemoryError`` from C, an
    iterator's ``StopIteration``, an exception another thread sends): lost as well and,
    with SIGINT ignored (a background job) or a host's own handler (uvicorn's sets a
    flag), they were called a Ctrl-C, stopping a gateway's whole server from a report's
    ``MemoryError`` (session 50's review). With Python's handler the two cannot be told
    apart: called a Ctrl-C, which stops the program either way."""
    return (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
