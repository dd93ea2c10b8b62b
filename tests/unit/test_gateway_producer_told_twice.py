"""A failure is told to a thread once, whichever way its ``DeliveryError`` reached the
caller, and no error a flush raised keeps the caller's frames alive (written by the
outside review of session 52, rrevu, against a producer that kept the raised error for
the thread's next flush: it held them; docs/decisions.md, "The gateway library's
leftovers of session 51")."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError
from tests.unit.test_gateway_library_open_items import RETRIABLE
from tests.unit.test_gateway_producer_signal_points import _named, _producer


def _failed_send(producer, kafka) -> str:
    event_id = producer.send(make_turn()).event_ids[0]
    kafka.deliver(0, RETRIABLE)
    return event_id


def _told(calls) -> list[str]:
    named: list[str] = []
    for call in calls:
        named += _named(call)
    return named


def test_caught_then_flushed_again_told_once():
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    assert _told([lambda: producer.flush(0)] * 3) == [event_id]


def test_propagated_out_of_a_with_block_told_once():
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    told: list[str] = []
    try:
        with producer:
            producer.flush(0)
    except DeliveryError as exc:
        told += [e for e, _ in exc.failures]
    told += _told([lambda: producer.flush(0)] * 2)
    assert told == [event_id]


def test_received_from_close_told_once():
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    assert _told([lambda: producer.close(0), lambda: producer.flush(0),
                  lambda: producer.close(0)]) == [event_id]


def test_received_on_another_thread_told_once():
    producer, kafka = _producer()
    told: list[list[str]] = []

    def other() -> None:
        event_id = _failed_send(producer, kafka)
        told.append([event_id])
        told.append(_told([lambda: producer.flush(0)] * 3))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert told[1] == told[0]


def test_received_in_a_coroutine_told_once():
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)

    async def flushes() -> list[str]:
        named: list[str] = []
        for _ in range(3):
            try:
                producer.flush(0)
            except DeliveryError as exc:
                named += [e for e, _ in exc.failures]
            await asyncio.sleep(0)
        return named

    assert asyncio.run(flushes()) == [event_id]


@pytest.mark.parametrize("in_function", ["_raise_failures", "flush"])
def test_a_handler_s_flush_while_the_error_unwinds_does_not_tell_it_twice(in_function):
    """A signal handler can run inside a tracer's function (it is Python code). One
    running at the ``exception`` event of the error in a producer's frame, whose flush's
    error it catches, and the caller that then catches the error: the failure named
    once between them (rgw9 named it to both: the error, still unwinding, had no
    traceback yet and counted as replaced)."""
    producer, kafka = _producer()
    event_id = _failed_send(producer, kafka)
    by_handler: list[str] = []

    def tracer(frame, event, arg):
        if (event == "exception" and not by_handler and frame.f_code.co_name == in_function
                and isinstance(arg[1], DeliveryError)):
            by_handler.append("ran")
            by_handler.extend(_named(lambda: producer.flush(0)))  # the handler's flush
        return tracer

    before = sys.gettrace()
    sys.settrace(tracer)
    try:
        by_caller = _named(lambda: producer.flush(0))
    finally:
        sys.settrace(before)
    assert by_handler[0] == "ran"
    assert [*by_handler[1:], *by_caller, *_named(lambda: producer.flush(0))] == [event_id]


def test_an_error_the_caller_caught_keeps_none_of_its_frames_alive():
    """rgw9 held the raised error, and by its traceback the caller's frames and their
    locals (a turn's items: 8 MiB), until the thread's next flush: for ever in a pool's
    idle thread (measured: 8.2 MiB held, 0.2 MiB once fixed). The caller's locals are
    freed once it returns, with no flush after."""
    import gc
    import weakref

    producer, kafka = _producer()

    class Items:  # what a request handler's frame holds
        pass

    def handle() -> weakref.ref:
        items = Items()
        _failed_send(producer, kafka)
        try:  # noqa: SIM105 (the plain ``except``, as a handler is written)
            producer.flush(0)
        except DeliveryError:
            pass
        return weakref.ref(items)

    items = handle()
    gc.collect()
    assert items() is None
    assert _named(lambda: producer.flush(0)) == []  # and it was told once
