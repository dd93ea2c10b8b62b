"""The chaos run's output reader (``observe.OutputReader``) never dies quietly.

Run 27 of session 51's soak failed ``damage_continuation_wrong`` 11: the turns sent on
damaged histories were never seen decided, though the workers processed them. The
reader was a thread that any exception but ``RegistryUnavailable`` ended silently;
every outcome after it then read "never decided", a verdict on the product from a
harness failure. Now its death is kept and the run fails ``observer_died`` (and only
that, not the checks built on what it did not see); one record it cannot decode is read
past and named (``observer_unread``).
"""

from __future__ import annotations

from types import SimpleNamespace

from ratchet.chaos import report as reporting
from ratchet.chaos.observations import Violation
from ratchet.chaos.observe import OutputReader, observer_violations
from ratchet.chaos.runner import judged
from schemas.errors import DecodeError
from schemas.models import DeadLetterReason


class _Msg:
    def __init__(self, value, offset):
        self._value, self._offset = value, offset

    def value(self):
        return self._value

    def error(self):
        return None

    def topic(self):
        return "chaos-x.checkpoints"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def timestamp(self):
        return (1, 1000 + self._offset)


class _Consumer:
    """Hands out ``msgs``, then tells the reader to stop (or raises ``then``)."""

    def __init__(self, msgs, reader_stop, then=None):
        self.msgs, self.reader_stop, self.then = list(msgs), reader_stop, then
        self.closed = False

    def subscribe(self, topics):
        pass

    def poll(self, timeout):
        if self.msgs:
            return self.msgs.pop(0)
        if self.then is not None:
            raise self.then
        self.reader_stop()
        return None

    def close(self):
        self.closed = True


class _Serde:
    """A tombstone cannot be decoded (as ``EventSerde``: ``NULL_VALUE``); ``boom``
    stands for any other exception; anything else decodes to ``object()``."""

    def decode(self, value, topic, partition, offset):
        if value is None:
            raise DecodeError(DeadLetterReason.NULL_VALUE, "null value (tombstone)",
                              topic=topic, partition=partition, offset=offset)
        if value == b"boom":
            raise KeyError("a bug in the reader's decode")
        return object()


def _reader(msgs, then=None) -> OutputReader:
    settings = SimpleNamespace(topic=lambda t: f"chaos-x.{t}")
    holder: dict = {}
    consumer = _Consumer(msgs, lambda: holder["r"].stop.set(), then)
    reader = OutputReader(settings, "g", consumer=consumer, serde=_Serde())
    holder["r"] = reader
    return reader


def test_an_exception_in_decode_is_kept_and_fails_the_run_as_the_observers():
    reader = _reader([_Msg(b"ok", 0), _Msg(b"boom", 1)])
    reader.run()  # returns: the reader stopped on the exception
    assert reader.failure is not None and "KeyError" in reader.failure
    [v] = observer_violations(reader)
    assert v.kind == "observer_died" and "a bug in the reader's decode" in v.detail
    assert "after 1 records" in v.detail
    assert reader._consumer.closed


def test_an_exception_from_the_consumer_is_kept_too():
    reader = _reader([], then=RuntimeError("consumer fatal"))
    reader.run()
    assert reader.failure == "RuntimeError: consumer fatal"


def test_a_record_it_cannot_decode_is_read_past_and_named():
    reader = _reader([_Msg(None, 0), _Msg(b"ok", 1)])
    reader.run()
    assert reader.failure is None
    assert reader.records == 1  # the record after the tombstone was taken
    [v] = observer_violations(reader)
    assert v.kind == "observer_unread" and "NULL_VALUE" in v.detail and "@0" in v.detail


def test_a_reader_that_ran_to_its_stop_has_no_verdict():
    reader = _reader([_Msg(b"ok", 0)])
    reader.run()
    assert reader.failure is None and observer_violations(reader) == []


def test_a_dead_observer_replaces_the_checks_built_on_what_it_did_not_see():
    died = Violation("observer_died", "-", "the output reader stopped: KeyError")
    never = [Violation("damage_continuation_wrong", "s", "never decided")]
    got = judged(died, [died], lambda: never)
    assert got == [died]
    deadline = Violation("run_deadline", "-", "late")
    assert judged(deadline, [], lambda: never) == [deadline, *never]
    unread = Violation("observer_unread", "-", "x")
    assert judged(None, [unread], lambda: never) == [unread, *never]


def test_the_summary_names_the_dead_observer_first():
    report = {
        "seed": 27, "tag": "t", "duration_s": 1.0, "workers": 3, "producers": 3,
        "events": {"sent_turns": 1, "responses": 1, "stories": 1,
                   "dead_letter_records": 0},
        "observed": {"promoted": 0, "rejected": 0, "orphaned": 0, "dead_letters": 0},
        "expected_outcomes": {}, "waits": {}, "faults": [], "unexpected_exits": [],
        "violations": reporting.group([
            Violation("damage_continuation_wrong", "s", "never decided"),
            Violation("observer_died", "-", "the output reader stopped: KeyError")]),
        "passed": False, "report_path": "r.json",
    }
    text = reporting.summary(report)
    assert text.index("observer_died") < text.index("damage_continuation_wrong")
    assert "verdict: FAIL" in text
