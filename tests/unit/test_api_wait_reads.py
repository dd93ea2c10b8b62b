"""What one answered ``wait_ms`` request asks of storage, counted (session 52).

The shape a gateway makes on every continuation turn, and ``ratchet bench processor``'s
"API beside" line makes per turn: the previous turn's history was answered (so it is
cached), the gateway produces the next turn and at once asks its history with
``wait_ms`` and the response's ``partition_key``; the API's own store never promoted
anything (it has learnt no location). Counted per storage call, the whole request asks:

- before the wait: the response's claim and the ledger's status (made at once);
- after the notifier's wake-up: ONE turn row (the extension of the cached prefix);
- nothing else: no partition read, no head, no ``turn_lost`` (whose last read is a
  Paxos round at SERIAL), no second claim or status read.

3 reads per answered wait, whatever the rate: docs/decisions.md, "What a wait costs
Cassandra". A read more on this path is paid on every turn a gateway continues.
"""

from __future__ import annotations

import threading
import time

import pytest

from schemas.items import message
from tests.unit.test_api_cache import CachingStack
from tests.unit.test_api_http import uid

COUNTED_STORE = ("read_history", "read_turn", "read_head", "locate", "turn_lost")


def _counting(stack: CachingStack) -> dict[str, int]:
    """Counts of every storage call the API's reads reach (the store's async reads
    call these) and of the ledger's status."""
    reads: dict[str, int] = {}

    def count(owner: object, name: str) -> None:
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            reads[name] = reads.get(name, 0) + 1
            return real(*args, **kwargs)

        setattr(owner, name, counted)

    for name in COUNTED_STORE:
        count(stack.store, name)
    count(stack.ledger, "status")
    return reads


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "fastapi"])
def test_an_answered_wait_for_a_continuation_reads_three_rows(fast_path):
    stack = CachingStack(fast_path=fast_path)
    tenant, conv = uid("tenant"), uid("conv")
    first = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    assert stack.history(tenant, first).status_code == 200  # the gateway's previous turn
    # The API's store never promotes: it has learnt no location from the promotions.
    stack.store._hints.locations = type(stack.store._hints.locations)(1000)
    reads = _counting(stack)
    rid, first_look = uid("resp"), threading.Event()

    def worker_promotes_then_notifier_wakes() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and reads.get("locate", 0) + reads.get(
                "status", 0) < 2:
            time.sleep(0.01)
        time.sleep(0.1)  # a read too many before the wait is caught below
        first_look.set()
        stack.promote(tenant, conv, 1, (message("b", item_id=uid("m")),), response_id=rid)
        stack.store._hints.locations = type(stack.store._hints.locations)(1000)
        while not stack.waiters.notify(rid, "promoted", (tenant, conv)):
            time.sleep(0.01)

    thread = threading.Thread(target=worker_promotes_then_notifier_wakes)
    thread.start()
    answer = stack.history(tenant, rid, wait_ms=5000, partition_key=conv)
    thread.join()
    assert first_look.is_set()
    assert answer.status_code == 200 and answer.json()["outcome"] == "certified"
    assert answer.json()["head_seq"] == 2
    assert reads == {"locate": 1, "status": 1, "read_turn": 1}


@pytest.mark.parametrize("hinted", [True, False], ids=["partition-key", "no-hint"])
@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "fastapi"])
def test_a_wait_whose_first_look_finds_the_turn_promoted_reads_three_rows(fast_path, hinted):
    """The worker ahead of the gateway: the turn is promoted before the request comes.
    The first look reads the claim and the status at once, then the turn row where the
    claim says, and finds it: the lookup extends the cached prefix by THAT row instead
    of reading it again (4 reads before session 52's change; 5 without the hint, whose
    lookup read the claim again too)."""
    from services.api import metrics

    stack = CachingStack(fast_path=fast_path)
    tenant, conv = uid("tenant"), uid("conv")
    first = stack.promote(tenant, conv, 0, (message("a", item_id=uid("m")),))
    assert stack.history(tenant, first).status_code == 200  # the gateway's previous turn
    rid = stack.promote(tenant, conv, 1, (message("b", item_id=uid("m")),))
    # The API's store never promotes: it has learnt no location from the promotions.
    stack.store._hints.locations = type(stack.store._hints.locations)(1000)
    found = metrics.WAIT_FIRST_LOOKS.labels("found")._value.get()
    reads = _counting(stack)
    params = {"partition_key": conv} if hinted else {}
    started = time.monotonic()
    answer = stack.history(tenant, rid, wait_ms=5000, **params)
    assert time.monotonic() - started < 2  # answered at once, not at the deadline
    assert metrics.WAIT_FIRST_LOOKS.labels("found")._value.get() == found + 1
    assert answer.status_code == 200 and answer.json()["outcome"] == "certified"
    assert answer.json()["head_seq"] == 2 and answer.json()["response_id"] == rid
    assert reads == {"locate": 1, "status": 1, "read_turn": 1}
    # The complete history, as a read of the whole partition answers it.
    assert answer.json()["items"] == stack.fresh(tenant, rid).json()["items"]


@pytest.mark.parametrize("fast_path", [True, False], ids=["fast-path", "fastapi"])
def test_a_row_lost_after_the_first_look_found_it_is_answered_as_read(fast_path):
    """Storage damage between the first look's row read and the lookup (rows never
    change or expire, so nothing else takes a found row away): the answer is the
    history as verified from the row read during the request, the same answer as a
    request that came a moment earlier, and cached like any history read before a
    loss; a read past the cache finds the loss (tests/unit/test_api_lost_turn.py).
    Before session 52's change the lookup read the row again and answered
    ``MISSING_HISTORY``: both are answers of a moment within the request."""
    from tests.unit.test_api_lost_turn import _delete_turn

    stack = CachingStack(fast_path=fast_path)
    tenant, conv = uid("tenant"), uid("conv")
    items = (message("a", item_id=uid("m")), message("b", item_id=uid("m")))
    first = stack.promote(tenant, conv, 0, items[:1])
    assert stack.history(tenant, first).status_code == 200
    rid = stack.promote(tenant, conv, 1, items[1:])
    real = stack.store.read_turn

    def read_then_lose(*args, **kwargs):
        row = real(*args, **kwargs)
        if row is not None and rid in stack.store._partitions[(tenant, conv)].checkpoints:
            _delete_turn(stack, tenant, conv, rid)
        return row

    stack.store.read_turn = read_then_lose
    answer = stack.history(tenant, rid, wait_ms=5000, partition_key=conv)
    assert rid not in stack.store._partitions[(tenant, conv)].checkpoints  # lost
    assert answer.status_code == 200 and answer.json()["outcome"] == "certified"
    assert answer.json()["head_seq"] == 2
    assert [item["item_id"] for item in answer.json()["items"]] == [i.item_id for i in items]
    fresh = stack.fresh(tenant, rid)
    assert (fresh.status_code, fresh.json()["reason"]) == (500, "MISSING_HISTORY")
