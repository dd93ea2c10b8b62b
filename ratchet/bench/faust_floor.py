"""Floor 0 of ``ratchet bench processor``: the Faust app alone, no storage, no rules.

One agent over a 12-partition topic that publishes one small outcome per record, waits
for the broker's ack (``acks=all``) and acks the record: what faust-streaming and
aiokafka cost per record before ratchet does anything. Run as a worker by the bench
(``python -m ratchet.bench.faust_floor``) with ``RATCHET_FLOOR_SOURCE``,
``RATCHET_FLOOR_SINK``, ``RATCHET_FLOOR_PARTITIONS`` and ``RATCHET_FLOOR_DATADIR`` set;
not a part of ratchet.
"""

from __future__ import annotations

import os

import faust

SOURCE = os.environ.get("RATCHET_FLOOR_SOURCE", "floor-0-in")
SINK = os.environ.get("RATCHET_FLOOR_SINK", "floor-0-out")
PARTITIONS = int(os.environ.get("RATCHET_FLOOR_PARTITIONS", "12"))

# The worker's settings where they change the per-record cost (streams/app.py).
app = faust.App(
    f"bench-{SOURCE}",
    broker=f"kafka://{os.environ.get('RATCHET_KAFKA_BOOTSTRAP', '127.0.0.1:9092')}",
    key_serializer="raw",
    value_serializer="raw",
    web_enabled=False,
    store="memory://",
    datadir=os.environ.get("RATCHET_FLOOR_DATADIR", "faust-floor-data"),
    topic_partitions=PARTITIONS,
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=1.0,
    producer_acks=-1,
    stream_wait_empty=False,
)
source = app.topic(SOURCE, key_type=bytes, value_type=bytes, partitions=PARTITIONS)


@app.agent(source, concurrency=1)
async def publish_and_ack(stream: faust.Stream) -> None:
    async for event in stream.noack().events():
        sent = await app.producer.send(SINK, event.message.key, b"outcome", None, None, None)
        await sent
        event.ack()


if __name__ == "__main__":
    # Started like ``ratchet worker`` (streams/worker.py): without the terminal spinner,
    # for which Faust would set the root logger to DEBUG, so that every debug call of
    # aiokafka built a LogRecord (a floor that paid this cost ratchet does not).
    worker = faust.Worker(app, loglevel="warn", quiet=True)
    worker.spinner = None
    worker.execute_from_commandline()
