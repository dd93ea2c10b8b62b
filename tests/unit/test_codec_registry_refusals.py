"""A registry that refuses a schema lookup for a reason that says nothing about the
record (408 timeout, 429 throttling, 401/403 credentials) makes the record wait and be
retried, never a dead letter: the record may be fine (docs/processor.md: "A registry
that does not answer is retried, never a dead letter"). Only 404 (no such schema id)
dead-letters it, as UNKNOWN_SCHEMA_ID. Before, anything below 500 but 404 went to the
catch-all and the valid turn was dead-lettered UNKNOWN, never decided. (Found by an
outside review of the worker's stream layer, 2026-12-04.)
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from schemas.avro import EventSerde
from schemas.errors import Unavailable
from services.ledger.memory import MemoryLedger
from services.store.base import StoreOptions
from services.store.memory import MemoryCheckpointStore
from streams.codec import RegistryCodec
from streams.processor import PromotionProcessor
from streams.records import RawRecord
from tests.unit.test_processor_rules import TOPICS


@pytest.mark.parametrize("status", [429, 408, 401, 403])
def test_a_registry_refusing_a_lookup_is_retried_not_a_dead_letter(status):
    class Busy(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b'{"error_code": %d, "message": "slow down"}' % status
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = SchemaRegistryClient({"url": f"http://127.0.0.1:{server.server_port}",
                                       "max.retries": 1, "retries.wait.ms": 10,
                                       "retries.max.wait.ms": 20})
        codec = RegistryCodec(EventSerde(client))
        processor = PromotionProcessor(MemoryCheckpointStore(StoreOptions()), MemoryLedger(),
                                       codec, TOPICS)
        # A Confluent-framed record with a schema id this worker has not cached yet
        # (any body: the lookup comes first).
        value = b"\x00" + (4242).to_bytes(4, "big") + b"\x02\x04ab"
        record = RawRecord(TOPICS.gateway_events, 0, 7, b"conv_1", value)
        try:
            handled = processor.handle(record)
        except Unavailable:
            return  # retried by the lane: what the docs promise
        letter = handled.outbound[0].model
        pytest.fail(f"registry answered {status}: the record was {handled.kind} "
                    f"({letter.reason}: {letter.error[:120]})")
    finally:
        server.shutdown()
