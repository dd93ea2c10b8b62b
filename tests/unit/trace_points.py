"""A runner that lands once, with a tracer, at a chosen point of chosen functions, and
acts there as a signal's handler would (raises ``KeyboardInterrupt``, or flushes).
Shared by the producer's signal tests (``test_gateway_producer_told_once.py``: the
n-th line of the collection; ``test_gateway_producer_signal_points.py``: an
instruction after a ``CALL``, where CPython 3.11 runs a pending signal's handler)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from types import CodeType, FrameType


def landing(codes: Collection[CodeType], at: Callable[[FrameType], bool],
            act: Callable[[FrameType], None], *, opcodes: bool = False
            ) -> tuple[Callable[[Callable[[], None]], None], list[bool]]:
    """A runner of a call, traced on this thread only: inside any of ``codes``, at each
    line event (each opcode event if ``opcodes``) it asks ``at(frame)``, and at the
    first one true runs ``act(frame)``, once; and a list that says whether it landed.
    ``at`` is asked at every such event, landed or not, so that it may count them."""
    landed: list[bool] = []
    kind = "opcode" if opcodes else "line"

    def local(frame, event, arg):
        if event == kind and at(frame) and not landed:
            landed.append(True)
            act(frame)
        return local

    def tracer(frame, event, arg):
        if frame.f_code not in codes:
            return None
        if opcodes:
            frame.f_trace_opcodes = True
        return local

    def run(call: Callable[[], None]) -> None:
        before = sys.gettrace()
        sys.settrace(tracer)
        try:
            call()
        finally:
            sys.settrace(before)
    return run, landed
