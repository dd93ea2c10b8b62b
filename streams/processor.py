"""The promotion processor core: one consumed record in, the records to publish out.

This is the Faust-free part of the agent. ``handle_async`` runs the common promotion
on the event loop (``loop_promotion.py``) and hands everything else to ``handle``, the
synchronous path, in a worker thread (the store and ledger drivers block there).
``handle`` does, for one record:

* decode it; an undecodable record becomes a ``DeadLetter`` (never an exception);
* ``ToolEffect``: record it in the ledger (dedupe by effect_id), then the request's
  facts mark; publishes it ``EffectOrphaned`` only if its request already stands
  promoted without it (an effect arriving after the promotion) or cancelled
  (``streams/request_facts.py``);
* ``TurnCancelled``: record the cancellation, then the facts mark; publishes the
  request's effects and claims ``TURN_CANCELLED`` when it stands promoted nowhere;
* ``TurnCompleted``: decide it as if the request had no facts (the promotion batch
  asserts that: no facts mark) unless they are needed or known to exist, then read
  them; replay an earlier rejection of this very event if there is one, else take the
  pairing state of the lineage the turn extends from the tail cache
  (``streams/tail_cache.py``) or a history read (``streams/lineage.py``), call the pure domain
  (``ratchet.domain.promotion``), make the outcome durable, and return
  ``CheckpointPromoted`` / ``PromotionRejected`` plus any ``EffectOrphaned``. The store
  writes the turn only on top of the lineage it was checked against (``extends``) and
  the facts it was decided with (``facts_mark``); a rejection decided without the facts
  or with cached facts is decided again from fresh reads.

Every write is idempotent, so handling the same record again (redelivery after a
crash, or a retry after an ``Unavailable``) returns the same outcome and
never promotes twice. Publishing and acking are the caller's job (``streams/app.py``)
and happen strictly after this returns.

``PromotionProcessor`` is a facade over parts with one job each, built in ``__init__``;
the imports point one way, from here to the parts (and from a part only to those below
it in this list), none back to the facade:

* ``loop_promotion.py``, ``LoopPromotion``: the event loop's fast path;
* ``turn_promotion.py``, ``TurnPromotion``: the thread path of a ``TurnCompleted``
  (the facts rounds, the replay, the recheck of a rejection from fresh reads);
* ``early_rejections.py``, ``EarlyRejections``: rejections decided from the event alone;
* ``turn_decider.py``, ``TurnDecider``: validate against a lineage, decide, promote
  (the lineage rounds);
* ``store_answers.py``, ``StoreAnswers``: what the store would answer a turn it never
  writes (a retry of a promoted request, ordering, an unreadable lineage, damage);
* ``verdict_recorder.py``, ``VerdictRecorder``: a verdict made durable (a rejection
  recorded and settled, the owners), whether a turn stands promoted;
* ``outbound.py``, ``OutboundBuilder``: the records to publish, a dead letter;
* ``handled.py``: ``Handled``, ``NO_FACTS``, ``lane_name``, shared by all.

Effects and cancellations are ``request_facts.py``'s (``RequestFacts.record_effect``,
``record_cancel``); the lineage a turn extends ``lineage.py``'s.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from schemas.errors import Unavailable
from schemas.limits import MAX_EVENT_BYTES
from schemas.models import (
    DeadLetterReason,
    GatewayEvent,
    ToolEffect,
    TurnCancelled,
)
from services.ledger.base import Ledger
from services.store.base import CheckpointStore
from streams import metrics
from streams.early_rejections import EarlyRejections
from streams.handled import Handled, lane_name
from streams.identity_checks import identity_problem, unquotable_field
from streams.lineage import LineageReader
from streams.loop_promotion import LoopPromotion
from streams.outbound import OutboundBuilder
from streams.records import DecodeFailed, EventCodec, RawRecord, TurnBeyondLimits
from streams.request_facts import RequestFacts
from streams.store_answers import StoreAnswers
from streams.tail_cache import TailCache
from streams.topics import Topics
from streams.turn_decider import TurnDecider
from streams.turn_promotion import TurnPromotion
from streams.verdict_recorder import VerdictRecorder

__all__ = ["Handled", "PromotionProcessor"]

log = logging.getLogger(__name__)


class PromotionProcessor:
    """Decode -> decide -> write durably; returns what to publish. Thread-safe.

    Cassandra is the source of truth. The only state kept between records is the
    bounded tail cache (``streams/tail_cache.py``): facts about promoted lineages that
    save reads, never decide a rejection alone, and never grow past a fixed size.
    """

    def __init__(self, store: CheckpointStore, ledger: Ledger, codec: EventCodec,
                 topics: Topics, clock_ms: Callable[[], int] | None = None,
                 tails: TailCache | None = None) -> None:
        self.store = store
        self.ledger = ledger
        self.codec = codec
        self.topics = topics
        self.clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        # Bounded memory of promoted lineages (pairing state, heads, owners); see
        # streams/tail_cache.py. ``TailCache(capacity=0)`` turns it off.
        self.tails = tails if tails is not None else TailCache()
        self.lineages = LineageReader(store, self.tails, self.clock_ms)
        self.request_facts = RequestFacts(store, ledger, self.tails, topics)
        self.loop_promotions = 0  # turns promoted on the event loop (``handle_async``)
        # The parts, each built on those before it (the arrows point one way).
        self._outbound = OutboundBuilder(topics, self.request_facts, self.clock_ms)
        verdicts = VerdictRecorder(store, ledger, self.request_facts, self.tails,
                                   self.clock_ms)
        answers = StoreAnswers(store, ledger, self.request_facts, self.lineages, self.clock_ms)
        self._decider = TurnDecider(store, ledger, self.tails, self.lineages, answers,
                                    verdicts, self.clock_ms)
        self._early = EarlyRejections(self.request_facts, verdicts, self._outbound)
        self._turns = TurnPromotion(store, ledger, self.tails, self.request_facts,
                                    self._decider, verdicts, self._early, self._outbound)
        self._loop = LoopPromotion(store, ledger, codec, self.tails, self.lineages,
                                   self._outbound, self.clock_ms)

    @property
    def cache_hits(self) -> int:
        return self.lineages.cache_hits

    @property
    def cache_misses(self) -> int:
        return self.lineages.cache_misses

    @property
    def cache_rechecks(self) -> int:
        """Rejections decided from cached facts (or without the facts), decided again."""
        return self._turns.cache_rechecks + self._decider.cache_rechecks

    # -- entry point -------------------------------------------------------------------
    def handle(self, record: RawRecord) -> Handled:
        """Handle one record; raises only ``Unavailable`` (store, ledger or registry
        down: retry later)."""
        try:
            size = len(record.value or b"")
            beyond = (f"event of {size} bytes exceeds the protocol maximum of "
                      f"{MAX_EVENT_BYTES} bytes" if size > MAX_EVENT_BYTES else None)
            try:
                event: GatewayEvent = self.codec.decode(record)
            except TurnBeyondLimits as exc:
                event, beyond = exc.turn, exc.detail
            if isinstance(event, ToolEffect | TurnCancelled):
                problem = identity_problem(event, record.key) or beyond
                if problem is not None:
                    # No outcome topic to reject it on, and no row may be keyed by such
                    # an id or hold such a record, or it is out of its request's order:
                    # the record is parked, bytes kept.
                    raise DecodeFailed(DeadLetterReason.INVALID_EVENT, problem)
                if isinstance(event, ToolEffect):
                    return Handled(self.request_facts.record_effect(event), "effect")
                return Handled(self.request_facts.record_cancel(event), "cancel")
            unquotable = unquotable_field(event)
            if unquotable is not None:
                raise DecodeFailed(DeadLetterReason.INVALID_EVENT, unquotable)
            problem = identity_problem(event, record.key)
            if problem is not None:
                return self._early.on_bad_identity(event, problem)
            if beyond is not None:
                return self._early.on_turn_beyond_limits(event, beyond)
            return self._turns.handle(event)
        except DecodeFailed as exc:
            return Handled((self._outbound.dead_letter(record, exc),), "dead_lettered")
        except Unavailable:
            raise
        except Exception as exc:
            # A bug met by this one record: park the record (bytes kept) in the dead
            # letters instead of crashing or stalling the partition forever.
            log.exception("unexpected error on %s; dead-lettering the record",
                          lane_name(record))
            failed = DecodeFailed(DeadLetterReason.UNKNOWN,
                                  f"processing failed: {type(exc).__name__}: {exc}")
            return Handled((self._outbound.dead_letter(record, failed),), "dead_lettered")

    async def handle_async(self, record: RawRecord,
                           in_thread: Callable[[Callable[[], Handled]], Awaitable[Handled]]
                           ) -> Handled:
        """``handle`` with its common case on the event loop: a turn that promotes from
        the tail cache with no fact of its request recorded (``LoopPromotion.promote``).
        Everything else, and every turn that does not promote that way, is handled by
        ``handle`` through ``in_thread`` (the drivers block), from the start: each
        write of the attempt on the loop is idempotent, so ``handle`` finds what it
        left (the claim is the request's own, a landed batch is its own promotion)."""
        try:
            handled = await self._loop.promote(record)
        except Exception as exc:  # noqa: BLE001 - the thread path decides and retries
            log.debug("%s: promotion on the loop gave way to the thread path (%r)",
                      lane_name(record), exc)
            handled = None
        if handled is not None:
            self.loop_promotions += 1
            self._events_on_loop.inc()
            return handled
        self._events_on_thread.inc()
        return await in_thread(lambda: self.handle(record))

    # The children of ``ratchet_worker_events_total``: each looked up on its first use
    # (as before: no sample until then) and held, not looked up by label per event.
    @functools.cached_property
    def _events_on_loop(self) -> Any:
        return metrics.events_by_path("loop")

    @functools.cached_property
    def _events_on_thread(self) -> Any:
        return metrics.events_by_path("thread")
