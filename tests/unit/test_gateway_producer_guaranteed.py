"""``GUARANTEED``, the settings the gateway protocol's delivery guarantees rest on,
checked against what confluent-kafka 2.16 / librdkafka 2.16 take (session 52, rgw9).

Every value the table lists must make a real ``Producer`` (none a dead entry the client
refuses), and a value it does not list is ``ProducerMisconfigured`` naming the property
and the value given. Before: ``"false"`` for ``delivery.report.only.error`` was listed
though confluent-kafka takes only a ``bool`` there (its ``TypeError``, made
``ProducerMisconfigured`` in session 51, named the property but not the value), and
values equal to a listed one but of another Python type (``0``, ``1.0``, ``0.0``) passed
the table's check and were refused by the client in its own words.
"""

from __future__ import annotations

import pytest

from ratchet.settings import Settings
from services.gateway.errors import ProducerMisconfigured
from services.gateway.producer import GUARANTEED, GatewayProducer


def _producer_with(config: dict) -> GatewayProducer:
    # No broker, no encoding: the constructor's handling of ``config`` only.
    return GatewayProducer(Settings(kafka_bootstrap="127.0.0.1:1"), serde=object(),
                           config={"log_level": 0, **config})


@pytest.mark.parametrize(("name", "value"), [
    (name, value) for name, values in GUARANTEED.items() for value in values
], ids=repr)
def test_every_value_the_table_lists_makes_a_producer(name, value):
    """The table says only what is true: the client takes each listed value (and
    ``GatewayProducer`` adds nothing that would refuse it)."""
    _producer_with({name: value}).close(timeout_s=1)


@pytest.mark.parametrize(("name", "value"), [
    ("delivery.report.only.error", "false"),  # confluent-kafka: a bool only
    ("delivery.report.only.error", 0),        # equal to False, not a bool
    ("enable.idempotence", 1.0),              # equal to True; librdkafka: "1.0" no bool
    ("allow.auto.create.topics", 0.0),        # equal to False; the same
    ("enable.idempotence", "yes"),            # not listed: refused by the table already
], ids=repr)
def test_a_value_the_table_does_not_list_is_refused_naming_property_and_value(name, value):
    with pytest.raises(ProducerMisconfigured, match="no producer made") as refused:
        _producer_with({name: value})
    assert f"{name}={value!r}" in str(refused.value), str(refused.value)
