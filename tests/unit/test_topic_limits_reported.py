"""``raise_size_limits`` returns once the broker reports the raised limit, not when the
alter is answered: the answer comes from the controller, the broker applies it a
moment later, and a record sent in that moment would be refused (the old value was
read right after the alter in a full integration run, session 49). No server: a
stand-in admin client whose broker applies the alter after a few reads."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from ratchet.settings import Settings
from schemas.limits import MIB, TOPIC_MAX_MESSAGE_BYTES
from streams.topics import TopicConfigError, raise_size_limits, topic_names


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class LaggingBroker:
    """Answers the alter at once; reports the new value only after ``lag`` reads."""

    def __init__(self, limits: dict[str, int], lag: int) -> None:
        self.limits = dict(limits)
        self.pending: dict[str, int] = {}
        self.lag = lag

    def describe_configs(self, resources, request_timeout=None):
        if self.pending:
            self.lag -= 1
            if self.lag < 0:
                self.limits.update(self.pending)
                self.pending = {}
        return {r: _done({"max.message.bytes": SimpleNamespace(value=str(self.limits[r.name]))})
                for r in resources}

    def incremental_alter_configs(self, resources, request_timeout=None):
        for r in resources:
            (entry,) = r.incremental_configs
            self.pending[r.name] = int(entry.value)
        return {r: _done(None) for r in resources}


@pytest.fixture
def topics():
    return topic_names(Settings.from_env({}))


def test_it_returns_once_the_broker_reports_the_raised_limit(topics):
    broker = LaggingBroker({topics.gateway_events: MIB}, lag=3)
    changes = raise_size_limits(broker, topics, [topics.gateway_events], timeout_s=30)
    assert changes == {topics.gateway_events: (MIB, TOPIC_MAX_MESSAGE_BYTES)}
    assert broker.limits[topics.gateway_events] == TOPIC_MAX_MESSAGE_BYTES  # reported now


def test_a_limit_never_reported_fails_typed_past_the_timeout(topics):
    broker = LaggingBroker({topics.gateway_events: MIB}, lag=10**9)
    with pytest.raises(TopicConfigError, match=rf"still reports max.message.bytes {MIB} "
                                               rf"of topic {topics.gateway_events}"):
        raise_size_limits(broker, topics, [topics.gateway_events], timeout_s=0.3)
