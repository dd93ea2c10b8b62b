"""Rows damaged in storage give their typed failure whenever the API LOADS them.

CONTRACT section 5: rehydration verifies seq continuity, lineage and every item digest
of every row it loads, and never answers a shortened, reordered or partly decoded
history. Pinned here for both loads the API makes, against both store backends (the
same ``RehydrationService`` over memory and Cassandra rows):

- the cold read: a ``Cache-Control: no-cache`` lookup (``use_cache=False``) of a
  response and of a Conversation, which reads and verifies the whole partition;
- the incremental extension: a verified, linked prefix is cached and the lookup reads
  only the rows after it (``verify_extension``), by the response endpoint (with the
  ``partition_key`` hint, on the event loop) and by the Conversation endpoint.

Each damage is written straight into the stored turn row, as a faulty disk or a
hand-edited row would be; the answer must be the reason and the HTTP status the
contract names, whichever load meets it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from ratchet.domain.history import TurnItems, VerifiedHistory
from ratchet.domain.plan import Promoted
from schemas.canonical import canonical_json_text as canonical_json
from schemas.models import Item, sha256_hex
from services.api.cache import HistoryCache
from services.api.service import Answer, RehydrationService
from services.api.waiters import PromotionWaiters
from services.store.base import CheckpointStore, StoreOptions
from services.store.memory import MemoryCheckpointStore
from services.store.rows import decode_turn_items, encode_turn_items
from tests.contract.store_support import FakeClock, OnCassandra, conversation_turn, uid

FP = "fp1"
# Fields of an item record (services/store/rows.py ``ITEM_RECORD_FIELDS``).
SEQ, ITEM_TYPE, ROLE, CALL_ID, CONTENT, DIGEST, FORMAT = 0, 2, 3, 4, 5, 6, 7


def _flip_content(records: list[list]) -> None:
    content = bytearray(records[0][CONTENT])
    content[2] ^= 0x01
    records[0][CONTENT] = bytes(content)


def _set(field: int, value) -> Callable[[list[list]], None]:
    def change(records: list[list]) -> None:
        records[-1][field] = value

    return change


def _renumber(records: list[list]) -> None:
    records[-1][SEQ] += 10


def _drop_last(records: list[list]) -> None:
    records.pop()


OTHER_DIGEST = hashlib.sha256(b'{"text":"something else"}').hexdigest()

# name -> (change to the turn's item records, reason). The type, role, call_id and
# format columns are covered by no digest. A format this build cannot read, or a type
# outside its catalogue, answers its own reason (checked first, as at promotion); a
# type, role or call_id that is not what the item's content says is CORRUPT_HISTORY
# (the items here are user messages: content type "message", role "user", no call_id).
ITEM_DAMAGE = {
    "content": (_flip_content, "CORRUPT_HISTORY"),
    "content_digest": (_set(DIGEST, OTHER_DIGEST), "CORRUPT_HISTORY"),
    "item_seq": (_renumber, "CORRUPT_HISTORY"),
    "missing_item": (_drop_last, "MISSING_HISTORY"),
    "unknown_type": (_set(ITEM_TYPE, "hologram"), "UNKNOWN_ITEM_TYPE"),
    "format_version": (_set(FORMAT, 99), "UNSUPPORTED_FORMAT"),
    "type": (_set(ITEM_TYPE, "reasoning"), "CORRUPT_HISTORY"),  # another KNOWN type
    "role": (_set(ROLE, "system"), "CORRUPT_HISTORY"),
    "role_null": (_set(ROLE, None), "CORRUPT_HISTORY"),
    "call_id": (_set(CALL_ID, "call_x"), "CORRUPT_HISTORY"),
}


def _call_items(call_id: str) -> tuple[Item, Item]:
    """A function call and its output, as a gateway stores them (the record's type,
    role and call_id are its content's)."""
    call_item, output_item = uid("fc"), uid("fco")
    call = {"type": "function_call", "id": call_item, "call_id": call_id, "name": "f",
            "arguments": "{}"}
    output = {"type": "function_call_output", "id": output_item, "call_id": call_id,
              "output": "ok"}
    return tuple(  # type: ignore[return-value]
        Item(item_id=body["id"], type=body["type"], role=None, call_id=call_id,
             content=(raw := canonical_json(body).encode()), content_digest=sha256_hex(raw))
        for body in (call, output)
    )


class LoadContract:
    """The damage is written by the backend's ``rewrite_items`` / ``rewrite_lineage``."""

    def make_store(self, options: StoreOptions) -> CheckpointStore:
        raise NotImplementedError

    def rewrite_items(self, store, tenant, conv, rid, change) -> None:
        raise NotImplementedError

    def rewrite_lineage(self, store, tenant, conv, rid, digest: str) -> None:
        """The turn's lineage digest, and the head's when the head names the turn (a
        digest the batch carried: the head cells agree with their row)."""
        raise NotImplementedError

    @pytest.fixture
    def stack(self):
        store = self.make_store(StoreOptions(clock=FakeClock()))
        cache = HistoryCache(1 << 20)
        service = RehydrationService(
            store, None, PromotionWaiters(), clock=FakeClock(), cache=cache
        )
        tenant, conv = uid("tenant"), uid("conv")
        turns = [conversation_turn(tenant, conv, i, n_items=n) for i, n in enumerate((2, 3, 2))]
        for turn in turns:
            store.promote(turn)
        return store, service, tenant, conv, [t.response_id for t in turns]

    # -- helpers ------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _loop(self):
        """One event loop per test, as in the API process (a store's ``loop_session``
        serves the loop it connected on)."""
        with asyncio.Runner() as self.runner:
            yield

    def answer(self, coroutine) -> tuple[int, str | None]:
        answer: Answer = self.runner.run(coroutine)
        body = json.loads(answer.payload)
        assert body["outcome"] == answer.outcome
        if answer.status_code == 200:
            assert body["outcome"] in ("certified", "fallback")
            return 200, None
        assert body["outcome"] == "failure" and "items" not in body or body["items"] is None
        return answer.status_code, body["reason"]

    def cold(self, service, tenant, conv, rid) -> list[tuple[int, str | None]]:
        """The answers of both cold reads: the response's and the Conversation's."""
        return [
            self.answer(service.response_history(tenant, rid, FP, 0, use_cache=False)),
            self.answer(service.conversation_history(tenant, conv, FP, use_cache=False)),
        ]

    def cache_prefix(self, service, tenant, conv, rid) -> None:
        """Load, verify and cache the history ending at ``rid`` (a linked prefix)."""
        assert self.answer(service.response_history(tenant, rid, FP, 0)) == (200, None)
        entry = service._cache.get(tenant, rid)
        assert entry is not None and entry.linked

    @staticmethod
    def counting_full_reads(store) -> list[str]:
        """Record every full history read from now on (an extension makes none)."""
        full: list[str] = []
        for name in ("read_history", "read_history_async"):
            method = getattr(store, name)

            def counted(*args, _method=method, _name=name, **kwargs):
                full.append(_name)
                return _method(*args, **kwargs)

            setattr(store, name, counted)
        return full

    # -- the intact history answers on every path ----------------------------------------

    def test_intact_rows_answer_on_every_load(self, stack):
        store, service, tenant, conv, (first, _, last) = stack
        assert self.cold(service, tenant, conv, last) == [(200, None)] * 2
        self.cache_prefix(service, tenant, conv, first)
        full = self.counting_full_reads(store)
        answer = service.response_history(tenant, last, FP, 0, partition_key=conv)
        assert self.answer(answer) == (200, None)
        assert full == []  # only the rows after the cached prefix were read

    # -- cold reads -----------------------------------------------------------------------

    @pytest.mark.parametrize("damage", sorted(ITEM_DAMAGE))
    def test_a_cold_read_refuses_a_damaged_item(self, stack, damage):
        store, service, tenant, conv, (_, middle, last) = stack
        change, reason = ITEM_DAMAGE[damage]
        self.rewrite_items(store, tenant, conv, middle, change)
        assert self.cold(service, tenant, conv, last) == [(500, reason)] * 2

    def test_a_cold_read_refuses_a_wrong_lineage_digest(self, stack):
        store, service, tenant, conv, (_, middle, last) = stack
        self.rewrite_lineage(store, tenant, conv, middle, "0" * 64)
        assert self.cold(service, tenant, conv, last) == [(500, "CORRUPT_HISTORY")] * 2

    # -- incremental extension ------------------------------------------------------------

    @pytest.mark.parametrize("damage", sorted(ITEM_DAMAGE))
    def test_an_extension_refuses_a_damaged_item(self, stack, damage):
        store, service, tenant, conv, (first, middle, last) = stack
        change, reason = ITEM_DAMAGE[damage]
        self.cache_prefix(service, tenant, conv, middle)
        self.rewrite_items(store, tenant, conv, last, change)
        full = self.counting_full_reads(store)
        by_response = service.response_history(tenant, last, FP, 0, partition_key=conv)
        assert self.answer(by_response) == (500, reason)
        assert full == []  # the extension decided, from the one row it loaded
        assert self.answer(service.conversation_history(tenant, conv, FP)) == (500, reason)
        assert full == []
        # The verified prefix stands; nothing damaged was cached.
        assert self.answer(service.response_history(tenant, middle, FP, 0)) == (200, None)
        assert service._cache.get(tenant, last) is None

    def test_an_extension_refuses_a_wrong_lineage_digest(self, stack):
        store, service, tenant, conv, (first, middle, last) = stack
        self.cache_prefix(service, tenant, conv, middle)
        self.rewrite_lineage(store, tenant, conv, last, "0" * 64)
        full = self.counting_full_reads(store)
        by_response = service.response_history(tenant, last, FP, 0, partition_key=conv)
        assert self.answer(by_response) == (500, "CORRUPT_HISTORY")
        assert self.answer(service.conversation_history(tenant, conv, FP)) == (
            500,
            "CORRUPT_HISTORY",
        )
        assert full == []

    # -- a call's call_id column -----------------------------------------------------------

    @pytest.fixture
    def call_stack(self, stack):
        """``stack`` with a fourth turn holding a function call and its output."""
        store, service, tenant, conv, rids = stack
        turn = conversation_turn(tenant, conv, len(rids), items=_call_items("call_1"))
        assert isinstance(store.promote(turn), Promoted)
        return store, service, tenant, conv, [*rids, turn.response_id]

    @pytest.mark.parametrize("call_id", ["call_2", None], ids=["other", "null"])
    def test_a_call_id_column_unlike_its_content_is_corrupt_on_every_load(self, call_stack,
                                                                          call_id):
        """The processor pairs a call with its output by the call_id column: one that is not
        its content's would pair what the model never saw paired. Cold or extended, the
        history is CORRUPT_HISTORY, never served."""
        store, service, tenant, conv, (*_, before, calls) = call_stack
        assert isinstance(store.read_history(tenant, conversation_id=conv), VerifiedHistory)
        self.cache_prefix(service, tenant, conv, before)
        self.rewrite_items(store, tenant, conv, calls, _set(CALL_ID, call_id))
        full = self.counting_full_reads(store)
        by_response = service.response_history(tenant, calls, FP, 0, partition_key=conv)
        assert self.answer(by_response) == (500, "CORRUPT_HISTORY")
        assert full == []  # the extension decided
        assert self.cold(service, tenant, conv, calls) == [(500, "CORRUPT_HISTORY")] * 2
        assert store.read_history(tenant, conversation_id=conv).reason == "CORRUPT_HISTORY"

    def test_an_extension_over_several_rows_verifies_each(self, stack):
        """Two rows after the cached prefix: damage in the first of them is caught."""
        store, service, tenant, conv, (first, middle, last) = stack
        self.cache_prefix(service, tenant, conv, first)
        self.rewrite_items(store, tenant, conv, middle, _flip_content)
        full = self.counting_full_reads(store)
        by_response = service.response_history(tenant, last, FP, 0, partition_key=conv)
        assert self.answer(by_response) == (500, "CORRUPT_HISTORY")
        assert full == []


class TestMemoryLoads(LoadContract):
    def make_store(self, options: StoreOptions) -> CheckpointStore:
        return MemoryCheckpointStore(options)

    def rewrite_items(self, store, tenant, conv, rid, change) -> None:
        partition = store._partitions[(tenant, conv)]
        turn = partition.items[rid]
        columns = (turn.seqs, turn.ids, turn.types, turn.roles, turn.call_ids)
        columns += (turn.contents, turn.digests, turn.formats)
        records = [list(record) for record in zip(*columns, strict=True)]
        change(records)
        partition.items[rid] = TurnItems(*(tuple(c) for c in zip(*records, strict=True)))

    def rewrite_lineage(self, store, tenant, conv, rid, digest: str) -> None:
        partition = store._partitions[(tenant, conv)]
        partition.checkpoints[rid] = replace(partition.checkpoints[rid], lineage_digest=digest)
        if partition.head.response_id == rid:  # the head cells carry it too
            partition.head = replace(partition.head, lineage_digest=digest)


WHERE = "WHERE tenant_id = %s AND partition_key = %s AND kind = 'checkpoint' AND ref = %s"


@pytest.mark.integration
class TestCassandraLoads(OnCassandra, LoadContract):
    def rewrite_items(self, store, tenant, conv, rid, change) -> None:
        row = self.session.execute(
            f"SELECT items FROM turns {WHERE}", (tenant, conv, rid), timeout=30
        ).one()
        records = [list(record) for record in decode_turn_items(row.items)]
        change(records)
        self.session.execute(
            f"UPDATE turns SET items = %s {WHERE}",
            (encode_turn_items(records), tenant, conv, rid),
            timeout=30,
        )

    def rewrite_lineage(self, store, tenant, conv, rid, digest: str) -> None:
        self.session.execute(
            f"UPDATE turns SET lineage_digest = %s {WHERE}", (digest, tenant, conv, rid), timeout=30
        )
        head = store.head(tenant, conv)
        if head.response_id == rid:  # the head cells carry it too
            self.session.execute(
                "UPDATE turns SET head_lineage_digest = %s "
                "WHERE tenant_id = %s AND partition_key = %s", (digest, tenant, conv), timeout=30
            )

    def test_an_undecodable_items_cell_is_corrupt_on_every_load(self, stack):
        store, service, tenant, conv, (first, middle, last) = stack
        self.session.execute(
            f"UPDATE turns SET items = %s {WHERE}", (b"\x02garbage", tenant, conv, last), timeout=30
        )
        assert self.cold(service, tenant, conv, last) == [(500, "CORRUPT_HISTORY")] * 2
        self.cache_prefix(service, tenant, conv, middle)
        by_response = service.response_history(tenant, last, FP, 0, partition_key=conv)
        assert self.answer(by_response) == (500, "CORRUPT_HISTORY")
        assert self.answer(service.conversation_history(tenant, conv, FP)) == (
            500,
            "CORRUPT_HISTORY",
        )


@pytest.mark.integration
class TestCassandraLoadsThroughTheCppDriver(TestCassandraLoads):
    """The same loads with the API's reads on the event loop going through the C++ driver
    (``RATCHET_LOOP_DRIVER=acsylla``, the default)."""

    @pytest.fixture(autouse=True)
    def _loop_session(self, _loop, _session, settings):
        from services.cassandra_loop import LoopSession

        self.loop_session = LoopSession(replace(settings, keyspace=self.session.keyspace))
        yield
        self.runner.run(self.loop_session.close())

    def make_store(self, options: StoreOptions) -> CheckpointStore:
        from services.store.cassandra import CassandraCheckpointStore

        return CassandraCheckpointStore(self.session, options, timeout_s=30,
                                        loop_session=self.loop_session)
