"""The one size limit of the protocol (CONTRACT section 4, docs/gateway-protocol.md).

``MAX_EVENT_BYTES`` bounds one gateway event value (5-byte Confluent header + Avro
body): the gateway library refuses a larger one before producing, and the processor
rejects one that arrives anyway ``UNSUPPORTED_FORMAT``. Everything below it travels end
to end: the store's own guard (``DEFAULT_MAX_TURN_BYTES`` of
``services/store/request_checks.py``, 15 MiB of ``turn_size``) is above what any event
within it can carry, many small items included.

The Kafka settings leave room ABOVE it on purpose: the gateway-events topic accepts
records up to ``TOPIC_MAX_MESSAGE_BYTES``, so a too-large record from a gateway that
does not check reaches the processor and gets a typed rejection instead of a broker
error the gateway may not surface. A dead letter carries a whole original record
(its key as the dead letter's Kafka key AND in its value, beside the original value)
plus the error text: up to twice a gateway record (a record of a 4 MiB key and an 11
MiB value makes a 19.9 MiB dead letter), so its topic takes twice the gateway topic's
limit and one MiB more. A dead letter that could not be published would stall its
partition for good (the publish is retried), so its bound is what any record of the
gateway topic makes. Producers and consumers are set to ``CLIENT_MAX_BYTES`` (above
every topic's limit; the topics enforce).

Cassandra: a promoted turn is ONE mutation of about its stored size, which must stay
under half of ``commitlog_segment_size`` (32 MiB -> 16 MiB; infra/servers/cassandra.py).
"""

from __future__ import annotations

MIB = 1024 * 1024
MAX_EVENT_BYTES = 10 * MIB  # 10,485,760: the documented maximum gateway event value
# The most array items and map entries one gateway event body may hold, in all (items,
# subturns, effect ids, digests, and those of fields ratchet does not read). Decoding
# builds objects per item: ~1.4 KB for a 7-byte item, so 4 MiB of tiny items took 877
# MB (the worker's limit is 768 MiB); at this bound ~250 MB at most. No valid turn of 8
# MiB of items is near it: an item takes 66 bytes or more (its 64-hex content digest).
MAX_EVENT_ELEMENTS = 131_072
# The most arrays and objects one item's content may hold, and the items' contents of
# one event in all. Parsing builds one Python object per container: content of 20 000
# arrays nested 199 deep (7.6 MiB, 4 M containers) cost the worker 2.6 s and +320 MB
# (13 s and +685 MB when not canonical), in parser calls that hold the GIL for seconds.
# Above either: UNSUPPORTED_FORMAT. An ordinary message item holds 4 (the item, its
# content list, a part, the part's annotations): 8 per item at the item bound.
MAX_ITEM_CONTAINERS = 131_072
MAX_EVENT_CONTAINERS = 1_048_576
TOPIC_MAX_MESSAGE_BYTES = 16 * MIB  # gateway-events (and the outcome topics)
DEAD_LETTER_MAX_MESSAGE_BYTES = 2 * TOPIC_MAX_MESSAGE_BYTES + MIB
CLIENT_MAX_BYTES = DEAD_LETTER_MAX_MESSAGE_BYTES + MIB

