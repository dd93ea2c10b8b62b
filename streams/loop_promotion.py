"""The event loop's fast path: the common promotion of a ``TurnCompleted`` awaited on
the loop, without a thread (``PromotionProcessor.handle_async``). It decides only what
it can promote from the tail cache with no fact of the request recorded; anything else
it gives back (None) to the thread path, which starts over: every write here is
idempotent, so the thread path finds what it left."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ratchet.domain import promotion
from ratchet.domain.plan import ResponseClaim
from ratchet.domain.promotion import Accepted, Facts, Promote
from ratchet.domain.validation import PROMOTABLE_STATUSES, request_digest_problem
from schemas.keys import partition_key
from schemas.models import TurnCompleted
from services.ledger.base import Ledger
from services.store.base import CheckpointStore
from streams import metrics
from streams.handled import NO_FACTS, Handled
from streams.identity_checks import _first_of_chain, identity_problem
from streams.lineage import LineageReader
from streams.outbound import OutboundBuilder
from streams.promotion_hints import _Hints
from streams.records import EventCodec, RawRecord
from streams.tail_cache import TailCache

# The largest record promoted on the event loop: decoding, validating and binding a
# turn is CPU work that holds up every other lane meanwhile (~0.5 ms for a few KiB; a
# turn near the 10 MiB limit would take the loop for a long while). Larger ones go
# to a thread.
LOOP_MAX_RECORD_BYTES = 256 * 1024


class LoopPromotion:
    """``promote``: a record promoted on the loop, or None (nothing decided)."""

    def __init__(self, store: CheckpointStore, ledger: Ledger, codec: EventCodec,
                 tails: TailCache, lineages: LineageReader, outbound: OutboundBuilder,
                 clock_ms: Callable[[], int]) -> None:
        self.store = store
        self.ledger = ledger
        self.codec = codec
        self.tails = tails
        self.lineages = lineages
        self.outbound = outbound
        self.clock_ms = clock_ms

    async def promote(self, record: RawRecord) -> Handled | None:
        """The fast path of ``TurnPromotion.handle`` without a thread, or None (nothing decided).

        Taken only when no read but the owner's is needed: the record decodes without
        the registry and is at most ``LOOP_MAX_RECORD_BYTES``; it is a promotable
        ``TurnCompleted`` that uses no tool effects, has only ids the API can serve and is
        not a chain's first response (which claims its request too,
        ``CheckpointStore.promote``); this worker wrote no facts mark for its request; the
        lineage it extends is in the tail cache (or it starts one). It
        awaits the claim, the promotion batch of the plan the hints give (asserting no
        facts mark) and the owners. Any other answer (a rejection, a refused or unknown
        write, a claim held by another request) returns None."""
        if not self.codec.decodes_offline(record):
            return None
        if len(record.value or b"") > LOOP_MAX_RECORD_BYTES:
            return None
        turn = self.codec.decode(record)
        if (not isinstance(turn, TurnCompleted) or turn.status not in PROMOTABLE_STATUSES
                or promotion.used_effect_ids(turn)):
            return None
        if _first_of_chain(turn):
            return None  # it claims its request and reads its facts: the thread path
        if (identity_problem(turn, record.key) is not None
                or request_digest_problem(turn.request_digest) is not None):
            return None  # rejected before any claim: the thread path
        key = partition_key(turn)
        if self.tails.facts_mark(turn.tenant_id, key, turn.idempotency_key) is not None:
            return None
        lineage = self.lineages.cached(turn, key)
        if lineage is None:
            return None
        claim = ResponseClaim(turn.tenant_id, turn.response_id, key, turn.idempotency_key,
                              turn.request_digest)
        # ``loop.create_task``, not ``asyncio.ensure_future`` (which checks its argument
        # and finds the loop again: 6 Python calls against 1); the store's and the
        # ledger's ``*_async`` are coroutine functions.
        loop = asyncio.get_running_loop()
        claiming = loop.create_task(self.store.claim_async(claim))  # sent now
        try:
            conversation = turn.conversation_id
            owner = None if conversation is None else self.tails.owner(conversation)
            if conversation is not None and owner is None:
                owner = await self.ledger.conversation_owner_async(conversation)
            # Timed by hand, not by the histograms' ``time()`` (a context manager: six
            # calls more per use, twice per turn); observed whatever happens, like it.
            started = time.perf_counter()
            try:
                validation = promotion.validate_after(turn, self.clock_ms(), lineage.pairing)
            finally:
                metrics.VALIDATION_SECONDS.observe(time.perf_counter() - started)
            # It uses no effects (checked above) and its key is known: not again.
            decided = promotion.decide_turn(turn, validation, Facts(
                cancelled=False, effects={}, conversation_owner=owner, claims={}),
                used=(), key=key)
            holder = await claiming
        finally:
            if not claiming.done():
                claiming.cancel()  # failed before the claim's answer: claimed again
            elif not claiming.cancelled():
                # Failed after it (both failing: Cassandra down): its error is retrieved,
                # or the task's finalizer logs "Task exception was never retrieved".
                claiming.exception()
        if not isinstance(decided, Promote) or holder != claim:
            return None
        hints = _Hints.of(decided, lineage)
        # A chain turn's response id owner, beside the batch (a Conversation's turns
        # own no response id: no task for an empty write).
        owners = (loop.create_task(self.ledger.record_owners_async(
            tenant_id=turn.tenant_id, response_id=turn.response_id, conversation_id=None))
            if conversation is None else None)
        started = time.perf_counter()
        try:
            promoted = await self.store.promote_from_hints_async(
                decided.request, head_hint=hints.head, parent_hint=hints.parent,
                extends=hints.extends, facts_mark=None)
        finally:
            metrics.LWT_SECONDS.observe(time.perf_counter() - started)
            if owners is not None:
                await owners  # durable before anything is published (raises if not)
        if promoted is None:
            return None
        if conversation is not None and owner is None:
            # The Conversation's owner only once its first turn is promoted (a refused
            # batch must not hand the Conversation to its tenant); durable before
            # anything is published (a crash before it: the redelivery writes it).
            await self.ledger.record_owners_async(
                tenant_id=turn.tenant_id, response_id=None, conversation_id=conversation)
        verdict = Accepted(promoted.checkpoint)
        self.lineages.learn(lineage, validation.pairing, promoted.checkpoint)
        if conversation is not None:
            self.tails.learn_owner(conversation, turn.tenant_id)
        return self.outbound.publishable(turn, key, verdict, NO_FACTS)
