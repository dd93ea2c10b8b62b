"""A bound on the bytes of history answers the API builds and holds that are their
request's own copy (not the cache's bytes).

Why: an answer the cache does not hold (the cache off, a history larger than it, one
evicted, a first read) is built per request by a full read, and stays in memory until
its client has read it. 40 clients reading an uncached 8.4 MB answer at 4 KiB/s held
+346 MiB for as long as they read (~36 minutes; the API pod's limit is 384 MiB), and 40
concurrent full reads of it peaked at +322 MiB (an outside review, session 37;
docs/decisions.md, "Clients that do not read").

How: a full read first reserves what it will cost (``reserve``), and waits, in arrival
order, while the reservations held would pass ``max_bytes`` (one alone always runs).
What it will cost is learned per lookup (a response or a Conversation of a tenant):
twice its last answer (the rows read and their JSON), or, for a lookup not read yet,
an eighth of the bound, so at most eight unknown reads run at once. Once the answer is
built, its reservation shrinks to the answer's own bytes (none when the answer is the
cache's bytes) and is released when the answer has been written (``PartsResponse``).
A read that finds no room within ``ROOM_WAIT_S`` is ``AnswersBusy``: 503, retryable.
Cache hits reserve nothing. One event loop's (the API's).

An answer of more than one slice that is a cached history's bytes is pinned while it
is written (``pin``, by the bytes object itself): those bytes are the cache's, counted
by its own bound, until the cache lets them go (``evicted``, from any thread). From
then on they are counted here, once however many answers write them, until the last
is done: a slow reader of an evicted history otherwise held its bytes outside both
bounds (left open in session 37).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from services.api import metrics

# How long a full read waits for room before its request is answered 503 (retryable):
# well inside a gateway's usual request timeout.
ROOM_WAIT_S = 5.0
# Lookups whose last answer size is remembered (a few dozen bytes each).
REMEMBERED_LOOKUPS = 10_000


class AnswersBusy(Exception):
    """No room in the answer budget within ``ROOM_WAIT_S``: 503, retryable."""


class Reservation:
    """Bytes of the budget held by one full read, then by its answer until written."""

    def __init__(self, budget: AnswerBudget, key: tuple[str, ...], nbytes: int) -> None:
        self._budget = budget
        self._key = key
        self.nbytes = nbytes

    def settle(self, answer_bytes: int | None, own_bytes: int,
               key: tuple[str, ...] | None = None) -> None:
        """The answer is built: remember what this lookup costs (``answer_bytes``; None:
        the answer says nothing of it, a failure) under ``key`` (None: the one it was
        reserved under), and keep only the answer's own bytes (``own_bytes``) until
        ``release``."""
        if answer_bytes is not None:
            self._budget.learn(key or self._key, answer_bytes)
        self._budget.resize(self, own_bytes)

    def release(self) -> None:
        """Idempotent: the answer was written (or will not be)."""
        self._budget.resize(self, 0)


@dataclass(eq=False)
class _Pinned:
    """A cached history's bytes that answers being written hold."""

    items: bytes  # kept alive here, so its id() is not reused while pinned
    readers: int = 0
    counted: bool = False  # let go by the cache: counted in ``held``

    @property
    def nbytes(self) -> int:
        return len(self.items)


class Pin:
    """One answer's hold on a cached history's bytes, until written (``release``)."""

    def __init__(self, budget: AnswerBudget, pinned: _Pinned) -> None:
        self._budget = budget
        self._pinned: _Pinned | None = pinned

    @property
    def nbytes(self) -> int:
        """The bytes this answer makes the budget count now (0 while the cache holds them)."""
        pinned = self._pinned
        return pinned.nbytes if pinned is not None and pinned.counted else 0

    def release(self) -> None:
        """Idempotent: the answer was written (or will not be)."""
        if self._pinned is not None:
            pinned, self._pinned = self._pinned, None
            self._budget._unpin(pinned)


class AnswerBudget:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._costs: OrderedDict[tuple[str, ...], int] = OrderedDict()
        self._pins: dict[int, _Pinned] = {}  # id(the pinned bytes) -> their pin
        self._loop: asyncio.AbstractEventLoop | None = None

    async def reserve(self, key: tuple[str, ...], wait_s: float | None = None) -> Reservation:
        """Room for a full read of ``key`` (its expected cost), in arrival order;
        ``AnswersBusy`` after ``wait_s`` (``ROOM_WAIT_S``)."""
        wait_s = ROOM_WAIT_S if wait_s is None else wait_s
        nbytes = self._cost(key)
        if not self._queue and self._fits(nbytes):
            return self._hold(key, nbytes)
        waiter = asyncio.get_running_loop().create_future()
        entry = (nbytes, waiter)
        self._queue.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait_s)
        except BaseException as exc:  # the wait's end, or the request cancelled
            timed_out = isinstance(exc, TimeoutError)
            if waiter.done():  # admitted as it ended: _admit held its bytes
                if timed_out:
                    return Reservation(self, key, nbytes)
                self.resize(Reservation(self, key, nbytes), 0)
                raise
            self._queue.remove(entry)
            self._admit()  # the ones behind it may fit now
            if not timed_out:
                raise
            metrics.ANSWER_BUDGET_REFUSALS.inc()
            raise AnswersBusy(
                f"answers being read and written ({self.held} bytes) fill the API's answer "
                f"budget (RATCHET_API_ANSWER_BUDGET_BYTES, {self.max_bytes}); retry"
            ) from None
        return Reservation(self, key, nbytes)  # _admit held its bytes

    def has_room(self, key: tuple[str, ...]) -> bool:
        """Whether a read of ``key`` would be admitted at once (nobody waits ahead of it)."""
        return not self._queue and self._fits(self._cost(key))

    def pin(self, items: bytes, cached: Callable[[], bool]) -> Pin:
        """An answer about to write ``items``, a cached history's bytes. ``cached()``
        says whether the cache holds them; it is asked once the pin is taken, so an
        eviction on another thread is either seen by it or told to ``evicted``, never
        missed. On the event loop."""
        self._loop = asyncio.get_running_loop()
        pinned = self._pins.get(id(items))
        if pinned is None:
            pinned = self._pins[id(items)] = _Pinned(items)
        pinned.readers += 1
        pin = Pin(self, pinned)
        try:
            if not cached():
                self._count_pinned(pinned)
        except BaseException:
            pin.release()
            raise
        return pin

    def evicted(self, items: bytes) -> None:
        """The cache let ``items`` go (any thread, under the cache's lock): answers still
        writing them make them count here until written. On the loop's own thread at
        once, so a burst of reads sees each eviction before the next read reserves."""
        loop = self._loop
        if loop is None or id(items) not in self._pins:  # one dict lookup: GIL-atomic
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._on_evicted(items)
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing is written
            loop.call_soon_threadsafe(self._on_evicted, items)

    def _on_evicted(self, items: bytes) -> None:
        pinned = self._pins.get(id(items))
        if pinned is not None and pinned.items is items:
            self._count_pinned(pinned)

    def _count_pinned(self, pinned: _Pinned) -> None:
        if not pinned.counted:
            pinned.counted = True
            self.held += pinned.nbytes
            metrics.ANSWER_BYTES_HELD.set(self.held)

    def _unpin(self, pinned: _Pinned) -> None:
        pinned.readers -= 1
        if pinned.readers > 0:
            return
        del self._pins[id(pinned.items)]
        if pinned.counted:
            self.held -= pinned.nbytes
            metrics.ANSWER_BYTES_HELD.set(self.held)
            self._admit()

    def learn(self, key: tuple[str, ...], answer_bytes: int) -> None:
        self._costs[key] = 2 * answer_bytes  # the rows read and their JSON
        self._costs.move_to_end(key)
        while len(self._costs) > REMEMBERED_LOOKUPS:
            self._costs.popitem(last=False)

    def resize(self, reservation: Reservation, nbytes: int) -> None:
        self.held += nbytes - reservation.nbytes
        reservation.nbytes = nbytes
        metrics.ANSWER_BYTES_HELD.set(self.held)
        self._admit()

    def _cost(self, key: tuple[str, ...]) -> int:
        cost = self._costs.get(key)
        return self.max_bytes // 8 if cost is None else cost

    def _fits(self, nbytes: int) -> bool:
        return self.held == 0 or self.held + nbytes <= self.max_bytes

    def _hold(self, key: tuple[str, ...], nbytes: int) -> Reservation:
        self.held += nbytes
        metrics.ANSWER_BYTES_HELD.set(self.held)
        return Reservation(self, key, nbytes)

    def _admit(self) -> None:
        """Wake the waiting reads, oldest first, while the oldest fits."""
        while self._queue and self._fits(self._queue[0][0]):
            nbytes, waiter = self._queue.popleft()
            self.held += nbytes
            metrics.ANSWER_BYTES_HELD.set(self.held)
            waiter.set_result(None)
