"""A fetched record whose Kafka header key is not UTF-8 is read, not fatal.

Why: Kafka's protocol types a header key as a UTF-8 String, but the broker does not
check it; a buggy or raw client can write any bytes. aiokafka decodes header keys
strictly while it unpacks a fetch (its C and its Python reader alike), so such a
record raised ``UnicodeDecodeError`` out of the consumer: Faust's fetcher crashed, the
worker stopped or hung without consuming, and a restart read the same record again.
ratchet never reads headers, so the record's key and value are all it needs: handled
like any other, it promotes, is rejected or becomes a dead letter with its bytes
(CONTRACT 4: "Undecodable record -> dead-letters; processing continues").

How: aiokafka's fetcher is given ``LenientPartitionRecords`` (its ``PartitionRecords``
unchanged on the common path) and keeps each partition's raw fetched bytes
(``_KeptRecords``). When the strict unpacking fails on a header key, the rest of the
fetch is read by ``read_batches`` below, written from Kafka's record batch v2 format
(the only one Kafka 4 stores): records at and after the next offset are delivered with
the headers whose keys decode (the others are dropped, logged). Control batches are
skipped as aiokafka skips them. Anything else the lenient reader cannot read (a legacy
batch, a transactional fetch read committed, a malformed batch) raises the original
error: no record is ever skipped silently. ``install()`` is called once per worker.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Any

from aiokafka import codec
from aiokafka.consumer import fetcher
from aiokafka.structs import ConsumerRecord

log = logging.getLogger(__name__)

_STRICT_MEMORY_RECORDS = fetcher.MemoryRecords
_READ_UNCOMMITTED = 0  # aiokafka's isolation level constant

# Record batch v2 (magic 2): baseOffset int64, batchLength int32, partitionLeaderEpoch
# int32, magic int8, crc uint32, attributes int16, lastOffsetDelta int32, baseTimestamp
# int64, maxTimestamp int64, producerId int64, producerEpoch int16, baseSequence int32,
# records count int32; then the records (compressed as a whole per the attributes).
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_OVERHEAD = 12  # baseOffset + batchLength: batchLength counts the bytes after them
_COMPRESSION_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_CONTROL_BIT = 0x20
_LOG_APPEND_TIME = 1
_DECOMPRESS = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode,
               4: codec.zstd_decode}


class UnreadableFetch(Exception):
    """The lenient reader cannot read these bytes either."""


class _KeptRecords:
    """aiokafka's ``MemoryRecords`` over a partition's fetched bytes, keeping the bytes
    (the lenient reader starts from them)."""

    __slots__ = ("data", "_records")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._records = _STRICT_MEMORY_RECORDS(data)

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self) -> Any:
        return self._records.next_batch()

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()


class LenientPartitionRecords(fetcher.PartitionRecords):
    """aiokafka's ``PartitionRecords``; a header key that is not UTF-8 switches to
    ``read_batches`` for the rest of the fetch (module docstring)."""

    def _unpack_records(self) -> Iterator[ConsumerRecord]:
        strict = super()._unpack_records()
        while True:
            try:
                record = next(strict)
            except StopIteration:
                return
            except UnicodeDecodeError as exc:
                raw = getattr(self._records, "data", None)
                if raw is None or self._isolation_level != _READ_UNCOMMITTED:
                    raise
                log.warning("%s: a record at or after offset %d has a header key that is "
                            "not UTF-8 (%s): reading the fetch leniently", self._tp,
                            self.next_fetch_offset, exc)
                try:
                    yield from self._lenient(raw)
                except UnreadableFetch as why:
                    raise exc from why
                return
            yield record

    def _lenient(self, raw: bytes) -> Iterator[ConsumerRecord]:
        tp = self._tp
        for batch_next_offset, offset, timestamp, timestamp_type, key, value, headers, \
                dropped in read_batches(raw):
            if offset is None:  # a control batch, or the end of a batch
                self.next_fetch_offset = max(self.next_fetch_offset, batch_next_offset)
                continue
            if offset < self.next_fetch_offset:
                continue  # delivered by the strict reader already
            if dropped:
                log.warning("%s@%d: %d header(s) with a key that is not UTF-8 dropped "
                            "(ratchet reads no header)", tp, offset, dropped)
            self.next_fetch_offset = offset + 1
            yield ConsumerRecord(
                tp.topic, tp.partition, offset, timestamp, timestamp_type,
                self._key_deserializer(key) if self._key_deserializer else key,
                self._value_deserializer(value) if self._value_deserializer else value,
                None, -1 if key is None else len(key), -1 if value is None else len(value),
                tuple(headers))


def read_batches(raw: bytes) -> Iterator[tuple]:
    """The records of record batches v2 in ``raw``, leniently about header keys:
    ``(batch_next_offset, offset, timestamp, timestamp_type, key, value, headers,
    dropped)`` per record, and ``(batch_next_offset, None, ...)`` once per batch after
    its records (also for a control batch, which has none to deliver). A batch cut
    short at the end of ``raw`` (a fetch ends anywhere) ends the reading."""
    view = memoryview(raw)
    pos = 0
    while len(raw) - pos >= _BATCH_HEADER.size:
        base_offset, length = struct.unpack_from(">qi", raw, pos)
        end = pos + _LOG_OVERHEAD + length
        if end > len(raw):
            return  # the last batch of a fetch may be partial: fetched again later
        (_, _, _, magic, _crc, attributes, last_delta, base_ts, max_ts, _pid, _epoch,
         _seq, count) = _BATCH_HEADER.unpack_from(raw, pos)
        if magic != 2:
            raise UnreadableFetch(f"record batch of magic {magic} at offset {base_offset}")
        next_offset = base_offset + last_delta + 1
        if not attributes & _CONTROL_BIT:
            body = view[pos + _BATCH_HEADER.size:end]
            compression = attributes & _COMPRESSION_MASK
            if compression:
                try:
                    body = memoryview(_DECOMPRESS[compression](bytes(body)))
                except Exception as exc:  # an unknown codec, a library missing, bad bytes
                    raise UnreadableFetch(f"batch at offset {base_offset}: compression "
                                          f"{compression}: {exc!r}") from exc
            timestamp_type = 1 if attributes & _TIMESTAMP_TYPE_BIT else 0
            for fields in _records(body, count):
                ts_delta, offset_delta, key, value, headers, dropped = fields
                timestamp = max_ts if timestamp_type == _LOG_APPEND_TIME else base_ts + ts_delta
                yield (next_offset, base_offset + offset_delta, timestamp, timestamp_type,
                       key, value, headers, dropped)
        yield (next_offset, None, None, None, None, None, (), 0)
        pos = end


def _records(body: memoryview, count: int) -> Iterator[tuple]:
    pos = 0
    for _ in range(count):
        length, pos = _varint(body, pos)
        start = pos
        pos += 1  # attributes (unused)
        ts_delta, pos = _varint(body, pos)
        offset_delta, pos = _varint(body, pos)
        key, pos = _bytes(body, pos)
        value, pos = _bytes(body, pos)
        header_count, pos = _varint(body, pos)
        headers: list[tuple[str, bytes | None]] = []
        dropped = 0
        for _ in range(header_count):
            name, pos = _bytes(body, pos)
            header_value, pos = _bytes(body, pos)
            try:
                headers.append((bytes(name or b"").decode("utf-8"), header_value))
            except UnicodeDecodeError:
                dropped += 1
        if pos != start + length:
            raise UnreadableFetch(f"record of {length} bytes read as {pos - start}")
        yield ts_delta, offset_delta, key, value, headers, dropped


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's signed varint and varlong)."""
    shift = result = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise UnreadableFetch("varint past the end of the record")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _bytes(buf: memoryview, pos: int) -> tuple[bytes | None, int]:
    size, pos = _varint(buf, pos)
    if size < 0:
        return None, pos
    if pos + size > len(buf):
        raise UnreadableFetch("a field past the end of the record")
    return bytes(buf[pos:pos + size]), pos + size


def install() -> None:
    """Make aiokafka's fetcher keep each partition's bytes and read leniently on a
    header key that is not UTF-8 (idempotent)."""
    fetcher.MemoryRecords = _KeptRecords
    fetcher.PartitionRecords = LenientPartitionRecords
