"""Adapter from the registry serde (``schemas.avro``) to the processor's codec port."""

from __future__ import annotations

from schemas.avro import EventSerde, register_schemas, registry_client
from schemas.errors import DecodeError, TooManyElements
from schemas.models import Frozen, GatewayEvent, TurnCompleted
from streams.records import DecodeFailed, RawRecord, TurnBeyondLimits


class RegistryCodec:
    """Confluent-framed Avro via the schema registry.

    ``decode`` raises ``DecodeFailed`` for a record that can never be decoded (it goes
    to the dead letters) and lets ``RegistryUnavailable`` through (retry: the record
    may be fine).
    """

    def __init__(self, serde: EventSerde) -> None:
        self.serde = serde

    @classmethod
    def connect(cls, registry_url: str, *, register: bool = True) -> RegistryCodec:
        client = registry_client(registry_url)
        if register:
            register_schemas(client)
        return cls(EventSerde(client))

    def decode(self, record: RawRecord) -> GatewayEvent:
        try:
            return self.serde.decode_gateway_event(record.value, record.topic,
                                                   record.partition, record.offset)
        except TooManyElements as exc:
            if isinstance(exc.turn, TurnCompleted):
                raise TurnBeyondLimits(exc.turn, exc.message) from exc
            raise DecodeFailed(exc.reason, str(exc), exc.schema_id) from exc
        except DecodeError as exc:
            raise DecodeFailed(exc.reason, str(exc), exc.schema_id) from exc

    def encode(self, topic: str, model: Frozen) -> bytes:
        return self.serde.encode(model, topic)

    def decodes_offline(self, record: RawRecord) -> bool:
        return self.serde.decodes_offline(record.value)

    def encodes_offline(self, model: Frozen) -> bool:
        return self.serde.encodes_offline(model)
