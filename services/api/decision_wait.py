"""``wait_ms``: one look, maybe one wait, one more read (see waiters.py).

A gateway asks for a response it just produced, before its promotion may be
decided: the request registers for the decision's notice first, looks once (the
response's claim and the ledger's status at once, ``_first_look``), and reads the
history (response_reader.py) when something is decided, when the notifier wakes it,
and once more at its deadline. Nothing decided in time: ``NOT_PROMOTED`` (409), the
truthful answer to a caller that says it produced the turn (service.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ratchet.metric_children import child
from services.api import metrics
from services.api.answer import Answer, not_promoted
from services.api.cache import HistoryCache
from services.api.response_reader import ClaimedRow, ResponseLookup
from services.api.waiters import PromotionWaiters
from services.ledger.base import Ledger, ResponseState
from services.store.base import CheckpointStore

WAIT_MS_CAP = 10_000


class DecisionWait:
    """A response lookup that waits for the response's promotion or rejection."""

    def __init__(
        self,
        waiters: PromotionWaiters,
        store: CheckpointStore,
        ledger: Ledger | None,
        cache: HistoryCache | None,
        read: Callable[[ResponseLookup], Awaitable[Answer]],
    ) -> None:
        self._waiters = waiters
        self._store = store
        self._ledger = ledger
        self._cache = cache
        self._read = read  # one lookup of the history (ResponseReader.read)

    async def wait(self, lookup: ResponseLookup, wait_ms: int) -> Answer:
        """The answer once the response is decided, or ``NOT_PROMOTED`` when nothing was
        decided within ``wait_ms`` (at most ``WAIT_MS_CAP``: the caller clamps it)."""
        deadline = time.monotonic() + wait_ms / 1000
        ticket = self._waiters.register(lookup.response_id)
        metrics.WAITING.inc()
        try:
            first = await self._first_look(lookup)
            answer = None if first is None else await self._read(first)
            while answer is None or _still_pending(answer):
                remaining = deadline - time.monotonic()
                woken = remaining > 0 and await self._waiters.wait(ticket, remaining)
                if not woken:
                    # One last read at the deadline covers a notifier that was down.
                    child(metrics.WAITS, "timeout").inc()
                    answer = await self._read(lookup)
                    if _still_pending(answer):
                        return not_promoted(
                            lookup.response_id, f"no decision within {wait_ms} ms"
                        )
                    return answer
                child(metrics.WAITS, f"woken_{ticket.decision}").inc()
                # Clear BEFORE re-reading: a decision published after this re-arms the event.
                ticket.event.clear()
                lookup = _with_record_hint(lookup, ticket.found_in)
                answer = await self._read(lookup)
            return answer
        finally:
            metrics.WAITING.dec()
            self._waiters.release(ticket)

    async def _first_look(self, lookup: ResponseLookup) -> ResponseLookup | None:
        """None when nothing about the response is decided yet, else the lookup to
        answer with. Two reads at once: the response's claim and the ledger's status (a
        rejection). No claim means no promotion (a response id is claimed before its
        promotion batch is sent); a claim costs one more read, the turn row where the
        claim says. A row found there is handed on with the lookup (``claimed_row``):
        the lookup extends by it instead of reading it again, so a wait that finds its
        turn promoted costs 3 reads, not 4 (5 without ``partition_key``).

        Why: a gateway waits right after producing its turn, so its first look nearly
        always finds nothing, mostly not even the claim. Made one after another, as a
        lookup makes them, its reads are 3-4 round trips, each waking the driver's I/O
        thread and the event loop (~0.3 ms of the API's CPU each on this host); made at
        once they share the wake-ups. Anything found (a row, a recorded decision, an
        error): the ordinary lookup answers, with all its checks (it reads again, but
        for a row found here, which it is handed): the look only ever decides "wait". That is safe because the request registered first: a
        decision published after the look wakes it (waiters.py)."""
        tenant_id, response_id = lookup.tenant_id, lookup.response_id
        cached = self._cache is not None and lookup.use_cache
        if cached and self._cache is not None and (
            self._cache.get(tenant_id, response_id) is not None
            or self._cache.location(tenant_id, response_id) is not None
        ):
            return lookup  # verified here before: decided
        reads: list[Any] = [self._store.locate_async(tenant_id, response_id)]
        if self._ledger is not None:
            reads.append(self._ledger.status_async(tenant_id, response_id))
        look = _claim_and_status(await asyncio.gather(*reads, return_exceptions=True))
        answer_with: ResponseLookup | None = None if look is True else lookup
        if isinstance(look, str):
            # Claimed: the turn row where the claim says decides. No row there: in
            # flight or refused (or, after storage damage, promoted and lost:
            # ``turn_lost`` is not asked on this hot path, the read at the wait's
            # deadline answers such a turn MISSING_HISTORY).
            try:
                row = await self._store.read_turn_async(tenant_id, look, response_id)
            except Exception:  # noqa: BLE001 - the ordinary lookup reads again and reports it
                row = None
            else:
                answer_with = None if row is None else lookup
            if row is not None and cached:
                # Found: handed on to a lookup through the cache (``no-cache`` asks for
                # the full read, which reads the partition anyway).
                answer_with = replace(lookup, claimed_row=ClaimedRow(look, row))
        child(metrics.WAIT_FIRST_LOOKS, "undecided" if answer_with is None else "found").inc()
        return answer_with


def _with_record_hint(lookup: ResponseLookup, found_in: tuple[str, str] | None) -> ResponseLookup:
    """The lookup with the partition the decision record named, when the caller named
    none and the record is of the caller's tenant. Like a gateway's hint it is only
    where the read looks first (``_response_miss``: the turn row must be found there,
    else the claim decides); it spares the claim's read."""
    if lookup.partition_key is not None or found_in is None or found_in[0] != lookup.tenant_id:
        return lookup
    return replace(lookup, partition_key=found_in[1])


def _claim_and_status(found: list[Any]) -> bool | str:
    """What ``_first_look``'s reads found, given in their order: the claim's partition
    and, with a ledger, the response's status. True: nothing decided; False: a decision
    or a failed read; a partition key: claimed there, the turn row still to be read."""
    if any(isinstance(result, BaseException) for result in found):
        return False  # the ordinary lookup reads again and reports the failure
    located, *status = found
    if status and status[0].status is not ResponseState.UNKNOWN:
        return False  # a recorded decision
    return True if located is None else str(located)


def _still_pending(answer: Answer) -> bool:
    """Only "nothing known yet" is worth waiting for; anything else is final."""
    return answer.outcome == "failure" and answer.reason == "NOT_FOUND"
