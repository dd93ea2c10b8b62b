"""The records a handled event publishes: its outcome (``CheckpointPromoted`` /
``PromotionRejected``) with the effects it orphans, or its dead letter. Built only,
never sent: publishing and acking are ``streams/app.py``'s, after the outcome is
durable."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ratchet.domain import promotion
from ratchet.domain.promotion import Accepted, Reject, Verdict
from schemas.avro import header_schema_id
from schemas.models import DeadLetter, TurnCompleted
from services.ledger.base import TurnFacts
from streams.handled import Handled
from streams.outcomes import orphaned_event, promoted_event, rejected_event
from streams.records import DecodeFailed, Outbound, RawRecord
from streams.request_facts import RequestFacts, withheld
from streams.topics import Topics

# The processor's logger: its log lines kept their name when this part left it.
log = logging.getLogger("streams.processor")


class OutboundBuilder:
    """A verdict's records to publish (``publishable``), a record's dead letter
    (``dead_letter``). Reads the stored promotion a rejected attempt's request stands
    with only when the request has effects or claims to orphan (rare)."""

    def __init__(self, topics: Topics, request_facts: RequestFacts,
                 clock_ms: Callable[[], int]) -> None:
        self.topics = topics
        self.request_facts = request_facts
        self.clock_ms = clock_ms

    def publishable(self, turn: TurnCompleted, partition: str, verdict: Verdict,
                    facts: TurnFacts) -> Handled:
        key = partition.encode()
        if isinstance(verdict, Accepted):
            out = [Outbound(self.topics.checkpoints, key,
                            promoted_event(turn, partition, verdict.checkpoint))]
            kind = "promoted"
        else:
            out = [Outbound(self.topics.rejections, key, rejected_event(turn, partition, verdict))]
            kind = "rejected"
        # A rejected attempt of a request that stands promoted must never orphan what
        # the promoted turn used: read the promotion, only when there is something to
        # orphan (rejections with effects or claims are rare).
        damaged = promotion.damaged_claim(facts.claims)
        if damaged is not None:
            # Which of the request's runs are used, and whether the damaged claim's ran,
            # cannot be read: nothing of the request is orphaned (session 53's review).
            withheld("claim", "orphans of %s not published: %s", turn.response_id, damaged)
        known, promoted = (self.request_facts.orphans_known(turn, verdict)
                           if damaged is None and isinstance(verdict, Reject)
                           and (facts.effects or facts.claims)
                           else (damaged is None, None))
        # The stored promotion that stands (a replayed one, or the one a rejected
        # attempt's request has): its items, only when an effect it does not list as
        # used could be one recorded after it that its turn carries (rare: a read).
        stands = (verdict.checkpoint if isinstance(verdict, Accepted) and verdict.replayed
                  else promoted)
        items = None
        if known and stands is not None and promotion.needs_promoted_items(
                stands, [e.effect_id for e in facts.effects]
                + [c.effect_id for c in facts.claims]):
            known, items = self.request_facts.promoted_items(stands)
        # claims hook (issue 17): a claim of an attempt not accepted is orphaned too
        orphans = (promotion.orphaned_effects(turn, verdict, facts.effects, facts.claims,
                                              promoted, items) if known else ())
        for orphan in orphans:
            out.append(Outbound(self.topics.orphaned_effects, key,
                                orphaned_event(turn, partition, orphan)))
        return Handled(tuple(out), kind)

    def dead_letter(self, record: RawRecord, exc: DecodeFailed) -> Outbound:
        log.warning("dead letter %s[%d]@%d: %s", record.topic, record.partition, record.offset,
                    exc.error)
        letter = DeadLetter(
            key=record.key, value=record.value, error=exc.error[:4000], reason=exc.reason,
            source_topic=record.topic, source_partition=record.partition,
            source_offset=record.offset,
            schema_id=header_schema_id(record.value) if exc.schema_id is None else exc.schema_id,
            dead_lettered_at=self.clock_ms(),
        )
        return Outbound(self.topics.dead_letters, record.key, letter)
