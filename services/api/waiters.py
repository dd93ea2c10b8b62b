"""Per-response wake-ups for ``wait_ms`` (read-your-writes for the next turn).

Why: a gateway that just produced turn N wants to rehydrate it for turn N+1. Polling
Cassandra per waiting request would multiply load by the wait; instead the API process
follows ``ratchet.checkpoints`` and ``ratchet.rejections`` (see ``notifier``) and wakes
the requests waiting on that response id. A woken request does ONE verified read.

Protocol, in this order (it has no lost wake-up):
1. ``register(response_id)`` before the first read;
2. read; if the answer is final, ``release`` and return it;
3. ``await wait(ticket, timeout)``: woken by a decision or by the timeout;
4. read ONCE more, ``release``, return that answer. The decision record names the
   response's partition (``Ticket.found_in``); a request that gave none reads there
   first, as with a gateway's ``partition_key`` hint (never trusted: the turn row must
   be found there), instead of reading the response's claim to find it.
The processor publishes only after the write is durable, so any decision published
before step 1 is already visible to the read of step 2. A decision published while the
notifier is not following the topics (connecting, reconnecting) is covered by its
``notify_all`` once it is positioned (notifier.py).

Thread-safety: ``notify`` is called from the Kafka consumer thread; events belong to
the event loop of the waiting request and are set with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field


@dataclass(eq=False)
class Ticket:
    """One waiting request. ``decision`` tells what woke it, if anything."""

    response_id: str
    loop: asyncio.AbstractEventLoop
    event: asyncio.Event = field(default_factory=asyncio.Event)
    decision: str | None = None  # "promoted" | "rejected" | "unknown" (undecodable record)
    # (tenant id, partition key) the decision record named, if it named them.
    found_in: tuple[str, str] | None = None


class PromotionWaiters:
    """Registry of waiting requests keyed by response id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_response: dict[str, set[Ticket]] = {}

    def register(self, response_id: str) -> Ticket:
        ticket = Ticket(response_id, asyncio.get_running_loop())
        with self._lock:
            self._by_response.setdefault(response_id, set()).add(ticket)
        return ticket

    def release(self, ticket: Ticket) -> None:
        with self._lock:
            tickets = self._by_response.get(ticket.response_id)
            if tickets is not None:
                tickets.discard(ticket)
                if not tickets:
                    del self._by_response[ticket.response_id]

    async def wait(self, ticket: Ticket, timeout_s: float) -> bool:
        """True if woken by a decision, False on timeout."""
        try:
            await asyncio.wait_for(ticket.event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def notify(self, response_id: str, decision: str,
               found_in: tuple[str, str] | None = None) -> int:
        """Wake every request waiting on ``response_id``; returns how many.
        ``found_in``: the (tenant id, partition key) the decision record names."""
        with self._lock:
            tickets = list(self._by_response.get(response_id, ()))
        for ticket in tickets:
            _wake(ticket, decision, found_in)
        return len(tickets)

    def notify_all(self, decision: str = "unknown") -> int:
        """Wake everyone: used when a decision record cannot be decoded. Waking is
        always safe (a woken request only re-reads), missing a wake-up is not."""
        with self._lock:
            tickets = [t for ts in self._by_response.values() for t in ts]
        for ticket in tickets:
            _wake(ticket, decision)
        return len(tickets)

    def waiting(self) -> int:
        with self._lock:
            return sum(len(ts) for ts in self._by_response.values())


def _wake(ticket: Ticket, decision: str, found_in: tuple[str, str] | None = None) -> None:
    def _set() -> None:
        ticket.decision = decision
        ticket.found_in = found_in
        ticket.event.set()

    # RuntimeError: the request's loop is closed, so nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        ticket.loop.call_soon_threadsafe(_set)
