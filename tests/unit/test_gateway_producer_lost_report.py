"""A delivery report an exception ended (Ctrl-C, a signal handler's exception) is told
by the next ``flush`` and by its ``Delivery``, not only by ``close`` (session 49).

confluent-kafka raises an exception out of the callback serving a report from the
``poll`` / ``flush`` it ran in and drops that report. Before, a ``flush`` between that
call and the ``close`` returned as if every event were written (nothing was in flight
any more), and the event's ``Delivery.wait`` said ``FlushTimeout``, "still in flight",
for ever: a caller that flushes to know its turn is written was told so wrongly. The
real client, its broker unreachable: the event times out after ``delivery.timeout.ms``
and its report is served by the main thread's ``flush``.
"""

from __future__ import annotations

import functools
import threading

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_turn
from ratchet.settings import Settings
from services.gateway.errors import DeliveryError, FlushTimeout
from services.gateway.producer import Delivery, GatewayProducer


class _Serde:
    def encode(self, event, topic):
        return b"\0" * 100


def _unreachable() -> GatewayProducer:
    return GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=_Serde(),
                           config={"log_level": 0, "delivery.timeout.ms": 200})


class _Client:
    """The real client; ``produce`` hands librdkafka the report wrapped by ``wrap``
    (the report librdkafka holds is then the wrapper, and only it)."""

    def __init__(self, real, wrap):
        self._real, self._wrap = real, wrap

    def produce(self, *args, on_delivery, **kwargs):
        return self._real.produce(*args, on_delivery=self._wrap(on_delivery), **kwargs)

    def __len__(self):
        return len(self._real)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _ctrl_c_before_its_first_line(report, err, msg):
    """Ctrl-C as the report is entered: Python runs a signal's handler at a function's
    first instruction, before any ``try`` in it (CPython 3.11's ``RESUME``)."""
    del report  # as the real case: no frame of the traceback holds the report
    raise KeyboardInterrupt


def _interrupted(producer: GatewayProducer, where: str) -> None:
    """Ctrl-C ends the event's report, ``where``: inside it, once it began (before it
    recorded anything), or before its first line."""
    if where == "inside":
        explained, interrupted = producer._explained, []

        def ctrl_c_once(err):  # called by the report before it records anything
            if not interrupted:
                interrupted.append(err)
                raise KeyboardInterrupt
            return explained(err)
        producer._explained = ctrl_c_once
    else:
        producer._producer = _Client(
            producer._producer,
            lambda report: functools.partial(_ctrl_c_before_its_first_line, report))


@pytest.mark.parametrize("where", ["inside", "before its first line"])
def test_a_flush_after_a_report_ctrl_c_ended_raises_it(where):
    """The flush after the interrupted one raises the event, retryable (it may or may
    not be written); so does its ``Delivery``, at once; the close tells it no more (it
    was told). Before: the flush returned, the wait was ``FlushTimeout``."""
    producer = _unreachable()
    _interrupted(producer, where)
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)  # serves the timed-out event's report: Ctrl-C ends it
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(0)
    assert [eid for eid, _ in flushed.value.failures] == list(sent.event_ids)
    assert flushed.value.retryable and flushed.value.pending == 0
    assert "never ran to its end" in flushed.value.failures[0][1]
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)
    producer.close(timeout_s=0)  # told once per thread: nothing left for the close


def test_a_delivery_waited_first_raises_the_report_ctrl_c_ended():
    """No flush between: the event's own ``wait`` raises it (it was ``FlushTimeout``,
    "still in flight", however long it waited)."""
    producer = _unreachable()
    _interrupted(producer, "inside")
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        sent.wait(10)
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=0)  # this thread never flushed: the close tells it


def test_ctrl_c_in_a_flush_that_ended_no_report_loses_nothing():
    """Control: Ctrl-C out of librdkafka's flush before it served the report (as
    confluent-kafka's check for signals between its waits raises it) drops nothing:
    the next flush serves the report and raises its own error, a timeout, not a lost
    report."""
    producer = _unreachable()
    real_flush = producer._producer.flush
    calls = []

    def ctrl_c_first(timeout=-1):
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real_flush(timeout)

    producer._producer = _Client(producer._producer, lambda report: report)
    producer._producer.flush = ctrl_c_first
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(10)
    [(event_id, text)] = flushed.value.failures
    assert event_id == sent.event_ids[0] and "within delivery.timeout.ms" in text
    with pytest.raises(DeliveryError):
        sent.wait(0)
    producer.close(timeout_s=0)


def test_a_report_still_to_come_is_no_lost_one():
    """Control: a flush after an exception, with the report not served yet, waits for
    it as before (``FlushTimeout`` with no time, nothing failed)."""
    producer = _unreachable()
    producer._reports_may_be_cut = True  # as after an exception out of a poll
    sent = producer.send(make_turn())
    with pytest.raises(FlushTimeout):
        producer.flush(0)
    with pytest.raises(FlushTimeout):
        sent.wait(0)
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=0)



def test_a_flush_of_another_thread_between_the_cut_and_its_call_s_end_raises_it():
    """A report another thread's flush waits for, ended by Ctrl-C inside the main
    thread's poll: librdkafka counts the event done as the report returns, so that
    flush can return before the poll's exception reaches the producer. The order is
    forced here (the flush runs to its end there); with the GIL taken in turn it is
    one the threads can take. Before (an outside review, session 49): that flush
    returned as if the event were written (the look for lost reports waited for a
    flag set only once the exception came out of the poll)."""
    producer = _unreachable()
    _interrupted(producer, "before its first line")
    told: list[BaseException | None] = []

    def flush_of_the_sender():
        sent.append(producer.send(make_turn()))
        ready.set()
        go.wait(10)
        try:
            producer.flush(10)
            told.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the flush raised is told
            told.append(exc)

    sent: list = []
    ready, go = threading.Event(), threading.Event()
    sender = threading.Thread(target=flush_of_the_sender)
    sender.start()
    assert ready.wait(10)
    real_poll = producer._producer.poll

    def poll_then_the_flush(timeout=-1):
        try:
            return real_poll(timeout)
        except KeyboardInterrupt:
            go.set()  # the cut report is gone: the other thread's flush now ends
            sender.join(10)
            raise

    producer._producer.poll = poll_then_the_flush
    with pytest.raises(KeyboardInterrupt):
        while not go.is_set():  # the main thread serves the report (Ctrl-C ends it)
            producer._serve_reports(0.1)
    sender.join(10)
    assert not sender.is_alive()
    [outcome] = told
    assert isinstance(outcome, DeliveryError), outcome
    assert [eid for eid, _ in outcome.failures] == list(sent[0].event_ids)
    assert "never ran to its end" in outcome.failures[0][1]
    with pytest.raises(DeliveryError) as waited:
        sent[0].wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent[0].event_ids)
    producer.close(timeout_s=0)  # the only sender flushed past it: nothing left to tell


def test_a_second_ctrl_c_in_the_look_for_lost_reports_loses_none():
    """Ctrl-C again while the look fails a lost report (in the failure's own lines):
    the next flush, the ``Delivery`` and the close still tell it. Before (an outside
    review, session 49): the look took the event out before failing it, so the flush
    after returned as if it were written, its wait said ``FlushTimeout`` and the
    close told no one."""
    producer = _unreachable()
    _interrupted(producer, "inside")
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)  # Ctrl-C ends the report
    explained, again = producer._explained, []

    def ctrl_c_again(err):  # the lost report's failure, as it is recorded
        if not again:
            again.append(err)
            raise KeyboardInterrupt
        return explained(err)
    producer._explained = ctrl_c_again
    with pytest.raises(KeyboardInterrupt):
        producer.flush(0)
    assert again, "the second Ctrl-C came in the look"
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(0)
    assert [eid for eid, _ in flushed.value.failures] == list(sent.event_ids)
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)
    producer.close(timeout_s=0)


def test_a_report_cut_before_its_send_kept_it_is_told():
    """The main thread's poll cuts the report (Ctrl-C) between another thread's
    ``produce`` and that send's keeping of the event, and a flush looks (clearing the
    flag) before it is kept: the sender's flush still raises it. Before (an outside
    review, session 49): kept with its report already gone and no flag set, it was
    told to no flush or wait until the close."""
    producer = _unreachable()
    _interrupted(producer, "before its first line")
    wrapped = producer._producer
    produced, keep = threading.Event(), threading.Event()

    class _Held(_Client):
        def produce(self, *args, **kwargs):
            wrapped.produce(*args, **kwargs)
            produced.set()
            keep.wait(10)  # the send keeps the event once the main thread let it

    producer._producer = _Held(wrapped._real, lambda report: report)
    told: list[BaseException | None] = []
    sent: list = []

    def send_then_flush():
        sent.append(producer.send(make_turn()))
        try:
            producer.flush(10)
            told.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the flush raised is told
            told.append(exc)

    sender = threading.Thread(target=send_then_flush)
    sender.start()
    try:
        assert produced.wait(10)
        with pytest.raises(KeyboardInterrupt):
            for _ in range(100):  # the main thread serves the report: Ctrl-C ends it
                producer._serve_reports(0.1)
        producer.flush(0)  # looks for lost reports before the send kept the event
    finally:
        keep.set()
        sender.join(10)
    [outcome] = told
    assert isinstance(outcome, DeliveryError), outcome
    assert [eid for eid, _ in outcome.failures] == list(sent[0].event_ids)
    with pytest.raises(DeliveryError):
        producer.close(timeout_s=0)  # the main thread flushed before it: told it too


def test_a_close_and_another_thread_s_look_fail_a_lost_event_once():
    """A close's failing of the events never reported (``_fail_unreported``) and a
    flush of another thread looking at the same lost event (``_fail_lost``), each past
    its check that the event is unreported before either recorded it: the event is
    failed once. Before session 50 both recorded it: every listing named it twice.
    The threads are sequenced by a barrier in the failure's first line."""
    producer = _unreachable()
    _interrupted(producer, "before its first line")
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    looking, both = threading.Event(), threading.Barrier(2, timeout=30)
    explained = producer._explained

    def meet(err):  # each thread's failure of the lost event, before it records it
        if err.code() == KafkaError._INTR:
            looking.set()
            both.wait()
        return explained(err)
    producer._explained = meet
    outcomes: dict[str, BaseException | None] = {}

    def run(name, call):
        try:
            call()
            outcomes[name] = None
        except BaseException as exc:  # noqa: BLE001 - the outcome is the test's
            outcomes[name] = exc

    flusher = threading.Thread(target=run, args=("flush", lambda: producer.flush(0)))
    closer = threading.Thread(target=run, args=("close", lambda: producer.close(0)))
    flusher.start()
    assert looking.wait(30)  # the flush's look is inside the event's failure
    closer.start()
    flusher.join(30)
    closer.join(30)
    assert set(outcomes) == {"flush", "close"}
    for name in ("flush", "close"):
        assert isinstance(outcomes[name], DeliveryError), (name, outcomes[name])
        assert [eid for eid, _ in outcomes[name].failures] == list(sent.event_ids)
    with pytest.raises(DeliveryError) as flushed:  # the sending thread's listing
        producer.flush(0)
    assert [eid for eid, _ in flushed.value.failures] == list(sent.event_ids)
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)


def _cut_before_marking(self, event_id, err):
    """Ctrl-C after the report logged its failure, before its ``Delivery`` knew."""
    raise KeyboardInterrupt


def _cut_inside_marking(self, event_id, err):
    """Ctrl-C between the ``Delivery``'s two lines: its failure kept, the event not
    yet marked reported."""
    if err is not None:
        self._failures.append((event_id, err))
    raise KeyboardInterrupt


@pytest.mark.parametrize("cut", [_cut_before_marking, _cut_inside_marking],
                         ids=["before its Delivery knew", "inside its Delivery's lines"])
def test_a_report_cut_after_it_recorded_its_failure_is_told_once_with_it(
        monkeypatch, cut):
    """A report Ctrl-C ended after it logged its own failure (a timeout here): the next
    flush and its ``Delivery`` name the event once, with that failure. Before session
    50 the look added a lost report's failure as well: the flush named the event twice
    (the timeout, then "never ran to its end"), and the ``Delivery`` cut before it knew
    said only the second."""
    real, cuts = Delivery._reported, []

    def cut_once(self, event_id, err):
        if not cuts:
            cuts.append(event_id)
            return cut(self, event_id, err)
        return real(self, event_id, err)
    monkeypatch.setattr(Delivery, "_reported", cut_once)
    producer = _unreachable()
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    assert cuts == list(sent.event_ids)
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(0)
    [(event_id, text)] = flushed.value.failures
    assert event_id == sent.event_ids[0] and "within delivery.timeout.ms" in text
    assert flushed.value.retryable and flushed.value.pending == 0
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    [(event_id, text)] = waited.value.failures
    assert event_id == sent.event_ids[0] and "within delivery.timeout.ms" in text
    producer.close(timeout_s=0)  # told once per thread: nothing left for the close


def test_a_ctrl_c_in_the_close_s_failing_of_lost_events_leaves_them_to_the_next_close():
    """Ctrl-C inside the close's failing of the events never reported (the client
    already closed): the next close fails them and raises them, typed. Before session
    50 the first close had swapped them out (lost, told to no one) and the next close's
    release flushed the closed client: confluent-kafka's ``RuntimeError``."""
    producer = _unreachable()
    _interrupted(producer, "before its first line")
    sent = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    explained, cuts = producer._explained, []

    def ctrl_c_once(err):  # the close's failure of the lost event, its first line
        if err.code() == KafkaError._INTR and not cuts:
            cuts.append(err)
            raise KeyboardInterrupt
        return explained(err)
    producer._explained = ctrl_c_once
    producer._reports_may_be_cut = False  # no flush's look first: the close's own
    with pytest.raises(KeyboardInterrupt):
        producer.close(0)
    assert cuts
    with pytest.raises(DeliveryError) as closed:
        producer.close(0)
    assert [eid for eid, _ in closed.value.failures] == list(sent.event_ids)
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == list(sent.event_ids)


class _CutAfterAppend(list):
    """The failure log, with Ctrl-C landing once right after a failure is appended
    (before ``_record``'s next line)."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = False

    def append(self, failure) -> None:
        super().append(failure)
        if not self.cut:
            self.cut = True
            raise KeyboardInterrupt


def test_a_report_cut_right_after_logging_its_failure_gives_the_next_one_its_own_number():
    """Ctrl-C between a failure's log append and the log's counter: the next failure
    was given the same number, so a flush past the first (its cursor at that number)
    was told the first again with the second (session 50's "Left")."""
    producer = _unreachable()
    producer._failure_log = _CutAfterAppend()
    first = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    assert producer._failure_log.cut
    with pytest.raises(DeliveryError) as flushed:  # the look finishes the cut report
        producer.flush(0)
    assert [eid for eid, _ in flushed.value.failures] == list(first.event_ids)
    second = producer.send(make_turn())
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(10)
    assert [eid for eid, _ in flushed.value.failures] == list(second.event_ids)
    assert not flushed.value.forgotten
    producer.close(timeout_s=0)


def test_a_look_after_every_thread_was_told_a_cut_report_s_failure_tells_it_no_more(
        monkeypatch):
    """A report cut after it logged its failure, before its ``Delivery`` knew, by a
    signal handler's ``flush`` inside it: that flush told the thread (the only one) the
    failure, so the log entry was trimmed, and its ``DeliveryError`` ended the report.
    The look then found no logged failure and told the event again as a lost report
    (session 50's "Left"). Now the entry stays until its ``Delivery`` knows."""
    producer = _unreachable()
    real, handler = Delivery._reported, []

    def flush_in_a_handler_once(self, event_id, err):
        if not handler:
            handler.append(event_id)
            producer.flush(0)  # inside the report: raises what it knows at once
        return real(self, event_id, err)
    monkeypatch.setattr(Delivery, "_reported", flush_in_a_handler_once)
    sent = producer.send(make_turn())
    with pytest.raises(DeliveryError) as handled:  # the handler's, out of the flush
        producer.flush(10)
    assert handler == list(sent.event_ids)
    [(event_id, text)] = handled.value.failures
    assert event_id == sent.event_ids[0] and "within delivery.timeout.ms" in text
    producer.flush(0)  # told already: nothing more
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    [(event_id, text)] = waited.value.failures
    assert event_id == sent.event_ids[0] and "within delivery.timeout.ms" in text
    producer.close(timeout_s=0)


def test_a_kept_cut_report_s_entry_gives_no_later_failure_a_number_already_passed(
        monkeypatch):
    """rgw7 keeps a cut report's entry while its ``Delivery`` does not know, and numbers
    the next failure after the log's last entry. A newer entry trimmed around the kept
    one (told to every thread) left the kept one last: the next failure took the trimmed
    one's number, below the cursor of the thread told it, so its next flush did not list
    it and returned as if the event were written (an outside review, session 51).
    Here: a report cut before it logged (A), then a handler's flush inside the report of
    B, whose look logs A after B and tells both; B's entry stays, A's goes; then C fails
    (its ``Delivery.wait`` serves its report) before the thread flushes again."""
    producer = _unreachable()
    _interrupted(producer, "inside")  # A's report: Ctrl-C before it logs anything
    first = producer.send(make_turn())
    with pytest.raises(KeyboardInterrupt):
        producer.flush(10)
    real, handled, second = Delivery._reported, [], []

    def flush_in_a_handler_once(self, event_id, err):
        if not handled and second and self is second[0]:
            handled.append(event_id)
            producer.flush(0)  # inside B's report: the look, then what it knows
        return real(self, event_id, err)
    monkeypatch.setattr(Delivery, "_reported", flush_in_a_handler_once)
    second.append(producer.send(make_turn()))
    with pytest.raises(DeliveryError) as told:  # the handler's, out of the flush
        producer.flush(10)
    assert handled == list(second[0].event_ids)
    assert sorted(eid for eid, _ in told.value.failures) == sorted(
        [*first.event_ids, *second[0].event_ids])
    third = producer.send(make_turn())
    with pytest.raises(DeliveryError):  # its look finishes B's report; C's failure
        third.wait(10)
    with pytest.raises(DeliveryError) as flushed:
        producer.flush(0)
    assert [eid for eid, _ in flushed.value.failures] == list(third.event_ids)
    assert not flushed.value.forgotten
    producer.close(timeout_s=0)
