"""Avro in Confluent wire format through a schema registry, with typed errors.

Wire format: byte 0 = magic 0, bytes 1-4 = schema id (big endian), then the Avro
binary body. Keys are NOT Avro: a key is the UTF-8 partition key (``encode_key``).

Subject strategy: RECORD NAME (``io.ratchet.TurnCompleted``, ...), on every topic.
``ratchet.gateway-events`` carries three record types; with the record-name strategy
each type evolves on its own subject (``compatibility_of``), producers never
wrap events in a union branch, and subjects do not depend on the configurable topic
prefix. The registry cannot enforce which types a topic allows, so
``decode_gateway_event`` does: any other record is ``UNEXPECTED_RECORD_TYPE``.
See docs/contracts.md for the union-schema alternative and why it lost.

Schemas are parsed once per process (``schemas.avsc``), serializers are built once per
record type, and schema ids are resolved once per id. Decoding does not go through
confluent-kafka's ``AvroDeserializer``: per schema id the writer schema is parsed
once, together with the reader schema it resolves to (none when writer and reader
are the same schema, the common case: no resolution at all), and the body is read
with fastavro's ``schemaless_reader``. ``AvroDeserializer`` re-expanded the reader
schema on every message (most of its cost).

Usage::

    serde = EventSerde(registry_client(settings.schema_registry_url))
    register_schemas(serde.client)              # idempotent; sets compatibility first
    value = serde.encode(turn, topic)           # bytes
    event = serde.decode_gateway_event(value, topic, partition, offset)
"""

from __future__ import annotations

import io
import json
from collections.abc import Collection
from typing import Any

from confluent_kafka.schema_registry import (
    Schema,
    SchemaRegistryClient,
    SchemaRegistryError,
    record_subject_name_strategy,
)
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.schema import SchemaParseException
from pydantic import ValidationError

from schemas import avsc
from schemas.avro_bodies import BodyReader, counted, identity_of, lenient_read
from schemas.avro_ranges import range_check
from schemas.errors import DecodeError, EncodeError, RegistryUnavailable, TooManyElements
from schemas.limits import MAX_EVENT_ELEMENTS
from schemas.models import (
    MODELS_BY_RECORD,
    DeadLetter,
    DeadLetterReason,
    Frozen,
    GatewayEvent,
    record_name,
)
from schemas.strict import Refusal, damage_before_the_end, plan_of, unsafe_shape
from schemas.writer_schema import (
    GATEWAY_RECORDS,
    foreign_logical_type,
    left_out,
    record_name_of,
    timestamps_as_longs,
    uuids_as_strings,
    without_docs,
)

MAGIC_BYTE = 0
HEADER_SIZE = 5
# What writing a value the schema does not take raises: fastavro's OverflowError (an
# integer beyond 64 bits) left ``encode`` raw before session 51.
_BAD_VALUE = (ValueError, TypeError, OverflowError)


def compatibility_of(record: str) -> str:
    """The registry compatibility of ``record``'s subject: FULL_TRANSITIVE for what
    gateways write, BACKWARD for ratchet's outcomes (its readers read its older ones)."""
    return "FULL_TRANSITIVE" if record in GATEWAY_RECORDS else "BACKWARD"

_NOT_FOUND = 404
_TRANSIENT_4XX = frozenset({408, 429})  # Request Timeout, Too Many Requests


# Seconds any registry request may take. confluent-kafka's client waits for ever by
# default: a registry that accepts connections but never answers hung a starting worker
# (and every decode of a new schema id) with no word.
REGISTRY_TIMEOUT_S = 10


def registry_client(url: str) -> SchemaRegistryClient:
    """The schema registry client every ratchet process uses (requests time out)."""
    return SchemaRegistryClient({"url": url, "timeout": REGISTRY_TIMEOUT_S})


def subject_for(record: str) -> str:
    """Registry subject of a record (record-name strategy): its full Avro name."""
    return avsc.full_name(record)


def encode_key(partition_key: str) -> bytes:
    """Kafka key bytes: the UTF-8 partition key (conversation_id or chain_root_id)."""
    return partition_key.encode("utf-8")


def register_schemas(
    client: SchemaRegistryClient,
    *,
    records: Collection[str] = avsc.TOP_LEVEL_RECORDS,
    compatibility: bool = True,
) -> dict[str, int]:
    """Register the current schema of every record; returns ``{subject: schema id}``.

    Idempotent (same text, same id). Compatibility is set on the subject BEFORE the
    new version is registered, so the registry checks it; for a brand-new subject the
    registry may refuse config on an unknown subject, so it is set right after the
    first version too (``compatibility_of``). ``compatibility=False`` skips it (the mock
    registry has no config).
    """
    ids: dict[str, int] = {}
    for record in records:
        subject = subject_for(record)
        schema = Schema(avsc.schema_text(record), "AVRO")
        level = compatibility_of(record)
        configured = compatibility and _try_set_compatibility(client, subject, level)
        ids[subject] = _registry_call(lambda s=subject, sc=schema: client.register_schema(s, sc))
        if compatibility and not configured:
            _registry_call(lambda s=subject, lv=level: client.set_compatibility(s, lv))
    return ids


def _try_set_compatibility(client: SchemaRegistryClient, subject: str, level: str) -> bool:
    try:
        _registry_call(lambda: client.set_compatibility(subject, level))
    except SchemaRegistryError as exc:
        if exc.http_status_code == _NOT_FOUND:
            return False
        raise
    return True


def _registry_call(call: Any) -> Any:
    """Run a registry request; infrastructure failures become ``RegistryUnavailable``."""
    try:
        return call()
    except SchemaRegistryError as exc:
        # 408 and 429 (a timeout, throttling) are transient like a 5xx: confluent-kafka's
        # own client retries them too.
        if (exc.http_status_code >= 500 or exc.http_status_code < 0
                or exc.http_status_code in _TRANSIENT_4XX):
            raise RegistryUnavailable(str(exc)) from exc
        raise
    except (OSError, ConnectionError) as exc:
        raise RegistryUnavailable(str(exc)) from exc
    except Exception as exc:  # httpx transport errors, without importing httpx here
        if type(exc).__module__.startswith(("httpx", "httpcore")):
            raise RegistryUnavailable(str(exc)) from exc
        raise


class EventSerde:
    """Encoder/decoder of every ratchet event, bound to one registry client."""

    def __init__(self, client: SchemaRegistryClient, *, auto_register: bool = False) -> None:
        """``auto_register=False`` (production): schemas are registered by
        ``register_schemas`` at deploy time and a producer with an unregistered schema
        fails loudly instead of silently creating a new version."""
        self.client = client
        self._auto_register = auto_register
        self._serializers: dict[str, AvroSerializer] = {}
        self._readers: dict[int, BodyReader] = {}
        self._encoded: set[str] = set()  # records encoded once: their schema id is known
        # Per record, once its serializer has encoded one: the wire header (magic byte
        # and schema id, fixed from then on) and the parsed schema, to write later
        # events without the serializer's per-call machinery (``_writer_of``).
        self._writers: dict[str, _Writer | None] = {}

    # --- encoding ---------------------------------------------------------------------

    def encode(self, event: Frozen, topic: str, data: dict[str, Any] | None = None
               ) -> bytes:
        """Confluent-framed Avro bytes of ``event`` for ``topic``. ``data``: the
        event's ``to_avro()`` when the caller has it already (the gateway producer
        range-checks it first), so it is not dumped twice."""
        record = record_name(event)
        writer = self._writers.get(record)
        if writer is not None:
            try:
                return _write(writer, event.to_avro() if data is None else data)
            except _BAD_VALUE as exc:
                raise EncodeError(record, str(exc)) from exc
        serializer = self._serializer(record)
        context = SerializationContext(topic, MessageField.VALUE)
        try:
            data = event.to_avro() if data is None else data
            encoded = _registry_call(lambda: serializer(data, context))
            self._encoded.add(record)
            if record not in self._writers:
                self._writers[record] = _writer_of(record, encoded, data)
            return encoded
        except SchemaRegistryError as exc:
            raise EncodeError(
                record, f"{exc} (is the schema registered? register_schemas)"
            ) from exc
        except _BAD_VALUE as exc:
            raise EncodeError(record, str(exc)) from exc

    def encodes_offline(self, event: Frozen) -> bool:
        """True when ``encode`` needs no registry round trip: a record of its type was
        encoded before (the serializer knows its schema id from then on)."""
        return record_name(event) in self._encoded

    def decodes_offline(self, value: bytes | None) -> bool:
        """True when decoding ``value`` needs no registry round trip: its writer schema
        id was seen before (a malformed header is decided without the registry too)."""
        if value is None or len(value) < HEADER_SIZE or value[0] != MAGIC_BYTE:
            return True
        return int.from_bytes(value[1:HEADER_SIZE], "big") in self._readers

    def _serializer(self, record: str) -> AvroSerializer:
        if record not in self._serializers:
            self._serializers[record] = AvroSerializer(
                self.client,
                avsc.schema_text(record),
                conf={
                    "auto.register.schemas": self._auto_register,
                    "subject.name.strategy": record_subject_name_strategy,
                },
            )
        return self._serializers[record]

    # --- decoding ---------------------------------------------------------------------

    def decode_gateway_event(
        self, value: bytes | None, topic: str, partition: int, offset: int
    ) -> GatewayEvent:
        """A ``TurnCompleted | ToolEffect | TurnCancelled`` or a ``DecodeError``.

        Raises ``RegistryUnavailable`` when the registry cannot be asked: retry that.
        """
        event = self.decode(value, topic, partition, offset, expected=avsc.GATEWAY_EVENT_RECORDS)
        return event  # type: ignore[return-value]

    def decode(
        self,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        *,
        expected: Collection[str] = avsc.TOP_LEVEL_RECORDS,
    ) -> Frozen:
        """Decode any ratchet event whose record name is in ``expected``.

        The writer's schema (from the registry, by the id in the header) is resolved
        against the CURRENT reader schema of that record, so data written with any
        older compatible version decodes into today's model.
        """
        where = {"topic": topic, "partition": partition, "offset": offset}
        schema_id = _check_header(value, where)
        record = self._record_of(schema_id, where)
        if record not in expected:
            raise DecodeError(
                DeadLetterReason.UNEXPECTED_RECORD_TYPE,
                f"{record} is not one of {sorted(expected)}",
                schema_id=schema_id,
                **where,
            )
        data = self._read_body(record, value, schema_id, where)
        try:
            return MODELS_BY_RECORD[record].from_avro(data)
        except ValidationError as exc:
            raise DecodeError(
                DeadLetterReason.INVALID_EVENT, str(exc), schema_id=schema_id, **where
            ) from exc

    def _record_of(self, schema_id: int, where: dict[str, Any]) -> str:
        """Record name of a writer schema id (asked once per id, then remembered)."""
        return self._reader_of(schema_id, where).record

    def _reader_of(self, schema_id: int, where: dict[str, Any]) -> BodyReader:
        """The registry is asked once per schema id; its answer is remembered."""
        found = self._readers.get(schema_id)
        if found is None:
            try:
                schema = _registry_call(lambda: self.client.get_schema(schema_id))
            except SchemaRegistryError as exc:
                if exc.http_status_code == _NOT_FOUND:
                    raise DecodeError(
                        DeadLetterReason.UNKNOWN_SCHEMA_ID, str(exc), schema_id=schema_id, **where
                    ) from exc
                # Any other refusal (401/403: credentials; 400: ...) says nothing about
                # the record, which may be fine: retried until the registry answers,
                # never a dead letter (the worker shows degraded meanwhile).
                raise RegistryUnavailable(f"registry refused the lookup of schema id "
                                          f"{schema_id}: {exc}") from exc
            found = BodyReader(record_name_of(schema), schema.schema_str)
            self._readers[schema_id] = found
        return found

    def _parsed_reader(self, schema_id: int, record: str) -> BodyReader:
        """The cached reader of ``schema_id`` with both schemas parsed (once per id)."""
        known = self._readers[schema_id]
        if known.writer is None:
            writer_json = uuids_as_strings(json.loads(known.writer_text))
            reader_json = json.loads(avsc.schema_text(record))
            declared = parse_schema(writer_json)
            # Same schema but for its docs (a writer registered with other doc
            # strings): read with the writer's alone. Resolving against the reader
            # doubled the decode (156 against 76 us per TurnCompleted).
            reader = (None if without_docs(writer_json) == without_docs(reader_json)
                      else avsc.parsed(record))
            # Bodies are read with the writer's timestamp-millis as plain longs; its
            # logical types are judged as declared (``foreign_logical_type``).
            writer = parse_schema(timestamps_as_longs(writer_json))
            known = BodyReader(
                known.record,
                known.writer_text,
                writer=writer,
                reader=reader,
                in_range=range_check(record),
                left_out=left_out(record, writer_json),
                strict_plan=plan_of(writer),
                unsafe=unsafe_shape(writer)
                or (None if reader is None else foreign_logical_type(declared, reader)),
            )
            self._readers[schema_id] = known
        return known

    def _read_body(
        self, record: str, value: bytes, schema_id: int, where: dict[str, Any]
    ) -> dict[str, Any]:
        """The body as the reader schema's dict, or the DecodeError saying why not.

        Besides what fastavro refuses, two things fastavro lets through are
        ``CORRUPT_PAYLOAD``: bytes left after one record of the writer schema (the body
        was written with another schema than its id names, e.g. a newer one labelled
        with an older id whose appended fields would be dropped, or the frame is
        damaged), and an ``int``/``long`` field beyond 32/64 bits (fastavro reads an
        ``int`` as a long varint; our outcome records would carry it on to readers that
        refuse it)."""
        if len(value) == HEADER_SIZE:
            raise DecodeError(
                DeadLetterReason.TRUNCATED, "no body after the header", schema_id=schema_id, **where
            )
        try:
            known = self._parsed_reader(schema_id, record)
        except (SchemaParseException, RecursionError, ValueError, KeyError, TypeError) as exc:
            # SchemaParseException: a writer schema the registry took but fastavro cannot
            # parse (a decimal whose scale exceeds its precision, found by a review): it
            # was dead-lettered UNKNOWN, with a traceback in the log. RecursionError: one
            # nested beyond what Python's JSON parser and fastavro's parser recurse to.
            # ValueError, KeyError, TypeError: what else fastavro's parser (e.g.
            # UnknownType for {"type": "<a name>"}) or our own measures raise on a
            # schema it did not expect.
            raise DecodeError(DeadLetterReason.SCHEMA_MISMATCH, f"{type(exc).__name__}: {exc}",
                              schema_id=schema_id, **where) from exc
        if known.unsafe is not None:
            raise DecodeError(DeadLetterReason.SCHEMA_MISMATCH, known.unsafe,
                              schema_id=schema_id, **where)
        walked = False
        if record in GATEWAY_RECORDS and len(value) - HEADER_SIZE > MAX_EVENT_ELEMENTS:
            # Counted before fastavro builds anything: it builds an object per array
            # item and map entry (with the model's, ~1.4 KB for a 7-byte item), so 4 MiB
            # of tiny items took 877 MB. A body of n bytes holds at most n of them (each
            # takes a byte or more: ``unsafe_shape``), so only a longer one is walked.
            refusal = counted(known, memoryview(value)[HEADER_SIZE:])
            if refusal is not None and refusal.too_many:
                raise self._beyond_the_element_bound(record, known, value, refusal,
                                                     schema_id, where)
            if refusal is not None:
                raise DecodeError(
                    DeadLetterReason.TRUNCATED if refusal.ran_out
                    else DeadLetterReason.CORRUPT_PAYLOAD,
                    f"{record}: {refusal.detail} (not valid Avro)", schema_id=schema_id, **where)
            walked = True
        try:
            body = io.BytesIO(value)
            body.seek(HEADER_SIZE)
            data: dict[str, Any] = schemaless_reader(  # type: ignore[assignment]
                body, known.writer, known.reader
            )
        except SchemaResolutionError as exc:
            reason, error = DeadLetterReason.SCHEMA_MISMATCH, exc
        except (EOFError, StopIteration) as exc:
            # fastavro reads a negative length as a short read: the walk tells the two
            # apart (a body that ends early is TRUNCATED, a damaged one CORRUPT_PAYLOAD)
            damage = damage_before_the_end(memoryview(value)[HEADER_SIZE:], known.writer)
            if damage is not None:
                raise DecodeError(DeadLetterReason.CORRUPT_PAYLOAD,
                                  f"{record}: {damage} (not valid Avro)",
                                  schema_id=schema_id, **where) from exc
            reason, error = DeadLetterReason.TRUNCATED, exc
        except (ValueError, TypeError, IndexError, KeyError, OverflowError, MemoryError) as exc:
            # garbage after a valid header: negative lengths, bad UTF-8, bad union index
            reason, error = DeadLetterReason.CORRUPT_PAYLOAD, exc
        else:
            if known.left_out is not None:
                raise DecodeError(DeadLetterReason.SCHEMA_MISMATCH, known.left_out,
                                  schema_id=schema_id, **where)
            left = len(value) - body.tell()
            if left:
                raise DecodeError(
                    DeadLetterReason.CORRUPT_PAYLOAD,
                    f"{left} bytes left after the {record} body of {len(value) - HEADER_SIZE}"
                    f" (not written with schema id {schema_id}, or damaged)",
                    schema_id=schema_id,
                    **where,
                )
            outside = known.in_range(data)
            if outside is not None:
                raise DecodeError(
                    DeadLetterReason.CORRUPT_PAYLOAD,
                    f"{record}{outside}",
                    schema_id=schema_id,
                    **where,
                )
            broken = None if walked else lenient_read(known, data,
                                                         memoryview(value)[HEADER_SIZE:])
            if broken is not None:
                raise DecodeError(
                    DeadLetterReason.CORRUPT_PAYLOAD,
                    f"{record}: {broken} (not valid Avro)",
                    schema_id=schema_id,
                    **where,
                )
            return data
        raise DecodeError(
            reason, f"{type(error).__name__}: {error}", schema_id=schema_id, **where
        ) from error

    def _beyond_the_element_bound(self, record: str, known: BodyReader, value: bytes,
                                  refusal: Refusal, schema_id: int,
                                  where: dict[str, Any]) -> DecodeError:
        """The error for a body holding more than ``MAX_EVENT_ELEMENTS`` array items and
        map entries: ``TooManyElements`` (``INVALID_EVENT``), carrying a
        ``TurnCompleted``'s identity for the processor to reject it
        ``UNSUPPORTED_FORMAT`` when it can be read safely (``identity_of``)."""
        if known.left_out is not None:  # what any body of this writer schema gets
            return DecodeError(DeadLetterReason.SCHEMA_MISMATCH, known.left_out,
                               schema_id=schema_id, **where)
        detail = (f"{record} holds {refusal.detail}: a gateway event holds at most "
                  f"{MAX_EVENT_ELEMENTS}")
        turn = identity_of(known, memoryview(value)[HEADER_SIZE:]) if record == "TurnCompleted" else None
        return TooManyElements(detail, turn=turn, schema_id=schema_id, **where)


def _write(writer: _Writer, data: dict[str, Any]) -> bytes:
    header, schema, hinted = writer
    if hinted:
        # Each such field's branch named (fastavro's tuple notation): fastavro picks a
        # union's branch by validating the value against each branch in turn, the
        # whole nested record again before writing it (about two thirds of a
        # TurnCompleted's write with its proof and artifact, session 50). A field of
        # ``null`` or one record has that record as its only branch for a non-null.
        data = {**data, **{name: (branch, data[name]) for name, branch in hinted
                           if data.get(name) is not None}}
    out = io.BytesIO()
    out.write(header)
    schemaless_writer(out, schema, data)
    return out.getvalue()


# The wire header, the parsed schema and its top-level fields typed ``null`` or one
# record (the field's name, the record's full name): what ``_write`` needs.
_Writer = tuple[bytes, Any, tuple[tuple[str, str], ...]]


def nullable_record_fields(schema: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The top-level fields of a parsed record schema whose type is the union of
    ``null`` and one named record, each with that record's full name (parsed schemas
    name records in full). Deeper unions are left to fastavro (none in ratchet's
    gateway records, ``tests/unit/test_avro_union_hints.py``)."""
    hinted = []
    for field in schema["fields"]:
        branches = field["type"]
        if not isinstance(branches, list) or len(branches) != 2 or "null" not in branches:
            continue
        other = branches[1 - branches.index("null")]
        if isinstance(other, dict) and other.get("type") == "record":
            hinted.append((field["name"], other["name"]))
    return tuple(hinted)


def _writer_of(record: str, encoded: bytes, data: dict[str, Any]) -> _Writer | None:
    """What ``_write`` needs to encode ``record`` as the registry serializer does, or
    None (the serializer stays in use): its output's header (magic byte, schema id)
    and the record's parsed schema, kept only if ``_write`` gives back exactly the
    bytes the serializer wrote for ``data``. The serializer itself writes the same way
    (``schemaless_writer`` after that header) once it knows the schema id, which it
    then never asks again; it is the serializer's per-call work (subject name, rule
    checks, buffers) that this skips."""
    if len(encoded) < HEADER_SIZE or encoded[0] != MAGIC_BYTE:
        return None
    schema = avsc.parsed(record)
    writer = (encoded[:HEADER_SIZE], schema, nullable_record_fields(schema))
    try:
        same = _write(writer, data) == encoded
    except (ValueError, TypeError):
        same = False
    return writer if same else None


def _check_header(value: bytes | None, where: dict[str, Any]) -> int:
    """Schema id from the Confluent header, or the DecodeError saying why there is none."""
    if value is None:
        raise DecodeError(DeadLetterReason.NULL_VALUE, "null value (tombstone)", **where)
    if len(value) < HEADER_SIZE:
        raise DecodeError(
            DeadLetterReason.TRUNCATED, f"{len(value)} bytes, shorter than the header", **where
        )
    if value[0] != MAGIC_BYTE:
        raise DecodeError(
            DeadLetterReason.BAD_MAGIC_BYTE, f"magic byte {value[0]}, expected 0", **where
        )
    return int.from_bytes(value[1:HEADER_SIZE], "big")


def header_schema_id(value: bytes | None) -> int | None:
    """The schema id in a record's Confluent header, or None if it has none (for a dead
    letter raised after decoding: its ``schema_id`` names the writer schema too)."""
    if value is None or len(value) < HEADER_SIZE or value[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(value[1:HEADER_SIZE], "big")


def dead_letter_for(
    error: DecodeError, *, key: bytes | None, value: bytes | None, now_ms: int
) -> DeadLetter:
    """The DeadLetter record for a record that failed to decode (bytes kept as they were)."""
    return DeadLetter(
        key=key,
        value=value,
        error=str(error),
        reason=error.reason,
        source_topic=error.topic,
        source_partition=error.partition,
        source_offset=error.offset,
        schema_id=error.schema_id,
        dead_lettered_at=now_ms,
    )
