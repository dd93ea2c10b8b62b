"""A gateway-events record whose Kafka header key is not UTF-8 (Kafka types it a String;
the broker does not check) is handled like any other record: here its value is not
Avro, so it becomes a dead letter with its bytes, and the next turn of its partition is
promoted. aiokafka decoded header keys strictly while unpacking a fetch, so the worker
stopped (its thread consumer) or hung without consuming (its loop consumer), and a
restart read the record again (CONTRACT 4: "Undecodable record -> dead-letters;
processing continues. Never crash"). Real Kafka, Cassandra and registry; both
consumers. (Found by an outside review of the worker's stream layer, 2026-12-04.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from ratchet.samples import make_turn
from schemas.models import DeadLetterReason
from streams.testing import Rig, isolated_settings

pytestmark = pytest.mark.integration

# aiokafka's pure-Python producer writes a header key with the key's own ``encode``: a
# str whose encode gives bytes that are not UTF-8 (no client writes one on purpose).
PRODUCE_BAD_HEADER = """
import asyncio, sys
from aiokafka import AIOKafkaProducer

class NotUtf8(str):
    def encode(self, *args, **kwargs):
        return b"\\xff\\xfe-key"

async def main(bootstrap, topic, key):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=b"\\x07not avro", key=key.encode(),
                                     headers=[(NotUtf8("x"), b"v"), ("ok", None)])
    finally:
        await producer.stop()

asyncio.run(main(*sys.argv[1:4]))
"""


def _turn(conv: str, head: int):
    return make_turn(conversation_id=conv, expected_head_seq=head,
                     response_id=f"resp_{uuid.uuid4().hex[:12]}",
                     idempotency_key=f"idem_{uuid.uuid4().hex[:12]}",
                     now_ms=int(time.time() * 1000))


@pytest.mark.parametrize("consumer", ["loop", "thread"])
def test_a_record_with_a_header_key_that_is_not_utf8_is_dead_lettered_and_the_partition_goes_on(
        settings, tmp_path, consumer):
    rig = Rig(isolated_settings(settings, "hdr", partitions=1, home=tmp_path / "home"))
    worker = rig.worker(tmp_path, env={"RATCHET_WORKER_CONSUMER": consumer})
    try:
        conv = f"conv_{uuid.uuid4().hex[:10]}"
        first = _turn(conv, 0)
        rig.send(first)
        assert rig.collector.outcome(first.response_id, timeout_s=90).seq == 1
        produced = subprocess.run(
            [sys.executable, "-c", PRODUCE_BAD_HEADER, settings.kafka_bootstrap,
             rig.topics.gateway_events, conv],
            env=dict(os.environ, AIOKAFKA_NO_EXTENSIONS="1"), capture_output=True, text=True,
            timeout=60)
        assert produced.returncode == 0, produced.stderr[-2000:]
        after = _turn(conv, 1)
        rig.send(after)
        assert rig.collector.outcome(after.response_id, timeout_s=60).seq == 2
        assert worker.alive(), worker.log_tail(2000)
        [seen] = rig.collector.dead_letters
        letter = seen.model
        assert letter.reason is DeadLetterReason.BAD_MAGIC_BYTE
        assert (letter.key, letter.value) == (conv.encode(), b"\x07not avro")
    finally:
        worker.terminate()
        rig.close()
