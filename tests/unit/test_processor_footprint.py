"""Memory stays flat with the number of conversations (nothing kept per conversation).

The processor core and its lanes are driven in-process with a store and a ledger that
remember nothing (Cassandra is the source of truth in production): RSS after 100k
distinct conversations must stay within 2x of RSS after 1k. The processor's own tail
cache is real here, so its bound (``streams/tail_cache.py``) is part of what is measured.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import uuid
from pathlib import Path

import pytest

from ratchet.domain.history import CheckpointRecord
from ratchet.domain.plan import Promoted
from ratchet.samples import NOW_MS, make_turn
from schemas.models import Certification
from services.ledger.memory import MemoryLedger
from streams.lanes import PartitionLanes
from streams.processor import PromotionProcessor
from streams.records import RawRecord
from streams.topics import Topics
from tests.unit.test_processor_rules import PickleCodec

pytestmark = pytest.mark.slow


class ForgetfulStore:
    """Promotes everything at seq 1 and keeps nothing."""

    def get_checkpoint(self, tenant_id, response_id):
        return None

    def read_history(self, *args, **kwargs):
        raise AssertionError("first turns read no history")

    def start_claiming(self, claim):
        return lambda: claim

    def promote(self, request, **hints):
        from datetime import UTC, datetime
        return Promoted(CheckpointRecord(
            tenant_id=request.tenant_id, partition_key=request.partition_key,
            response_id=request.response_id, seq=1, mode=request.mode,
            parent_response_id=None, previous_response_id=None,
            idempotency_key=request.idempotency_key, request_digest=request.request_digest,
            certification=Certification.CERTIFIED, fingerprint_hash=None,
            token_artifact=None, router_receipt=None, boundary_proof=None,
            first_item_seq=1, last_item_seq=len(request.items), items_digest="x",
            promoted_at=datetime.now(UTC)))


class ForgetfulLedger(MemoryLedger):
    def record_response_owner(self, *args) -> None:
        pass

    def record_conversation_owner(self, *args) -> None:
        pass


def rss_mb() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_rss_after_100k_conversations_is_at_most_twice_rss_after_1k():
    topics = Topics.with_prefix("mem.")
    processor = PromotionProcessor(ForgetfulStore(), ForgetfulLedger(), PickleCodec(), topics,
                                   clock_ms=lambda: NOW_MS)
    template = make_turn()

    async def drive(count: int, offset: int) -> None:
        async def handle(record, lane):
            handled = processor.handle(record)
            assert handled.kind == "promoted", handled

        lanes = PartitionLanes(handle)
        for n in range(count):
            conv = f"conv_{uuid.uuid4().hex}"
            turn = template.model_copy(update={
                "conversation_id": conv, "response_id": f"resp_{uuid.uuid4().hex}",
                "idempotency_key": f"idem_{uuid.uuid4().hex}",
                "event_id": str(uuid.uuid4())})
            record = RawRecord(topics.gateway_events, n % 12, offset + n, conv.encode(),
                               pickle.dumps(turn))
            await lanes.submit(n % 12, record, lambda: None)
        await lanes.wait_idle()
        await lanes.stop()

    asyncio.run(drive(1000, 0))
    after_1k = rss_mb()
    asyncio.run(drive(99_000, 1000))
    after_100k = rss_mb()
    print(f"RSS after 1k conversations {after_1k:.1f} MB, after 100k {after_100k:.1f} MB")
    assert after_100k <= 2 * after_1k
