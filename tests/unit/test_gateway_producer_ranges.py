"""The gateway library refuses, before producing, an event the processor dead-letters
for a value outside its Avro type's range (an outside review, session 48).

docs/gateway-protocol.md, section 6: a timestamp (``timestamp-millis``) must lie within
years 1 to 9999, an ``int`` within 32 bits, a ``long`` within 64; the processor
dead-letters a record that breaks one (``CORRUPT_PAYLOAD``: no decision ever comes, and
``/status`` stays ``unknown``). docs/service.md, section 3: the library refuses before
producing what the processor would only dead-letter, typed (``EventBeyondLimits``).
Before session 48 such a turn, effect or cancellation was produced; a value beyond 64
bits leaked fastavro's ``OverflowError``.

No broker is needed: the refusal comes before encoding (``FakeKafka``, ``SizedSerde``).
"""

from __future__ import annotations

import pytest

from ratchet.samples import make_turn, make_turn_cancelled
from schemas.avro_ranges import INSTANT_RANGE
from services.gateway.errors import EventBeyondLimits
from tests.unit.test_gateway_library_review import effect_of, gateway

FIRST_MS, LAST_MS = INSTANT_RANGE  # 0001-01-01T00:00:00.000Z, 9999-12-31T23:59:59.999Z
INT_MAX = 2**31 - 1


def _turn(**fields):
    return make_turn().model_copy(update=fields)


def _effect(**fields):
    return effect_of(make_turn(), "call_1").model_copy(update=fields)


def _cancelled(**fields):
    return make_turn_cancelled(make_turn()).model_copy(update=fields)


OUTSIDE = [
    pytest.param(_turn, "produced_at", LAST_MS + 1, id="turn-produced-after-9999"),
    pytest.param(_turn, "produced_at", FIRST_MS - 1, id="turn-produced-before-year-1"),
    pytest.param(_turn, "expires_at", 2**62, id="turn-expires-far-beyond"),
    pytest.param(_turn, "produced_at", 2**63, id="turn-produced-beyond-64-bits"),
    pytest.param(_turn, "attempt", INT_MAX + 1, id="turn-attempt-beyond-32-bits"),
    pytest.param(_effect, "executed_at", LAST_MS + 1, id="effect-executed-after-9999"),
    pytest.param(_effect, "subturn_index", -(2**31) - 1, id="effect-subturn-beyond-32-bits"),
    pytest.param(_cancelled, "cancelled_at", FIRST_MS - 1, id="cancel-before-year-1"),
]


@pytest.mark.parametrize(("make", "field", "value"), OUTSIDE)
def test_a_value_outside_its_avro_range_is_refused_typed_before_producing(make, field,
                                                                           value):
    producer, kafka = gateway()
    event = make(**{field: value})
    with pytest.raises(EventBeyondLimits) as refused:
        producer.send(event)
    assert f".{field} = {value}" in str(refused.value) and not refused.value.retryable
    assert refused.value.event_id == event.event_id
    assert kafka.produced == []


@pytest.mark.parametrize(("make", "field", "value"), [
    pytest.param(_turn, "produced_at", LAST_MS, id="turn-last-millisecond-of-9999"),
    pytest.param(_turn, "produced_at", FIRST_MS, id="turn-first-millisecond-of-year-1"),
    pytest.param(_turn, "attempt", INT_MAX, id="turn-attempt-at-32-bits"),
    pytest.param(_effect, "executed_at", LAST_MS, id="effect-last-millisecond"),
    pytest.param(_cancelled, "cancelled_at", FIRST_MS, id="cancel-first-millisecond"),
])
def test_a_value_at_the_edge_of_its_range_is_produced(make, field, value):
    producer, kafka = gateway()
    producer.send(make(**{field: value}))
    assert len(kafka.produced) == 1


def test_a_turns_effect_outside_its_range_refuses_the_whole_turn():
    """``send_turn`` checks every event before producing the first: nothing of it."""
    producer, kafka = gateway()
    turn = make_turn()
    effect = effect_of(turn, "call_1").model_copy(update={"executed_at": LAST_MS + 1})
    with pytest.raises(EventBeyondLimits):
        producer.send_turn(turn, effects=[effect])
    assert kafka.produced == []
