"""A command stopped by a signal, as exceptions: what the CLI's stop lines tell apart.

Here, not in the adapters, so that the CLI can name them before it imports anything
slow (a stop can land during the import) and the adapters can raise them."""

from __future__ import annotations

import signal


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises ``KeyboardInterrupt``: how
    Kubernetes stops a Job's pod (its deadline, a deleted pod). With Python's default
    handler ``ratchet migrate`` died at once, exit 143 and no ``finally``, its lease held
    for its TTL (120 s), the Job's next attempt waiting that long (session 47's review,
    left; session 48). A ``BaseException``: nothing that handles failures takes it for
    one."""


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises ``Terminated`` in the main thread."""
    signal.signal(signal.SIGTERM, _raise_terminated)


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise Terminated


class LeaseLeft(BaseException):
    """``ratchet migrate`` was stopped (Ctrl-C, SIGTERM: the stop is the ``__cause__``)
    while it released its migration lease: whether the ``DELETE`` reached Cassandra is
    unknown, so the lease may stay held until its TTL ends, a migrate started sooner
    waiting for it. The stop came out as it was, and the CLI's line said nothing of the
    lease (session 47's review, left; session 48). ``failure``: the run's own failure the
    release came after (None: it came after a success or a stop), said before the stop's
    line (session 48's review)."""

    def __init__(self, lease: str, failure: Exception | None = None) -> None:
        super().__init__(lease)
        self.lease = lease
        self.failure = failure
