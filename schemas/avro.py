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

import copy
import io
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import cache
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

from ratchet.speedups import SPEEDUPS
from schemas import avsc
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
from schemas.strict import (
    RECORD_KINDS,
    Refusal,
    damage_before_the_end,
    plan_of,
    refusal_of,
    strict_violation,
    unsafe_shape,
)

MAGIC_BYTE = 0
HEADER_SIZE = 5
# The records gateways write and ratchet reads. Their subjects are FULL_TRANSITIVE: the
# registry refuses a version that any earlier one cannot read, so no client can register
# a writer schema ratchet's readers cannot read (under BACKWARD a gateway could register
# `attempt` as long, or drop a field that has no default: every gateway that then took
# `versions/latest` wrote records that were dead-lettered, found by a gateway built in
# Java from the docs), nor one that the workers of the previous version cannot read during
# a rolling upgrade. Ratchet's own changes to them add fields with defaults (since v1:
# `TurnCompleted.gateway_id`), which passes both ways.
GATEWAY_RECORDS = frozenset({"TurnCompleted", "ToolEffect", "TurnCancelled"})


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


@dataclass(frozen=True)
class _Reader:
    """How to read bodies written with one schema id (built once per id)."""

    record: str  # record name without namespace, "?" if the schema is not a record
    writer_text: str
    writer: Any = None  # fastavro-parsed writer schema (None until first body read)
    reader: Any = None  # parsed reader schema, or None: writer == reader, no resolution
    in_range: Any = None  # the reader record's int/long range check (``_range_check``)
    # A gateway record's writer that lacks a field ratchet's first schema has: what it
    # lacks (``_left_out``), else None.
    left_out: str | None = None
    strict_plan: bytes = b""  # the writer schema as the C strict walk's plan (``plan_of``)
    # Why fastavro must not read bodies of this writer schema, else None: a shape whose
    # bodies could cost without bound (``unsafe_shape``), or a logical type ratchet's
    # field does not have (``_foreign_logical_type``).
    unsafe: str | None = None


class EventSerde:
    """Encoder/decoder of every ratchet event, bound to one registry client."""

    def __init__(self, client: SchemaRegistryClient, *, auto_register: bool = False) -> None:
        """``auto_register=False`` (production): schemas are registered by
        ``register_schemas`` at deploy time and a producer with an unregistered schema
        fails loudly instead of silently creating a new version."""
        self.client = client
        self._auto_register = auto_register
        self._serializers: dict[str, AvroSerializer] = {}
        self._readers: dict[int, _Reader] = {}
        self._encoded: set[str] = set()  # records encoded once: their schema id is known
        # Per record, once its serializer has encoded one: the wire header (magic byte
        # and schema id, fixed from then on) and the parsed schema, to write later
        # events without the serializer's per-call machinery (``_writer_of``).
        self._writers: dict[str, tuple[bytes, Any] | None] = {}

    # --- encoding ---------------------------------------------------------------------

    def encode(self, event: Frozen, topic: str) -> bytes:
        """Confluent-framed Avro bytes of ``event`` for ``topic``."""
        record = record_name(event)
        writer = self._writers.get(record)
        if writer is not None:
            try:
                return _write(writer, event.to_avro())
            except (ValueError, TypeError) as exc:
                raise EncodeError(record, str(exc)) from exc
        serializer = self._serializer(record)
        context = SerializationContext(topic, MessageField.VALUE)
        try:
            data = event.to_avro()
            encoded = _registry_call(lambda: serializer(data, context))
            self._encoded.add(record)
            if record not in self._writers:
                self._writers[record] = _writer_of(record, encoded, data)
            return encoded
        except SchemaRegistryError as exc:
            raise EncodeError(
                record, f"{exc} (is the schema registered? register_schemas)"
            ) from exc
        except (ValueError, TypeError) as exc:
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

    def _reader_of(self, schema_id: int, where: dict[str, Any]) -> _Reader:
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
            found = _Reader(_record_name(schema), schema.schema_str)
            self._readers[schema_id] = found
        return found

    def _parsed_reader(self, schema_id: int, record: str) -> _Reader:
        """The cached reader of ``schema_id`` with both schemas parsed (once per id)."""
        known = self._readers[schema_id]
        if known.writer is None:
            writer_json = _uuids_as_strings(json.loads(known.writer_text))
            reader_json = json.loads(avsc.schema_text(record))
            writer = parse_schema(writer_json)
            # Same schema but for its docs (a writer registered with other doc
            # strings): read with the writer's alone. Resolving against the reader
            # doubled the decode (156 against 76 us per TurnCompleted).
            reader = (None if _without_docs(writer_json) == _without_docs(reader_json)
                      else avsc.parsed(record))
            known = _Reader(
                known.record,
                known.writer_text,
                writer=writer,
                reader=reader,
                in_range=_range_check(record),
                left_out=_left_out(record, writer_json),
                strict_plan=plan_of(writer),
                unsafe=unsafe_shape(writer)
                or (None if reader is None else _foreign_logical_type(writer, reader)),
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
            refusal = _counted(known, memoryview(value)[HEADER_SIZE:])
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
            broken = None if walked else _lenient_read(known, data,
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

    def _beyond_the_element_bound(self, record: str, known: _Reader, value: bytes,
                                  refusal: Refusal, schema_id: int,
                                  where: dict[str, Any]) -> DecodeError:
        """The error for a body holding more than ``MAX_EVENT_ELEMENTS`` array items and
        map entries: ``TooManyElements`` (``INVALID_EVENT``), carrying a
        ``TurnCompleted``'s identity for the processor to reject it
        ``UNSUPPORTED_FORMAT`` when it can be read safely (``_identity_of``)."""
        if known.left_out is not None:  # what any body of this writer schema gets
            return DecodeError(DeadLetterReason.SCHEMA_MISMATCH, known.left_out,
                               schema_id=schema_id, **where)
        detail = (f"{record} holds {refusal.detail}: a gateway event holds at most "
                  f"{MAX_EVENT_ELEMENTS}")
        turn = _identity_of(known, value) if record == "TurnCompleted" else None
        return TooManyElements(detail, turn=turn, schema_id=schema_id, **where)


def _counted(known: _Reader, body: memoryview) -> Refusal | None:
    """The strict walk with at most ``MAX_EVENT_ELEMENTS`` array items and map entries.
    In C it answers every body of a writer schema ``unsafe_shape`` passed (it is not
    sure only of what such a schema cannot hold: a REFUSE node, nesting past its depth)
    and says where it stopped, so the Python twin never walks a long body again to word
    a refusal (a review: 26 s for 131 072 items of a writer's 1 000-field record). The
    Python walk runs only without the C module: its items are bounded, not the fields
    each one holds (docs/decisions.md, "Items per event")."""
    if SPEEDUPS is not None:
        code, at, _ = SPEEDUPS.avro_counted(known.strict_plan, body, MAX_EVENT_ELEMENTS)
        if code == _CONFORMS:
            return None
        if code == _TOO_MANY:
            return Refusal(f"more than {MAX_EVENT_ELEMENTS} array items and map entries",
                           too_many=True)
        if code == _DAMAGED:
            return Refusal(f"not valid Avro at byte {at} of {len(body)} (the C walk)")
        if code == _RAN_OUT:
            return Refusal(f"the body ends at byte {at} inside a value (the C walk)",
                           ran_out=True)
        # Not sure: a plan node it does not take, nesting past its depth; no writer
        # schema ``unsafe_shape`` passes has one. Refused rather than walked in Python
        # (a review: a long body walked there took 17-30 s).
        return Refusal(f"the C walk cannot check it (stopped at byte {at})")
    return refusal_of(body, known.writer, most_elements=MAX_EVENT_ELEMENTS)


# What ``avro_counted`` answers (0: not sure, the Python walk decides)
_CONFORMS, _TOO_MANY, _DAMAGED, _RAN_OUT = 1, 2, 3, 4
# The most schema nodes a turn beyond the element bound may take to read for its fields
# (fastavro skips its arrays value by value, ~20-100 ns a node, holding the GIL): ratchet's
# own schema with 16 M one-byte items is 16 M nodes (1.8 s); a writer's wide records in an
# array took 22.5 s (a review). More: a dead letter, not a rejection.
MAX_IDENTITY_NODES = 16 * 2**20


def _identity_of(known: _Reader, value: bytes) -> Any:
    """A ``TurnCompleted`` beyond the element bound read WITHOUT its arrays and maps
    (fastavro skips a field the reader lacks, building nothing; they are empty in the
    model): what the processor needs to reject it ``UNSUPPORTED_FORMAT`` (its ids,
    request, attempt). None when that cannot be read safely, so it is a dead letter:
    without the C module (the Python walk over up to 16 M items would take minutes),
    when the whole body does not keep to the spec (fastavro reads damage leniently: a
    wrapped union index could change an id), when reading it would walk more than
    ``MAX_IDENTITY_NODES`` schema nodes, when the writer's arrays are not ratchet's
    (``_arrays_as_ratchets``: such a writer's bodies within the bound are
    ``SCHEMA_MISMATCH``, so one beyond it must not record a rejection), or when the
    fields do not make a turn."""
    if SPEEDUPS is None or not _arrays_as_ratchets(known.writer):
        return None
    body = memoryview(value)[HEADER_SIZE:]
    code, _, nodes = SPEEDUPS.avro_counted(known.strict_plan, body, -1)
    if code != _CONFORMS or nodes > MAX_IDENTITY_NODES:
        return None
    reader, fill = _without_arrays_reader()
    try:
        data = schemaless_reader(io.BytesIO(body), known.writer, reader)
    except (SchemaResolutionError, EOFError, StopIteration, ValueError, TypeError,
            IndexError, KeyError, OverflowError):
        return None
    fill(data)
    if known.in_range(data) is not None:
        return None
    try:
        return MODELS_BY_RECORD["TurnCompleted"].from_avro(data)
    except ValidationError:
        return None


@cache
def _without_arrays_reader() -> tuple[Any, Callable[[dict[str, Any]], None]]:
    """ratchet's ``TurnCompleted`` reader schema without its array and map fields (at
    any depth), and the function that puts them back empty into a dict it read."""
    removed: list[tuple[tuple[str, ...], Any]] = []  # (record path, empty value)

    def strip(schema: Any, path: tuple[str, ...]) -> Any:
        if not isinstance(schema, dict) or schema.get("type") not in RECORD_KINDS:
            return schema
        fields = []
        for field in schema["fields"]:
            kind = field["type"]
            if isinstance(kind, dict) and kind.get("type") in ("array", "map"):
                removed.append(((*path, field["name"]), [] if kind["type"] == "array" else {}))
                continue
            fields.append({**field, "type": strip(kind, (*path, field["name"]))})
        return {**schema, "fields": fields}

    reader = parse_schema(copy.deepcopy(strip(avsc.inlined("TurnCompleted"), ())))

    def fill(data: dict[str, Any]) -> None:
        for path, empty in removed:
            at: Any = data
            for name in path[:-1]:
                at = at.get(name) if isinstance(at, dict) else None
            if isinstance(at, dict):
                at[path[-1]] = type(empty)()

    return reader, fill


def _arrays_as_ratchets(writer: Any) -> bool:
    """Whether every array and map field of ratchet's ``TurnCompleted`` (the fields the
    identity read skips) has the very same type in the writer schema, names' namespaces
    and docs aside. A writer with another type there (``tool_effect_ids`` of longs, an
    ``input_items`` that is no array) cannot be read as ratchet's, but skipping the field
    hides it (found by a review)."""
    names = writer.get("__named_schemas", {}) if isinstance(writer, dict) else {}
    for path, wanted in _ratchet_arrays():
        node: Any = writer
        for name in path:
            node = _record_of_node(node, names)
            fields = {} if node is None else {f["name"]: f["type"] for f in node["fields"]}
            if name not in fields:
                return False
            node = fields[name]
        if _shape(node, names) != wanted:
            return False
    return True


@cache
def _ratchet_arrays() -> tuple[tuple[tuple[str, ...], Any], ...]:
    """(path, shape) of every array and map field of ratchet's ``TurnCompleted``."""
    reader = avsc.parsed("TurnCompleted")
    names = reader.get("__named_schemas", {})
    found: list[tuple[tuple[str, ...], Any]] = []

    def visit(node: Any, path: tuple[str, ...]) -> None:
        record = _record_of_node(node, names)
        if record is None:
            return
        for field in record["fields"]:
            kind = field["type"]
            if isinstance(kind, dict) and kind.get("type") in ("array", "map"):
                found.append(((*path, field["name"]), _shape(kind, names)))
            else:
                visit(kind, (*path, field["name"]))

    visit(reader, ())
    return tuple(found)


def _record_of_node(node: Any, names: dict[str, Any]) -> dict[str, Any] | None:
    """The record a schema node is (a named reference resolved), else None."""
    if isinstance(node, str):
        node = names.get(node)
    if isinstance(node, dict) and isinstance(node.get("type"), dict | list):
        return _record_of_node(node["type"], names)
    if isinstance(node, dict) and node.get("type") in RECORD_KINDS:
        return node
    return None


def _shape(node: Any, names: dict[str, Any]) -> Any:
    """A schema node as a comparable value: references resolved, short names, record
    fields in name order, no docs, defaults or aliases (the schemas compared recurse
    nowhere: ``unsafe_shape``)."""
    if isinstance(node, str):
        return _shape(names[node], names) if node in names else node
    if isinstance(node, list):
        return [_shape(branch, names) for branch in node]
    kind = node["type"]
    if isinstance(kind, dict | list):
        return _shape(kind, names)
    short = str(node.get("name", "")).rsplit(".", 1)[-1]
    if kind in RECORD_KINDS:  # fields by name: a reader resolves them by name, not place
        return ["record", short, sorted((f["name"], _shape(f["type"], names))
                                        for f in node["fields"])]
    if kind == "enum":
        return ["enum", short, list(node["symbols"])]
    if kind == "fixed":
        return ["fixed", short, node["size"], node.get("logicalType")]
    if kind == "array":
        return ["array", _shape(node["items"], names)]
    if kind == "map":
        return ["map", _shape(node["values"], names)]
    return [kind, node.get("logicalType")]


def _left_out(record: str, writer: Any) -> str | None:
    """For a record gateways write: the first field of ratchet's v1 schema (any of its
    records, matched by name without namespace) that ``writer`` does not have, said as
    a refusal; else None. Schema resolution reads such a field as the reader's default:
    a writer that renamed ``tool_effect_ids`` (with an alias, which the reader ignores)
    had its effects read as ``[]`` and the turn promoted, where ratchet's own schema
    gave ``MISSING_TOOL_EFFECT`` (found by a review). Fields added since v1 may be
    missing: a v1 writer does not have them."""
    if record not in GATEWAY_RECORDS:
        return None
    written = _record_fields(writer)
    for name, fields in _record_fields(avsc.inlined(record, avsc.V1_DIR)).items():
        if name in written:
            missing = sorted(fields - written[name])
            if missing:
                return (f"the writer schema's {name} has no field {missing[0]!r}, which "
                        f"ratchet's {name} reads: it would be read as its default")
    return None


def _foreign_logical_type(writer: Any, reader: Any) -> str | None:
    """The first logical type the fastavro-parsed ``writer`` puts on a field that
    ratchet's ``reader`` reads without it, said as a refusal; else None.

    fastavro reads a value as its WRITER's logical type says, where Java's Avro applies
    the reader's: ``date`` on ``attempt`` came back a date (a TypeError in the range
    check: an ``UNKNOWN`` dead letter), and ``decimal`` on ``Item.content`` made an
    integer of the content, quadratic in its size (900 KB: 92 s holding the GIL) (a
    review, session 34). Allowed: the reader's own logical type, and
    ``timestamp-micros`` where the reader has ``timestamp-millis``: read as the same
    instant (docs/gateway-protocol.md section 2), where Java would read the number as
    milliseconds. A writer's ``uuid`` on a string was dropped before
    (``_uuids_as_strings``); fields ratchet does not read are skipped, not read."""
    reader_records = {name.rsplit(".", 1)[-1]: schema
                      for name, schema in reader.get("__named_schemas", {}).items()
                      if schema.get("type") in RECORD_KINDS}
    for name, record in writer.get("__named_schemas", {}).items():
        short = name.rsplit(".", 1)[-1]
        if record.get("type") not in RECORD_KINDS or short not in reader_records:
            continue
        reader_fields = {f["name"]: f["type"] for f in reader_records[short]["fields"]}
        for field in record["fields"]:
            if field["name"] not in reader_fields:
                continue
            allowed = _logical_types(reader_fields[field["name"]])
            if "timestamp-millis" in allowed:
                allowed = allowed | {"timestamp-micros"}
            foreign = sorted(_logical_types(field["type"]) - allowed)
            if foreign:
                return (f"the writer schema's {short}.{field['name']} has logicalType "
                        f"{foreign[0]!r}, which ratchet's does not: fastavro would read it "
                        f"as that type, not as ratchet's")
    return None


def _logical_types(schema: Any) -> set[str]:
    """The logical types in a field's type, not inside a named record it defines (that
    record's own fields are compared on their own)."""
    if isinstance(schema, list):
        return set().union(*(_logical_types(branch) for branch in schema))
    if not isinstance(schema, dict):
        return set()
    kind = schema["type"]
    if isinstance(kind, (dict, list)):
        return _logical_types(kind)
    found = {schema["logicalType"]} if "logicalType" in schema else set()
    if kind == "array":
        found |= _logical_types(schema["items"])
    elif kind == "map":
        found |= _logical_types(schema["values"])
    return found


def _record_fields(schema: Any, found: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Field names of the records defined in ``schema``, by name without namespace: of
    two records with one name (in two namespaces), the names both have. A review hid a
    renamed ``tool_effect_ids`` behind a decoy ``other.TurnCompleted`` with every field:
    the decoy, defined last, stood for both."""
    found = {} if found is None else found
    if isinstance(schema, list):
        for branch in schema:
            _record_fields(branch, found)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in RECORD_KINDS:
            short = schema["name"].rsplit(".", 1)[-1]
            fields = {f["name"] for f in schema["fields"]}
            found[short] = found[short] & fields if short in found else fields
            for field in schema["fields"]:
                _record_fields(field["type"], found)
        elif kind == "array":
            _record_fields(schema["items"], found)
        elif kind == "map":
            _record_fields(schema["values"], found)
        elif isinstance(kind, (dict, list)):
            _record_fields(kind, found)
    return found


def _lenient_read(known: _Reader, data: dict[str, Any], body: memoryview) -> str | None:
    """What in ``body`` fastavro read but the spec refuses (``schemas.strict``), else
    None. With the C module every body is walked in C (a few us); the Python walk
    decides only what the C walk is not sure of. Without it: a body that is the plain
    encoding of ``data`` has no such flaw (every one changes the bytes), so it is walked
    only when it is not, or was read by resolution."""
    if SPEEDUPS is not None:
        if SPEEDUPS.avro_conforms(known.strict_plan, body):
            return None
        return strict_violation(body, known.writer)
    if known.reader is None:
        plain = io.BytesIO()
        schemaless_writer(plain, known.writer, data)
        if plain.getbuffer() == body:
            return None
    return strict_violation(body, known.writer)


# --- int/long ranges --------------------------------------------------------------------
# fastavro reads an Avro ``int`` as a long varint (up to 10 bytes, wrapping beyond), so
# a body may carry an ``int`` field far beyond 32 bits. The check is derived once per
# record from its reader schema (the shape of every decoded dict) and visits only the
# int/long fields; a check returns None, or where the first bad value is and what it is.

_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
_DATETIME_TYPES = frozenset({"timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                             "local-timestamp-micros", "date", "time-millis", "time-micros"})
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class _Scalar:
    """An int or long value (its range): checked inline by its record or array."""

    low: int
    high: int


@cache
def _range_check(record: str) -> _Check:
    """The range check of a top-level record (derived from its schema once per process).

    Raises NotImplementedError for a schema shape it does not handle (a union of more
    than null and one other type holding ints), so a new schema cannot slip past it.
    """
    check = _compile(avsc.inlined(record), {}, avsc.NAMESPACE)
    return check if callable(check) else _nothing_to_check


def _nothing_to_check(_: Any) -> None:
    return None


def _compile(schema: Any, names: dict[str, Any], namespace: str) -> _Scalar | _Check | None:
    """A ``_Scalar`` for an int/long, a check for a type holding some, else None."""
    if isinstance(schema, str):
        if schema in _RANGES:
            return _Scalar(*_RANGES[schema])
        if schema in _PRIMITIVES:
            return None
        return names.get(schema if "." in schema else f"{namespace}.{schema}")  # defined above
    if isinstance(schema, list):
        branches = [c for c in (_compile(b, names, namespace) for b in schema) if c is not None]
        if len(branches) > 1:
            raise NotImplementedError(f"range check of the union {schema}")
        return branches[0] if branches else None  # null is skipped where the value is read
    kind = schema["type"]
    if isinstance(kind, dict | list):
        return _compile(kind, names, namespace)
    if kind in _RANGES:
        # fastavro hands these back as date/time objects, built only from values it can
        # represent (else OverflowError or ValueError: CORRUPT_PAYLOAD): nothing to check
        return None if schema.get("logicalType") in _DATETIME_TYPES else _Scalar(*_RANGES[kind])
    if kind == "record":
        full = avsc.full_name_of({"namespace": namespace, **schema})
        scalars: list[tuple[str, int, int]] = []
        nested: list[tuple[str, _Check]] = []
        names[full] = check = _record_check(scalars, nested)  # a recursive use finds it
        inner_namespace = full.rpartition(".")[0]
        for field in schema["fields"]:
            found = _compile(field["type"], names, inner_namespace)
            if isinstance(found, _Scalar):
                scalars.append((field["name"], found.low, found.high))
            elif found is not None:
                nested.append((field["name"], found))
        if not scalars and not nested:
            names[full] = None
            return None
        # complete now (a recursive use above got it before: no inlining there)
        check.scalars, check.nested = scalars, nested  # type: ignore[attr-defined]
        return check
    if kind in ("array", "map"):
        inner = _compile(schema["items" if kind == "array" else "values"], names, namespace)
        if inner is None:
            return None
        return _array_check(inner) if kind == "array" else _map_check(inner)
    if kind in ("enum", "fixed"):
        names[avsc.full_name_of({"namespace": namespace, **schema})] = None
    return None


def _outside(value: Any, high: int) -> str:
    kind, bits = ("int", 32) if high == _RANGES["int"][1] else ("long", 64)
    return f" = {value!r}: outside the {bits}-bit range of an Avro {kind}"


def _record_check(scalars: list[tuple[str, int, int]], nested: list[tuple[str, _Check]]) -> _Check:
    def check(data: dict[str, Any]) -> str | None:
        for name, low, high in scalars:
            value = data[name]
            if value is not None and not low <= value <= high:
                return f".{name}{_outside(value, high)}"
        for name, inner in nested:
            value = data[name]
            if value is not None:
                bad = inner(value)
                if bad is not None:
                    return f".{name}{bad}"
        return None

    return check


def _array_check(inner: _Scalar | _Check) -> _Check:
    if isinstance(inner, _Scalar):
        low, high = inner.low, inner.high

        def scalars(values: list[Any]) -> str | None:
            for i, value in enumerate(values):
                if value is not None and not low <= value <= high:
                    return f"[{i}]{_outside(value, high)}"
            return None

        return scalars

    fields = getattr(inner, "scalars", None)
    if fields and not inner.nested:  # type: ignore[attr-defined]
        # records of ints alone (an Item's format_version): their fields inline

        def flat(values: list[Any]) -> str | None:
            for i, value in enumerate(values):
                if value is not None:
                    for name, low, high in fields:
                        field = value[name]
                        if field is not None and not low <= field <= high:
                            return f"[{i}].{name}{_outside(field, high)}"
            return None

        return flat

    def records(values: list[Any]) -> str | None:
        for i, value in enumerate(values):
            if value is not None:
                bad = inner(value)
                if bad is not None:
                    return f"[{i}]{bad}"
        return None

    return records


def _map_check(inner: _Scalar | _Check) -> _Check:
    check_values = _array_check(inner)

    def check(values: dict[str, Any]) -> str | None:
        for key, value in values.items():
            bad = check_values([value])
            if bad is not None:
                return f"[{key!r}]{bad.removeprefix('[0]')}"
        return None

    return check


def _write(writer: tuple[bytes, Any], data: dict[str, Any]) -> bytes:
    header, schema = writer
    out = io.BytesIO()
    out.write(header)
    schemaless_writer(out, schema, data)
    return out.getvalue()


def _writer_of(record: str, encoded: bytes, data: dict[str, Any]) -> tuple[bytes, Any] | None:
    """What ``_write`` needs to encode ``record`` as the registry serializer does, or
    None (the serializer stays in use): its output's header (magic byte, schema id)
    and the record's parsed schema, kept only if ``_write`` gives back exactly the
    bytes the serializer wrote for ``data``. The serializer itself writes the same way
    (``schemaless_writer`` after that header) once it knows the schema id, which it
    then never asks again; it is the serializer's per-call work (subject name, rule
    checks, buffers) that this skips."""
    if len(encoded) < HEADER_SIZE or encoded[0] != MAGIC_BYTE:
        return None
    writer = (encoded[:HEADER_SIZE], avsc.parsed(record))
    try:
        same = _write(writer, data) == encoded
    except (ValueError, TypeError):
        same = False
    return writer if same else None


def _record_name(schema: Any) -> str:
    """The ratchet record a registered schema is (``TurnCompleted``), or a name no
    ratchet record has: ``UNEXPECTED_RECORD_TYPE``. Only an Avro record named in
    ratchet's namespace is one of ours (docs/gateway-protocol.md section 2): a record
    named ``TurnCompleted`` without a namespace was taken for ``io.ratchet.TurnCompleted``,
    and a Protobuf or JSON schema was an ``UNKNOWN`` dead letter with a JSON error (an
    outside review, session 26)."""
    kind = getattr(schema, "schema_type", None) or "AVRO"
    if kind.upper() != "AVRO":
        return f"a {kind} schema, not Avro"
    try:
        parsed = json.loads(schema.schema_str)
    except ValueError:
        return "an Avro schema that is not JSON"
    except RecursionError:  # JSON nested deeper than Python's parser recurses
        return "an Avro schema nested too deep to parse"
    if not isinstance(parsed, dict) or "name" not in parsed:
        return "an Avro schema that is not a named record"
    # A top-level schema without a namespace is in Avro's null namespace (not ours:
    # ``avsc.full_name_of`` defaults to ours, for the nested types of our own files).
    name, namespace = str(parsed["name"]), parsed.get("namespace")
    if "." not in name and namespace:
        name = f"{namespace}.{name}"
    prefix = avsc.NAMESPACE + "."
    return name.removeprefix(prefix) if name.startswith(prefix) else f"{name} (not {prefix}*)"


def _uuids_as_strings(schema: Any) -> Any:
    """A writer schema with ``"logicalType": "uuid"`` dropped from its strings. The
    annotation changes no byte (the value is the UUID's text), but fastavro reads it as
    a ``uuid.UUID``, which no ratchet field takes: a Java gateway annotating
    ``event_id`` so had every event dead-lettered ``INVALID_EVENT`` (a review, session
    33). Read as the string it is, the field's own rules judge it."""
    if isinstance(schema, dict):
        if schema.get("type") == "string" and schema.get("logicalType") == "uuid":
            return {k: v for k, v in schema.items() if k != "logicalType"}
        return {k: _uuids_as_strings(v) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_uuids_as_strings(v) for v in schema]
    return schema


def _without_docs(schema: Any) -> Any:
    """A schema's JSON without its ``doc`` attributes, which never change decoding."""
    if isinstance(schema, dict):
        return {k: _without_docs(v) for k, v in schema.items() if k != "doc"}
    if isinstance(schema, list):
        return [_without_docs(v) for v in schema]
    return schema


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
