"""Concurrent full reads of one history share one read (single flight).

Why: N requests for the same history that the cache does not hold yet (N woken by one
promotion, N cold reads of one Conversation after a restart) each read and verified it
from Cassandra: N full reads for one answer (left open in session 43).

How: one asyncio future per key (the running read, a ``Task``); a request for a key
whose read has not begun joins it, and every request that joined gets its result, or
the read's exception as an object of its own (never kept: the next request reads
again). A request for a key whose read began before it arrived does not take that
read's answer: it may predate a promotion the request was told of (a waiter woken by
its decision would read "not found" again and sleep to its deadline). Such requests
share the NEXT read, which begins when the running one ends, or once it has waited
``OVERTAKE_AFTER_S`` for it (a read stuck until the driver's timeout held every later
request for the history as long), with at most ``MAX_READS_PER_KEY`` reads of one key
running at once. Each read begins after every request it answers arrived
(linearizable). A request cancelled leaves the read to the others. One event loop's
(the API's).
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ratchet.metric_children import child
from services.api import metrics

T = TypeVar("T")

# How long the next read of a history waits for the running one before it begins
# beside it. A full read takes milliseconds (tens for a history of megabytes); one
# running a second is stuck or on an overloaded store, and the API's store requests
# time out after 5 s. Lower, a slow but healthy store would get two reads of a
# history where one would do; higher, a stuck read holds later requests longer.
OVERTAKE_AFTER_S = 1.0
# Reads of one key running at once: the one that overran and one beside it. A third
# waits for either to end (two stuck reads say the store is, and more would add to its
# load, not get an answer sooner).
MAX_READS_PER_KEY = 2


@dataclass(frozen=True)
class _Outcome(Generic[T]):
    """A read's result or exception. The shared task never raises the read's exception:
    awaited by each request, one object would be raised in each (its traceback, context
    and notes rewritten by every raise, one request's shown in another's log)."""

    value: T | None
    error: Exception | None


class _Flight(Generic[T]):
    def __init__(self, previous: _Flight[T] | None) -> None:
        self.previous = previous
        self.begun = False
        self.task: asyncio.Future[_Outcome[T]] | None = None


class SingleFlight(Generic[T]):
    def __init__(self, kind: str, *, overtake_after_s: float | None = None) -> None:
        """``overtake_after_s``: None is ``OVERTAKE_AFTER_S`` as it is when built."""
        self._kind = kind
        self._overtake_after = (OVERTAKE_AFTER_S if overtake_after_s is None
                                else overtake_after_s)
        self._flights: dict[Hashable, _Flight[T]] = {}  # the latest read of each key
        self._running: dict[Hashable, set[asyncio.Future]] = {}  # begun, not ended

    def __len__(self) -> int:
        return len(self._flights)

    async def run(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """``read()``'s result, shared with the other requests for ``key`` that joined."""
        flight = self._flights.get(key)
        if flight is None or flight.begun:
            flight = _Flight(flight)
            self._flights[key] = flight
            flight.task = asyncio.ensure_future(self._fly(key, flight, read))
            flight.task.add_done_callback(_retrieved)
            child(metrics.SHARED_READS, self._kind, "read").inc()
        else:
            child(metrics.SHARED_READS, self._kind, "joined").inc()
        assert flight.task is not None
        outcome = await asyncio.shield(flight.task)
        if outcome.error is not None:
            raise _own_copy(outcome.error)
        return outcome.value  # type: ignore[return-value]

    async def _fly(self, key: Hashable, flight: _Flight[T],
                   read: Callable[[], Awaitable[T]]) -> _Outcome[T]:
        task = asyncio.current_task()
        assert task is not None
        try:
            previous, flight.previous = flight.previous, None
            if previous is not None and previous.task is not None:
                await self._after(key, previous.task)
            flight.begun = True
            self._running.setdefault(key, set()).add(task)
            try:
                return _Outcome(await read(), None)
            except Exception as error:  # noqa: BLE001 - each request raises its own copy
                return _Outcome(None, error)
        finally:
            running = self._running.get(key)
            if running is not None:
                running.discard(task)
                if not running:
                    del self._running[key]
            if self._flights.get(key) is flight:
                del self._flights[key]

    async def _after(self, key: Hashable, previous: asyncio.Future) -> None:
        """Until ``previous`` (the read begun before this one) ends, or, once this read
        has waited ``OVERTAKE_AFTER_S`` for it, until fewer than ``MAX_READS_PER_KEY``
        reads of ``key`` run."""
        await asyncio.wait([previous], timeout=self._overtake_after)
        while not previous.done():
            running = self._running.get(key, set())
            if len(running) < MAX_READS_PER_KEY:
                child(metrics.SHARED_READ_OVERTAKES, self._kind).inc()
                return
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)


def _own_copy(error: Exception) -> Exception:
    """``error`` as an object of its own for one request: the same type, arguments and
    attributes, cause and context, and the read's traceback (this request's frames are
    added as it is raised; the read's own object is never raised again). Built without
    its ``__init__`` (``__new__`` with its arguments, then its ``__dict__``), else as
    ``copy.copy`` builds it (with its ``__init__``: a field it sets in C, as
    ``UnicodeDecodeError``'s, ``SyntaxError``'s or an ``OSError`` subclass's errno, is
    not in its arguments or ``__dict__``), whichever reads as ``error`` does
    (``_readable``); neither (a slot, an ``__init__`` with other arguments): raised as
    it is, shared, as before session 45. Until session 46 the first was raised whatever
    it lacked: a request raised a ``UnicodeDecodeError`` with an empty message."""
    try:
        expected = _readable(error)
    except Exception:  # noqa: BLE001 - an attribute or text that raises when read
        return error
    for build in (_built_bare, copy.copy):
        try:
            own = build(error)
            if _readable(own) == expected:
                break
        except Exception:  # noqa: BLE001 - e.g. a __new__ or __init__ with other arguments
            continue
    else:
        return error
    if isinstance(getattr(error, "__notes__", None), list):
        own.__notes__ = list(error.__notes__)  # a request's note is its own
    own.__cause__ = error.__cause__
    own.__context__ = error.__context__
    own.__suppress_context__ = error.__suppress_context__
    return own.with_traceback(error.__traceback__)


def _built_bare(error: Exception) -> Exception:
    """``error``'s type built without its ``__init__``: its arguments and ``__dict__``."""
    cls = type(error)
    own = cls.__new__(cls, *error.args)
    if hasattr(error, "__dict__"):
        own.__dict__.update(error.__dict__)
    return own


def _readable(error: Exception) -> tuple[str, str, dict[str, object]]:
    """What a handler or a log line reads of an exception: its text and its attributes
    (its slots and C-level fields too; ``__dict__``'s values are the same objects in a
    copy, compared by identity first). One that cannot be read (a slot unset, an
    ``OSError``'s ``characters_written``) reads as ``_UNSET``."""
    attributes = {}
    for name in (*_class_attributes(type(error)), *getattr(error, "__dict__", ())):
        try:
            value = getattr(error, name)
        except AttributeError:
            value = _UNSET
        if not callable(value):
            attributes[name] = _Same(value)
    return str(error), repr(error), attributes


_UNSET = object()


@functools.cache
def _class_attributes(cls: type) -> tuple[str, ...]:
    """The attribute names an exception class gives its instances (its slots and C
    fields among them), dunders and methods left out: ``dir`` once per class (~20 us)."""
    return tuple(name for name in dir(cls)
                 if not name.startswith("__") and not callable(getattr(cls, name, None)))


class _Same:
    """A value equal to the same object, or to an equal one (a NaN equals itself)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and (
            other.value is self.value or bool(other.value == self.value))

    __hash__ = None  # type: ignore[assignment]


def _retrieved(task: asyncio.Future) -> None:
    """Every request that joined may have been cancelled: the read's exception is theirs
    to see, not the loop's "never retrieved" log."""
    if not task.cancelled():
        task.exception()
