"""Damage to one of the two histories that share a partition key fails that one only.

A tenant's Conversation ``X`` and its chain whose first response is ``X`` live in one
store partition (docs/store.md, "Two histories in one partition"). Cassandra reads a
Conversation's whole partition, chain rows included, and a chain response's whole
partition, Conversation rows included: a row of one history that is damaged, or cannot
even be decoded, is in every read of the other. It fails the history it belongs to
(``CORRUPT_HISTORY``, a ``CORRUPT`` rejection of a turn extending it) and nothing else:
the other history reads, answers ``/status``, promotes its next turn (a warm worker, a
cold one) and is served by the API (cold and cached, both HTTP paths) as before.

Both backends with damage the memory store can hold (an item's content rewritten: its
digest no longer matches); Cassandra also with rows that cannot be decoded (an unknown
``mode``, an ``items`` cell that is not one). Session 46 left this tested in the API on
memory only (docs/decisions.md, "A Conversation id equal to a chain's first response
id"); no defect was found (docs/decisions.md, "Two histories in one partition under
damage") but one: the Conversation's first turn whose ``mode`` reads ``chain`` was a
verified one-turn chain, fixed in session 47 (both backends; "A damaged ``mode`` cell").
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from ratchet.domain.history import HistoryFailure, PromotionMode, VerifiedHistory
from schemas.models import CheckpointPromoted, RejectionReason
from services.api.app import create_app
from services.api.cache import HistoryCache
from services.api.fastpath import HistoryFastPath
from services.api.service import RehydrationService
from services.api.status_reader import StatusReader
from services.api.waiters import PromotionWaiters
from services.store.base import CorruptPartition
from services.store.memory import MemoryCheckpointStore
from services.store.rows import decode_turn_items, encode_turn_items
from tests.contract.test_conversation_and_chain_share_a_key import (
    NOW,
    Shared,
    assert_history,
    items_of,
)
from tests.contract.test_processor_handover import ENTRIES

R = RejectionReason
ROW = "WHERE tenant_id = %s AND partition_key = %s AND kind = 'checkpoint' AND ref = %s"
CONTENT = 5  # an item record's content (``ITEM_RECORD_FIELDS``)
NO_CACHE = {"Cache-Control": "no-cache"}


def damage(s: Shared, response_id: str, how: str) -> None:
    """Damage ``response_id``'s stored turn, as ``tests/integration/test_store_corruption``
    does: ``content`` (its first item's content changed: decodes, fails its digest),
    ``row`` (``mode`` unknown: the row cannot be decoded), ``items_cell`` (not an items
    cell: the turn cannot be decoded), ``mode_chain`` (a Conversation turn's ``mode``
    rewritten to ``chain``)."""
    store = s.data.store()
    if how == "mode_chain":  # decodes, and reads as a chain row (session 47)
        if isinstance(store, MemoryCheckpointStore):
            checkpoints = store._partitions[(s.tenant, s.key)].checkpoints
            checkpoints[response_id] = replace(checkpoints[response_id],
                                               mode=PromotionMode.CHAIN)
        else:
            store._session.execute(f"UPDATE turns SET mode = 'chain' {ROW}",
                                   (s.tenant, s.key, response_id), timeout=30)
        return
    if isinstance(store, MemoryCheckpointStore):
        assert how == "content"  # the memory store holds records: nothing undecodable
        partition = store._partitions[(s.tenant, s.key)]
        stored = partition.items[response_id]
        partition.items[response_id] = replace(
            stored, contents=(b'{"x":1}', *stored.contents[1:]))
        return
    session, key = store._session, (s.tenant, s.key, response_id)
    if how == "content":
        row = session.execute(f"SELECT items FROM turns {ROW}", key, timeout=30).one()
        items = [list(record) for record in decode_turn_items(row.items)]
        flipped = bytearray(items[0][CONTENT])
        flipped[3] ^= 0x20
        items[0][CONTENT] = bytes(flipped)
        cell = encode_turn_items(items)
        session.execute(f"UPDATE turns SET items = %s {ROW}", (cell, *key), timeout=30)
    elif how == "row":
        session.execute(f"UPDATE turns SET mode = 'sideways' {ROW}", key, timeout=30)
    else:
        assert how == "items_cell"
        session.execute(f"UPDATE turns SET items = %s {ROW}", (b"\x09junk", *key), timeout=30)


def read(s: Shared, **which) -> VerifiedHistory | HistoryFailure:
    """A cold store's read, blocking and awaited (the API's) alike."""
    store = s.data.store()
    found = store.read_history(s.tenant, now=NOW, **which)
    assert asyncio.run(store.read_history_async(s.tenant, now=NOW, **which)) == found
    return found


def assert_corrupt(found) -> None:
    assert isinstance(found, HistoryFailure), found
    assert found.reason.value == "CORRUPT_HISTORY", found


def api_clients(s: Shared) -> list[TestClient]:
    """The API over the shared store (one cache each), as ``ratchet api`` serves it and
    FastAPI alone."""
    service = RehydrationService(s.data.store(), s.data.ledger(), PromotionWaiters(),
                                 clock=lambda: NOW, cache=HistoryCache(1 << 20))
    app = create_app(service, lambda: True)
    return [TestClient(HistoryFastPath(app, service), raise_server_exceptions=False),
            TestClient(app, raise_server_exceptions=False)]


def get(client: TestClient, s: Shared, path: str, **headers):
    return client.get(path, params={"tenant_id": s.tenant, "fingerprint_hash": "f" * 64},
                      headers=headers)


class Partition:
    """The shared partition: the chain ``c1`` (= the key) <- ``c2`` and the Conversation
    ``v1`` <- ``v2``, interleaved, promoted by one worker that stays warm."""

    def __init__(self, data, entry: str) -> None:
        self.s = s = Shared(data, entry, fresh=False)
        self.warm = s.worker()
        self.c1 = s.chain(None)
        self.v1 = s.conversation(0)
        self.v2 = s.conversation(1)
        self.c2 = s.chain(self.c1.response_id)
        for event, seq in ((self.c1, 1), (self.v1, 1), (self.v2, 2), (self.c2, 2)):
            s.promoted(event, seq)
        self.lineages = {"c1": (self.c1,), "c2": (self.c1, self.c2),
                         "v1": (self.v1,), "v2": (self.v1, self.v2)}

    def event(self, name: str):
        return getattr(self, name)

    def cold(self, event):
        return self.s.data.worker(self.s.entry).outcome(event)


# Which turn is damaged, and which responses' histories hold it (the rest must stand).
TARGETS = {
    "chain_child": ("c2", {"c2"}),
    "chain_root": ("c1", {"c1", "c2"}),
    "conversation_first_turn": ("v1", {"v1", "v2", "conversation"}),
}


def check(p: Partition, target: str, how: str, clients: list[TestClient]) -> None:
    s = p.s
    damaged_rid, failing = TARGETS[target]
    chain_damaged = damaged_rid.startswith("c")
    # Reads: the damaged history's responses that hold the turn are CORRUPT_HISTORY,
    # every other response (either history) verifies with its own items.
    for name, lineage in p.lineages.items():
        found = read(s, response_id=p.event(name).response_id)
        if name in failing:
            assert_corrupt(found)
        else:
            assert_history(found, lineage[-1], lineage, 1 if name == "c1" else 2)
    conversation = read(s, conversation_id=s.key)
    if "conversation" in failing:
        assert_corrupt(conversation)
    else:
        assert_history(conversation, p.v2, (p.v1, p.v2), 2)

    # ``/status``: an undecodable row is the status endpoint's CorruptPartition (500
    # CORRUPT_HISTORY); a turn whose item is damaged stands promoted (the status reads
    # the checkpoint row, not the items); the other history's responses are promoted.
    status = StatusReader(s.data.store(), s.data.ledger())
    for name in p.lineages:
        rid = p.event(name).response_id
        if name == damaged_rid and how == "row":
            with pytest.raises(CorruptPartition):
                status.status(s.tenant, rid)
            continue
        body = status.status(s.tenant, rid)
        assert (body.state, body.seq) == ("promoted", len(p.lineages[name])), (name, body)

    # The API, cold then cached (primed before the damage): the other history as before,
    # the damaged response 500 CORRUPT_HISTORY when read anew.
    for client in clients:
        broken = get(client, s, f"/v1/responses/{p.event(damaged_rid).response_id}/history",
                     **NO_CACHE)
        assert (broken.status_code, broken.json()["reason"]) == (500, "CORRUPT_HISTORY")
        for headers in (NO_CACHE, {}):
            for name, lineage in p.lineages.items():
                if name in failing or name.startswith("c") == chain_damaged:
                    continue
                resp = get(client, s, f"/v1/responses/{p.event(name).response_id}/history",
                           **headers)
                assert resp.status_code == 200, (name, resp.text)
                assert [i["item_id"] for i in resp.json()["items"]] == items_of(*lineage)
            if chain_damaged:
                resp = get(client, s, f"/v1/conversations/{s.key}/history", **headers)
                assert resp.status_code == 200, resp.text
                assert resp.json()["response_id"] == p.v2.response_id

    # The worker: a turn extending the damaged lineage is CORRUPT (a cold worker reads
    # it); the other history's next turns are promoted, by the warm worker and a cold one.
    if chain_damaged:
        assert p.cold(s.chain(p.event(damaged_rid).response_id)).reason is R.CORRUPT
        first, second = s.conversation(2), s.conversation(3)
    else:
        assert p.cold(s.conversation(2)).reason is R.CORRUPT
        first = s.chain(p.c2.response_id)
        second = s.chain(first.response_id)
    for outcome, event, seq in ((p.warm.outcome(first), first, 3),
                                (p.cold(second), second, 4)):
        assert isinstance(outcome, CheckpointPromoted), outcome
        assert (outcome.response_id, outcome.seq) == (event.response_id, seq)
    if target == "chain_child":  # the chain's other fork does not hold the damaged turn
        fork = s.chain(p.c1.response_id)
        assert p.cold(fork).seq == 2


def prime(p: Partition, clients: list[TestClient]) -> None:
    """Every history read through the API once: cached before the damage."""
    for client in clients:
        for name in p.lineages:
            path = f"/v1/responses/{p.event(name).response_id}/history"
            assert get(client, p.s, path).status_code == 200
        assert get(client, p.s, f"/v1/conversations/{p.s.key}/history").status_code == 200


@ENTRIES
@pytest.mark.parametrize("target", list(TARGETS))
def test_a_damaged_item_fails_its_own_history_only(data, entry, target):
    p = Partition(data, entry)
    clients = api_clients(p.s)
    prime(p, clients)
    damage(p.s, p.event(TARGETS[target][0]).response_id, "content")
    check(p, target, "content", clients)


@pytest.mark.parametrize("data", ["cassandra"], indirect=True)
@ENTRIES
@pytest.mark.parametrize("how", ["row", "items_cell"])
@pytest.mark.parametrize("target", list(TARGETS))
def test_an_undecodable_row_fails_its_own_history_only(data, entry, how, target):
    p = Partition(data, entry)
    clients = api_clients(p.s)
    prime(p, clients)
    damage(p.s, p.event(TARGETS[target][0]).response_id, how)
    check(p, target, how, clients)


@ENTRIES
def test_a_conversation_first_turn_whose_mode_reads_chain_fails_its_own_history_only(
        data, entry):
    """The Conversation's first turn with its ``mode`` cell rewritten to ``chain``: its
    response, the Conversation and its later turns are ``CORRUPT_HISTORY`` (its response
    read as a verified one-turn chain before session 47: docs/decisions.md, "A damaged
    ``mode`` cell"), a chain turn naming it as its parent is ``CORRUPT``, and the chain
    sharing the key stands, on both backends."""
    p = Partition(data, entry)
    clients = api_clients(p.s)
    prime(p, clients)
    damage(p.s, p.v1.response_id, "mode_chain")
    check(p, "conversation_first_turn", "mode_chain", clients)
    # Nor is anything built on it: a chain turn naming it as its parent (in the shared
    # partition, where its row now reads as a chain root) was promoted before session 47.
    for worker in (p.warm.outcome, p.cold):
        child = p.s.chain(p.v1.response_id)
        outcome = worker(child)
        assert getattr(outcome, "reason", None) is R.CORRUPT, outcome
        assert p.s.data.store().get_checkpoint(p.s.tenant, child.response_id) is None
