"""The gateway producer as it stands after session 48's three changes, reviewed from
outside (session 48, rrevc).

docs/service.md, section 3: a signal handler's ``close`` inside a call of its own
thread that serves delivery reports (librdkafka's ``poll`` or ``flush``: a
``Delivery.wait``'s, a ``flush``'s) never waits there; the call finishes and raises
what was not delivered. A ``close`` while another thread closes waits for that one to
end, but not from there: the other close's release closes the client, and
confluent-kafka's close waits for every call inside the client to return, the
handler's call among them, which waited for that release: a deadlock (the real
client, in a subprocess bounded by its timeout).
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from ratchet.samples import make_turn
from services.gateway.errors import DeliveryError
from tests.unit.producer_process import run_script
from tests.unit.test_gateway_library_review import gateway

_HANDLERS_CLOSE_INSIDE_A_CALL_WHILE_ANOTHER_THREAD_CLOSES = '''
import signal

told = {}
served = threading.Event()  # the main thread served a purged event's report


def handler(signum, frame):
    told["handler"] = outcome(lambda: producer.close(timeout_s=0), "nothing")


class Client:
    """The real client; the closing thread's last flush (which serves the purged
    events' reports) waits until the main thread's call served them instead."""

    def __init__(self, real):
        self._real = real

    def flush(self, timeout=-1):
        if timeout == 0 and threading.current_thread() is not threading.main_thread():
            served.wait(10)
        return self._real.flush(timeout)

    def __len__(self):
        return len(self._real)

    def __getattr__(self, name):
        return getattr(self._real, name)


producer = unreachable({})
producer._producer = Client(producer._producer)
plain_on_delivery = producer._on_delivery


def on_delivery(event_id, delivery=None):
    """The report, served inside the main thread's call: SIGUSR1 lands there first."""
    report = plain_on_delivery(event_id, delivery)

    def in_main(err, msg):
        if threading.current_thread() is threading.main_thread() and not served.is_set():
            signal.raise_signal(signal.SIGUSR1)  # the handler runs before this returns
            served.set()
        report(err, msg)
    return in_main


producer._on_delivery = on_delivery
signal.signal(signal.SIGUSR1, handler)
turn = make_turn()
sent = producer.send(turn)


def close():  # the broker never answers: the turn is purged
    told["closer"] = outcome(lambda: producer.close(timeout_s=1), "nothing")


closer = threading.Thread(target=close, daemon=True)
closer.start()
producer._closing.wait(10)
call = sent.wait if sys.argv[1] == "wait" else producer.flush
told["main"] = outcome(lambda: call(timeout_s=600), "written")
closer.join(30)
for name in ("handler", "main", "closer"):
    print(name, told.get(name))
print("turn", turn.event_id)
'''


@pytest.mark.parametrize("call", ["wait", "flush"])
def test_a_handlers_close_inside_a_call_while_another_thread_closes_does_not_hang(call):
    """Thread T closes (the broker unreachable: its flush times out, it purges the
    turn); the main thread is in ``Delivery.wait`` or ``flush`` and serves the purged
    turn's report, where SIGUSR1's handler closes too. The handler's close returns
    (raising nothing there) and the main thread's call raises the purged turn. T's
    close raises it after a wait (which tells no thread's flush), not after a flush of
    the main thread, the only sender, which was told it (a thread that never sent is
    told what no sender has flushed past). Before, the handler's close waited for T's release while T's close of
    the client waited for the main thread's call: killed at the bound."""
    *told, turn = run_script(_HANDLERS_CLOSE_INSIDE_A_CALL_WHILE_ANOTHER_THREAD_CLOSES,
                             call, timeout_s=30)
    event_id = turn.removeprefix("turn ")
    closer = [event_id] if call == "wait" else "nothing"
    assert told == ["handler nothing", f"main {[event_id]}", f"closer {closer}"]


def test_a_wait_of_no_time_serves_the_reports_already_come():
    """``wait(0)`` asks what is known now, and serves the reports librdkafka holds, as
    ``flush(0)`` and ``wait_async(0)`` do: the broker answered the turn (written) and
    the other turn (timed out) before anyone polled. It served none before: each was
    ``FlushTimeout``, however long ago the broker answered."""
    producer, kafka = gateway()
    written, failed = producer.send(make_turn()), producer.send(make_turn())
    kafka.deliver(0)
    kafka.deliver(0, KafkaError(KafkaError._MSG_TIMED_OUT))
    written.wait(0)
    with pytest.raises(DeliveryError) as raised:
        failed.wait(0)
    assert [eid for eid, _ in raised.value.failures] == list(failed.event_ids)


def test_a_report_ctrl_c_interrupted_is_a_failure_once_the_producer_is_closed():
    """Ctrl-C lands in a delivery report before it recorded anything (its first line):
    confluent-kafka raises the ``KeyboardInterrupt`` out of the flush serving it and the
    report is gone, the failure with it (checked with the real client, delivery timed
    out: the next flush, and the close, returned as if the turn were written; its
    ``Delivery`` said ``FlushTimeout``, "still in flight", for ever). No report can come
    once the client is closed, so ``close`` names such an event: a retryable
    ``DeliveryError`` (it may or may not be written), and so does its wait."""
    producer, kafka = gateway()
    plain_on_delivery = producer._on_delivery
    interrupted: list[str] = []

    def on_delivery(event_id, delivery=None):
        report = plain_on_delivery(event_id, delivery)

        def ctrl_c_first(err, msg):
            if not interrupted:
                interrupted.append(event_id)
                raise KeyboardInterrupt
            report(err, msg)
        return ctrl_c_first

    producer._on_delivery = on_delivery
    sent = producer.send(make_turn())
    kafka.deliver(0, KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KeyboardInterrupt):
        producer.flush(5)
    assert interrupted == list(sent.event_ids)
    with pytest.raises(DeliveryError) as raised:
        producer.close(timeout_s=0)
    assert [eid for eid, _ in raised.value.failures] == interrupted
    assert raised.value.retryable
    with pytest.raises(DeliveryError) as waited:
        sent.wait(0)
    assert [eid for eid, _ in waited.value.failures] == interrupted
