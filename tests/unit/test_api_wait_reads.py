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
