"""Retry persistence inside the agent, with capped exponential backoff.

An exception escaping a Faust agent *acks* the event (it would be skipped), so a
persistence failure must never leave the lane: the lane waits here, its partition
makes no progress (order kept), the worker reports ``degraded`` and resumes by itself
when the database answers again. Only a lane being stopped (rebalance, shutdown)
ends the wait, and then the event is left unacked, to be redelivered.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from schemas.errors import Unavailable
from streams import metrics
from streams.health import Health

log = logging.getLogger(__name__)
T = TypeVar("T")


class PublishUnavailable(Unavailable):
    """The outcomes could not be encoded (registry) or published (Kafka): retry later."""

    dependency = "Kafka or the schema registry (publishing outcomes)"


class LaneStopped(Exception):
    """The lane was asked to stop while an event was waiting for persistence."""


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (0-based): ``min(cap, base * factor**n)`` with jitter."""

    base_s: float = 0.05
    factor: float = 2.0
    cap_s: float = 2.0
    jitter: float = 0.2  # +/- 20 %: workers retrying together do not stampede

    def delay(self, attempt: int) -> float:
        raw = min(self.cap_s, self.base_s * self.factor ** min(attempt, 32))
        return raw * (1 + random.uniform(-self.jitter, self.jitter))


async def retry_until_done(
    call: Callable[[], Awaitable[T]],
    *,
    lane: str,
    health: Health,
    backoff: Backoff,
    stopping: Callable[[], bool],
) -> T:
    """Await ``call()`` until it does not raise ``Unavailable`` (the store, the ledger,
    the registry or the broker down: ``StoreUnavailable``, ``LedgerUnavailable``,
    ``RegistryUnavailable``, ``PublishUnavailable``).

    Raises ``LaneStopped`` if ``stopping()`` becomes true between attempts.
    """
    attempt = 0
    what = ""
    try:
        while True:
            try:
                return await call()
            except Unavailable as exc:
                what = exc.dependency
                if attempt == 0:
                    log.warning("%s: %s unavailable, retrying: %s", lane, exc.dependency, exc)
                health.retrying(lane, str(exc), new=attempt == 0)
                metrics.PERSISTENCE_RETRIES.inc()
                await _sleep_unless_stopping(backoff.delay(attempt), stopping)
                attempt += 1
    finally:
        if attempt:
            health.recovered(lane)
            log.info("%s: %s back after %d retries", lane, what, attempt)


async def _sleep_unless_stopping(seconds: float, stopping: Callable[[], bool]) -> None:
    step = 0.05
    while seconds > 0:
        if stopping():
            raise LaneStopped()
        await asyncio.sleep(min(step, seconds))
        seconds -= step
    if stopping():
        raise LaneStopped()
