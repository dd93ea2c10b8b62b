"""The store's exceptions: broken infrastructure (``StoreUnavailable``, which says
whether retrying the same call can help), a malformed request (``InvalidPromotion``, a
bug in the caller), a hook that raised ``StopIteration`` (``StrayStopIteration``, a bug
in the hook) and a promoted turn whose row is gone (``TurnLost``). Expected
results are outcomes, not exceptions (``ratchet.domain.plan``)."""

from __future__ import annotations

from ratchet.domain.plan import CorruptPartition
from schemas.errors import Unavailable


class StoreError(Exception):
    """Base of the store's exceptions."""


class StoreUnavailable(StoreError, Unavailable):
    """The store could not be reached or did not answer in time.

    ``retryable`` says whether repeating the same call can succeed (a timeout or an
    unavailable replica: yes; a schema missing or a query refused: no). After an
    unknown write outcome that could not be resolved, repeating ``promote`` with the
    same idempotency key is safe: it returns ``Duplicate`` if the first write landed.
    """

    dependency = "the checkpoint store (Cassandra)"

    def __init__(self, message: str, *, retryable: bool, operation: str = "") -> None:
        super().__init__(message)
        self.retryable = retryable
        self.operation = operation


class InvalidPromotion(StoreError, ValueError):
    """The request itself is malformed; the caller must validate before promoting."""


class StrayStopIteration(StoreError, RuntimeError):
    """A hook the store called raised ``StopIteration`` (a used-up ``Mock``, a
    subclass's bare ``next``): a bug in the hook, never an answer. The store raises this
    instead (the ``StopIteration`` is its ``__cause__``) because a ``StopIteration``
    cannot cross the boundaries a store call goes through: out of a generator or a
    coroutine Python makes it a bare ``RuntimeError``, into an asyncio future it cannot
    be set at all (the awaiting caller waits for ever), and a caller iterating (``map``,
    a ``for`` over a generator that calls the store) takes it for the end of its input
    and stops short, silently. A ``RuntimeError``, as Python makes it of one that leaves
    a generator (PEP 479)."""


class TurnLost(CorruptPartition):
    """A promoted response whose turn row is not in its partition (``turn_lost``):
    data loss, answered ``MISSING_HISTORY`` (its history is), never as an unknown id."""
