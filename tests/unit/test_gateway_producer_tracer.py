"""A Ctrl-C under a Python tracer (a debugger, coverage's Python tracer) while a flush
raises its ``DeliveryError`` (session 52, rgw9; left by rrevr, session 51).

A tracer's function runs at each frame's ``exception`` event as the error unwinds; an
exception it raises there (a Ctrl-C landing in it) replaces the ``DeliveryError``,
which the caller never sees. The thread's cursor had moved in the raise's line: its
failures were lost for it, its failed turn taken as written. Now the error raised is
kept on the thread's place until its next flush, which tells its failures again unless
the error left the producer's frames (reached the caller's).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError
from services.gateway.producer import GatewayProducer
from tests.unit.test_gateway_library_open_items import RETRIABLE
from tests.unit.test_gateway_producer_signal_points import _named, _producer


def _ctrl_c_at_exception_event(in_function: str) -> Callable[[], None]:
    """A tracer raising ``KeyboardInterrupt`` once, at the ``exception`` event of a
    ``DeliveryError`` in the frame of ``in_function`` (a producer's method)."""
    fired: list[bool] = []

    def tracer(frame, event, arg):
        if (event == "exception" and not fired and frame.f_code.co_name == in_function
                and isinstance(arg[1], DeliveryError)):
            fired.append(True)
            raise KeyboardInterrupt
        return tracer

    def installed() -> None:
        sys.settrace(tracer)
    installed.fired = fired  # type: ignore[attr-defined]
    return installed


def _failed_send(producer: GatewayProducer, kafka) -> str:
    event_id = producer.send(make_turn()).event_ids[0]
    kafka.deliver(0, RETRIABLE)
    return event_id


@pytest.mark.parametrize("in_function", ["_raise_failures", "flush"])
def test_a_ctrl_c_replacing_the_error_inside_the_producer_leaves_the_failures(in_function):
    """The tracer's Ctrl-C replaces the ``DeliveryError`` in a producer's frame: the
    caller gets ``KeyboardInterrupt``; the thread's next flush names the failure (once:
    the flush after it names nothing). Before: the next flush returned, nothing told."""
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    install = _ctrl_c_at_exception_event(in_function)
    before = sys.gettrace()
    install()
    try:
        with pytest.raises(KeyboardInterrupt):
            producer.flush(0)
    finally:
        sys.settrace(before)
    assert install.fired == [True]  # type: ignore[attr-defined]
    assert _named(lambda: producer.flush(0)) == [event_id]
    assert _named(lambda: producer.flush(0)) == []


def test_an_error_the_caller_caught_is_not_told_again():
    """Under a tracer that raises nothing, and without one: the caller catches the
    ``DeliveryError``; its next flush does not name the failure again, nor one that
    failed since (told once each)."""
    producer, kafka = _producer()
    first = _failed_send(producer, kafka)
    before = sys.gettrace()
    sys.settrace(lambda frame, event, arg: None)
    try:
        assert _named(lambda: producer.flush(0)) == [first]
    finally:
        sys.settrace(before)
    second = _failed_send(producer, kafka)
    assert _named(lambda: producer.flush(0)) == [second]
    assert _named(lambda: producer.flush(0)) == []


def test_failures_kept_for_a_replaced_error_come_with_those_since():
    """The replaced error's failure and one reported after it are named together by
    the thread's next flush, each once; another thread's flushes are not affected."""
    producer, kafka = _producer()
    first = _failed_send(producer, kafka)
    install = _ctrl_c_at_exception_event("_raise_failures")
    before = sys.gettrace()
    install()
    try:
        with pytest.raises(KeyboardInterrupt):
            producer.flush(0)
    finally:
        sys.settrace(before)
    second = _failed_send(producer, kafka)
    assert sorted(_named(lambda: producer.flush(0))) == sorted([first, second])
    assert _named(lambda: producer.flush(0)) == []


def test_a_ctrl_c_replacing_the_error_as_the_with_block_ends_leaves_the_failures():
    """Leaving the ``with`` block closes, and its ``DeliveryError`` passes through
    ``__exit__``: replaced there by the tracer's Ctrl-C, the thread's next flush (a
    closed producer's: it raises what is left) names the failure."""
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    install = _ctrl_c_at_exception_event("__exit__")
    before = sys.gettrace()
    install()
    try:
        with pytest.raises(KeyboardInterrupt), producer:
            pass
    finally:
        sys.settrace(before)
    assert install.fired == [True]  # type: ignore[attr-defined]
    assert _named(lambda: producer.flush(0)) == [event_id]


def test_an_error_the_with_block_swallowed_is_told_by_a_later_flush():
    """Leaving the block with its own exception, the close's ``DeliveryError`` is
    swallowed (the block's error is the one to see): told to no one, a later flush of
    the thread names it (a closed producer's flush raises what is left). Before: the
    cursor had moved past it, the failure lost for the thread."""
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    with pytest.raises(RuntimeError), producer:
        raise RuntimeError("the block's own error")
    assert _named(lambda: producer.flush(0)) == [event_id]
    assert _named(lambda: producer.flush(0)) == []
