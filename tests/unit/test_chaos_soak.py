"""What session 45's chaos soak found in the harness (docs/chaos.md, "Defects it found").

A chaos producer whose Kafka client stopped delivering goes on with a new one. Seed 3 of session 45's soak (``--faults ci --turns 600 --rate 20``, lane window 4): after
the Kafka restart one producer process's raw client (``_RawProducer``) delivered nothing
again. Each round timed out after ``DELIVERY_TIMEOUT_MS`` and was sent again through the
same client, which timed out again, until the run's deadline failed a correct run
(``run_deadline``). A failed flush now replaces the client whose events were not
delivered; the round is then sent again through the new one. Here a client that never
delivers stands in for the stuck one (no servers).

The same run then ended in a traceback of the damage phase (no report, no verdict): it
damages turns the oracle expects promoted, and a turn never sent has no row. A run that
ends with a turn undecided now skips the phase and reports its verdict.

Seed 5 (``--faults long --turns 1000 --rate 20 --workers 3``) failed ``waits_unanswered``
on a correct run: once every turn was sent, the ``wait_ms`` threads asked the last
"surely promoted" response again and again, a turn whose logical expiry had passed
before it was sent, whose every read is ``EXPIRED``. The threads now ask only responses
answered with a history.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ratchet.chaos import produce
from ratchet.chaos.observations import Violation
from ratchet.chaos.oracle import expect
from ratchet.chaos.workload import generate
from services.gateway.errors import DeliveryError, GatewayError


class _Client:
    """librdkafka's ``Producer`` as ``_RawProducer`` uses it. The first one made is stuck:
    every flush leaves its events in flight, as the stuck client did."""

    made: list[_Client] = []

    def __init__(self, config: dict) -> None:
        self.stuck = not _Client.made
        self.queued: list = []
        self.purged = False
        _Client.made.append(self)

    def produce(self, topic, value=None, key=None, on_delivery=None) -> None:
        self.queued.append(on_delivery)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        if self.stuck:
            return len(self.queued)
        for report in self.queued:
            report(None, SimpleNamespace(offset=lambda: 7))
        self.queued = []
        return 0

    def purge(self) -> None:
        self.purged = True
        self.queued = []


@pytest.fixture
def clients(monkeypatch):
    _Client.made = []
    monkeypatch.setattr(produce, "Producer", _Client)
    return _Client.made


def _settings():
    return SimpleNamespace(kafka_bootstrap="127.0.0.1:1", topic=lambda name: f"t.{name}")


def test_a_raw_client_that_never_delivers_is_replaced(clients):
    raw = produce._RawProducer(_settings())
    raw.send(b"k", b"v")
    with pytest.raises(GatewayError):
        raw.flush()
    raw.send(b"k", b"v")  # the round, sent again
    raw.flush()  # delivered through a new client
    assert len(clients) == 2 and clients[0].purged


class _Gateway:
    """``GatewayProducer`` as ``_Sender`` uses it: the first one made never delivers."""

    made: list[_Gateway] = []

    def __init__(self, settings, serde, config=None) -> None:
        self.stuck = not _Gateway.made
        self.closed = False
        _Gateway.made.append(self)

    def flush(self, timeout_s: float = 30.0) -> None:
        if self.stuck:
            raise DeliveryError([("evt-1", "Local: Message timed out")], retryable=True)

    def close(self, timeout_s: float = 30.0) -> None:
        self.closed = True
        raise DeliveryError([("evt-1", "Local: Purged in queue")], retryable=True)


def test_a_gateway_producer_that_never_delivers_is_replaced(clients, monkeypatch):
    _Gateway.made = []
    monkeypatch.setattr(produce, "GatewayProducer", _Gateway)
    monkeypatch.setattr(produce, "registry_client", lambda url: None)
    monkeypatch.setattr(produce, "EventSerde", lambda registry: "serde")
    sender = produce._Sender(SimpleNamespace(
        **vars(_settings()), schema_registry_url="http://127.0.0.1:1",
        api_host="127.0.0.1", api_port=1))
    clients[0].stuck = False  # only the gateway producer is stuck here
    with pytest.raises(GatewayError):
        sender.flush()
    sender.flush()  # the round, sent again through a new gateway producer
    assert sender.gateway is not _Gateway.made[0] and _Gateway.made[0].closed


def test_a_run_cut_short_damages_nothing():
    from ratchet.chaos.runner import damage_plan

    expectations = [expect(s) for s in generate(seed=3, turns=400, tag="unit").stories]
    said: list[str] = []
    overdue = Violation("run_deadline", "-", "276/603 turns sent")
    assert damage_plan(expectations, 3, overdue, [("ten-1", "resp-1")], said.append) == []
    assert damage_plan(expectations, 3, None, [("ten-1", "resp-1")], said.append) == []
    assert all(line.startswith("damage: skipped") for line in said) and len(said) == 2
    assert damage_plan(expectations, 3, None, [], said.append)  # a whole run: damaged


def test_waits_ask_only_responses_answered_with_a_history():
    from ratchet.chaos.runner import _surely_promoted

    expectations = [expect(s) for s in generate(seed=5, turns=1000, tag="5x9c2115").stories]
    expired = {(e.story.tenant, rid) for e in expectations for w in e.worlds
               for rid, p in w.promoted.items() if p.expired}
    assert expired  # the workload has such turns
    asked = _surely_promoted(expectations)
    assert asked and not expired & set(asked)
    worlds = {(e.story.tenant, rid): e.worlds for e in expectations for w in e.worlds
              for rid in w.promoted}
    # (a timed turn's waits are judged by when they were asked: ratchet/chaos/timed.py)
    assert all(w.promoted[rid].read_at(w.promoted[rid].fingerprint_hash,
                                       past_expiry=False)[0] != "failure"
               for tenant, rid in asked for w in worlds[(tenant, rid)])
