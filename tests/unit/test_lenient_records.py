"""A fetched record whose Kafka header key is not UTF-8 is delivered with its key and
value (streams/lenient_records.py), where aiokafka raised out of the consumer and the
worker stopped or hung (found by an outside review of the worker's stream layer,
2026-12-04). The lenient reader agrees with aiokafka's own on every field of records
it can read (one batch or several, compressed or not); records before the bad one are
delivered once; those after it, in its batch and the next, are delivered too; what it
cannot read raises the original error, never a silent skip."""

from __future__ import annotations

import struct

import pytest
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from streams.lenient_records import (
    LenientPartitionRecords,
    UnreadableFetch,
    _KeptRecords,
    read_batches,
)

TP = TopicPartition("t", 0)
GZIP = 1


def batch(base_offset: int, values: list[bytes], compression: int = 0,
          bad_header: bool = False) -> bytes:
    """A record batch v2 as a producer writes it, at ``base_offset``; ``bad_header``:
    the first record's header key "HKEY" made invalid UTF-8 (CRC fixed, so only the
    header key is wrong)."""
    builder = _DefaultRecordBatchBuilderPy(magic=2, compression_type=compression,
                                           is_transactional=0, producer_id=-1,
                                           producer_epoch=-1, base_sequence=-1,
                                           batch_size=1 << 20)
    for i, value in enumerate(values):
        headers = [("HKEY" if i == 0 else "trace", b"h%d" % i), ("ok", None)]
        builder.append(i, timestamp=1_000 + i, key=b"conv_%d" % i, value=value,
                       headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if bad_header:
        assert compression == 0
        at = data.index(b"HKEY")
        data[at:at + 4] = b"\xff\xfe\xfd\xfc"
        struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def read(cls, raw: bytes, fetch_offset: int) -> list:
    return list(cls(TP, _KeptRecords(raw), [], fetch_offset, None, None, True, 0))


def fields(records) -> list[tuple]:
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers)
            for r in records]


@pytest.mark.parametrize("compression", [0, GZIP])
def test_records_read_leniently_equal_aiokafkas(compression):
    raw = batch(10, [b"a", b"b"], compression) + batch(12, [b"c"], compression)
    strict = read(PartitionRecords, raw, 10)
    lenient = [(offset, ts, ts_type, key, value, tuple(headers))
               for _next, offset, ts, ts_type, key, value, headers, _dropped
               in read_batches(raw) if offset is not None]
    assert fields(strict) == lenient and len(lenient) == 3


def test_a_bad_header_key_is_fatal_to_aiokafkas_own_reader():
    raw = batch(10, [b"a"]) + batch(11, [b"b", b"c"], bad_header=True)
    with pytest.raises(UnicodeDecodeError):
        read(PartitionRecords, raw, 10)


def test_every_record_around_a_bad_header_key_is_delivered_once():
    raw = batch(10, [b"a"]) + batch(11, [b"b", b"c"], bad_header=True) + batch(13, [b"d"])
    got = read(LenientPartitionRecords, raw, 10)
    assert [(r.offset, r.value) for r in got] == [(10, b"a"), (11, b"b"), (12, b"c"),
                                                   (13, b"d")]
    bad = got[1]
    assert bad.key == b"conv_0" and bad.headers == (("ok", None),)  # the bad one dropped
    assert got[2].headers == (("trace", b"h1"), ("ok", None))


def test_the_fetch_position_moves_past_what_was_delivered():
    raw = batch(11, [b"b", b"c"], bad_header=True)
    records = LenientPartitionRecords(TP, _KeptRecords(raw), [], 11, None, None, True, 0)
    assert [r.offset for r in records] == [11, 12]
    assert records.next_fetch_offset == 13


def test_a_fetch_started_inside_a_batch_delivers_from_its_offset():
    raw = batch(11, [b"b", b"c", b"d"], bad_header=True)
    assert [r.offset for r in read(LenientPartitionRecords, raw, 12)] == [12, 13]


def test_what_the_lenient_reader_cannot_read_raises_the_original_error():
    raw = bytearray(batch(11, [b"b"], bad_header=True))
    struct.pack_into(">i", raw, 57, 2)  # claims two records: the second is not there
    struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    with pytest.raises(UnicodeDecodeError) as caught:
        read(LenientPartitionRecords, bytes(raw), 11)
    assert isinstance(caught.value.__cause__, UnreadableFetch)


def test_a_fetch_read_committed_is_not_read_leniently():
    raw = batch(11, [b"b"], bad_header=True)
    with pytest.raises(UnicodeDecodeError):
        list(LenientPartitionRecords(TP, _KeptRecords(raw), [], 11, None, None, True, 1))


def test_a_partial_last_batch_is_left_for_the_next_fetch():
    """The last batch of a fetch may be cut short (the broker fills the fetch size): the
    lenient reader delivers the whole batches before it and leaves it to be fetched
    again, as aiokafka's own reader does. A mutation review, session 43."""
    raw = batch(10, [b"a", b"b"], bad_header=True) + batch(12, [b"c"])[:-1]
    got = read(LenientPartitionRecords, raw, 10)
    assert [(r.offset, r.value) for r in got] == [(10, b"a"), (11, b"b")]


def test_an_empty_value_is_read_as_empty_not_as_none():
    """Zero bytes and null are two values on the wire (length 0 and -1): an empty
    record value stays ``b""`` (a tombstone is ``None``). A mutation review, session 43."""
    raw = batch(10, [b"a", b""], bad_header=True)
    got = read(LenientPartitionRecords, raw, 10)
    assert [r.value for r in got] == [b"a", b""]
    assert [r.value for r in read(PartitionRecords, batch(10, [b"a", b""]), 10)] == [b"a", b""]
